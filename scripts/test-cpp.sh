#!/usr/bin/env bash
# The C++ face (include/dlock.hpp, issue 21): the API test compiled with
# -std=c++17 and -std=c++20, -Wall -Wextra -Werror -pedantic, run under
# -fsanitize=address,undefined; the two-translation-unit ODR test (LTO,
# -Wodr); examples/cpp/worker.cpp built strictly and its story checked by
# core/tests/c_worker.rs (the C worker's story, told the same way); one
# election on the real etcd (ffi-c/tests/cpp/election_etcd.cpp); semaphores
# (ffi-c/tests/cpp/semaphore.cpp) and read/write locks
# (ffi-c/tests/cpp/rwlock.cpp) on the embedded service. Links
# the release libdlock.so as scripts/test-c.sh does (flags: c-flags.sh).
#
# etcd: the cluster whose env is exported (DLOCK_TEST_ETCD, from
# scripts/etcd-cluster.sh), else one started here and stopped on exit, on
# ports and a folder of its own (DLOCK_TEST_PORT_BASE + 2000,
# target/etcd-cpp), apart from scripts/test.sh's other lanes' clusters.
# Prints `cpp: N passed, N failed`; fails on any failure.
# Usage: scripts/test-cpp.sh [LOGFILE]   (every step's output is appended to it)
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/checks.sh
label=cpp
etcd_here=
with_scratch '[[ -z $etcd_here ]] || scripts/etcd-cluster.sh stop >/dev/null 2>&1'
. scripts/c-flags.sh
. scripts/lib.sh
need_debs g++=g++ >>"$log" 2>&1 || { echo "cpp: cannot install g++" >&2; exit 1; }

step "the release build (scripts/build-release.sh)" scripts/build-release.sh
[[ -f $C_LIB_DIR/libdlock.so ]] || summary

odr() {
  local out=$1
  shift
  g++ "$@" -O2 -flto -Wodr -Iinclude ffi-c/tests/cpp/odr_a.cpp ffi-c/tests/cpp/odr_b.cpp -o "$out" "${LINK[@]}" &&
    "$out"
}

# sanitized NAME WHAT [ARG...]: ffi-c/tests/cpp/NAME.cpp built with the
# loop's `flags` and the sanitizers, then run (with the ARGs) under them,
# the run's step named NAME.cpp (std)WHAT.
sanitized() {
  local name=$1 what=$2 bin=$work/$1-$std
  shift 2
  step "$name.cpp: g++ ${flags[*]} -fsanitize=address,undefined" \
    g++ "${flags[@]}" -O1 -g "${SAN[@]}" -Iinclude "ffi-c/tests/cpp/$name.cpp" -o "$bin" "${LINK[@]}"
  san_env_on
  [[ -x $bin ]] && step "$name.cpp ($std)$what" "$bin" "$@"
  san_env_off
}

for std in c++17 c++20; do
  flags=(-std=$std -Wall -Wextra -Werror -pedantic)
  sanitized api " under ASan/UBSan"
  # scenarios/vectors/bad_input.json: every case C++ can express gets the
  # vector's code (the core's), the others skipped by the file.
  sanitized bad_input ": the shared bad inputs under ASan/UBSan" "$root/scenarios/vectors/bad_input.json"
  # Semaphores: N + 1 contenders, N hold on distinct slots, a release
  # wakes the waiter onto that slot, the limit mismatch, slot().
  sanitized semaphore ": N of N + 1 hold, one slot each, a release wakes one waiter"
  # Read/write locks: readers share, a writer excludes, downgrade keeps
  # the token, the gate's two watermarks.
  sanitized rwlock ": readers share, a writer excludes, downgrade keeps the token"
  # The README's C++ blocks as written: the loop (its text checked against
  # this file by core/tests/readme.rs) stops at a fence; the election (its
  # text checked by readme.cpp itself) leads, then resigns.
  sanitized readme ": the README's C++ loop stops at a fence, its election leads and resigns"
  # Two units in one program: a definition that is not inline fails the
  # link, a category that is not one object fails the run.
  step "odr: odr_a.cpp + odr_b.cpp ($std, -flto -Wodr)" odr "$work/odr-$std" "${flags[@]}"
done

step "examples/cpp/worker.cpp: g++ -std=c++17 strict, shared and static" bash -c '
  g++ -std=c++17 -Wall -Wextra -Werror -pedantic -O2 -Iinclude examples/cpp/worker.cpp -o "$1/worker" \
    -L"$2" -ldlock -lpthread "-Wl,-rpath,$2" &&
  g++ -std=c++17 -Wall -Wextra -Werror -pedantic -O2 -Iinclude examples/cpp/worker.cpp -o "$1/worker-static" \
    "$2/libdlock.a" -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc' _ "$work" "$C_LIB_DIR"

# The C worker's story, checked on the C++ worker's typed output: commits,
# the drain, the fence, a clean stop with 0 in flight, no commit after it.
worker_story() { DLOCK_C_WORKER=$1 ws_test --test c_worker -- --nocapture; }
[[ -x $work/worker ]] && step "examples/cpp/worker: stops cleanly at the fence" worker_story "$work/worker"
[[ -x $work/worker-static ]] && step "examples/cpp/worker-static: the same, linked with libdlock.a" worker_story "$work/worker-static"

# One election on the real etcd (the fast tier's one real case; the
# embedded service's elections are api.cpp's): two candidates, the
# observer sees the leader and the hand-over on resign.
if [[ -z ${DLOCK_TEST_ETCD:-} ]]; then
  export DLOCK_TEST_PORT_BASE=$((${DLOCK_TEST_PORT_BASE:-23790} + 2000)) DLOCK_TEST_ETCD_DIR=target/etcd-cpp
  etcd_here=1
  step "etcd test cluster (scripts/etcd-cluster.sh start, port base $DLOCK_TEST_PORT_BASE)" scripts/etcd-cluster.sh start
  # shellcheck disable=SC1091
  [[ -f $DLOCK_TEST_ETCD_DIR/env ]] && source "$DLOCK_TEST_ETCD_DIR/env"
fi
step "election_etcd.cpp: g++ -std=c++17 -Wall -Wextra -Werror -pedantic -fsanitize=address,undefined" \
  g++ -std=c++17 -Wall -Wextra -Werror -pedantic -O1 -g "${SAN[@]}" -Iinclude ffi-c/tests/cpp/election_etcd.cpp \
  -o "$work/election-etcd" "${LINK[@]}"
san_env_on
[[ -x $work/election-etcd && -n ${DLOCK_TEST_ETCD:-} ]] &&
  step "election_etcd.cpp on etcd under ASan/UBSan: one leads, resign hands over, the observer sees both" "$work/election-etcd"
san_env_off

summary
