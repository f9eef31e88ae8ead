#!/usr/bin/env bash
# The PostgreSQL tests: starts the test servers (scripts/pg-cluster.sh:
# primary + synchronous standby, lone server + asynchronous standby,
# PgBouncer), runs every PostgreSQL test binary (core/tests/postgres*.rs:
# the backend, the fault cases of postgres_faults.rs, PgBouncer in
# postgres_bouncer.rs, the asynchronous standby's promotion in
# postgres_async.rs, elections in postgres_election.rs, a clock step on
# the stepped server in postgres_clockstep.rs, ...) and the command's
# (cli/tests/cli_postgres.rs) with --ignored (they are #[ignore]d so a
# plain `cargo test` does not count them; here a missing server fails
# them), stops the servers on any exit, and prints the fault figures.
#
# usage: scripts/test-postgres.sh [LOGFILE]   (cargo test output is appended
#        to LOGFILE, as scripts/test-etcd.sh does)
# DLOCK_FAULT_RUNS (default 3) repeats each fault case.
# DLOCK_TEST_PG_PORT_BASE and DLOCK_TEST_PG_DIR go to scripts/pg-cluster.sh
# (ports and data directory, default 25430 and target/pg).
set -euo pipefail
cd "$(dirname "$0")/.."

log=${1:-$(mktemp)}
out=$(mktemp)
one=$(mktemp)
trap 'scripts/pg-cluster.sh stop; rm -f "$out" "$one" "$one.pg_guard"' EXIT

# The holders of core/tests/postgres_guard_process.rs: the Rust example and
# the C example (libpq; the release libdlock.so, which test-c.sh built).
printf '\n==> %s\n' "postgres: build examples/rust/pg_guard.rs and examples/c/pg_guard.c"
. scripts/lib.sh
need_debs gcc=gcc pkg-config=pkg-config /usr/include/postgresql/libpq-fe.h=libpq-dev
# The Rust example: built by the workspace's test build (cargo builds every
# example with the tests), in the same feature set; the C one on the one
# release build's libdlock.so.
cargo build --workspace --all-features --locked --example pg_guard
wait_release
scripts/build-release.sh
lib=$(release_dir)
# shellcheck disable=SC2046
gcc -std=c11 -Wall -Wextra -Werror -pedantic -O1 -Iinclude $(pkg-config --cflags libpq) examples/c/pg_guard.c \
  -o "$one.pg_guard" -L"$lib" -ldlock $(pkg-config --libs libpq) -Wl,-rpath,"$lib"
export DLOCK_PG_GUARD_RUST=$(cargo_target_dir)/debug/examples/pg_guard DLOCK_PG_GUARD_C=$one.pg_guard

printf '\n==> %s\n' "postgres: start the test servers"
scripts/pg-cluster.sh start
# shellcheck disable=SC1091
source "${DLOCK_TEST_PG_DIR:-target/pg}/env"
export DLOCK_FAULT_RUNS=${DLOCK_FAULT_RUNS:-3}

printf '\n==> %s\n' "postgres: backend, parity and fault tests (DLOCK_FAULT_RUNS=$DLOCK_FAULT_RUNS)"
tests=()
for t in core/tests/postgres*.rs; do
  t=$(basename "$t" .rs)
  [[ $t == postgres_failover || $t == postgres_syncwait ]] || tests+=(--test "$t")
done
rc=0
ws_test "${tests[@]}" -- --ignored --nocapture 2>&1 | tee "$out" || rc=$?
# The command on the same servers: run, show, list, elect, postgres migrate.
printf '\n==> %s\n' "postgres: the dlock command (cli/tests/cli_postgres.rs)"
ws_test --test cli_postgres -- --ignored --nocapture 2>&1 | tee -a "$out" || rc=$?
cat "$out" >>"$log"

# Each alone, after the others: one stalls every commit on the primary,
# the last kills it.
alone() {
  printf '\n==> postgres: %s\n' "$1"
  if ! ws_test --test "$2" -- --ignored --nocapture >"$one" 2>&1; then
    rc=1
    cat "$one"
  else
    grep -E '^test |test result' "$one"
  fi
  cat "$one" >>"$out"
  cat "$one" >>"$log"
}
alone "a cancelled wait for synchronous replication" postgres_syncwait
alone "promotion of the synchronous standby" postgres_failover

printf '\n==> %s\n' "postgres: fault figures over $DLOCK_FAULT_RUNS run(s) per case (ms, one monotonic clock)"
{
  echo "case|runs|cut->drain min/median/max|drained|smallest on_fence lead over contender|other"
  grep -o 'FAULT|.*' "$out" | cut -d'|' -f2- | sort
} | column -t -s '|' || true
exit "$rc"
