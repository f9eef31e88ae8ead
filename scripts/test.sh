#!/usr/bin/env bash
# Runs the tests: what .ci/run runs (the fast tier), or with --full the full
# proof (the fast tier's cases plus everything docs/testing.md lists as
# full tier: the fault cases' repetitions, valgrind over every C test, the
# sdist build, `cargo install`, the long nemesis modes, a short soak per
# face). Installs what it needs; safe to run on a fresh machine.
#
#   ./scripts/test.sh          the fast tier (about 20 minutes on 2 cores)
#   ./scripts/test.sh --full   the full proof (at most an hour)
#
# Each crate is compiled once per profile: one debug build of the whole
# workspace (--all-features: the build every `cargo test` below reuses, see
# ws_test in scripts/lib.sh), one check build (clippy), one release build
# (scripts/build-release.sh, zig: it serves the packages, the C and C++
# tests, the command and the nemesis holders).
#
# After the builds, three lanes run side by side:
#   timers  suites that mostly wait on timers, at normal priority: the
#           unit, property and scenario tests, etcd, PostgreSQL, the nemesis
#   work    the CPU-bound rest, niced: the release build and packing,
#           clippy, docs, C, C++, the alert rules
#   faces   once the packages exist, the faces whose suites wait on their
#           own clusters, at normal priority: Python, Node, the command;
#           then the packages installed as users do (niced)
# Each lane's servers are its own (ports and folders apart), so a fault
# case never shares a cluster with another lane's tests. A lane's output
# goes to target/test-logs/LANE.log and is printed when the lane ends.
#
# The run ends with a table of its steps and their seconds, then one line:
# `all: N passed, N failed` (every cargo test binary's counts, the C, C++,
# package, Python, Node and alert tallies, and any step that failed without
# a count).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

full=
case ${1:-} in
  --full) full=1 ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--full]" >&2; exit 2 ;;
esac
if [[ -n $full ]]; then
  export DLOCK_FULL=1
  export PROPTEST_CASES=${PROPTEST_CASES:-10000}
  export DLOCK_FAULT_RUNS=${DLOCK_FAULT_RUNS:-3}
else
  unset DLOCK_FULL
  # The property tests' cases: 2,000 here, 10,000 in the full tier.
  export PROPTEST_CASES=${PROPTEST_CASES:-2000}
  # Each fault case once; the full tier repeats them (DLOCK_FAULT_RUNS=3).
  export DLOCK_FAULT_RUNS=${DLOCK_FAULT_RUNS:-1}
  # The nemesis, shorter: every mode and case, fewer seconds and runs.
  export DLOCK_NEMESIS_SECONDS=${DLOCK_NEMESIS_SECONDS:-40} DLOCK_NEMESIS_MANY_SECONDS=${DLOCK_NEMESIS_MANY_SECONDS:-30}
  export DLOCK_NEMESIS_ELECTION_SECONDS=${DLOCK_NEMESIS_ELECTION_SECONDS:-30} DLOCK_NEMESIS_RUNS=${DLOCK_NEMESIS_RUNS:-3}
  export DLOCK_NEMESIS_FLAP_SECONDS=${DLOCK_NEMESIS_FLAP_SECONDS:-30} DLOCK_NEMESIS_PG_SECONDS=${DLOCK_NEMESIS_PG_SECONDS:-60}
  export DLOCK_NEMESIS_SEMAPHORE_SECONDS=${DLOCK_NEMESIS_SEMAPHORE_SECONDS:-25} DLOCK_NEMESIS_PG_SEMAPHORE_SECONDS=${DLOCK_NEMESIS_PG_SEMAPHORE_SECONDS:-25}
  export DLOCK_NEMESIS_RWLOCK_SECONDS=${DLOCK_NEMESIS_RWLOCK_SECONDS:-25} DLOCK_NEMESIS_PG_RWLOCK_SECONDS=${DLOCK_NEMESIS_PG_RWLOCK_SECONDS:-25}
fi

. scripts/lib.sh
need_build_tools
need_python
for c in rustfmt clippy; do
  if ! cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1; then
    printf '\n==> installing %s\n' "$c"
    rustup component add "$c"
  fi
done

logs=$root/target/test-logs
rm -rf "$logs"
mkdir -p "$logs"
table=$logs/steps # name|lane|seconds|ok or FAILED, one line per step
started=$SECONDS

# timed LANE NAME COMMAND...: runs one step, records its seconds and result.
timed() {
  local lane=$1 name=$2 t0=$SECONDS rc=0
  shift 2
  printf '\n==> [%s] %s\n' "$lane" "$name"
  # Progress on the run's own output (fd 3) while a lane's goes to its file.
  [[ $lane == main ]] || printf '==> %5d s  [%s] %s\n' $((SECONDS - started)) "$lane" "$name" >&3
  "$@" || rc=$?
  printf '%s|%s|%d|%s\n' "$name" "$lane" $((SECONDS - t0)) "$( ((rc == 0)) && echo ok || echo FAILED)" >>"$table"
  [[ $lane == main ]] || printf '==> %5d s  [%s] %s: %s in %d s\n' $((SECONDS - started)) "$lane" "$name" \
    "$( ((rc == 0)) && echo ok || echo FAILED)" $((SECONDS - t0)) >&3
  return $rc
}

