#!/usr/bin/env bash
# The Python face (issue 10, bindings/python): starts its own etcd test
# cluster and PostgreSQL servers and runs the pytest suite: the API on the
# embedded backend, every file of scenarios/ through the shared runner, the
# etcd tests, dlock.guard with psycopg, the examples, stubtest and mypy
# --strict. Closes with
# `python: N passed, M failed`. The wheel under test comes one of two ways:
#
# - DLOCK_DIST=DIR (scripts/test.sh, after scripts/dist.sh): the artifact
#   users install, built once (issue 21). `pip install --no-index
#   --find-links DIR dlock-fence` into a fresh virtualenv
#   (target/py-venv-dist), and the suite and examples run against it from a
#   copy under target/py-installed/ (no path there leads to the source
#   tree), with cargo and protoc shadowed on PATH by stubs that fail. Then
#   the sdist (DIR/dlock_fence-V.tar.gz) is built by pip with cargo but no
#   protoc (its protoc comes from a build requirement), in this
#   repository's target dir, so only the dlock crates compile again.
# - no DLOCK_DIST (a developer's run): the old build. maturin builds the
#   wheel into the test virtualenv (target/py-venv), `pip install
#   ./bindings/python` is checked in a fresh virtualenv, and the suite runs
#   from bindings/python/tests. No zig, no dist.sh needed.
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

tests=$root/bindings/python/tests
# The PostgreSQL driver of examples/python/pg_guard.py and its test.
PSYCOPG=3.3.9
dist=${DLOCK_DIST:-}
if [[ -z $dist ]]; then
  step "python: the test virtualenv ($venv)"
  [[ -x $py ]] || python3 -m venv "$venv"
  "$py" -c 'import maturin, pytest, mypy, hypothesis, prometheus_client' 2>/dev/null || "$py" -m pip install -q maturin pytest mypy hypothesis prometheus_client
  "$py" -c "import psycopg; assert psycopg.__version__ == '$PSYCOPG'" 2>/dev/null || "$py" -m pip install -q "psycopg[binary]==$PSYCOPG"

  step "python: the scenario runner and the wheel"
  cargo build --release --locked -p dlock-scenarios
  rm -rf target/py-wheel
  "$venv/bin/maturin" build --release --locked -m bindings/python/Cargo.toml -o target/py-wheel
  "$py" -m pip install -q --force-reinstall --no-deps target/py-wheel/dlock_fence-*.whl

  step "python: pip install ./bindings/python in a fresh virtualenv"
  rm -rf "$fresh"
  python3 -m venv "$fresh"
  "$fresh/bin/pip" install -q ./bindings/python
  (cd /tmp && "$fresh/bin/python" -c 'import dlock; c = dlock.Client(); l = c.lock("x"); l.acquire(1); l.release(); print("fresh install: dlock", dlock.__version__, "works")')
  rm -rf "$fresh"
