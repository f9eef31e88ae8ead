"""Leader elections in the Python face (docs/elections.md): campaign,
proclaim, resign with a permit in flight, observers (``None`` when nobody
leads), asyncio, bad input; on the embedded backend, then a short test on
the etcd test cluster against ``etcdctl elect``."""

from __future__ import annotations

import asyncio
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import IO, List, Optional

import pytest

import dlock
from shared import interrupted

# Short timings so faults play out in about a second.
FAST = dict(ttl=2.0, keepalive_interval=0.5, keepalive_timeout=0.2, retry_interval=0.2, margin=0.5)
WITHIN = 10.0  # the bound of every wait for an event: far above what any takes


def client(**kw: object) -> dlock.Client:
    return dlock.Client(memory=dlock.MemoryService(), **kw)  # type: ignore[arg-type]


def kinds(o: dlock.Observer, n: int) -> List[str]:
    out = []
    for _ in range(n):
        e = o.next_event(WITHIN)
        assert e is not None
        out.append(e.kind)
    return out


# ------------------------------------------------------------- campaign


def test_with_campaign_leads_or_raises_and_resigns() -> None:
    c = client()
    a, b = c.election("e"), c.session().election("e")
    with a.campaign("host-a", timeout=1) as lead:
        assert lead.token == a.token and a.state is dlock.State.HOLDING
        with lead.permit() as p:
            assert p.token == lead.token
        ran = []
        with pytest.raises(dlock.Timeout) as t:
            with b.campaign(b"host-b", timeout=0.2):
                ran.append(True)
        # the same class an acquire raises on timeout; the body never ran
        assert t.value.code == "timeout" and isinstance(t.value, dlock.Error)
        assert ran == [] and b.state is not dlock.State.HOLDING
        leader = a.leader()
        assert leader is not None and leader.value == b"host-a" and leader.token == lead.token
    # leaving the block resigned: no permit, the key is gone
    assert a.state is dlock.State.RELEASED
    with pytest.raises(dlock.PermitRefused):
        a.permit()
    assert a.leader() is None
    with b.campaign(b"host-b", timeout=1) as lb:
        assert lb.token > lead.token
        leader = b.leader()
        assert leader is not None and leader.value == b"host-b"
        assert leader.key.startswith("e/") and leader.lease == b.session.lease


def test_proclaim_keeps_the_token_and_takes_str_as_utf8() -> None:
    c = client()
    e = c.election("p")
    with pytest.raises(dlock.NotHeld):
        e.proclaim("early")  # not campaigning yet
    with e.campaign("one", timeout=1) as lead:
        lead.proclaim("dé")
        got = e.leader()
        assert got is not None and got.value == "dé".encode() and got.token == lead.token
        e.proclaim(bytearray(b"\x00\xff"))
        got = e.leader()
        assert got is not None and got.value == b"\x00\xff"
    with pytest.raises(dlock.NotHeld):
        lead.proclaim("after the resign")


def test_proclaim_after_a_fence_is_fenced() -> None:
    c = client(**FAST)
    e = c.session(reacquire=False).election("f")
    fenced = threading.Event()
    e.on_fence(lambda token, in_flight: fenced.set())
    lead = e.campaign("v", timeout=1)
    link = c.link
    assert link is not None
    link.declare_lease_lost()
    assert fenced.wait(WITHIN)
    with pytest.raises(dlock.Fenced) as f:
        lead.proclaim("late")
    assert f.value.code == "fenced" and f.value.token == lead.token


def test_resign_waits_for_the_permit_in_flight_then_the_next_leads_higher() -> None:
    c = client()
    a, b = c.election("r"), c.session().election("r")
    lead = a.campaign("a", timeout=1)
    p = lead.permit()
    won: "queue.Queue[int]" = queue.Queue()
    ended_at: List[float] = []
    tb = threading.Thread(target=lambda: won.put(b.campaign("b", timeout=WITHIN).token))
    tb.start()
    resigned = threading.Thread(target=lambda: lead.resign(grace=WITHIN))
    resigned.start()
    # the permit is in flight: the key stays, nobody else leads
    with pytest.raises(queue.Empty):
        won.get(timeout=0.3)
    assert resigned.is_alive()
    with pytest.raises(dlock.PermitRefused):
        a.permit()  # no new permit once resigning
    ended_at.append(time.monotonic())
    p.end()
    token_b = won.get(timeout=WITHIN)
    elected_at = time.monotonic()
    resigned.join(WITHIN)
    tb.join(WITHIN)
    assert elected_at >= ended_at[0] and token_b > lead.token
    b.resign(0)


