#!/usr/bin/env bash
# The CLI face (issue 12, cli/): the `dlock` command.
#   - `cargo install --path cli` (debug profile, into a temporary root,
#     sharing the target folder) and the installed binary answering
#     --version: the full tier only (DLOCK_FULL=1), as it compiles the
#     command a second time;
#   - the cluster tests: starts the 3-member test cluster
#     (scripts/etcd-cluster.sh, honours DLOCK_TEST_PORT_BASE and
#     DLOCK_TEST_ETCD_DIR), runs cli_etcd, elect_etcd, semaphore_etcd
#     (`dlock run -n N`) and rwlock_etcd (`dlock run --read`; a missing
#     cluster fails them), stops the cluster
#     on any exit, and prints the cut-off figures (`CLI|...` lines).
# The tests that need no service run in scripts/test.sh's `cargo test
# --workspace`; the cluster tests' lint is its one clippy.
# Pass/fail is decided by the Rust tests; this script only counts.
#
# usage: scripts/test-cli.sh [LOGFILE]   (the cluster tests' cargo output is
#        appended to LOGFILE for scripts/test.sh's closing count; the other
#        tests already count there through `cargo test --workspace`)
# DLOCK_FAULT_RUNS (default 3) repeats the cut-off case.
# Prints `cli: N passed, M failed` (tests, plus failed steps) and exits 1 on
# any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
log=${1:-/dev/null}
[[ $log = /* || $log = /dev/null ]] || log="$PWD/$log"

. scripts/lib.sh
need_build_tools || exit 1

out=$(mktemp)
cluster_out=$(mktemp)
inst=$(mktemp -d)
trap 'scripts/etcd-cluster.sh stop >/dev/null 2>&1; rm -rf "$out" "$cluster_out" "$inst"' EXIT

failed_steps=0
# step NAME COMMAND...: output to the terminal and $out; counts a failure.
step() {
  local name=$1
  shift
  printf '\n==> cli: %s\n' "$name"
  if ! "$@" 2>&1 | tee -a "$out"; then
    failed_steps=$((failed_steps + 1))
    printf 'cli: FAILED: %s\n' "$name" | tee -a "$out"
  fi
}

installed() {
  cargo install --locked --debug --quiet --path cli --root "$inst" --target-dir "$(cargo_target_dir)" &&
    "$inst/bin/dlock" --version
}

# The cluster tests' lint is scripts/test.sh's one clippy; the tests that
# need no service run in its `cargo test --workspace`. `cargo install`
# compiles the command again on its own: the full tier (DLOCK_FULL=1).
if [[ -n ${DLOCK_FULL:-} ]]; then
  step "cargo install --path cli" installed
fi

printf '\n==> cli: start the test cluster\n'
if scripts/etcd-cluster.sh start; then
  # shellcheck disable=SC1091
  source "${DLOCK_TEST_ETCD_DIR:-target/etcd}/env"
  export DLOCK_FAULT_RUNS=${DLOCK_FAULT_RUNS:-3}
  printf '\n==> cli: tests on the cluster (DLOCK_FAULT_RUNS=%s)\n' "$DLOCK_FAULT_RUNS"
  if ! ws_test --test cli_etcd --test elect_etcd --test semaphore_etcd --test rwlock_etcd -- --nocapture 2>&1 | tee "$cluster_out"; then
    # A build failure prints no `test result:` line: count it.
    grep -q '^test result:' "$cluster_out" || failed_steps=$((failed_steps + 1))
  fi
  cat "$cluster_out" >>"$out"
  cat "$cluster_out" >>"$log"
else
  echo "cli: cannot start the test cluster" | tee -a "$out"
  failed_steps=$((failed_steps + 1))
fi

printf '\n==> cli: cut-off figures (ms, one monotonic clock)\n'
grep -o 'CLI|.*' "$cluster_out" | cut -d'|' -f2- | tr '|' '\t' || true
printf '\n==> cli: exit while holding (ms from the end of the holder to the acquisition of the contender)\n'
grep -o 'EXIT|.*' "$cluster_out" | cut -d'|' -f2- | tr '|' '\t' || true

awk -v steps="$failed_steps" '/^test result:/ { p += $4; f += $6 }
  END { printf "\ncli: %d passed, %d failed\n", p, f + steps; exit (f + steps) ? 1 : 0 }' "$out"
