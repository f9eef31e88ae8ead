"""Semaphores in the Python face (issue 29, docs/design.md §26): the face
converts, the core decides. On the embedded engine: N + 1 contenders and
exactly N hold, on distinct slots; try_acquire; the limit's rules; a
timeout, a cancelled task or Ctrl-C leave nothing held; `with` releases;
README.md's Python block as written. One case on the etcd test cluster
when DLOCK_TEST_ETCD says it exists."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import List, Optional

import pytest

import dlock
from shared import etcdctl, interrupted, times_out_with_the_loop_free

ROOT = Path(__file__).resolve().parents[3]
WITHIN = 10.0


def client(svc: Optional[dlock.MemoryService] = None) -> dlock.Client:
    return dlock.Client(memory=svc or dlock.MemoryService())


def holders(svc: dlock.MemoryService, name: str, limit: int) -> List[Optional[int]]:
    """The token holding each slot of `name` on the service (None: free)."""
    return [svc.holder(f"{name}/slot/{i}") for i in range(limit)]


# ----------------------------------------------------------------- basics


def test_acquire_gives_a_held_slot_lock() -> None:
    svc = dlock.MemoryService()
    c = client(svc)
    sem = c.semaphore("gpu", 2)
    assert (sem.name, sem.limit) == ("gpu", 2)
    assert dlock.MAX_SEMAPHORE_LIMIT == 1024
    held = sem.acquire(timeout=5.0)
    assert isinstance(held, dlock.Lock)
    assert held.slot in (0, 1) and isinstance(held.slot, int)
    assert held.name == f"gpu/slot/{held.slot}"
    assert held.state is dlock.State.HOLDING and held.token is not None
    with held.permit() as p:
        assert p.token == held.token
    assert svc.holder(held.name) == held.token
    held.release()
    assert held.state is dlock.State.RELEASED
    assert holders(svc, "gpu", 2) == [None, None]
    # a plain lock has no slot
    assert c.lock("plain").slot is None


def test_n_plus_one_contenders_exactly_n_hold_on_distinct_slots() -> None:
    svc = dlock.MemoryService()
    c = client(svc)
    n = 3
    sems = [c.session().semaphore("pool", n) for _ in range(n + 1)]
    won: List[dlock.Lock] = []
    timed_out: List[int] = []
    mu = threading.Lock()

    def contend(i: int) -> None:
        try:
            h = sems[i].acquire(timeout=1.0)
            with mu:
                won.append(h)
        except dlock.Timeout:
            with mu:
                timed_out.append(i)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(n + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WITHIN)
    assert len(won) == n and len(timed_out) == 1
    assert sorted(h.slot for h in won if h.slot is not None) == list(range(n))
    assert all(h.state is dlock.State.HOLDING for h in won)
    # the one that timed out holds nothing: the service's holders are the N
    assert holders(svc, "pool", n) == [h.token for h in sorted(won, key=lambda h: h.slot or 0)]
    # a release passes the slot on to the next one
    freed = won[0]
    freed.release()
    again = sems[timed_out[0]].acquire(timeout=5.0)
    assert again.slot == freed.slot and again.token is not None and freed.token is None
    for h in [again, *won[1:]]:
        h.release()
    assert holders(svc, "pool", n) == [None] * n


def test_try_acquire_would_block_when_every_slot_is_held() -> None:
    c = client()
    sem = c.semaphore("t", 2)
    a, b = sem.try_acquire(), c.session().semaphore("t", 2).try_acquire()
    assert {a.slot, b.slot} == {0, 1}
    with pytest.raises(dlock.WouldBlock) as e:
        c.session().semaphore("t", 2).try_acquire()
    assert e.value.code == "would_block"
    # timeout 0 is one try too
    with pytest.raises(dlock.WouldBlock):
        c.session().semaphore("t", 2).acquire(timeout=0)
    b.release()
    third = c.session().semaphore("t", 2).try_acquire()
    assert third.slot == b.slot
    a.release()
    third.release()


def test_the_limit_rules_are_the_cores() -> None:
    c = client()
    c.semaphore("lim", 3)
    with pytest.raises(dlock.InvalidArgument) as e:
        c.session().semaphore("lim", 4)
    assert e.value.code == "invalid_argument"
    assert "3" in str(e.value) and "4" in str(e.value), str(e.value)
    for bad in (0, dlock.MAX_SEMAPHORE_LIMIT + 1, 2**40, -1):
        with pytest.raises(dlock.InvalidArgument):
            c.semaphore("other", bad)
    with pytest.raises(dlock.InvalidArgument):
        c.semaphore("", 1)
    with pytest.raises(TypeError):
        c.semaphore(b"bytes", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        c.semaphore("x", "2")  # type: ignore[arg-type]
    # the same limit again is fine, from any session
    assert c.session().semaphore("lim", 3).limit == 3


def test_a_timeout_leaves_nothing_held() -> None:
    svc = dlock.MemoryService()
    c = client(svc)
    full = c.semaphore("full", 2)
    a, b = full.acquire(timeout=5), full.acquire(timeout=5)
    before = holders(svc, "full", 2)
    started = time.monotonic()
    with pytest.raises(dlock.Timeout):
        c.session().semaphore("full", 2).acquire(timeout=0.3)
    assert 0.25 < time.monotonic() - started < WITHIN
    assert holders(svc, "full", 2) == before
    a.release()
    b.release()
    assert holders(svc, "full", 2) == [None, None]


def test_with_releases_on_exit_and_enters_without_acquiring_again() -> None:
    svc = dlock.MemoryService()
    c = client(svc)
    sem = c.semaphore("w", 1)
    with sem.acquire(timeout=5.0) as held:
        assert held.state is dlock.State.HOLDING and held.slot == 0
        assert svc.holder("w/slot/0") == held.token
    assert held.state is dlock.State.RELEASED
    assert svc.holder("w/slot/0") is None
    # an exception in the block releases too
    with pytest.raises(RuntimeError):
        with sem.acquire(timeout=5.0):
            raise RuntimeError("boom")
    assert svc.holder("w/slot/0") is None
    # a slot's lock is an ordinary lock: entering it later acquires it again
    with held:
        assert held.state is dlock.State.HOLDING
    assert svc.holder("w/slot/0") is None


def test_session_semaphore_holds_on_that_session() -> None:
    c = client()
    s = c.session()
    held = s.semaphore("s", 2).acquire(timeout=5.0)
    assert held.session.lease == s.lease
    s.close()
    assert held.state is dlock.State.RELEASED


# ---------------------------------------------------------------- asyncio


def test_asyncio_acquire_async_and_async_with() -> None:
    async def main() -> None:
        svc = dlock.MemoryService()
        c = client(svc)
        sem = c.semaphore("aio", 2)
        a = await sem.acquire_async(timeout=5.0)
        b = await c.session().semaphore("aio", 2).acquire_async()
        assert {a.slot, b.slot} == {0, 1}
        with pytest.raises(dlock.Timeout):
            await c.session().semaphore("aio", 2).acquire_async(timeout=0.2)
        await a.release_async()
        async with await sem.acquire_async(timeout=5.0) as held:
            assert held.slot == a.slot and held.state is dlock.State.HOLDING
        assert held.state is dlock.State.RELEASED
        async with sem.acquire_async(timeout=5.0) as h2:
            assert h2.slot == a.slot and svc.holder(h2.name) == h2.token
        assert h2.state is dlock.State.RELEASED
        await b.release_async()
        assert holders(svc, "aio", 2) == [None, None]

    asyncio.run(main())


def test_asyncio_cancellation_leaves_nothing_held() -> None:
    async def main() -> None:
        svc = dlock.MemoryService()
        c = client(svc)
        sem = c.semaphore("cx", 2)
        a, b = await sem.acquire_async(), await sem.acquire_async()
        before = holders(svc, "cx", 2)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(c.session().semaphore("cx", 2).acquire_async(), 0.2)
        assert holders(svc, "cx", 2) == before
        await a.release_async()
        await b.release_async()
        # a cancel just as a free slot is won: let go too
        for _ in range(20):
            t = asyncio.ensure_future(sem.acquire_async())
            await asyncio.sleep(0)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
        # both slots free: two holders get them at once
        x = await c.session().semaphore("cx", 2).acquire_async(timeout=2)
        y = await c.session().semaphore("cx", 2).acquire_async(timeout=2)
        assert {x.slot, y.slot} == {0, 1}
        await x.release_async()
        await y.release_async()

    asyncio.run(main())


def test_the_loop_stays_free_while_acquire_async_waits() -> None:
    async def main() -> None:
        c = client()
        held = c.semaphore("loop", 1).acquire(timeout=5)
        await times_out_with_the_loop_free(lambda: c.session().semaphore("loop", 1).acquire_async(0.3))
        held.release()

    asyncio.run(main())


# ------------------------------------------------------------------ Ctrl-C


@pytest.mark.skipif(not hasattr(signal, "SIGINT") or sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_cancels_a_waiting_acquire() -> None:
    code = textwrap.dedent(
        """
        import sys, threading, time
        import dlock
        svc = dlock.MemoryService()
        c = dlock.Client(memory=svc)
        held = c.semaphore("ctl", 1).acquire(timeout=5)
        waiter = c.session().semaphore("ctl", 1)
        threading.Timer(0.2, lambda: print("waiting", flush=True)).start()
        try:
            waiter.acquire()          # forever, unless interrupted
            sys.exit(3)
        except KeyboardInterrupt:
            pass
        held.release()
        time.sleep(0.2)
        print("holder", svc.holder("ctl/slot/0"), flush=True)
        # nothing left behind: another handle gets the slot at once
        print("slot", c.session().semaphore("ctl", 1).acquire(timeout=2).slot, flush=True)
        """
    )
    lines, _ = interrupted(code, WITHIN)
    assert lines[:2] == ["holder None", "slot 0"], lines


# ----------------------------------------------------------------- README


def semaphores_block(lang: str) -> str:
    """The first ```LANG block of README.md's ``## Semaphores`` section."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Semaphores\n", 1)[1].split("\n## ", 1)[0]
    assert f"```{lang}\n" in section, f"README.md's Semaphores section has no {lang} block: update this test"
    return section.split(f"```{lang}\n", 1)[1].split("```", 1)[0]


