"""The `dlock run` holder of the nemesis (docs/nemesis.md, "A holder of
another face"): the holder protocol's flags in, `dlock run --restart NAME --
run_child.py ...` out, in the same process (exec), so the nemesis's
SIGSTOP and SIGKILL hit dlock itself. The command under the lock
(run_child.py) knows nothing of dlock: it reads DLOCK_TOKEN, ETCD_LOCK_KEY
and ETCD_LOCK_REV from its environment and does the writes.

Before the exec a recorder process is forked: it reads dlock's stderr (the
child's too) and turns it into the protocol's records, stamped with
CLOCK_BOOTTIME when the line is read (dlock prints no instant: `at` is
later than the core's decision, so G1 leads come out smaller, never
larger):

- the child's first line ("nemesis-child: holding TOKEN NS [SLOT]") ->
  `child_started` (`at` NS), and for the first token `acquired` and
  `state` -> holding (dlock prints nothing at its first acquisition);
- "acquired again, token T" (after a restart) -> `acquired` and `state`
  -> holding: the lock is held again, the command starts next;
- "draining (REASON): the command goes on" / "resumed" -> `state`;
- "fenced (token T): ... SIGTERM to process group" -> `fence` (and state
  -> fenced): when dlock acts on the fence;
- "process group N is gone" -> `group_gone` (`at`, `token`): when nothing
  of the command is left (the promise of `dlock run`);
- "waiting for the lock again" -> `state` -> reacquiring;
- "...: not starting the command" -> `refused`;
- every other line -> `log`.

On EOF of stdin the recorder records `final` (the state it followed; none
once dlock was killed) and sends SIGTERM to dlock, which stops the group
and releases.

usage: python3 run_holder.py [--dlock PATH] --id ID --endpoints URLS
         --lock NAME --key KEY --gate HOST:PORT --history FILE [--ttl-ms N
         --interval-ms N --timeout-ms N --retry-ms N --margin-ms N
         --unit-ms N --idle-ms N --writes 0|1 --election 0|1 --semaphore N
         --rwlock r|w]

--semaphore N: `dlock run -n N`, a slot of the semaphore NAME; the child
names its slot (DLOCK_SLOT) on its first line, and from then on every
record carries "li": slot (a fenced slot is taken back by dlock itself).

--rwlock r|w: a reader (`dlock run --read NAME`) or a writer (a plain
`dlock run NAME`) of the read/write lock NAME; the child, given --rwlock
too, reads or writes the gate's two-key register by DLOCK_MODE (dlock sets
DLOCK_MODE=read for a reader) instead of the etcd and gate writes. A mode
of its own (no --election, no --semaphore). Here this process does not
exec: it runs one `dlock run` after another (dlock in its process group,
which the nemesis signals whole), each in the other mode, the child told
to end after a number of units drawn in [20, 200] (the Rust holder's
generator, seeded from ID); when dlock exits 0 (released), it records
`release` and `mode` as the other faces' holders, and starts the next.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time

from handover import rw_rng, rw_units
from protocol import History, flags, now

HOLDING = re.compile(r"nemesis-child: holding (\d+) (\d+)(?: (\d+))?$")
FENCED = re.compile(r"fenced \(token (\d+)\): .*SIGTERM to process group")
AGAIN = re.compile(r"acquired again, token (\d+)$")
DRAINING = re.compile(r"draining \(([^)]*)\): ")


def follower(h):
    """The state followed from dlock's stderr, and the records of the
    semaphore's slot tagged with it (once the child named it)."""
    st = {"state": "acquiring", "token": None, "li": None, "mu": threading.Lock()}
    plain = h.record

    def tagged(ev, **fields):
        if st["li"] is not None:
            fields["li"] = st["li"]
        plain(ev, **fields)

    h.record = tagged
    return st


def state(h, st, to, reason, at=None):
    at = at if at is not None else now()
    h.record("state", at=at, wall=int(time.time()), **{"from": st["state"]}, to=to, reason=reason)
    st["state"] = to


