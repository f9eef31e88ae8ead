#!/usr/bin/env bash
# Runs the Rust examples against the etcd test cluster and checks their
# stories: the quickstart (A behind a relay that is cut: drain, then fence,
# then B acquires with a higher token) and guarded_write (the stale write is
# refused by etcd). Needs the env of scripts/etcd-cluster.sh (sourced or in
# target/etcd/env). Exits non-zero on a failed check.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z ${DLOCK_TEST_MEMBERS:-} && -f target/etcd/env ]]; then
  # shellcheck disable=SC1091
  source target/etcd/env
fi
[[ -n ${DLOCK_TEST_MEMBERS:-} ]] || { echo "etcd-examples: no cluster (run scripts/etcd-cluster.sh start)" >&2; exit 1; }
export DLOCK_ENDPOINTS=$DLOCK_TEST_MEMBERS

fail() { echo "etcd-examples: $*" >&2; exit 1; }
line() { grep -n -m1 -- "$1" <<<"$2" | cut -d: -f1; }

out=$(cargo run --quiet --locked --example quickstart)
echo "$out"
grep -q -- '-- backend: etcd' <<<"$out" || fail "quickstart did not run on etcd"
drain=$(line 'A  Holding -> Draining' "$out")
fence=$(line 'A  FENCED token' "$out")
b=$(line 'B  holds the lock, token' "$out")
[[ -n $drain && -n $fence && -n $b ]] && ((drain < fence && fence < b)) ||
  fail "quickstart: expected drain, then fence, then B acquiring"
ta=$(grep -m1 -o 'A  FENCED token [0-9]*' <<<"$out" | grep -o '[0-9]*$')
tb=$(grep -m1 -o 'B  holds the lock, token [0-9]*' <<<"$out" | grep -o '[0-9]*$')
((tb > ta)) || fail "quickstart: B's token $tb is not above A's $ta"
echo "etcd-examples: quickstart ok (A fenced token $ta before B acquired $tb)"

out=$(cargo run --quiet --locked --example guarded_write)
echo "$out"
grep -q '^backend: etcd' <<<"$out" || fail "guarded_write did not run on etcd"
grep -q 'A: the service refused the write: fenced token' <<<"$out" ||
  fail "guarded_write: the stale write was not refused"
echo "etcd-examples: guarded_write ok"