def test_the_default_grace_is_the_cores_as_in_every_face() -> None:
    # Node's RESIGN_GRACE_MS and C's LK_RESIGN_GRACE_MS are the same value.
    assert dlock.RESIGN_GRACE == dlock._dlock.RESIGN_GRACE == 5.0
    c = client()
    e = c.election("default-grace")
    lead = e.campaign("a", timeout=1)
    p = lead.permit()
    resigned = threading.Thread(target=lead.resign)
    resigned.start()
    resigned.join(0.3)  # a window to show the key stays while the permit runs
    assert resigned.is_alive() and e.leader() is not None
    p.end()
    resigned.join(WITHIN)
    assert not resigned.is_alive() and e.leader() is None


def test_resign_deletes_the_key_at_the_grace_with_a_permit_still_in_flight() -> None:
    c = client()
    e = c.election("g")
    lead = e.campaign("a", timeout=1)
    p = lead.permit()
    t0 = time.monotonic()
    lead.resign(grace=0.3)
    took = time.monotonic() - t0
    assert 0.25 <= took < 0.3 + 2.0, took
    assert not p.valid() and e.leader() is None
    p.end()


def test_ctrl_c_interrupts_a_blocking_campaign_and_leaves_no_candidate() -> None:
    code = textwrap.dedent(
        """
        import sys, threading, dlock
        c = dlock.Client(memory=dlock.MemoryService())
        lead = c.election("held").campaign("holder")
        waiter = c.session().election("held")
        released = threading.Event()
        def changed(old, new, why):
            if new is dlock.State.ACQUIRING:
                print("waiting", flush=True)
            if new is dlock.State.RELEASED:
                released.set()
        waiter.on_state_change(changed)
        try:
            with waiter.campaign("waiter"):   # forever, unless interrupted
                sys.exit(3)
        except KeyboardInterrupt:
            print("interrupted", released.wait(5) and waiter.state.value, flush=True)
        lead.resign()
        # the cancelled candidate's key went: nobody leads
        print("leader", c.election("held").leader(), flush=True)
        """
    )
    lines, took = interrupted(code, WITHIN)
    assert lines[0] == "interrupted Released" and "leader None" in lines, lines
    assert took < 2.0 + 2.0, f"the interrupt took {took:.2f} s"  # + the exit's shutdown


# ------------------------------------------------------------- observers


def test_observer_reports_leader_proclaimed_and_none() -> None:
    c = client()
    o = c.observe("o")
    e = c.election("o")
    first = o.next_event(WITHIN)
    assert first is not None and first.kind == "no-leader" and first.leader is None
    lead = e.campaign("v1", timeout=1)
    ev = o.next_event(WITHIN)
    assert ev is not None and ev.kind == "leader"
    assert ev.leader is not None and ev.leader.value == b"v1" and ev.leader.token == lead.token
    lead.proclaim("v2")
    ev = o.next_event(WITHIN)
    assert ev is not None and ev.kind == "proclaimed"
    assert ev.leader is not None and ev.leader.value == b"v2" and ev.leader.token == lead.token
    lead.resign()
    assert kinds(o, 1) == ["no-leader"]
    # the iterator form: Leader or None
    o2 = c.observe("o")
    it = iter(o2)
    assert next(it) is None
    lead = e.campaign("v3", timeout=1)
    got = next(it)
    assert isinstance(got, dlock.Leader) and got.value == b"v3" and got == e.leader()
    o.close()
    o2.close()
    assert list(o2) == [] and o2.closed


def test_observer_sees_no_leader_when_the_lease_expires() -> None:
    c = client(**FAST)
    e = c.session(reacquire=False).election("x")
    lead = e.campaign("v", timeout=1)
    # the observer on a client of its own: the leader's link is cut, not its
    with dlock.Client(memory=c.memory).observe("x") as o:
        it = iter(o)
        first = next(it)
        assert first is not None and first.token == lead.token
        link = c.link
        assert link is not None
        link.partition()  # no keepalive reaches the service: the lease expires
        assert next(it) is None
        link.heal()


def test_close_from_another_thread_ends_a_blocked_iteration() -> None:
    c = client()
    o = c.observe("b")
    seen: List[Optional[dlock.Leader]] = []
    first, done = threading.Event(), threading.Event()

    def read() -> None:
        for leader in o:
            seen.append(leader)
            first.set()
        done.set()

    t = threading.Thread(target=read)
    t.start()
    assert first.wait(WITHIN)  # the reader is blocked on the next event now
    o.close()
    assert done.wait(WITHIN) and seen == [None]
    t.join(WITHIN)


