#!/usr/bin/env bash
# Benchmarks of the Node face (figures, not tests; not run by CI):
# a. permit() + end() in ns beside an empty native call and
#    process.hrtime.bigint() (bindings/node/bench/permit.js);
# b. uncontended acquire + release per second on the test etcd beside the
#    floor (one put + one delete through the `etcd3` npm package), a txn
#    floor (a guarded put + delete through dlock's own connection) and the
#    `etcd3` package 1.1.2's lock, in the same run (bindings/node/bench/etcd.js). etcd3 is installed here
#    into target/bench-node, for this script only.
# Builds the addon first (npm ci + npm run build). Uses the running test
# cluster (target/etcd/env) or starts one and stops it on exit; set
# DLOCK_TEST_PORT_BASE for a cluster of your own.
#
#   scripts/bench-node.sh [PERMIT_BATCHES [ETCD_ROUNDS [ETCD_OPS]]]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

. scripts/lib.sh
need_debs node=nodejs npm=npm
(cd bindings/node && { [[ -d node_modules ]] || npm ci --no-audit --no-fund; } && npm run build >/dev/null)

printf '\n== a. permit() + end()\n'
node bindings/node/bench/permit.js "${1:-200}" 20000

bench_dir=$root/target/bench-node
if [[ ! -f $bench_dir/node_modules/etcd3/package.json ]]; then
  mkdir -p "$bench_dir"
  npm install --prefix "$bench_dir" --no-save --no-package-lock --no-audit --no-fund etcd3@1.1.2 >/dev/null
fi

# The running test cluster, else one of our own for this run.
if ! { [[ -f target/etcd/env ]] && scripts/etcd-cluster.sh status >/dev/null 2>&1; }; then
  scripts/etcd-cluster.sh start
  trap 'scripts/etcd-cluster.sh stop' EXIT
fi
# shellcheck disable=SC1091
source target/etcd/env

printf '\n== b. etcd: uncontended acquire + release\n'
ETCD3_DIR=$bench_dir node bindings/node/bench/etcd.js "${2:-7}" "${3:-200}"