def final(h, st):
    s = st["state"]
    h.record("final", state=s, token=st["token"] if s in ("holding", "draining") else None)


def follow(h, st, lines):
    """Records dlock's stderr lines until it closes."""
    for raw in lines:
        line = raw.decode(errors="replace").rstrip("\n")
        at = now()
        with st["mu"]:
            m = HOLDING.search(line)
            if m:
                token, t = int(m.group(1)), int(m.group(2))
                if m.group(3) is not None:
                    st["li"] = int(m.group(3))
                h.record("child_started", at=t, token=token)
                if token != st["token"]:
                    h.record("acquired", at=t, token=token)
                    st["token"] = token
                    state(h, st, "holding", "acquired", t)
                continue
            m = AGAIN.search(line)
            if m:
                # dlock's lock holds again (the core's Holding): the command
                # starts next (its `child_started`).
                token = int(m.group(1))
                h.record("acquired", at=at, token=token)
                st["token"] = token
                state(h, st, "holding", "reacquired", at)
                continue
            m = FENCED.search(line)
            if m:
                token = int(m.group(1))
                h.record("fence", at=at, token=token, in_flight=1)
                state(h, st, "fenced", "fenced", at)
                continue
            if "process group" in line and "is gone" in line:
                h.record("group_gone", at=at, token=st["token"])
                continue
            m = DRAINING.search(line)
            if m and st["state"] == "holding":
                state(h, st, "draining", m.group(1), at)
                continue
            if line.endswith(": resumed") and st["state"] == "draining":
                state(h, st, "holding", "resumed", at)
                continue
            if "waiting for the lock again" in line:
                state(h, st, "reacquiring", "restart", at)
                continue
            if line.endswith("not starting the command"):
                h.record("refused", reason=line.rsplit(": ", 2)[-2], state=st["state"])
                continue
            h.record("log", line=line)


