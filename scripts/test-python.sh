#!/usr/bin/env bash
# The Python face (issue 10, bindings/python): builds the abi3 wheel with
# maturin, installs it into the test virtualenv (target/py-venv: maturin,
# pytest, mypy), checks that `pip install ./bindings/python` works in a
# fresh virtualenv, starts its own etcd test cluster, and runs the pytest
# suite: the API on the embedded backend, every file of scenarios/ through
# the shared runner, the etcd tests, the examples, stubtest and
# mypy --strict. Closes with `python: N passed, M failed`.
#
# usage: scripts/test-python.sh [LOGFILE]   (the Python face runs no cargo
#        test; LOGFILE is accepted as every face script accepts it)
# Honours DLOCK_TEST_PORT_BASE for its cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
step() { printf '\n==> %s\n' "$*"; }

. scripts/lib.sh
need_build_tools
need_python
venv=$root/target/py-venv
py=$venv/bin/python
fresh=$root/target/py-venv-fresh
junit=$root/target/py-junit.xml
started=$(date +%s)

step "python: the test virtualenv ($venv)"
[[ -x $py ]] || python3 -m venv "$venv"
"$py" -c 'import maturin, pytest, mypy' 2>/dev/null || "$py" -m pip install -q maturin pytest mypy

step "python: the scenario runner and the wheel"
cargo build --release --locked -p dlock-scenarios
rm -rf target/py-wheel
"$venv/bin/maturin" build --release --locked -m bindings/python/Cargo.toml -o target/py-wheel
"$py" -m pip install -q --force-reinstall --no-deps target/py-wheel/dlock-*.whl

step "python: pip install ./bindings/python in a fresh virtualenv"
rm -rf "$fresh"
python3 -m venv "$fresh"
"$fresh/bin/pip" install -q ./bindings/python
(cd /tmp && "$fresh/bin/python" -c 'import dlock; c = dlock.Client(); l = c.lock("x"); l.acquire(1); l.release(); print("fresh install: dlock", dlock.__version__, "works")')
rm -rf "$fresh"

step "python: the etcd test cluster"
trap 'scripts/etcd-cluster.sh stop' EXIT
scripts/etcd-cluster.sh start
# shellcheck disable=SC1091
source target/etcd/env
export DLOCK_TEST_REQUIRE_ETCD=1

step "python: pytest (API, scenarios, etcd, examples, stubtest, mypy --strict)"
rc=0
(cd bindings/python/tests && "$py" -m pytest -q -p no:cacheprovider --junitxml="$junit" .) || rc=$?
"$py" - "$junit" "$started" <<'PY'
import sys, time, xml.etree.ElementTree as ET
s = ET.parse(sys.argv[1]).getroot()
s = s if s.tag == "testsuite" else s.find("testsuite")
n, f, e, k = (int(s.get(a, 0)) for a in ("tests", "failures", "errors", "skipped"))
print(f"python face took {int(time.time()) - int(sys.argv[2])} s")
print(f"python: {n - f - e - k} passed, {f + e} failed" + (f", {k} skipped" if k else ""))
PY
exit "$rc"
