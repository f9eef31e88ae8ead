#!/usr/bin/env bash
# Benchmark, not a test (docs/elections.md, "Figures"): the election's
# fail-over and observer figures, release build, each beside its baseline
# of the same run (`nemesis bench-election`, nemesis/src/bench.rs):
# - fail-over: a leader process killed (SIGKILL), or cut off (its fault
#   proxies blackhole), -> the next leader's first permit, RUNS runs each
#   (default 5), medians beside the TTL;
# - observer latency: proclaim start -> `client.observe`'s event, beside
#   `etcdctl elect -l` in the same run, PROCLAIMS (default 200) back to
#   back and as many 20 ms apart; p50 and p99.
#
# usage: scripts/bench-election.sh [--runs N] [--proclaims N] [--only failover|observer]
#        (starts the etcd test cluster unless DLOCK_TEST_ETCD says one runs;
#        DLOCK_TEST_PORT_BASE is honoured)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_build_tools
cargo build -p dlock-nemesis --release --locked --bins --quiet
if [[ -z ${DLOCK_TEST_ETCD:-} ]]; then
  trap 'scripts/etcd-cluster.sh stop' EXIT
  scripts/etcd-cluster.sh start
  # shellcheck disable=SC1091
  source target/etcd/env
fi
target/release/nemesis bench-election --dir target/nemesis/bench-election "$@"