else
  [[ $dist = /* ]] || dist=$root/$dist
  version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
  sdist=$dist/dlock_fence-$version.tar.gz
  if ! compgen -G "$dist/dlock_fence-$version-*.whl" >/dev/null || [[ ! -f $sdist ]]; then
    echo "python: DLOCK_DIST=$dist has no dlock_fence $version wheel and sdist: run scripts/dist.sh" >&2
    printf '\npython: 0 passed, 1 failed\n'
    exit 1
  fi
  step "python: the scenario runner (a test tool, not the artifact: the one release build's)"
  scripts/build-release.sh
  DLOCK_SCENARIO_LIB=$(release_dir)/libdlock_scenarios.so
  export DLOCK_SCENARIO_LIB
  target_dir=$(cargo_target_dir)

  # cargo, rustc and protoc: stubs that fail, first on PATH, from here on.
  stubs=$root/target/py-stubs
  build_path=$PATH
  shadow_build_tools "$stubs" test-python
  mkdir -p "$stubs/sdist"
  cp "$stubs/protoc" "$stubs/sdist/protoc" # protoc alone: for the sdist

  step "python: pip install --no-index --find-links $dist dlock-fence (a fresh virtualenv, cargo and protoc stubbed)"
  venv=$root/target/py-venv-dist
  py=$venv/bin/python
  rm -rf "$venv"
  python3 -m venv "$venv"
  t0=$(date +%s%N)
  "$venv/bin/pip" install -q --no-cache-dir --no-index --find-links "$dist" dlock-fence
  echo "cold pip install of the wheel: $((($(date +%s%N) - t0) / 1000000)) ms"
  "$py" -m pip install -q pytest mypy hypothesis prometheus_client "psycopg[binary]==$PSYCOPG" # the suite's tools, not the artifact

  # The suite finds examples/, scenarios/ and core/tests/fixtures three
  # levels up from itself: a copy of those, where nothing leads to bindings/python/python.
  copy=$root/target/py-installed
  rm -rf "$copy"
  mkdir -p "$copy/bindings/python" "$copy/examples"
  cp -r bindings/python/tests "$copy/bindings/python/"
  cp -r examples/python "$copy/examples/"
  cp -r scenarios "$copy/"
  cp README.md "$copy/" # its Python loop, run as written (test_examples_and_types.py)
  # The metric family list every face's exporter is checked against.
  mkdir -p "$copy/core/tests"
  cp -r core/tests/fixtures "$copy/core/tests/"
  tests=$copy/bindings/python/tests
  (cd "$tests" && "$py" -c '
import sys, dlock, dlock._dlock as m
print("import dlock:", m.__file__)
assert m.__file__.startswith(sys.prefix), "dlock imported from outside the virtualenv"')

  # The sdist compiles every crate again (pip's own cargo build): the full
  # tier only (DLOCK_FULL=1, scripts/test.sh --full; docs/testing.md).
  if [[ -n ${DLOCK_FULL:-} ]]; then
    step "python: pip install of the sdist with cargo but no protoc (CARGO_TARGET_DIR=$target_dir)"
    fresh=$root/target/py-venv-sdist
    rm -rf "$fresh"
    python3 -m venv "$fresh"
    t0=$(date +%s)
    PATH=$stubs/sdist:$build_path CARGO_TARGET_DIR=$target_dir "$fresh/bin/pip" install -q --no-cache-dir "$sdist"
    echo "sdist build and install: $(($(date +%s) - t0)) s"
    (cd /tmp && "$fresh/bin/python" -c 'import dlock; c = dlock.Client(); l = c.lock("x"); l.acquire(1); l.release(); print("sdist install: dlock", dlock.__version__, "works")')
    rm -rf "$fresh"
  fi
fi

step "python: the etcd test cluster"
trap 'scripts/pg-cluster.sh stop; scripts/etcd-cluster.sh stop' EXIT
scripts/etcd-cluster.sh start
# shellcheck disable=SC1091
source "${DLOCK_TEST_ETCD_DIR:-target/etcd}/env"

# For tests/test_pg_guard.py (dlock.guard with psycopg): its own servers
# (DLOCK_TEST_PG_PORT_BASE, DLOCK_TEST_PG_DIR as for scripts/pg-cluster.sh).
step "python: the PostgreSQL test servers"
scripts/pg-cluster.sh start
# shellcheck disable=SC1091
source "${DLOCK_TEST_PG_DIR:-target/pg}/env"

step "python: pytest (API, scenarios, etcd, PostgreSQL's guard, examples, stubtest, mypy --strict)"
rc=0
(cd "$tests" && "$py" -m pytest -q -p no:cacheprovider --junitxml="$junit" .) || rc=$?
"$py" - "$junit" "$started" <<'PY'
import sys, time, xml.etree.ElementTree as ET
s = ET.parse(sys.argv[1]).getroot()
s = s if s.tag == "testsuite" else s.find("testsuite")
n, f, e, k = (int(s.get(a, 0)) for a in ("tests", "failures", "errors", "skipped"))
print(f"python face took {int(time.time()) - int(sys.argv[2])} s")
print(f"python: {n - f - e - k} passed, {f + e} failed" + (f", {k} skipped" if k else ""))
PY
exit "$rc"
