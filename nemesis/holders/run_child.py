"""The command under `dlock run` in the nemesis (run_holder.py starts it):
knows nothing of dlock. It reads the lock's token from its environment
(DLOCK_TOKEN; ETCD_LOCK_KEY and ETCD_LOCK_REV, as `etcdctl lock` sets them)
and loops as fast as it can: a guarded put of KEY = ID:SEQ:TOKEN to etcd,
then one line "ID TOKEN SEQ" to the gate, recording each write to FILE.

The guarded put is the transaction of examples/cli/guarded-put.sh (commit
only while ETCD_LOCK_KEY still has ETCD_LOCK_REV as its create revision:
etcd decides, not the script), sent to etcd's JSON gateway (`POST
/v3/kv/txn`) over one kept-alive HTTP connection rather than an `etcdctl`
process per write, through the same endpoints (the fault proxies) as
dlock. No lease is needed: the compare on the lock key fails once the key
is gone (lease expired or revoked, key deleted) or belongs to a new holder.

SEQ is TOKEN * 1,000,000 + n, unique across restarts (a new token each).

--rwlock r|w (run_holder.py's, under `dlock run --read` or a plain `dlock
run`): the unit is instead one read or write of the gate's two-key
register, "ID TOKEN SEQ r|w", recorded as a "write" of res "register"
with its "mode"; no etcd write. The mode sent is the one dlock gives
(DLOCK_MODE=read: "r", none: "w"); one that disagrees with --rwlock ends
the child (exit 2, a line on stderr). --units N: the child exits 0 after N
units (dlock then releases and exits 0, and run_holder.py starts the next
`dlock run` in the other mode).

usage: python3 run_child.py --id ID --key KEY --gate HOST:PORT --history FILE
         [--unit-ms 10] [--writes 1] [--rwlock r|w [--units N]]
"""

import base64
import http.client
import json
import os
import sys
import time

from protocol import Gate, History, now


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


class Etcd:
    """A guarded put through etcd's JSON gateway: "ok", "fenced" (the
    compare failed), "unknown" (no answer after the request went out),
    "error" (not sent)."""

    def __init__(self, endpoints):
        self.urls = [u.split("://")[-1] for u in endpoints.split(",") if u]
        self.i = 0
        self.conn = None

    def next(self):
        if self.conn is not None:
            self.conn.close()
        self.conn = None
        self.i = (self.i + 1) % len(self.urls)

    def put(self, lock_key, rev, key, value):
        body = json.dumps({
            "compare": [{"key": b64(lock_key), "target": "CREATE", "result": "EQUAL",
                         "create_revision": str(rev)}],
            "success": [{"request_put": {"key": b64(key), "value": b64(value)}}],
        })
        if self.conn is None:
            host, port = self.urls[self.i].rsplit(":", 1)
            self.conn = http.client.HTTPConnection(host, int(port), timeout=2)
            try:
                self.conn.connect()
            except OSError:
                self.next()
                return "error", "connect failed"
        try:
            self.conn.request("POST", "/v3/kv/txn", body, {"Content-Type": "application/json"})
        except OSError as e:
            self.next()
            return "unknown", f"send: {e}"
        try:
            resp = self.conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            self.next()
            return "unknown", f"no answer: {e}"
        if resp.status != 200:
            self.next()
            return "unknown", f"HTTP {resp.status}: {data[:200]!r}"
        return ("ok", "") if json.loads(data).get("succeeded") else ("fenced", "")


def main():
    a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    who, key, path = a["--id"], a["--key"], a["--history"]
    unit = int(a.get("--unit-ms", "10")) / 1e3
    writes = a.get("--writes", "1") == "1"
    rw_flag = a.get("--rwlock")
    units = int(a.get("--units", "0"))
    token = int(os.environ["DLOCK_TOKEN"])
    lock_key, rev = os.environ["ETCD_LOCK_KEY"], os.environ["ETCD_LOCK_REV"]
    # A semaphore's slot (`dlock run -n`): its own resource key, its own
    # gate fence, every record tagged.
    slot = os.environ.get("DLOCK_SLOT")
    li = int(slot) if slot else None
    if li is not None:
        key = f"{key}-{li}"
    record = History(path, who, **({} if li is None else {"li": li})).record

    sys.stderr.write(f"nemesis-child: holding {token} {now()}{'' if li is None else f' {li}'}\n")
    sys.stderr.flush()
    rw_mode = None
    if rw_flag:
        # What dlock says this command holds: a reader, or a writer.
        rw_mode = "r" if os.environ.get("DLOCK_MODE") == "read" else "w"
        if rw_mode != rw_flag:
            sys.exit(f"nemesis-child: DLOCK_MODE={os.environ.get('DLOCK_MODE')!r} "
                     f"but the holder is --rwlock {rw_flag}")
    etcd, gate = Etcd(os.environ["DLOCK_ENDPOINTS"]), Gate(a["--gate"])
    n = 0
    while True:
        time.sleep(unit / 2)
        if not writes:
            continue
        n += 1
        seq = token * 1_000_000 + n
        if rw_mode:
            time.sleep(unit / 2)
            sent = now()
            out = gate.register(who, token, seq, rw_mode)
            record("write", res="register", mode=rw_mode, token=token, seq=seq, sent=sent, out=out)
            if n == units:
                sys.exit(0)
            continue
        sent = now()
        out, msg = etcd.put(lock_key, rev, key, f"{who}:{seq}:{token}")
        record("write", res="etcd", token=token, seq=seq, sent=sent, out=out,
               code="" if out in ("ok", "fenced") else "backend", msg=msg)
        time.sleep(unit / 2)
        sent = now()
        out = gate.write(who, token, seq, li)
        record("write", res="gate", token=token, seq=seq, sent=sent, out=out)


if __name__ == "__main__":
    main()