def test_the_readme_block_runs_as_written() -> None:
    """README.md's Python block under ``## Semaphores``: its slots are
    distinct and each unit runs under its own slot's name and token."""
    code = semaphores_block("python")
    svc = dlock.MemoryService()
    seen: List[tuple] = []

    def use_gpu(slot: int, name: str, token: int) -> None:
        assert svc.holder(name) == token
        seen.append((slot, name, token))

    ns: dict = {"dlock": dlock, "client": client(svc), "use_gpu": use_gpu, "asyncio": asyncio}
    exec(compile(code, "README.md", "exec"), ns)
    assert seen, "the block ran no unit"
    for slot, name, _ in seen:
        assert name == f"gpu/slot/{slot}"
    assert holders(svc, "gpu", 4) == [None] * 4, "the block left a slot held"


# ------------------------------------------------------------------- etcd


@pytest.mark.skipif(not os.environ.get("DLOCK_TEST_ETCD"), reason="no etcd test cluster (DLOCK_TEST_ETCD unset)")
def test_on_etcd_n_plus_one_and_the_limit() -> None:
    members = os.environ["DLOCK_TEST_MEMBERS"]
    fast = dict(ttl=4.0, keepalive_interval=1.0, keepalive_timeout=0.5, retry_interval=0.5, margin=1.0)
    c = dlock.Client(members, **fast)  # type: ignore[arg-type]
    name = f"py-test/sem-{uuid.uuid4().hex[:12]}"
    sems = [c.session().semaphore(name, 2) for _ in range(3)]
    a = sems[0].acquire(timeout=WITHIN)
    b = sems[1].acquire(timeout=WITHIN)
    assert {a.slot, b.slot} == {0, 1}
    with pytest.raises(dlock.WouldBlock):
        sems[2].try_acquire()
    with pytest.raises(dlock.Timeout):
        sems[2].acquire(timeout=0.5)
    with pytest.raises(dlock.InvalidArgument) as e:
        c.semaphore(name, 3)
    assert "2" in str(e.value) and "3" in str(e.value)
    # the slot's key is etcd's lock key under the slot's name
    keys = etcdctl(members, "get", "--prefix", "--keys-only", f"{name}/slot/", timeout=WITHIN).split()
    assert sorted(k.rsplit("/", 1)[0] for k in keys) == [f"{name}/slot/0", f"{name}/slot/1"], keys
    b.release()
    with sems[2].acquire(timeout=WITHIN) as c3:
        assert c3.slot == b.slot
    a.release()
    c.shutdown()
