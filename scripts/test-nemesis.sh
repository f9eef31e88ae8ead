#!/usr/bin/env bash
# The nemesis (issue 13; docs/nemesis.md): starts the etcd test cluster
# (scripts/etcd-cluster.sh; DLOCK_TEST_PORT_BASE is honoured), runs the
# checker's own tests and every nemesis case against the cluster
# (nemesis/tests/nemesis_cases.rs: the random fault mix with one holder of
# each face: Rust, C (examples/nemesis/holder.c), Python, Node and `dlock
# run` (nemesis/holders/), quorum loss,
# paused past the TTL, the wall-clock step under libfaketime, CPU
# starvation, flapping; the election mode: Rust and `dlock elect`
# candidates; the semaphore mode: one holder of each face on 3 slots),
# stops the cluster, then starts the PostgreSQL primary +
# synchronous standby of scripts/pg-cluster.sh (DLOCK_TEST_PG_PORT_BASE and
# DLOCK_TEST_PG_DIR are honoured) and runs the nemesis on PostgreSQL
# (nemesis/tests/nemesis_postgres.rs: Rust and C holders writing app.writes
# under dlock.guard; a holder paused past its TTL refused by the database,
# and its unguarded control caught by the checker), stops the servers on
# any exit, prints the figures of each case and one closing line
# `nemesis: N passed, M failed`.
#
# The etcd part and the PostgreSQL part run side by side (each on its own
# servers; both mostly wait on timers).
#
# usage: scripts/test-nemesis.sh [LOGFILE]   (cargo test output is appended)
# Lengths (override in the environment; these defaults are the full tier's,
# scripts/test.sh's fast tier sets shorter ones, docs/testing.md):
# DLOCK_NEMESIS_SECONDS=60 (the mix, one lock), DLOCK_NEMESIS_MANY_SECONDS=60
# (the mix, 100 locks per holder), DLOCK_NEMESIS_ELECTION_SECONDS=60 (the
# mix, one election), DLOCK_NEMESIS_RUNS=10 (runs of each case),
# DLOCK_NEMESIS_FLAP_SECONDS=60, DLOCK_NEMESIS_PG_SECONDS=120 (the mix on
# PostgreSQL).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_build_tools
need_debs faketime=faketime gcc=gcc /usr/include/postgresql/libpq-fe.h=libpq-dev

log=${1:-$(mktemp)}
out=$(mktemp)
trap 'scripts/etcd-cluster.sh stop; scripts/pg-cluster.sh stop; rm -f "$out" "$out.pg"' EXIT
# The election mode's minute is taken from the mix (120 s before it).
export DLOCK_NEMESIS_SECONDS=${DLOCK_NEMESIS_SECONDS:-60} DLOCK_NEMESIS_MANY_SECONDS=${DLOCK_NEMESIS_MANY_SECONDS:-60}
export DLOCK_NEMESIS_ELECTION_SECONDS=${DLOCK_NEMESIS_ELECTION_SECONDS:-60}
export DLOCK_NEMESIS_RUNS=${DLOCK_NEMESIS_RUNS:-10}
export DLOCK_NEMESIS_FLAP_SECONDS=${DLOCK_NEMESIS_FLAP_SECONDS:-60}
export DLOCK_NEMESIS_PG_SECONDS=${DLOCK_NEMESIS_PG_SECONDS:-120}
export DLOCK_NEMESIS_SEMAPHORE_SECONDS=${DLOCK_NEMESIS_SEMAPHORE_SECONDS:-60} DLOCK_NEMESIS_PG_SEMAPHORE_SECONDS=${DLOCK_NEMESIS_PG_SEMAPHORE_SECONDS:-60}
export DLOCK_NEMESIS_RWLOCK_SECONDS=${DLOCK_NEMESIS_RWLOCK_SECONDS:-60} DLOCK_NEMESIS_PG_RWLOCK_SECONDS=${DLOCK_NEMESIS_PG_RWLOCK_SECONDS:-60}
# libfaketime as Debian installs it, wherever the architecture puts it.
DLOCK_NEMESIS_FAKETIME_LIB=${DLOCK_NEMESIS_FAKETIME_LIB:-$(dpkg -L libfaketime | grep -m1 '/libfaketimeMT\.so\.1$')}
export DLOCK_NEMESIS_FAKETIME_LIB

