#!/usr/bin/env bash
# The C face against the etcd test cluster: ffi-c/tests/c/etcd.c (plaintext
# members, the TLS member with mTLS + password, lk_client_from_env) once
# under -fsanitize=address,undefined and once under valgrind, its guarded
# writes read back with etcdctl, and examples/c/worker on etcd fenced by an
# operator's `etcdctl del` of its lock key.
#
# Expects the env of scripts/etcd-cluster.sh exported (source
# target/etcd/env); scripts/test-etcd.sh runs it that way. Without it
# (DLOCK_TEST_ETCD unset: no cluster) it fails.
# Prints `c-etcd: N passed, N failed`; fails on any failure.
# Usage: scripts/test-c-etcd.sh [LOGFILE]   (every step's output is appended)
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/checks.sh
label=c-etcd

if [[ -z ${DLOCK_TEST_ETCD:-} ]]; then
  echo "c-etcd: no etcd test cluster (DLOCK_TEST_ETCD unset: run scripts/etcd-cluster.sh start and source target/etcd/env)" | tee -a "$log" >&2
  exit 1
fi
for v in DLOCK_TEST_MEMBERS DLOCK_TEST_TLS_ENDPOINT DLOCK_TEST_CA DLOCK_TEST_CERT DLOCK_TEST_KEY DLOCK_TEST_USER DLOCK_TEST_PASSWORD; do
  [[ -n ${!v:-} ]] || { echo "c-etcd: $v is not set (source target/etcd/env)" >&2; exit 1; }
done

with_scratch
. scripts/c-flags.sh

. scripts/lib.sh
need_debs gcc=gcc valgrind=valgrind etcdctl=etcd-client >>"$log" 2>&1 ||
  { echo "c-etcd: cannot install its tools" >&2; exit 1; }

ctl() { ETCDCTL_API=3 etcdctl --dial-timeout 2s --command-timeout 5s --endpoints "$DLOCK_TEST_MEMBERS" "$@"; }
ctl_tls() {
  ETCDCTL_API=3 etcdctl --dial-timeout 2s --command-timeout 5s --endpoints "$DLOCK_TEST_TLS_ENDPOINT" \
    --cacert "$DLOCK_TEST_CA" --cert "$DLOCK_TEST_CERT" --key "$DLOCK_TEST_KEY" \
    --user "$DLOCK_TEST_USER:$DLOCK_TEST_PASSWORD" "$@"
}

step "the release build (scripts/build-release.sh)" scripts/build-release.sh
[[ -f $C_LIB_DIR/libdlock.so ]] || summary

compile() {
  gcc "${STRICT[@]}" -O1 -g "${SAN[@]}" -Iinclude ffi-c/tests/c/etcd.c -o "$work/etcd-asan" "${LINK[@]}" &&
    gcc "${STRICT[@]}" -O1 -g -Iinclude ffi-c/tests/c/etcd.c -o "$work/etcd" "${LINK[@]}" &&
    gcc "${STRICT[@]}" -O2 -Iinclude examples/c/worker.c -o "$work/worker" "${LINK[@]}" &&
    gcc "${STRICT[@]}" -O2 -Iinclude ffi-c/tests/c/exit_holding.c -o "$work/exit_holding" "${LINK[@]}" &&
    echo "compiled etcd.c (sanitized and plain), examples/c/worker.c and exit_holding.c"
}
step "compile: gcc ${STRICT[*]}" compile

# run_etcd_test BIN...: runs the C etcd test, then reads each value it says
# it wrote back from etcd with etcdctl.
run_etcd_test() {
  local out line which key value got
  out=$("$@") || { echo "$out"; return 1; }
  echo "$out"
  local n=0
  while read -r line; do
    read -r which key value <<<"${line#etcd: written }"
    if [[ $which = tls ]]; then
      got=$(ctl_tls get "$key" --print-value-only) || return 1
    else
      got=$(ctl get "$key" --print-value-only) || return 1
    fi
    [[ $got = "$value" ]] || { echo "etcdctl get $key ($which): '$got', expected '$value'"; return 1; }
    echo "etcdctl get $key ($which): '$got' (as written)"
    n=$((n + 1))
  done < <(grep '^etcd: written ' <<<"$out")
  ((n == 2)) || { echo "expected 2 written keys, saw $n"; return 1; }
}

san_env_on
[[ -x $work/etcd-asan ]] && step "etcd.c under -fsanitize=address,undefined" run_etcd_test "$work/etcd-asan"
san_env_off
# ffi-c/tests/c/tls.supp: two false positives inside TLS record encryption
# (ring's AES-GCM assembly), nothing else.
# Under valgrind in the full tier only (DLOCK_FULL=1): the sanitized run
# above is the fast tier's case (docs/testing.md).
[[ -x $work/etcd && -n ${DLOCK_FULL:-} ]] && step "etcd.c under valgrind" run_etcd_test \
  "${VALGRIND[@]}" --suppressions=ffi-c/tests/c/tls.supp "$work/etcd"

# The worker on etcd, checked on its typed output by
# core/tests/c_worker_etcd.rs (a test = false target), which starts it and
# deletes its lock key with etcdctl as an operator might: units committed
# with guarded puts; it fences at once (lock_lost), stops cleanly, and etcd
# keeps the last unit committed before the fence and refuses the old token.
worker_story() {
  DLOCK_C_WORKER=$work/worker ws_test --test c_worker_etcd -- --nocapture
}
[[ -x $work/worker ]] && step "examples/c/worker on etcd: guarded commits, fenced by etcdctl del, clean stop" worker_story

# Exit while holding (ffi-c/tests/exit_etcd.rs, a test = false target): the
# C child returns from main / calls exit while holding, the Rust child calls
# dlock::shutdown; a contender must acquire within one keepalive timeout of
# the exit (a SIGKILLed child, the baseline, waits out the lease). Prints
# `EXIT|<face>|<ms>` lines.
exit_story() {
  DLOCK_C_EXIT=$work/exit_holding ws_test --test exit_etcd -- --nocapture --test-threads=1
}
[[ -x $work/exit_holding ]] && step "exit while holding: C (return, exit) and Rust release at once; SIGKILL waits out the lease" exit_story

summary
