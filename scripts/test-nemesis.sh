#!/usr/bin/env bash
# The nemesis (issue 13; docs/nemesis.md): starts the etcd test cluster
# (scripts/etcd-cluster.sh; DLOCK_TEST_PORT_BASE is honoured), runs the
# checker's own tests and every nemesis case against the cluster
# (nemesis/tests/nemesis_cases.rs: the random fault mix with one holder of
# each face: Rust, C (examples/nemesis/holder.c), Python, Node and `dlock
# run` (nemesis/holders/), quorum loss,
# paused past the TTL, the wall-clock step under libfaketime, CPU
# starvation, flapping; the election mode: Rust and `dlock elect`
# candidates), stops the cluster on any exit, prints the figures
# of each case and one closing line `nemesis: N passed, M failed`.
#
# usage: scripts/test-nemesis.sh [LOGFILE]   (cargo test output is appended)
# CI lengths (override in the environment): DLOCK_NEMESIS_SECONDS=60 (the
# mix, one lock), DLOCK_NEMESIS_MANY_SECONDS=60 (the mix, 100 locks per
# holder), DLOCK_NEMESIS_ELECTION_SECONDS=60 (the mix, one election),
# DLOCK_NEMESIS_RUNS=10 (runs of each case),
# DLOCK_NEMESIS_FLAP_SECONDS=60.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_build_tools
need_debs faketime=faketime gcc=gcc

log=${1:-$(mktemp)}
out=$(mktemp)
trap 'scripts/etcd-cluster.sh stop; rm -f "$out"' EXIT
# The election mode's minute is taken from the mix (120 s before it).
export DLOCK_NEMESIS_SECONDS=${DLOCK_NEMESIS_SECONDS:-60} DLOCK_NEMESIS_MANY_SECONDS=${DLOCK_NEMESIS_MANY_SECONDS:-60}
export DLOCK_NEMESIS_ELECTION_SECONDS=${DLOCK_NEMESIS_ELECTION_SECONDS:-60}
export DLOCK_NEMESIS_RUNS=${DLOCK_NEMESIS_RUNS:-10}
export DLOCK_NEMESIS_FLAP_SECONDS=${DLOCK_NEMESIS_FLAP_SECONDS:-60}
# libfaketime as Debian installs it, wherever the architecture puts it.
DLOCK_NEMESIS_FAKETIME_LIB=${DLOCK_NEMESIS_FAKETIME_LIB:-$(dpkg -L libfaketime | grep -m1 '/libfaketimeMT\.so\.1$')}
export DLOCK_NEMESIS_FAKETIME_LIB

printf '\n==> %s\n' "nemesis: build, clippy of the cluster tests (a test = false target)"
cargo build -p dlock-nemesis --locked --bins --tests --quiet
cargo clippy -p dlock-nemesis --test nemesis_cases --locked --quiet -- -D warnings

printf '\n==> %s\n' "nemesis: the holders of every face (nemesis/holders/build-faces.sh)"
# One holder of each face in the mix, in this order: h1 Rust, h2 C, h3
# Python, h4 Node, h5 `dlock run` (a killed holder's replacement is of its
# face).
DLOCK_NEMESIS_HOLDER_CMDS=$(nemesis/holders/build-faces.sh)
export DLOCK_NEMESIS_HOLDER_CMDS

printf '\n==> %s\n' "nemesis: the checker's own tests"
# Also part of `cargo test --workspace`: counted here, not appended to the
# log a second time.
rc=0
cargo test -p dlock-nemesis --locked --lib 2>&1 | tee "$out" || rc=1
passed=$(awk '/^test result:/ { p += $4 } END { print p + 0 }' "$out")
failed=$(awk '/^test result:/ { f += $6 } END { print f + 0 }' "$out")

printf '\n==> %s\n' "nemesis: start the test cluster"
scripts/etcd-cluster.sh start
# shellcheck disable=SC1091
source target/etcd/env

printf '\n==> %s\n' "nemesis: the mix (${DLOCK_NEMESIS_SECONDS} s + ${DLOCK_NEMESIS_MANY_SECONDS} s of 100 locks + ${DLOCK_NEMESIS_ELECTION_SECONDS} s of an election) and the cases (${DLOCK_NEMESIS_RUNS} runs each)"
cargo test -p dlock-nemesis --locked --test nemesis_cases -- --nocapture 2>&1 | tee "$out" || rc=1
cat "$out" >>"$log"
passed=$((passed + $(awk '/^test result:/ { p += $4 } END { print p + 0 }' "$out")))
failed=$((failed + $(awk '/^test result:/ { f += $6 } END { print f + 0 }' "$out")))
grep -q '^test result:' "$out" || { failed=$((failed + 1)); rc=1; }

printf '\n==> %s\n' "nemesis: figures per case (ms, one shared clock)"
printf '%-16s %-5s %s\n' case runs figures
{ grep -o 'NEMESIS|.*' "$out" || true; } | sort | while IFS='|' read -r _ case runs figures; do
  printf '%-16s %-5s %s\n' "$case" "$runs" "$figures"
done
echo "nemesis: $passed passed, $failed failed"
exit "$rc"