printf '\n==> %s\n' "nemesis: the holders of every face (nemesis/holders/build-faces.sh)"
# One holder of each face in the mix, in this order: h1 Rust, h2 C, h3
# Python, h4 Node, h5 `dlock run` (a killed holder's replacement is of its
# face). The checker's own tests run in `cargo test --workspace`; the
# cluster tests' lint is scripts/test.sh's one clippy.
DLOCK_NEMESIS_HOLDER_CMDS=$(nemesis/holders/build-faces.sh)
export DLOCK_NEMESIS_HOLDER_CMDS
ws_test --no-run --quiet --test nemesis_cases --test nemesis_postgres
rc=0

# PostgreSQL, in the background: its own servers, its own output file.
pg_part() {
  printf '\n==> %s\n' "nemesis on PostgreSQL: start the primary + synchronous standby (scripts/pg-cluster.sh)"
  scripts/pg-cluster.sh start || return 1
  # shellcheck disable=SC1091
  source "${DLOCK_TEST_PG_DIR:-target/pg}/env"
  printf '\n==> %s\n' "nemesis on PostgreSQL: the mix (${DLOCK_NEMESIS_PG_SECONDS} s, Rust and C holders), the semaphore mode (${DLOCK_NEMESIS_PG_SEMAPHORE_SECONDS} s), the read/write mode (${DLOCK_NEMESIS_PG_RWLOCK_SECONDS} s) and a holder paused past its TTL"
  # Rust and C holders in turn (the C one with libpq, built by
  # build-faces.sh above).
  local prc=0
  DLOCK_NEMESIS_PG_HOLDER_CMDS=${DLOCK_NEMESIS_PG_HOLDER_CMDS:-rust;$PWD/target/nemesis/c-holder} \
    ws_test --test nemesis_postgres -- --nocapture || prc=1
  scripts/pg-cluster.sh stop
  return $prc
}
pg_part >"$out.pg" 2>&1 &
pg_pid=$!

printf '\n==> %s\n' "nemesis: start the test cluster"
scripts/etcd-cluster.sh start
# shellcheck disable=SC1091
source "${DLOCK_TEST_ETCD_DIR:-target/etcd}/env"

printf '\n==> %s\n' "nemesis: the mix (${DLOCK_NEMESIS_SECONDS} s + ${DLOCK_NEMESIS_MANY_SECONDS} s of 100 locks + ${DLOCK_NEMESIS_ELECTION_SECONDS} s of an election + ${DLOCK_NEMESIS_SEMAPHORE_SECONDS} s of a semaphore + ${DLOCK_NEMESIS_RWLOCK_SECONDS} s of a read/write lock) and the cases (${DLOCK_NEMESIS_RUNS} runs each)"
ws_test --test nemesis_cases -- --nocapture 2>&1 | tee "$out" || rc=1
cat "$out" >>"$log"
passed=$(awk '/^test result:/ { p += $4 } END { print p + 0 }' "$out")
failed=$(awk '/^test result:/ { f += $6 } END { print f + 0 }' "$out")
grep -q '^test result:' "$out" || { failed=$((failed + 1)); rc=1; }
scripts/etcd-cluster.sh stop

wait "$pg_pid" || rc=1
cat "$out.pg"
cat "$out.pg" >>"$log"
passed=$((passed + $(awk '/^test result:/ { p += $4 } END { print p + 0 }' "$out.pg")))
failed=$((failed + $(awk '/^test result:/ { f += $6 } END { print f + 0 }' "$out.pg")))
grep -q '^test result:' "$out.pg" || { failed=$((failed + 1)); rc=1; }
cat "$out.pg" >>"$out"

printf '\n==> %s\n' "nemesis: figures per case (ms, one shared clock)"
printf '%-16s %-5s %s\n' case runs figures
{ grep -o 'NEMESIS|.*' "$out" || true; } | sort | while IFS='|' read -r _ case runs figures; do
  printf '%-16s %-5s %s\n' "$case" "$runs" "$figures"
done
echo "nemesis: $passed passed, $failed failed"
exit "$rc"