def recorder(h, lines, dlock_pid):
    """Follows dlock's stderr; records; on EOF of stdin: final, SIGTERM."""
    st = follower(h)

    def watch_stdin():
        while os.read(0, 4096):
            pass
        with st["mu"]:
            # dlock is this process's parent: once it is gone (killed), the
            # recorder was handed to another parent, and the state it
            # followed is not dlock's any more (a killed holder records no
            # `final`, as the other faces' holders, killed with their
            # process, record none). The command's stderr outlives dlock.
            if os.getppid() == dlock_pid:
                final(h, st)
        try:
            os.kill(dlock_pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        os._exit(0)

    threading.Thread(target=watch_stdin, daemon=True).start()
    follow(h, st, lines)
    # dlock is gone (killed, or exited): nothing more to follow.
    h.record("log", line="dlock's stderr closed")
    os._exit(0)


def rw_loop(h, argv_of, mode, env, retry):
    """--rwlock: one `dlock run` after another, each in the other mode.
    The command does its units and exits 0, dlock releases and exits 0;
    then a `release` and a `mode` record, and the next `dlock run`. This
    process stays (the nemesis's holder): dlock runs in its process group,
    which the nemesis signals (SIGSTOP, SIGKILL reach dlock). A dlock that
    exits 122 (the backend: a `dlock run` started while no member answers)
    is started again in the same mode after `retry` seconds, as a
    supervisor would (an `acquire_err`)."""
    st = follower(h)
    rng = rw_rng(h.who)

    def watch_stdin():
        while os.read(0, 4096):
            pass
        with st["mu"]:
            st["ending"] = True
            final(h, st)
            d = st.get("dlock")
        if d is not None and d.poll() is None:
            d.send_signal(signal.SIGTERM)
            try:
                d.wait(3)
            except subprocess.TimeoutExpired:
                pass
        os._exit(0)

    threading.Thread(target=watch_stdin, daemon=True).start()
    while True:
        r, w = os.pipe()
        with st["mu"]:
            st["dlock"] = subprocess.Popen(argv_of(mode, rw_units(rng)), env=env,
                                           stdin=subprocess.DEVNULL, stderr=w)
        os.close(w)
        t = threading.Thread(target=follow, args=(h, st, os.fdopen(r, "rb", buffering=0)),
                             daemon=True)
        t.start()
        rc = st["dlock"].wait()
        # The command's lines, and dlock's last ones, recorded first.
        t.join(2)
        if st.get("ending"):
            time.sleep(10)  # the end (EOF of stdin): watch_stdin exits
        if rc == 122:
            with st["mu"]:
                h.record("acquire_err", code="backend", msg="dlock exited 122")
                if st["state"] != "acquiring":
                    state(h, st, "acquiring", "restart")
            time.sleep(retry)
            continue
        if rc != 0:
            h.record("log", line=f"dlock exited {rc}")
            os._exit(rc if rc > 0 else 128 - rc)
        with st["mu"]:
            token = st["token"]
            state(h, st, "released", "release")
            h.record("release", token=token, mode=mode, out="ok")
            mode = "w" if mode == "r" else "r"
            h.record("mode", mode=mode)
            state(h, st, "acquiring", "acquire")


def main():
    # --dlock: the one on PATH unless given.
    f = flags(sys.argv[1:], "run_holder", {"dlock": "dlock", "rwlock": ""})
    h = History(f["history"], f["id"])
    rw_mode = f["rwlock"] or None
    if rw_mode not in (None, "r", "w"):
        sys.exit(f"run_holder: --rwlock takes r or w, not {rw_mode}")
    if rw_mode and (f["election"] == 1 or f["semaphore"]):
        sys.exit("run_holder: --rwlock r|w is a mode of its own (no --election, no --semaphore)")
    h.record("start", face="run", pid=os.getpid(), lock=f["lock"], wall=int(time.time()),
             election=f["election"] == 1, semaphore=f["semaphore"] or None, rwlock=rw_mode,
             ttl_ms=f["ttl-ms"], margin_ms=f["margin-ms"], interval_ms=f["interval-ms"])
    ms = lambda k: f"{f[k]}ms"  # noqa: E731
    child = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run_child.py")
    # --election 1: `dlock elect NAME ID` (a candidate; the same run code
    # and the same lines on stderr) instead of `dlock run NAME`.
    verb, name = (["elect"], [f["lock"], f["id"]]) if f["election"] == 1 else (["run"], [f["lock"]])
    if f["semaphore"]:
        verb = ["run", "-n", str(f["semaphore"])]

    def argv_of(mode, units):
        """dlock's command line; --rwlock: a reader is `dlock run --read`,
        a writer a plain `dlock run`, its command ending after `units`."""
        v = ["run", "--read"] if mode == "r" else verb
        rw = ["--rwlock", mode, "--units", str(units)] if mode else []
        return [f["dlock"], *v, "--restart", "--endpoints", f["endpoints"],
                "--ttl", ms("ttl-ms"), "--keepalive-interval", ms("interval-ms"),
                "--keepalive-timeout", ms("timeout-ms"), "--retry-interval", ms("retry-ms"),
                "--margin", ms("margin-ms"), *name, "--",
                sys.executable, child, "--id", f["id"], "--key", f["key"], "--gate", f["gate"],
                "--history", f["history"], "--unit-ms", str(f["unit-ms"]),
                "--writes", str(f["writes"]), *rw]

    env = dict(os.environ, DLOCK_ENDPOINTS=f["endpoints"])
    if rw_mode:
        rw_loop(h, argv_of, rw_mode, env, f["retry-ms"] / 1e3)
    argv = argv_of(None, 0)
    r, w = os.pipe()
    pid = os.getpid()
    if os.fork() == 0:
        os.close(w)
        recorder(h, os.fdopen(r, "rb", buffering=0), pid)
    os.close(r)
    os.dup2(w, 2)
    os.close(w)
    os.execvpe(f["dlock"], argv, env)


if __name__ == "__main__":
    main()
