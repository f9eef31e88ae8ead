#!/usr/bin/env bash
# A nemesis run as long as asked (docs/nemesis.md): starts the etcd test
# cluster (unless DLOCK_TEST_ETCD says one runs), runs `nemesis run`
# for N minutes with H holders, writes the history to DIR (default
# target/nemesis/run-<time>) and prints the checker's table; exits non-zero
# on any violation.
#
# usage: scripts/nemesis.sh [--minutes N] [--holders H] [--seed S] [--dir DIR]
#                           [--faults a,b,..] [--holder-cmds "rust;PROG ARGS"]
#                           [--all-faces]   (one holder command per face:
#                           Rust, C, Python, Node, `dlock run`; at least 5
#                           holders; nemesis/holders/build-faces.sh)
#                           [--locks 100]   (the second mode: 100 locks on one
#                           session of each holder; Rust holders only)
#                           [--election 1]  (the election mode: candidates of
#                           one election and an observer; every face's holder
#                           campaigns, the `dlock run` one as `dlock elect`:
#                           with --all-faces, one candidate of each face)
#                           [--semaphore N] (the semaphore mode: holders of
#                           one semaphore of N slots, each slot checked as a
#                           lock, and at most N holders with valid permits
#                           at once; give --holders N+2; every face's
#                           holder takes it)
#                           [--rwlock 1]    (the read/write mode: holders of
#                           one read/write lock, on the gate's two-key
#                           register (on PostgreSQL: app.register under
#                           dlock.guard_write / guard_read), odd ones
#                           starting as writers, even ones as readers, each
#                           switching mode at every handover; every face's
#                           holder takes it, Rust and C on PostgreSQL)
#                           [--backend postgres] (the PostgreSQL mode: the
#                           primary + synchronous standby of
#                           scripts/pg-cluster.sh, started here unless
#                           DLOCK_TEST_PG_URL names one (its env file
#                           sourced: DLOCK_TEST_PG_DIR for the primary's
#                           faults), or [--pg-url URL]; Rust and C holders
#                           in turn unless --holder-cmds says otherwise)
#                           (N default 3, H default 4; holders of the listed
#                           commands in turn, the Rust holder by default;
#                           target/nemesis/c-holder is the C one)
# Judge a history again: <cargo target dir>/release/nemesis check DIR
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_build_tools

minutes=3
args=()
dir=
all_faces=
backend=etcd
while (($#)); do
  case $1 in
    --all-faces) all_faces=1; shift ;;
    --minutes) minutes=${2:?--minutes needs a number}; shift 2 ;;
    --dir) dir=${2:?--dir needs a path}; shift 2 ;;
    --backend) backend=${2:?--backend needs etcd or postgres}; shift 2 ;;
    --holders | --seed | --faults | --holder-cmds | --locks | --election | --semaphore | --rwlock | --pg-url) args+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
    *) echo "usage: scripts/nemesis.sh [--minutes N] [--holders H] [--seed S] [--dir DIR] [--faults a,b,..]" >&2; exit 2 ;;
  esac
done
[[ $minutes =~ ^[0-9]+$ ]] && ((minutes > 0)) || { echo "--minutes must be a whole number > 0, got '$minutes'" >&2; exit 2; }
[[ $backend == etcd || $backend == postgres ]] || { echo "--backend is etcd or postgres, got '$backend'" >&2; exit 2; }
dir=${dir:-target/nemesis/run-$(date -u +%Y%m%dT%H%M%S)}

cargo build -p dlock-nemesis --release --locked --bins --quiet
nemesis=$(cargo_target_dir)/release/nemesis
# The C holder, for --holder-cmds "rust;target/nemesis/c-holder" (libpq
# for its guarded transactions on PostgreSQL), on the one release build's
# libdlock.so (scripts/build-release.sh).
need_debs gcc=gcc /usr/include/postgresql/libpq-fe.h=libpq-dev
scripts/build-release.sh
. scripts/c-flags.sh
mkdir -p target/nemesis
gcc "${STRICT[@]}" -O2 -Iinclude -I/usr/include/postgresql examples/nemesis/holder.c -o target/nemesis/c-holder "${LINK[@]}" -lpq
if [[ -n $all_faces ]]; then
  args+=(--holder-cmds "$(nemesis/holders/build-faces.sh)")
  [[ " ${args[*]} " == *" --holders "* ]] || args+=(--holders 5)
fi
if [[ $backend == postgres ]]; then
  [[ " ${args[*]} " == *" --holder-cmds "* ]] || args+=(--holder-cmds "rust;target/nemesis/c-holder")
  args+=(--backend postgres)
  if [[ -z ${DLOCK_TEST_PG_URL:-} && " ${args[*]} " != *" --pg-url "* ]]; then
    trap 'scripts/pg-cluster.sh stop' EXIT
    scripts/pg-cluster.sh start
    pg_dir=${DLOCK_TEST_PG_DIR:-target/pg}
    # shellcheck disable=SC1091
    source "$pg_dir/env"
  fi
elif [[ -z ${DLOCK_TEST_ETCD:-} ]]; then
  trap 'scripts/etcd-cluster.sh stop' EXIT
  scripts/etcd-cluster.sh start
  # shellcheck disable=SC1091
  source "${DLOCK_TEST_ETCD_DIR:-target/etcd}/env"
fi
echo "nemesis: $minutes min on $backend, history in $dir"
"$nemesis" run --dir "$dir" --seconds $((minutes * 60)) "${args[@]}"
