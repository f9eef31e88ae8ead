"""The Python holder of the nemesis (docs/nemesis.md, "A holder of another
face"), on the public API of `import dlock` only: contends for one lock on
etcd through the endpoints given, works under permits as fast as it can (a
guarded put of KEY = ID:SEQ:TOKEN, then one line "ID TOKEN SEQ" to the
gate), and appends the holder protocol's records to FILE, stamped with
CLOCK_BOOTTIME in nanoseconds (the clock of dlock's deadlines). Event
instants `at` are the events' own (`Event.at`, seconds on dlock's clock).
EOF on stdin: records "final" and exits.

--election 1: a candidate of the election NAME (`client.election`) instead
of a lock holder, as the Rust holder: it campaigns (value ID) where it
would acquire, and as the leader proclaims ID:N every 100th permit (a
"proclaim" record). Only the leader writes: a permit is leadership.

--semaphore N: a holder of the semaphore NAME of N slots
(`client.semaphore`), as the Rust holder: it waits for any slot, then works
on that slot's lock (a fenced slot takes itself back), writing KEY-<slot>
and "ID TOKEN SEQ SLOT" to the gate; every record of the slot carries
"li": slot, and its first "acquired" is stamped when the acquire returned.

--rwlock r|w: a reader or a writer of the read/write lock NAME
(`client.rwlock(NAME).reader()` / `.writer()`), as the Rust holder: its
unit is a read or a write of the gate's two-key register (the line
"ID TOKEN SEQ r|w", answered "ok ..." or "stale HIGHEST"), recorded as a
"write" of res "register" with its "mode"; no etcd write. A mode of its
own (no --election, no --semaphore). After a number of units drawn in
[20, 200] (the Rust holder's generator, seeded from ID) it releases (a
"release" record), and acquires again in the other mode on a new handle
(a "mode" record), and so on.

usage: python holder.py --id ID --endpoints URLS --lock NAME --key KEY
         --gate HOST:PORT --history FILE [--ttl-ms N --interval-ms N
         --timeout-ms N --retry-ms N --margin-ms N --unit-ms N --idle-ms N
         --writes 0|1 --election 0|1 --semaphore N --rwlock r|w]
"""

import os
import sys
import threading
import time

import dlock

from handover import rw_rng, rw_units
from protocol import Gate, History, flags, now

def ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def main():
    f = flags(sys.argv[1:], "holder", {"rwlock": ""})
    who = f["id"]
    h = History(f["history"], who)
    election = f["election"] == 1
    sem_n = f["semaphore"]
    rw_mode = f["rwlock"] or None
    if rw_mode not in (None, "r", "w"):
        sys.exit(f"holder: --rwlock takes r or w, not {rw_mode}")
    if rw_mode and (election or sem_n):
        sys.exit("holder: --rwlock r|w is a mode of its own (no --election, no --semaphore)")
    h.record("start", face="python", pid=os.getpid(), lock=f["lock"], wall=int(time.time()),
             election=election, semaphore=sem_n or None, rwlock=rw_mode, ttl_ms=f["ttl-ms"], margin_ms=f["margin-ms"], interval_ms=f["interval-ms"])
    client = dlock.Client(
        f["endpoints"], ttl=f["ttl-ms"] / 1e3, keepalive_interval=f["interval-ms"] / 1e3,
        keepalive_timeout=f["timeout-ms"] / 1e3, retry_interval=f["retry-ms"] / 1e3,
        margin=f["margin-ms"] / 1e3, reacquire=True)
    held = {"lock": None, "li": None}

    def rec(ev, **fields):
        """A record, tagged with the semaphore's slot once one is held."""
        if held["li"] is not None:
            fields["li"] = held["li"]
        h.record(ev, **fields)

    def watch_stdin():
        while sys.stdin.buffer.read(4096):
            pass
        lk = held["lock"]
        if lk is None:
            h.record("final", state="acquiring", token=None)
        else:
            rec("final", state=lk.state.value.lower(), token=lk.token)
        os._exit(0)

    threading.Thread(target=watch_stdin, daemon=True).start()

    def event(e: dlock.Event) -> None:
        at = ns(e.at)
        if e.kind == "state":
            rec("state", at=at, wall=int(time.time()), **{"from": e.from_state.lower()},
                to=e.to_state.lower(), reason=e.reason)
        elif e.kind == "fence":
            rec("fence", at=at, token=e.token, in_flight=e.in_flight)
        elif e.kind == "acquired":
            rec("acquired", at=at, token=e.token)
        elif e.kind == "drained":
            rec("drained", at=at)

    key = f["key"]
    if sem_n:
        sem = client.semaphore(f["lock"], sem_n)
        while True:
            h.record("acquire")
            try:
                lock = sem.acquire(30)
                break
            except dlock.Error as e:
                h.record("acquire_err", code=e.code, msg=str(e))
                time.sleep(f["retry-ms"] / 1e3)
        held["li"] = lock.slot
        key = f"{key}-{lock.slot}"
        lock.on_event(event)
        rec("acquired", at=now(), token=lock.token)
        rec("acquire_ok", token=lock.token)
    elif rw_mode:
        rw = client.rwlock(f["lock"])
        lock = rw.reader() if rw_mode == "r" else rw.writer()
        lock.on_event(event)
    else:
        lock = client.election(f["lock"]) if election else client.lock(f["lock"])
        lock.on_event(event)
    held["lock"] = lock

    gate = Gate(f["gate"])
    unit, idle = f["unit-ms"] / 1e3, f["idle-ms"] / 1e3
    seq, refused_n, last_refusal, permits = 0, 0, None, 0
    # --rwlock: units left before the handover (release, then the other mode).
    rng = rw_rng(who)
    rw_left = rw_units(rng)
    while True:
        if lock.state in (dlock.State.IDLE, dlock.State.RELEASED):
            rec("acquire")
            try:
                token = lock.campaign(who, 30).token if election else lock.acquire(30)
                rec("acquire_ok", token=token)
            except dlock.Error as e:
                rec("acquire_err", code=e.code, msg=str(e))
                time.sleep(f["retry-ms"] / 1e3)
            continue
        t0 = now()
        try:
            p = lock.permit()
        except dlock.PermitRefused as e:
            refused_n += 1
            if e.code != last_refusal:
                rec("refused", reason=e.code, state=lock.state.value.lower())
                last_refusal = e.code
            time.sleep(idle)
            continue
        if last_refusal is not None:
            rec("refusals", n=refused_n)
            refused_n, last_refusal = 0, None
        token = p.token
        # The permit's deadline: the clock read before `remaining` plus
        # `remaining` (a bound below the permit's own deadline: stricter).
        t1 = now()
        rec("permit", t0=t0, token=token, deadline=t1 + ns(p.remaining))
        permits += 1
        if election and permits % 100 == 0:
            value, out = f"{who}:{permits}", "ok"
            try:
                lock.proclaim(value)
            except dlock.Error as e:
                out = e.code
            h.record("proclaim", token=token, value=value, out=out)
        time.sleep(unit / 2)
        if rw_mode and f["writes"]:
            seq += 1
            time.sleep(unit / 2)
            sent = now()
            out = gate.register(who, token, seq, rw_mode)
            rec("write", res="register", mode=rw_mode, token=token, seq=seq, sent=sent, out=out)
        elif f["writes"]:
            seq += 1
            sent = now()
            out, code, msg = "ok", "", ""
            try:
                lock.guarded_put(token, key, f"{who}:{seq}:{token}")
            except dlock.Fenced:
                out, code = "fenced", "fenced"
            except dlock.BackendError as e:
                out, code, msg = "unknown", e.code, str(e)
            except dlock.Error as e:
                out, code, msg = "error", e.code, str(e)
            rec("write", res="etcd", token=token, seq=seq, sent=sent, out=out, code=code, msg=msg)
            time.sleep(unit / 2)
            sent = now()
            out = gate.write(who, token, seq, held["li"])
            rec("write", res="gate", token=token, seq=seq, sent=sent, out=out)
        p.end()
        if rw_mode:
            rw_left -= 1
            if rw_left == 0:
                out = "ok"
                try:
                    lock.close()
                except dlock.Error as e:
                    out = e.code
                rec("release", token=token, mode=rw_mode, out=out)
                rw_mode = "w" if rw_mode == "r" else "r"
                lock = rw.reader() if rw_mode == "r" else rw.writer()
                lock.on_event(event)
                held["lock"] = lock
                rec("mode", mode=rw_mode)
                rw_left = rw_units(rng)


if __name__ == "__main__":
    main()
