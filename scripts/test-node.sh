#!/usr/bin/env bash
# The Node face's checks (bindings/node, issue 11): installs Node and npm
# (Debian) if missing, `npm ci` (the committed package-lock.json), builds
# the addon through the README's command (`npm run build`: build.mjs, a
# plain cargo build into target/release plus the generated typings and
# tsc) and the test addon with the scenario runner (`npm run build:test`),
# starts its own etcd test cluster, and runs every node:test file one at a
# time (the scenarios' windows want an unloaded loop). Prints
# `node: N passed, N failed` (node's own counts) and fails on any failure.
# Usage: scripts/test-node.sh [LOGFILE]   (everything is appended to it)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
log=${1:-/dev/null}
[[ $log = /* || $log = /dev/null ]] || log="$root/$log"

say() { printf '\n==> node: %s\n' "$*" | tee -a "$log"; }
fail() {
  printf 'node: %s\n\nnode: 0 passed, 1 failed\n' "$*" | tee -a "$log"
  exit 1
}

. scripts/lib.sh
need_build_tools >>"$log" 2>&1 || fail "cannot install the Rust build's tools"
need_debs node=nodejs npm=npm etcd=etcd-server etcdctl=etcd-client >>"$log" 2>&1 || fail "cannot install nodejs, npm, etcd"

say "cargo clippy -p dlock-node --features scenarios (the test-only code; test.sh lints the default build)"
cargo clippy -p dlock-node --features scenarios --all-targets --locked -- -D warnings 2>&1 | tee -a "$log"
((PIPESTATUS[0] == 0)) || fail "clippy of the scenarios feature failed"

cd bindings/node
say "npm ci (node $(node --version), npm $(npm --version))"
npm ci --no-audit --no-fund 2>&1 | tee -a "$log"
((PIPESTATUS[0] == 0)) || fail "npm ci failed"
say "npm run build (the addon, native.d.ts, index.js, index.d.ts)"
npm run build 2>&1 | tee -a "$log"
((PIPESTATUS[0] == 0)) || fail "npm run build failed"
say "npm run build:test (the test addon with the scenario runner)"
npm run build:test 2>&1 | tee -a "$log"
((PIPESTATUS[0] == 0)) || fail "npm run build:test failed"
(cd "$root" && node -e "require('./bindings/node')") 2>&1 | tee -a "$log"
((PIPESTATUS[0] == 0)) || fail "require('./bindings/node') failed"
cd "$root"

say "etcd test cluster (port base ${DLOCK_TEST_PORT_BASE:-default})"
trap '"$root/scripts/etcd-cluster.sh" stop >>"$log" 2>&1' EXIT
scripts/etcd-cluster.sh start 2>&1 | tee -a "$log"
((PIPESTATUS[0] == 0)) || fail "cannot start the etcd test cluster"
# shellcheck disable=SC1091
source target/etcd/env
export DLOCK_TEST_REQUIRE_ETCD=1

say "node --test (every file of bindings/node/test, one at a time)"
cd bindings/node
node --test --test-concurrency=1 \
  --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=./test/count-reporter.mjs --test-reporter-destination=stdout \
  test/*.test.js 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
exit "$rc"