def test_observe_on_a_shut_down_client_raises_shutdown() -> None:
    c = client()
    c.shutdown()
    with pytest.raises(dlock.Shutdown) as s:
        c.observe("s")
    assert s.value.code == "shutdown"


# ---------------------------------------------------------------- asyncio


def test_asyncio_campaign_async_with_and_async_for() -> None:
    async def main() -> None:
        c = client()
        e = c.election("a")
        o = c.observe("a")
        seen: "asyncio.Queue[Optional[dlock.Leader]]" = asyncio.Queue()

        async def watch() -> None:
            async for leader in o:
                await seen.put(leader)

        async def next_seen() -> Optional[dlock.Leader]:
            return await asyncio.wait_for(seen.get(), WITHIN)

        w = asyncio.ensure_future(watch())
        assert await next_seen() is None
        async with e.campaign_async("v1", timeout=1) as lead:
            assert e.state is dlock.State.HOLDING
            got = await next_seen()
            assert got is not None and got.value == b"v1" and got.token == lead.token
            await lead.proclaim_async("v2")
            got = await next_seen()
            assert got is not None and got.value == b"v2" and got.token == lead.token
        assert e.state is dlock.State.RELEASED
        assert await next_seen() is None
        lead2 = await e.campaign_async(b"v3", timeout=1)
        assert lead2.token > lead.token
        got = await next_seen()
        assert got is not None and got.value == b"v3" and got.token == lead2.token
        await lead2.resign_async()
        assert await next_seen() is None
        o.close()  # ends the async for
        await asyncio.wait_for(w, WITHIN)

    asyncio.run(main())


def test_asyncio_cancelled_campaign_leaves_no_candidate() -> None:
    async def main() -> None:
        c = client()
        holder = c.election("c")
        lead = await holder.campaign_async("h", timeout=1)
        waiter = c.session().election("c")
        released = threading.Event()
        waiter.on_state_change(lambda old, new, why: new is dlock.State.RELEASED and released.set())
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(waiter.campaign_async("w"), 0.2)
        # the core ends the cancelled campaign (its completion may come a
        # moment before the state is published: the same holds for a lock)
        assert released.wait(WITHIN)
        await lead.resign_async()
        # the waiter's key went with the cancel: nobody leads, a third
        # candidate wins at its one try
        assert holder.leader() is None
        third = await c.session().election("c").campaign_async("t", timeout=0)
        assert third.token > lead.token

    asyncio.run(main())


def test_observer_closed_during_async_read_ends_it() -> None:
    async def main() -> None:
        c = client()
        o = c.observe("z")
        assert (await o.next_event_async()) is not None  # no-leader first
        read = asyncio.ensure_future(o.next_event_async())
        await asyncio.sleep(0.05)
        o.close()
        assert (await asyncio.wait_for(read, WITHIN)) is None

    asyncio.run(main())


# -------------------------------------------------------------- bad input


def test_bad_input_is_one_clear_error_and_holds_nothing() -> None:
    c = client()
    for bad in ("", "x" * (dlock.MAX_NAME_LEN + 1), "a\0b"):
        with pytest.raises(dlock.InvalidArgument):
            c.election(bad)
        with pytest.raises(dlock.InvalidArgument):
            c.observe(bad)
    with pytest.raises(TypeError):
        c.election(b"bytes")  # type: ignore[arg-type]
    e = c.election("bad")
    with pytest.raises(dlock.InvalidArgument) as big:
        e.campaign(b"v" * (2 * 1024 * 1024), timeout=1)
    assert big.value.code == "invalid_argument"
    assert e.state is dlock.State.IDLE and e.leader() is None
    with pytest.raises(TypeError):
        e.campaign(12, timeout=1)  # type: ignore[arg-type]
    with pytest.raises(dlock.InvalidArgument):
        e.campaign("v", timeout=-1)
    with e.campaign("v", timeout=1) as lead:
        with pytest.raises(dlock.InvalidArgument):
            lead.proclaim(b"v" * (2 * 1024 * 1024))
        with pytest.raises(dlock.InvalidArgument):
            e.resign(grace=float("nan"))
        assert e.state is dlock.State.HOLDING
    with pytest.raises(TypeError):
        with e:
            pass
    s = c.session()
    closed = s.election("bad")
    s.close()
    with pytest.raises(dlock.Released) as r:
        closed.campaign("v", timeout=1)
    assert r.value.code == "released"
    assert e.leader() is None


# ------------------------------------------------------------------- etcd

ETCD = os.environ.get("DLOCK_TEST_ETCD")
ETCD_FAST = dict(ttl=4.0, keepalive_interval=1.0, keepalive_timeout=0.5, retry_interval=0.5, margin=1.0)


