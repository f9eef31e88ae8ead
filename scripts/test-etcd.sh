#!/usr/bin/env bash
# The etcd tests: starts the test cluster (scripts/etcd-cluster.sh), runs
# every etcd test binary against it (core/tests/etcd*.rs: etcd, etcd_faults,
# etcd_parity, etcd_sessions; `test = false` targets) and the etcd backend's
# own cluster tests (core/src/etcd/cluster_tests.rs, `#[ignore]`d in a plain
# `cargo test`, run here with --ignored), stops the cluster on any exit, and
# prints the fault figures table (etcd_faults' cases and etcd_sessions'
# sessions_* cases of 1,000 locks).
#
# One switch says a cluster exists: DLOCK_TEST_ETCD (the env file sets it).
# A plain `cargo test` runs no etcd test (none counts as passed); run here,
# every one of them fails when the cluster is missing.
#
# usage: scripts/test-etcd.sh [LOGFILE]   (cargo test output is appended to
#        LOGFILE, so scripts/test.sh's closing count includes it)
# DLOCK_FAULT_RUNS (default 3) repeats each fault case.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

log=${1:-$(mktemp)}
out=$(mktemp)
lib_out=$(mktemp)
trap 'scripts/etcd-cluster.sh stop; rm -f "$out" "$lib_out"' EXIT

printf '\n==> %s\n' "etcd: start the test cluster"
scripts/etcd-cluster.sh start
# shellcheck disable=SC1091
source "${DLOCK_TEST_ETCD_DIR:-target/etcd}/env"
export DLOCK_FAULT_RUNS=${DLOCK_FAULT_RUNS:-3}

printf '\n==> %s\n' "etcd: backend, fault and session tests (DLOCK_FAULT_RUNS=$DLOCK_FAULT_RUNS)"
tests=()
for t in core/tests/etcd*.rs; do
  tests+=(--test "$(basename "$t" .rs)")
done
rc=0
ws_test "${tests[@]}" -- --nocapture 2>&1 | tee "$out" || rc=$?
cat "$out" >>"$log"

printf '\n==> %s\n' "etcd: the backend's own tests (unlock, the key watch of a session)"
# Their output in full only when one fails (they are quiet when they pass).
if ws_test --lib etcd::cluster_tests:: -- --ignored >"$lib_out" 2>&1; then
  grep -E '^test |test result' "$lib_out"
else
  rc=1
  cat "$lib_out"
fi
cat "$lib_out" >>"$log"

printf '\n==> %s\n' "etcd: the examples' stories on the cluster"
scripts/etcd-examples.sh "$log" || rc=1
# The C face links the release build: under scripts/test.sh, the other
# lane may still be making it.
{ wait_release && scripts/test-c-etcd.sh "$log"; } || rc=1

printf '\n==> %s\n' "etcd: fault figures over $DLOCK_FAULT_RUNS run(s) per case (ms, one monotonic clock)"
{
  echo "case|runs|cut->drain min/median/max|drained|smallest on_fence lead over contender|other"
  grep -o 'FAULT|.*' "$out" | cut -d'|' -f2- | sort
} | awk -F'|' '
  { n = NR; for (i = 1; i <= NF; i++) { c[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) }; if (NF > nf) nf = NF }
  END { for (r = 1; r <= n; r++) { line = ""; for (i = 1; i <= nf; i++) line = line sprintf("%-*s  ", w[i], c[r, i]); sub(/ +$/, "", line); print line } }'
exit "$rc"
