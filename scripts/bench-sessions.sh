#!/usr/bin/env bash
# Benchmarks (not tests) of sessions, core/benches/sessions.rs: on etcd,
# acquire+release on one live session beside a bare put+delete, and 10,000
# locks held on one session (keepalives per interval from the members'
# /metrics, RSS per lock, time to acquire); the same 10,000 on the embedded
# backend. Prints figures and a summary table; no figure fails the run.
#
# Uses the test cluster of scripts/etcd-cluster.sh when it runs (its env
# file in target/etcd/), else starts one and stops it on exit. Set
# DLOCK_TEST_PORT_BASE for a cluster of your own; the DLOCK_BENCH_*
# settings are listed in core/benches/sessions.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

started=0
cleanup() { if ((started)); then scripts/etcd-cluster.sh stop; fi; }
trap cleanup EXIT
if [[ -f target/etcd/env ]] && scripts/etcd-cluster.sh status >/dev/null 2>&1; then
  echo "bench-sessions: using the running cluster (target/etcd/env)" >&2
else
  scripts/etcd-cluster.sh start
  started=1
fi
# shellcheck disable=SC1091
source target/etcd/env

cargo bench --quiet -p dlock --bench sessions --no-run
cargo bench --quiet -p dlock --bench sessions -- "$@"