# print_table: every step with its seconds (in the order they ended), the
# wall time, and the lanes' sums.
print_table() {
  printf '\n==> steps (seconds; the lanes ran side by side)\n'
  awk -F'|' -v wall=$((SECONDS - started)) '
    { printf "  %-6s %-62s %5d  %s\n", $2, $1, $3, $4; sum[$2] += $3 }
    END { printf "  wall time %d s (%d min %d s)", wall, wall / 60, wall % 60
          for (l in sum) printf "; %s %d s", l, sum[l]; printf "\n" }' "$table"
}

# counts: the passed and failed counts of the whole run. Every cargo test
# binary's `test result:` line, from the logs (each face script appends its
# cargo output there once); and the tallies of the faces whose tests are
# not cargo's (C, C++, the packages, Python, Node, the alert rules: their
# closing lines, from the lanes' output), the last line of each.
counts() {
  awk '/^test result:/ { p += $4; f += $6 } END { print p + 0, f + 0 }' "$main_log" "$logs"/{timers,work,faces}.log 2>/dev/null |
    { read -r p f
      awk -v p="$p" -v f="$f" '
        match($0, /^(c|c-etcd|cpp|dist|python|node|alerts): [0-9]+ passed, [0-9]+ failed/) { split($0, w, /[ :,]+/); pp[w[1]] = w[2]; ff[w[1]] = w[4] }
        END { for (k in pp) { p += pp[k]; f += ff[k] }; print p, f }' "$logs"/{timers,work,faces}.out 2>/dev/null; }
}

# --- the builds ---------------------------------------------------------------
main_log=$logs/main.log
: >"$main_log"
build_failed=0
timed main "cargo fmt --check" cargo fmt --all -- --check 2>&1 | tee -a "$main_log" || build_failed=1

# The workspace's debug build, once, with every feature and every test
# target (also those marked test = false, which the scripts below run by
# name): every later `cargo test` finds it fresh.
extra_tests=()
while read -r t; do extra_tests+=(--test "$t"); done < <(
  cargo metadata --format-version 1 --no-deps --locked | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "test" in t["kind"] and not t.get("test", True):
            print(t["name"])' | sort -u)
debug_build() {
  cargo build --workspace --all-features --locked &&
    ws_test --no-run &&
    ws_test --no-run "${extra_tests[@]}"
}
timed main "debug build (workspace, all features, every test target)" debug_build 2>&1 | tee -a "$main_log" ||
  build_failed=1
if ((build_failed)); then
  print_table
  echo "all: 0 passed, 1 failed"
  exit 1
fi

# --- two lanes ------------------------------------------------------------------
sync=$logs/sync
mkdir -p "$sync"
export DLOCK_RELEASE_READY=$sync/release
# wait_for FILE: the timers and faces lanes wait here for the work lane's
# packages (the nemesis holders and the faces install them); the release
# build's own wait is wait_release (scripts/lib.sh), which the suites call.
wait_for() { # FILE
  until [[ -e $sync/$1 ]]; do
    [[ -e $sync/work-failed-early ]] && { echo "the work lane's $1 failed: nothing to test"; return 1; }
    sleep 1
  done
}

timers_lane() {
  local log=$logs/timers.log rc=0
  timed timers "cargo test --workspace (unit, property: PROPTEST_CASES=$PROPTEST_CASES, scenarios, drivers, examples)" \
    ws_test 2>&1 | tee -a "$log" || rc=1
  # Servers of this lane: the scripts' default ports and folders. etcd
  # first: its Rust suites need no release build, and its C part waits for
  # the work lane's (wait_release in scripts/lib.sh).
  timed timers "etcd (scripts/test-etcd.sh: Rust, C, examples, DLOCK_FAULT_RUNS=$DLOCK_FAULT_RUNS)" \
    ./scripts/test-etcd.sh "$log" || rc=1
  timed timers "PostgreSQL (scripts/test-postgres.sh, DLOCK_FAULT_RUNS=$DLOCK_FAULT_RUNS)" \
    ./scripts/test-postgres.sh "$log" || rc=1
  wait_for dist || return 1
  # The nemesis holders install the packages (nemesis/holders/build-faces.sh).
  export DLOCK_DIST=$root/dist
  timed timers "nemesis (scripts/test-nemesis.sh: etcd and PostgreSQL side by side, every face)" \
    ./scripts/test-nemesis.sh "$log" || rc=1
  if [[ -n $full ]]; then
    timed timers "soak, short, every face (scripts/soak.sh)" \
      env DLOCK_SOAK_CYCLES=20000 DLOCK_SOAK_PERMITS=200000 DLOCK_SOAK_ETCD_CYCLES=2000 DLOCK_SOAK_ETCD_PERMITS=20000 \
      ./scripts/soak.sh || rc=1
  fi
  return $rc
}

work_lane() {
  local log=$logs/work.log rc=0
  # Niced: the other lanes' suites get the CPU at once when they wake.
  renice -n 10 -p "$BASHPID" >/dev/null
  # The packages (issue 21): one release build (scripts/build-release.sh,
  # which fails on a native file above the glibc floor or a missing
  # SONAME), packed by scripts/dist.sh; the faces below install them.
  if ! timed work "the release build (scripts/build-release.sh)" scripts/build-release.sh; then
    touch "$sync/work-failed-early" "$sync/release.failed"
    return 1
  fi
  touch "$sync/release"
  if ! timed work "scripts/dist.sh (every package, from that build)" scripts/dist.sh; then
    touch "$sync/work-failed-early"
    return 1
  fi
  touch "$sync/dist"
  export DLOCK_DIST=$root/dist
  # One check build: every target, every feature, and the test = false
  # targets the scripts run by name. In a target folder of its own: cargo
  # locks a build folder while it compiles, and the timers lane's `cargo
  # test` runs must not wait for it. cargo doc shares its check build.
  local check_dir
  check_dir=$(cargo_target_dir)/check
  timed work "cargo clippy -D warnings (one pass: workspace, all features, every test target)" \
    env CARGO_TARGET_DIR="$check_dir" cargo clippy --workspace --all-features --all-targets "${extra_tests[@]}" --locked -- -D warnings || rc=1
  timed work "cargo doc (warnings are errors)" \
    env CARGO_TARGET_DIR="$check_dir" RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --locked --quiet || rc=1
  timed work "PostgreSQL servers from a checkout under a mode-700 folder (scripts/pg-cluster.sh)" pg_in_private_folder || rc=1
  timed work "C (scripts/test-c.sh)" ./scripts/test-c.sh "$log" || rc=1
  local face
  for face in cpp alerts; do
    [[ -e scripts/test-$face.sh ]] || continue
    timed work "$face (scripts/test-$face.sh)" "./scripts/test-$face.sh" "$log" || rc=1
  done
  return $rc
}

# The faces whose suites mostly wait on their own clusters' timers: the
# installed packages (DLOCK_DIST) of Python and Node, and the command.
faces_lane() {
  local log=$logs/faces.log rc=0 face
  # Servers of this lane: ports and folders apart from the timers lane's
  # (which uses the scripts' defaults, or DLOCK_TEST_PORT_BASE and
  # DLOCK_TEST_PG_PORT_BASE when set: this lane's are 4,000 above those).
  export DLOCK_TEST_PORT_BASE=$((${DLOCK_TEST_PORT_BASE:-23790} + 4000)) DLOCK_TEST_ETCD_DIR=target/etcd-faces
  export DLOCK_TEST_PG_PORT_BASE=$((${DLOCK_TEST_PG_PORT_BASE:-25430} + 3000)) DLOCK_TEST_PG_DIR=target/pg-faces
  wait_for dist || return 1
  export DLOCK_DIST=$root/dist
  for face in python node cli; do
    timed faces "$face (scripts/test-$face.sh)" "./scripts/test-$face.sh" "$log" || rc=1
  done
  # The packages installed as users do: CPU-bound (compiles of the C and
  # C++ workers), so niced like the work lane.
  timed faces "packages (scripts/test-dist.sh)" nice -n 10 ./scripts/test-dist.sh "$log" || rc=1
  return $rc
}

# pg_in_private_folder: the PostgreSQL test servers start from a checkout
# whose parent only root may enter (a clone under root's home): their
# files go where the postgres user can reach them.
pg_in_private_folder() {
  local d
  d=$(mktemp -d) # mode 700
  mkdir -p "$d/co/target"
  cp -r scripts "$d/co/"
  local rc=0
  export DLOCK_TEST_PG_PORT_BASE=$((${DLOCK_TEST_PG_PORT_BASE:-25430} + 3100)) DLOCK_TEST_PG_DIR=
  "$d/co/scripts/pg-cluster.sh" start && "$d/co/scripts/pg-cluster.sh" status || rc=1
  "$d/co/scripts/pg-cluster.sh" stop || rc=1
  rm -rf "$d"
  return $rc
}

exec 3>&1
(timers_lane >"$logs/timers.out" 2>&1) &
timers_pid=$!
(work_lane >"$logs/work.out" 2>&1) &
work_pid=$!
(faces_lane >"$logs/faces.out" 2>&1) &
faces_pid=$!

rc=0
wait "$timers_pid" || rc=1
wait "$work_pid" || rc=1
wait "$faces_pid" || rc=1
for lane in timers work faces; do
  printf '\n==================== the %s lane ====================\n' "$lane"
  cat "$logs/$lane.out"
done

print_table
read -r passed failed < <(counts)
# A step that failed without a count (a build, a script that stopped early)
# still fails the line.
steps_failed=$(grep -c '|FAILED$' "$table" || true)
((rc == 0 && steps_failed == 0)) || ((failed > 0)) || failed=$steps_failed
((failed > 0 || rc == 0)) || failed=1
echo "all: $passed passed, $failed failed"
((rc == 0 && failed == 0))
