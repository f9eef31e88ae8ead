#!/usr/bin/env bash
# Benchmarks of the Python face (figures, not tests; not run by CI):
# `with lock.permit(): pass` beside `with threading.Lock(): pass`, and
# acquire + release per second on a throwaway etcd cluster beside the floor
# (put + delete) and python-etcd3's lock. python-etcd3 0.12 lives in a
# virtualenv of its own (target/py-bench-venv), with the protobuf and
# tenacity versions it needs against etcd 3.4.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_build_tools
need_python
venv=target/py-bench-venv
[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
"$venv/bin/python" -c 'import etcd3, maturin' 2>/dev/null ||
  "$venv/bin/pip" install -q maturin etcd3==0.12.0 protobuf==3.20.3 tenacity==6.3.1
"$venv/bin/maturin" build --release --locked -m bindings/python/Cargo.toml -o target/wheels-bench
"$venv/bin/pip" install -q --force-reinstall --no-deps target/wheels-bench/dlock_fence-*.whl
trap 'scripts/etcd-cluster.sh stop' EXIT
scripts/etcd-cluster.sh start
# shellcheck disable=SC1091
source target/etcd/env
"$venv/bin/python" bindings/python/bench/bench.py
