#!/usr/bin/env bash
# Benchmark, not a test: how late on_fence runs after the deadline, with two
# busy processes beside the holders and without (the baseline, same run):
# the cpu_starvation case of nemesis/tests/nemesis_cases.rs with
# DLOCK_NEMESIS_CPU_ROUNDS rounds (default 20) of 10 holders cut off at once
# (200 fences per setting), release build. Prints both figure lines.
#
# usage: scripts/bench-nemesis.sh   (starts the etcd test cluster unless
#        DLOCK_TEST_ETCD says one runs)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_build_tools
export DLOCK_NEMESIS_CPU_ROUNDS=${DLOCK_NEMESIS_CPU_ROUNDS:-20} DLOCK_NEMESIS_RUNS=10
if [[ -z ${DLOCK_TEST_ETCD:-} ]]; then
  trap 'scripts/etcd-cluster.sh stop' EXIT
  scripts/etcd-cluster.sh start
  # shellcheck disable=SC1091
  source target/etcd/env
fi
for busy in 0 2; do
  echo "== $busy busy processes"
  DLOCK_NEMESIS_CPU_BUSY=$busy cargo test --release -p dlock-nemesis --locked --test nemesis_cases \
    -- --exact cpu_starvation --nocapture 2>&1 | grep -o 'NEMESIS|.*' || true
done