def etcdctl_elect(*args: str) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        ["etcdctl", f"--endpoints={os.environ['DLOCK_TEST_MEMBERS']}", "elect", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "ETCDCTL_API": "3"},
    )


def lines_of(out: "IO[str]") -> "queue.Queue[str]":
    q: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=lambda: [q.put(line.rstrip("\n")) for line in out], daemon=True).start()
    return q


def read_until(q: "queue.Queue[str]", want: str) -> List[str]:
    seen = []
    while want not in seen:
        seen.append(q.get(timeout=WITHIN))
    return seen


@pytest.mark.skipif(not ETCD, reason="no etcd test cluster (DLOCK_TEST_ETCD unset: source target/etcd/env)")
def test_etcd_interop_with_etcdctl_elect() -> None:
    members = os.environ["DLOCK_TEST_MEMBERS"]
    name = f"py-test/elect-{uuid.uuid4().hex[:12]}"
    c = dlock.Client(members, **ETCD_FAST)  # type: ignore[arg-type]
    # etcdctl elect -l sees the Python leader's value, and its proclaim
    listen = etcdctl_elect("-l", name)
    try:
        assert listen.stdout is not None
        heard = lines_of(listen.stdout)
        e = c.election(name)
        with e.campaign("py-leader", timeout=WITHIN) as lead:
            seen = read_until(heard, "py-leader")
            leader = e.leader()
            assert leader is not None and leader.key in seen and leader.token == lead.token
            lead.proclaim("py-proclaimed")
            read_until(heard, "py-proclaimed")
    finally:
        listen.kill()
        listen.wait()
    # a Python observer sees etcdctl's leader; a Python candidate waits for it
    ctl = etcdctl_elect(name, "ctl-value")
    try:
        with c.observe(name) as o:
            it = iter(o)
            got = next(it)
            while got is None:
                got = next(it)
            assert got.value == b"ctl-value"
            b = c.election(name)
            with pytest.raises(dlock.Timeout):
                b.campaign("py-next", timeout=0.5)
            ctl.send_signal(2)  # SIGINT: etcdctl resigns
            ctl.wait(WITHIN)
            with b.campaign("py-next", timeout=WITHIN) as lead:
                assert lead.token > got.token
                # The timed-out campaign's key is deleted just after its
                # Timeout: if etcdctl resigned first, that key (a lower
                # token) led for a moment, and the observer says so, as
                # `etcdctl elect -l` would. Then this campaign's leads.
                got = next(it)
                while got is None or got.token < lead.token:
                    got = next(it)
                assert (got.token, got.value) == (lead.token, b"py-next")
    finally:
        ctl.kill()
        ctl.wait()


# ------------------------------------------------------------ issue 32


def test_a_bad_grace_is_refused_before_the_campaign() -> None:
    """Issue 32, item 7: a grace the resign would refuse is refused by
    campaign itself, before anything is held or any body runs."""
    c = client()
    e = c.election("grace")
    for bad in (-1.0, float("nan"), float("inf")):
        ran = []
        with pytest.raises(dlock.InvalidArgument) as err:
            with e.campaign("v", timeout=1, grace=bad):
                ran.append(True)
        assert err.value.code == "invalid_argument" and ran == []
        assert e.state is dlock.State.IDLE and e.leader() is None

        async def run_async(grace: float) -> None:
            async with e.campaign_async("v", timeout=1, grace=grace):
                ran.append(True)

        with pytest.raises(dlock.InvalidArgument):
            asyncio.run(run_async(bad))
        assert ran == [] and e.state is dlock.State.IDLE and e.leader() is None


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_an_observer_nobody_reads_keeps_bounded_memory() -> None:
    """Issue 32, item 3: an observer whose events are never read holds a
    bounded backlog (the core's), not every change: 3,000 proclaims of
    32 KiB (about 94 MiB if all were kept) leave the RSS within 40 MiB; the
    reader then sees the newest state."""
    c = client()
    o = c.observe("soak")
    e = c.election("soak")
    lead = e.campaign("v", timeout=1)
    pad = b"x" * (32 * 1024)
    before = rss_bytes()
    for i in range(3000):
        lead.proclaim(b"%d:" % i + pad)
    grown = rss_bytes() - before
    assert grown < 40 * 1024 * 1024, f"RSS grew {grown >> 20} MiB"
    while True:
        ev = o.next_event(WITHIN)
        assert ev is not None
        if ev.leader is not None and ev.leader.value.startswith(b"2999:"):
            break
    o.close()
    lead.resign()
