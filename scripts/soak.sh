#!/usr/bin/env bash
# Soak per face (issue 23; docs/testing.md "Soak"): for each face asked
# (rust, c, python, node; default all four), 100,000 acquire/release cycles
# and 1,000,000 permits on the embedded backend, then 10,000 cycles and
# 100,000 permits on the etcd test cluster (scripts/etcd-cluster.sh,
# started unless DLOCK_TEST_ETCD says one runs; DLOCK_TEST_PORT_BASE is
# honoured). Each face's program decides pass or fail itself: RSS growth
# after the warm-up (a tenth of the run) under DLOCK_SOAK_RSS_MIB (default
# 4 MiB; Node: the RSS less V8's committed heap, and the JavaScript heap
# used within 1 MiB), open descriptors and threads equal to the warm-up's
# at each of ten samples. Prints the table of figures; exits 1 if any face failed.
# Not in CI (about 15 minutes on 2 cores).
#
# usage: scripts/soak.sh [rust|c|python|node ...]
#   DLOCK_SOAK_CYCLES / DLOCK_SOAK_PERMITS           embedded (100000 / 1000000; cycles 0: no embedded run)
#   DLOCK_SOAK_ETCD_CYCLES / DLOCK_SOAK_ETCD_PERMITS etcd (10000 / 100000; cycles 0: no etcd run)
#   DLOCK_SOAK_NO_BUILD=1   use the builds there are (e.g. while a nemesis
#                           run uses them): target/release/libdlock.so, the
#                           wheel in target/py-venv, the built bindings/node
#   DLOCK_SOAK_PYTHON=PATH  the Python with the wheel (target/py-venv/bin/python)
#
# The programs: core/tests/soak.rs (debug build), ffi-c/tests/c/soak.c (on
# the release libdlock.so), bindings/python/tests/soak_cycles.py (the
# wheel), bindings/node/bench/soak.js.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_build_tools

faces=("$@")
((${#faces[@]})) || faces=(rust c python node)
for f in "${faces[@]}"; do
  case $f in rust | c | python | node) ;; *) echo "usage: scripts/soak.sh [rust|c|python|node ...]" >&2; exit 2 ;; esac
done
has() { [[ " ${faces[*]} " == *" $1 "* ]]; }

mkdir -p target/soak
if [[ -z ${DLOCK_SOAK_NO_BUILD:-} ]]; then
  printf '\n==> %s\n' "soak: build"
  has rust && ws_test --no-run --test soak --quiet
  if has c || has python || has node; then nemesis/holders/build-faces.sh >/dev/null; fi
fi
if has c; then
  . scripts/c-flags.sh
  gcc "${STRICT[@]}" -O2 -Iinclude ffi-c/tests/c/soak.c -o target/soak/c-soak "${LINK[@]}"
fi

lines=$(mktemp)
trap 'rm -f "$lines"' EXIT
failed=()
# run FACE BACKEND: one face's program with the counts of its backend.
run() {
  local face=$1 backend=$2 out rc=0
  printf '\n==> %s\n' "soak: $face on $backend"
  out=$(mktemp)
  case $face in
    rust) ws_test --test soak --quiet ;;
    c) target/soak/c-soak ;;
    python) "${DLOCK_SOAK_PYTHON:-target/py-venv/bin/python}" bindings/python/tests/soak_cycles.py ;;
    node)
      # The package build-faces.sh installed from DLOCK_DIST, else the built bindings/node.
      if [[ -n ${DLOCK_DIST:-} ]]; then
        DLOCK_NODE_PACKAGE=$PWD/target/nemesis/node/node_modules/dlock node --expose-gc bindings/node/bench/soak.js
      else
        node --expose-gc bindings/node/bench/soak.js
      fi
      ;;
  esac >"$out" || rc=$?
  cat "$out"
  grep '^SOAK|' "$out" >>"$lines" || true
  rm -f "$out"
  ((rc == 0)) || failed+=("$face/$backend")
}

mem_cycles=${DLOCK_SOAK_CYCLES:-100000}
if ((mem_cycles > 0)); then
  for f in "${faces[@]}"; do
    DLOCK_ENDPOINTS= DLOCK_SOAK_CYCLES=$mem_cycles DLOCK_SOAK_PERMITS=${DLOCK_SOAK_PERMITS:-1000000} run "$f" memory
  done
fi

etcd_cycles=${DLOCK_SOAK_ETCD_CYCLES:-10000}
if ((etcd_cycles > 0)); then
  if [[ -z ${DLOCK_TEST_ETCD:-} ]]; then
    trap 'rm -f "$lines"; scripts/etcd-cluster.sh stop' EXIT
    scripts/etcd-cluster.sh start
    # shellcheck disable=SC1091
    source "${DLOCK_TEST_ETCD_DIR:-target/etcd}/env"
  fi
  for f in "${faces[@]}"; do
    DLOCK_ENDPOINTS=$DLOCK_TEST_MEMBERS DLOCK_SOAK_CYCLES=$etcd_cycles DLOCK_SOAK_PERMITS=${DLOCK_SOAK_ETCD_PERMITS:-100000} run "$f" etcd
  done
fi

printf '\n==> %s\n' "soak: figures (RSS in MiB; growth: the largest of ten samples over the warm-up's)"
awk -F'|' 'BEGIN { printf "%-7s %-7s %8s %9s %8s %9s %8s %11s %9s %9s %7s\n", "face", "backend", "cycles", "permits", "seconds", "RSS warm", "RSS end", "growth KiB", "bound", "fds w/e", "thr w/e" }
  { printf "%-7s %-7s %8s %9s %8s %9.1f %8.1f %11s %5s MiB %9s %7s\n", $2, $3, $4, $5, $6, $7 / 1024, $8 / 1024, $9, $14, $10 "/" $11, $12 "/" $13 }' "$lines"
if ((${#failed[@]})); then
  echo "soak: FAILED: ${failed[*]}"
  exit 1
fi
echo "soak: every face flat"
