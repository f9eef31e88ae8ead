#!/usr/bin/env bash
# The Node face's checks (bindings/node, issue 11): installs Node and npm
# (Debian) if missing, `npm ci` (the committed package-lock.json), builds
# the addon through the README's command (`npm run build`: build.mjs, a
# plain cargo build into target/release plus the generated typings and
# tsc) and the test addon with the scenario runner (`npm run build:test`),
# starts its own etcd test cluster and PostgreSQL servers, and runs every
# node:test file one at a time (the scenarios' windows want an unloaded loop). Prints
# `node: N passed, N failed` (node's own counts) and fails on any failure.
#
# With DLOCK_DIST=DIR (scripts/test.sh, after scripts/dist.sh), the package
# under test is the artifact users install, built once (issue 21): no `npm
# run build`; `npm install --offline` of DIR/npm's two tarballs (dlock-fence and
# its platform package) into an empty project under target/node-installed/,
# laid out as the repository is (bindings/node, examples/node, scenarios),
# whose bindings/node/index.js is `require('dlock')`; every test file runs
# there, with cargo and protoc shadowed on PATH by stubs that fail. The
# scenarios file keeps its test addon (build:test: the runner is test-only).
# Without DLOCK_DIST (a developer's run): the old build, tests in place.
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

# The scenarios feature's code is linted by scripts/test.sh's one clippy
# (--all-features).

cd bindings/node
say "npm ci (node $(node --version), npm $(npm --version))"
npm ci --no-audit --no-fund 2>&1 | tee -a "$log"
((PIPESTATUS[0] == 0)) || fail "npm ci failed"
dist=${DLOCK_DIST:-}
if [[ -z $dist ]]; then
  say "npm run build (the addon, native.d.ts, index.js, index.d.ts)"
  npm run build 2>&1 | tee -a "$log"
  ((PIPESTATUS[0] == 0)) || fail "npm run build failed"
fi
say "npm run build:test (the test addon with the scenario runner)"
npm run build:test 2>&1 | tee -a "$log"
((PIPESTATUS[0] == 0)) || fail "npm run build:test failed"
cd "$root"
pkg=$root/bindings/node
if [[ -z $dist ]]; then
  node -e "require('./bindings/node')" 2>&1 | tee -a "$log"
  ((PIPESTATUS[0] == 0)) || fail "require('./bindings/node') failed"
else
  [[ $dist = /* ]] || dist=$root/$dist
  version=$(node -p "require('./bindings/node/package.json').version")
  main_tgz=$dist/npm/dlock-fence-$version.tgz
  plat_tgz=$dist/npm/dlock-fence-linux-x64-gnu-$version.tgz
  [[ -f $main_tgz && -f $plat_tgz ]] || fail "DLOCK_DIST=$dist lacks npm/dlock-fence-$version.tgz or its platform package: run scripts/dist.sh"
  # cargo, rustc and protoc: stubs that fail, first on PATH, from here on.
  shadow_build_tools "$root/target/node-stubs" test-node
  app=$root/target/node-installed
  pkg=$app/bindings/node
  rm -rf "$app"
  mkdir -p "$pkg" "$app/examples"
  echo '{ "name": "dlock-installed-tests", "private": true }' >"$pkg/package.json"
  say "npm install --offline dlock@file:$(basename "$main_tgz") $(basename "$plat_tgz") (an empty project)"
  t0=$(date +%s%N)
  (cd "$pkg" && npm install --offline --no-audit --no-fund "dlock@file:$main_tgz" "$plat_tgz") 2>&1 | tee -a "$log"
  ((PIPESTATUS[0] == 0)) || fail "npm install --offline of the tarballs failed"
  echo "cold npm install of the two tarballs: $((($(date +%s%N) - t0) / 1000000)) ms" | tee -a "$log"
  # The suite as in the repository: test/ (with the test addon), the
  # examples and scenarios beside it; '..' from test/ is require('dlock').
  cp -r bindings/node/test "$pkg/"
  cp -r examples/node "$app/examples/"
  cp -r scenarios "$app/"
  mkdir -p "$app/core/tests" # the metric family list every face is checked against
  cp -r core/tests/fixtures "$app/core/tests/"
  echo "module.exports = require('dlock');" >"$pkg/index.js"
  echo "export * from 'dlock';" >"$pkg/index.d.ts"
  echo "module.exports = require('dlock/prometheus');" >"$pkg/prometheus.js"
  # The suite's tools (not the artifact): TypeScript, @types/node,
  # fast-check, prom-client (dlock/prometheus's optional peer), a parser and
  # pg (examples/node/pg-guard.js and its test; its own dependencies resolve
  # from its real path).
  for m in typescript @types fast-check prom-client prom2javascript pg; do ln -s "$root/bindings/node/node_modules/$m" "$pkg/node_modules/$m"; done
  (cd "$pkg" && node -e '
    const d = require("dlock");
    const addon = Object.keys(require.cache).find((k) => k.endsWith(".node"));
    if (!addon || !addon.includes("/node_modules/dlock-fence-linux-x64-gnu/")) throw new Error("addon from " + addon);
    console.log("require(\"dlock\"):", require.resolve("dlock"), "with", addon);
    if (typeof d.Client !== "function") throw new Error("no Client");') 2>&1 | tee -a "$log"
  ((PIPESTATUS[0] == 0)) || fail "require('dlock') did not load the platform package's addon"
fi

say "etcd test cluster (port base ${DLOCK_TEST_PORT_BASE:-default})"
trap '"$root/scripts/pg-cluster.sh" stop >>"$log" 2>&1; "$root/scripts/etcd-cluster.sh" stop >>"$log" 2>&1' EXIT
scripts/etcd-cluster.sh start 2>&1 | tee -a "$log"
((PIPESTATUS[0] == 0)) || fail "cannot start the etcd test cluster"
# shellcheck disable=SC1091
source "${DLOCK_TEST_ETCD_DIR:-target/etcd}/env"

# For test/pg-guard.test.js (dlock.guard with node-postgres): its own
# servers (DLOCK_TEST_PG_PORT_BASE, DLOCK_TEST_PG_DIR as for pg-cluster.sh).
say "PostgreSQL test servers (port base ${DLOCK_TEST_PG_PORT_BASE:-default})"
scripts/pg-cluster.sh start 2>&1 | tee -a "$log"
((PIPESTATUS[0] == 0)) || fail "cannot start the PostgreSQL test servers"
# shellcheck disable=SC1091
source "${DLOCK_TEST_PG_DIR:-target/pg}/env"

say "node --test (every file of $pkg/test, one at a time)"
cd "$pkg"
node --test --test-concurrency=1 \
  --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=./test/count-reporter.mjs --test-reporter-destination=stdout \
  test/*.test.js 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
exit "$rc"
