#!/bin/sh
# A command to run under dlock: puts KEY=VALUE in etcd only while this run
# still holds its lock. One etcd transaction compares the lock key's create
# revision (ETCD_LOCK_KEY, ETCD_LOCK_REV: set by `dlock run`, as by
# `etcdctl lock`) with the token, so a run that was fenced, or a token
# copied from an old run, writes nothing: etcd decides, not the script.
#
# usage: dlock run NAME -- examples/cli/guarded-put.sh KEY VALUE
#        (KEY and VALUE without spaces; etcd from DLOCK_ENDPOINTS)
# Prints etcdctl's answer; exits 0 if the put committed, 1 if refused.
set -eu
[ $# -eq 2 ] || { echo "usage: dlock run NAME -- $0 KEY VALUE" >&2; exit 2; }
: "${ETCD_LOCK_KEY:?not set: run under dlock run}" "${ETCD_LOCK_REV:?}" "${DLOCK_ENDPOINTS:?}"
out=$(printf 'create("%s") = "%s"\n\nput %s %s\n\n\n' "$ETCD_LOCK_KEY" "$ETCD_LOCK_REV" "$1" "$2" |
  ETCDCTL_API=3 etcdctl --endpoints "$DLOCK_ENDPOINTS" txn)
echo "$out"
[ "$(echo "$out" | head -n 1)" = SUCCESS ]
