"""The Python face on the embedded backend: API, errors, callbacks, threads,
signals, asyncio, fork, exit and memory."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import List, Tuple

import pytest

import dlock
from dlock import _dlock
from shared import interrupted, times_out_with_the_loop_free

# Short timings so faults play out in about a second.
FAST = dict(ttl=2.0, keepalive_interval=0.5, keepalive_timeout=0.2, retry_interval=0.2, margin=0.5)
WITHIN = 10.0  # the bound of every wait for an event: far above what any takes


def client(**kw: object) -> dlock.Client:
    return dlock.Client(memory=dlock.MemoryService(), **kw)  # type: ignore[arg-type]


# ----------------------------------------------------------------- basics


def test_acquire_permit_release() -> None:
    c = client()
    lock = c.lock("jobs")
    assert lock.state is dlock.State.IDLE and lock.token is None
    token = lock.acquire(5)
    assert token >= 1 and lock.token == token and lock.state is dlock.State.HOLDING
    assert lock.time_left is not None and 0 < lock.time_left <= c.options()["ttl"]
    assert lock.deadline is not None and lock.deadline > dlock.now()
    with lock.permit() as p:
        assert p.token == token and p.valid() and p.remaining > 0
        assert lock.in_flight == 1
    assert not p.valid() and p.remaining == 0 and lock.in_flight == 0
    stats = lock.stats()
    assert stats.acquisitions == 1 and stats.in_flight == 0
    lock.release()
    assert lock.state is dlock.State.RELEASED
    with pytest.raises(dlock.Released) as e:
        lock.permit()
    assert e.value.code == "released"


def test_with_lock_acquires_or_raises_and_releases() -> None:
    c = client()
    with c.lock("w") as lock:
        assert lock.state is dlock.State.HOLDING
        other = c.lock("w")
        with pytest.raises(dlock.WouldBlock):
            other.try_acquire()
        with pytest.raises(dlock.Timeout) as e:
            other.acquire(0.2)
        assert isinstance(e.value, TimeoutError) and e.value.code == "timeout"
    assert lock.state is dlock.State.RELEASED
    ran = False
    holder = c.lock("w2")
    holder.acquire()
    with pytest.raises(dlock.Timeout):
        waiter = c.lock("w2")
        waiter.acquire(0.1)  # the body below must never run without the lock
        ran = True
    assert not ran


def test_body_exception_releases() -> None:
    c = client()
    lock = c.lock("boom")
    with pytest.raises(RuntimeError):
        with lock:
            raise RuntimeError("x")
    assert lock.state is dlock.State.RELEASED


def test_permit_refusals_are_permit_refused_with_codes() -> None:
    c = client()
    lock = c.lock("p")
    with pytest.raises(dlock.NotHeld) as e:
        lock.permit()
    assert isinstance(e.value, dlock.PermitRefused) and isinstance(e.value, dlock.Error)
    assert e.value.code == "not_held"
    # a failed keepalive drains (fast timings: within an interval)
    c2 = client(**FAST)
    l2 = c2.lock("p")
    drained = threading.Event()
    l2.on_state_change(lambda a, b, r: drained.set() if b is dlock.State.DRAINING else None)
    l2.acquire()
    assert c2.link is not None
    c2.link.fail_keepalives("cut")
    assert drained.wait(WITHIN)
    with pytest.raises(dlock.Draining) as d:
        l2.permit()
    assert d.value.code == "draining"


def test_fenced_refusal_after_lease_lost() -> None:
    c = client(**FAST)
    lock = c.lock("f")
    fenced = threading.Event()
    lock.on_fence(lambda token, in_flight: fenced.set())
    lock.acquire()
    svc_link = c.link
    assert svc_link is not None
    svc_link.partition()
    assert fenced.wait(WITHIN)
    with pytest.raises(dlock.PermitRefused) as e:
        lock.permit()
    assert e.value.code in ("fenced", "not_held")
    svc_link.heal()


def test_every_core_code_has_its_class() -> None:
    from dlock._errors import BY_CODE

    for word in _dlock.codes():
        if word in ("ok", "null_parameter"):
            continue
        cls = BY_CODE[word]
        assert cls.code == word and issubclass(cls, dlock.Error)
    for cls in (dlock.Draining, dlock.Fenced, dlock.Released, dlock.NotHeld):
        assert issubclass(cls, dlock.PermitRefused)
    assert issubclass(dlock.Timeout, TimeoutError)
    assert [s.value for s in dlock.State] == _dlock.states()


# ---------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    "kw",
    [
        dict(ttl=1.0),
        dict(ttl=-1.0),
        dict(ttl=float("nan")),
        dict(keepalive_interval=0.0),
        # Contradictions the user wrote (a setting left out never is one).
        dict(keepalive_interval=2.0, keepalive_timeout=2.0),
        dict(ttl=6.0, margin=6.0),
        dict(ttl=float("inf")),
    ],
)
def test_bad_options_are_invalid_option(kw: dict) -> None:
    with pytest.raises(dlock.InvalidOption) as e:
        client(**kw)
    assert isinstance(e.value, ValueError) and e.value.code == "invalid_option"


def test_left_out_options_follow_the_given_ones() -> None:
    # design §14: a 6 s TTL with a 2 s interval derives the rest.
    o = client(ttl=6.0, keepalive_interval=2.0).options()
    assert (o["keepalive_timeout"], o["retry_interval"], o["margin"]) == (0.8, 0.4, 1.0)


def test_bad_arguments() -> None:
    c = client()
    with pytest.raises(TypeError):
        c.lock(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        c.lock(b"bytes")  # type: ignore[arg-type]
    for bad in ("", "x" * (dlock.MAX_NAME_LEN + 1), "a\0b"):
        with pytest.raises(dlock.InvalidArgument) as e:
            c.lock(bad)
        assert isinstance(e.value, ValueError)
    lock = c.lock("ok")
    with pytest.raises(dlock.InvalidArgument):
        lock.acquire(-1)
    with pytest.raises(dlock.InvalidArgument):
        lock.acquire(float("nan"))
    with pytest.raises(TypeError):
        lock.acquire("soon")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        dlock.Client(memory=dlock.MemoryService(), ttl="15")  # type: ignore[arg-type]
    with pytest.raises(dlock.InvalidArgument):
        dlock.Client("not a url at all::")
    with pytest.raises(dlock.InvalidArgument):
        dlock.Client(ca_file="/nope.pem")
    with pytest.raises(dlock.InvalidArgument):
        dlock.Client("127.0.0.1:1", memory=dlock.MemoryService())
    with pytest.raises(TypeError):
        dlock.Client(12)  # type: ignore[arg-type]
    # the state is intact after every refusal
    assert lock.state is dlock.State.IDLE
    lock.acquire(1)
    with pytest.raises(dlock.AlreadyHeld) as e2:
        lock.acquire(1)
    assert e2.value.code == "already_held"
    with pytest.raises(TypeError):
        lock.guarded_put(lock.token or 0, 5, b"v")  # type: ignore[arg-type]
    # A list of ints is no bytes: refused, not stored as b"" (a property
    # test found `[]` stored as b"").
    for not_bytes in ([], [118], (118,)):
        with pytest.raises(TypeError):
            lock.guarded_put(lock.token or 0, b"k", not_bytes)  # type: ignore[arg-type]
    with pytest.raises(dlock.InvalidArgument):
        lock.guarded_put(lock.token or 0, b"", b"v")
    assert lock.state is dlock.State.HOLDING



def test_a_postgres_url_as_endpoints_is_decided_by_the_core() -> None:
    # Nothing listens on port 1: the error names PostgreSQL, so the core
    # took the URL as PostgreSQL (an etcd list would refuse its scheme).
    with pytest.raises(dlock.BackendError) as e:
        dlock.Client("postgresql://dlock@127.0.0.1:1/db", connect_timeout=0.5)
    assert "PostgreSQL at 127.0.0.1:1" in str(e.value)
    with pytest.raises(dlock.BackendError):
        dlock.Client(["postgres://dlock@127.0.0.1:1/db"], password="pw")
    # Misplaced settings: one clear error before anything connects.
    with pytest.raises(dlock.InvalidArgument, match="cert_file"):
        dlock.Client("postgres://h/db", cert_file="/tmp/c.pem")
    with pytest.raises(dlock.InvalidArgument, match="only endpoint"):
        dlock.Client(["postgres://h/db", "127.0.0.1:2379"])
    with pytest.raises(dlock.InvalidArgument, match="sslmode"):
        dlock.Client("postgres://h/db?sslmode=disable", ca_file="/tmp/ca.pem")

# --------------------------------------------------------------- callbacks


def test_callbacks_in_order_and_exceptions_logged(caplog: pytest.LogCaptureFixture) -> None:
    c = client(**FAST)
    lock = c.lock("cb")
    seen: List[Tuple[str, object]] = []
    done = threading.Event()

    @lock.on_acquired
    def acquired(token: int) -> None:
        seen.append(("acquired", token))
        raise RuntimeError("a callback that raises")

    @lock.on_state_change
    def changed(old: dlock.State, new: dlock.State, reason: str) -> None:
        seen.append(("state", (old, new, reason)))
        if new is dlock.State.RELEASED:
            done.set()

    assert callable(acquired) and callable(changed)  # decorators give the function back
    with caplog.at_level(logging.ERROR, logger="dlock"):
        token = lock.acquire()
        # the keepalive goes on: several intervals later the lock is held
        time.sleep(3 * 0.5)
        assert lock.state is dlock.State.HOLDING and lock.stats().fences_deadline == 0
        lock.release()
        assert done.wait(WITHIN)
    assert ("acquired", token) in seen
    assert seen[0] == ("state", (dlock.State.IDLE, dlock.State.ACQUIRING, "acquire"))
    assert seen[-1][1] == (dlock.State.HOLDING, dlock.State.RELEASED, "release")
    records = [r for r in caplog.records if r.name == "dlock"]
    assert records and "on_acquired" in records[0].getMessage()
    assert records[0].exc_info is not None and "a callback that raises" in str(records[0].exc_info[1])


def test_callback_may_release_its_lock() -> None:
    c = client()
    lock = c.lock("self-release")
    released = threading.Event()

    @lock.on_acquired
    def release_now(token: int) -> None:
        lock.release()
        released.set()

    lock.acquire()
    assert released.wait(WITHIN)
    assert lock.state is dlock.State.RELEASED


def test_fence_then_reacquire_with_higher_token() -> None:
    c = client(**FAST)
    lock = c.lock("re")
    tokens: List[int] = []
    fences: List[Tuple[int, int]] = []
    again = threading.Event()
    lock.on_fence(lambda t, n: fences.append((t, n)))

    @lock.on_acquired
    def got(t: int) -> None:
        tokens.append(t)
        if len(tokens) == 2:
            again.set()

    first = lock.acquire()
    assert c.link is not None
    c.link.declare_lease_lost()
    assert again.wait(WITHIN)
    assert fences == [(first, 0)] and tokens[1] > first
    assert lock.state is dlock.State.HOLDING


def test_handlers_add_up_and_a_non_callable_is_a_type_error() -> None:
    """Issue 32, item 5: a second ``on_fence`` / ``on_acquired`` (and every
    other ``on_*``) adds a handler beside the first, called in the order
    registered; a handler that is not callable is a ``TypeError`` at once,
    not a log line at the fence."""
    svc = dlock.MemoryService()
    c = dlock.Client(memory=svc, **FAST)  # type: ignore[arg-type]
    lock = c.lock("handlers")
    seen: List[str] = []
    done = threading.Event()
    for register in (lock.on_fence, lock.on_acquired, lock.on_drained, lock.on_event, lock.on_state_change):
        for bad in (42, None, "f"):
            with pytest.raises(TypeError):
                register(bad)  # type: ignore[arg-type]

    @lock.on_fence
    def fence_1(t: int, n: int) -> None:
        seen.append("fence 1")

    @lock.on_fence
    def fence_2(t: int, n: int) -> None:
        seen.append("fence 2")

    @lock.on_acquired
    def acquired_1(t: int) -> None:
        seen.append("acquired 1")

    @lock.on_acquired
    def acquired_2(t: int) -> None:
        seen.append("acquired 2")
        if seen.count("acquired 2") == 2:
            done.set()

    lock.acquire()
    assert svc.delete_lock_key("handlers")
    assert done.wait(WITHIN)
    assert seen == ["acquired 1", "acquired 2", "fence 1", "fence 2", "acquired 1", "acquired 2"]
    lock.release()


def test_events_iterator_ends_with_close() -> None:
    c = client()
    lock = c.lock("ev")
    events = lock.events()
    token = lock.acquire()
    lock.close()
    lines = [str(e) for e in events]
    assert lines == [
        "state Idle->Acquiring acquire",
        "state Acquiring->Holding acquired",
        f"acquired token={token}",
        "state Holding->Released release",
    ]
    quiet = c.lock("quiet")
    with pytest.raises(dlock.Timeout):
        quiet.events().next(0.05)


def test_async_for_events() -> None:
    async def main() -> List[str]:
        c = client()
        lock = c.lock("aev")
        events = lock.events()
        await lock.acquire_async()
        await lock.close_async()
        return [e.kind async for e in events]

    assert asyncio.run(main()) == ["state", "state", "acquired", "state"]


def test_a_cancelled_async_read_loses_no_event() -> None:
    async def main() -> List[str]:
        c = client()
        lock = c.lock("acancel")
        events = lock.events()
        it = events.__aiter__()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(it.__anext__(), 0.05)  # nothing happens yet
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(it.__anext__(), 0.05)  # joins the first read
        await lock.acquire_async()
        await lock.close_async()
        return [str(e) async for e in it]

    lines = asyncio.run(main())
    assert lines[:2] == ["state Idle->Acquiring acquire", "state Acquiring->Holding acquired"]
    assert lines[-1] == "state Holding->Released release" and len(lines) == 4


# ------------------------------------------------------- threads, signals


def test_other_threads_run_during_a_blocking_acquire() -> None:
    c = client()
    holder = c.lock("busy")
    holder.acquire()
    waiter = c.lock("busy")
    result: List[object] = []
    t = threading.Thread(target=lambda: result.append(waiter.acquire(WITHIN)))
    t.start()
    # this thread keeps running Python while the other waits
    ticks = 0
    until = time.monotonic() + 0.3
    while time.monotonic() < until:
        ticks += 1
    assert ticks > 1000 and t.is_alive()
    holder.release()
    t.join(WITHIN)
    assert result and isinstance(result[0], int)


def test_ctrl_c_interrupts_a_blocking_acquire() -> None:
    code = textwrap.dedent(
        """
        import sys, threading, time, dlock
        c = dlock.Client(memory=dlock.MemoryService())
        holder = c.lock("held"); holder.acquire()
        waiter = c.lock("held")
        released = threading.Event()
        # told from the callback thread once the acquire is under way
        def changed(old, new, why):
            if new is dlock.State.ACQUIRING:
                print("waiting", flush=True)
            if new is dlock.State.RELEASED:
                released.set()
        waiter.on_state_change(changed)
        try:
            waiter.acquire()          # forever, unless interrupted
            sys.exit(3)
        except KeyboardInterrupt:
            # the core decides the cancel on its driver, just after
            print("interrupted", released.wait(5) and waiter.state.value, flush=True)
        holder.release()
        # no lock left behind: the cancelled acquire holds nothing
        other = c.lock("held"); other.acquire(2)
        print("free", flush=True)
        """
    )
    lines, took = interrupted(code, WITHIN)
    assert lines[0] == "interrupted Released" and "free" in lines, lines
    assert took < 2.0, f"the interrupt took {took:.2f} s"


def test_exit_while_callbacks_release_the_gil_never_aborts() -> None:
    """The exit's shutdown releases every lock: their state callbacks run
    on the core's callback thread while the interpreter finalizes. A
    callback that released the GIL (any I/O) and took it back then was
    ended by pthread_exit through Rust frames: the process aborted (10 of
    10 runs of this). The exit hook now lets no core thread into Python
    once it ran, and waits for those inside."""
    code = textwrap.dedent(
        """
        import time, dlock
        c = dlock.Client(memory=dlock.MemoryService())
        locks = [c.lock(f"exit/{i}") for i in range(40)]
        def busy(old, new, why):
            time.sleep(0.005)  # the GIL released inside a callback
        for lock in locks:
            lock.on_state_change(busy)
            lock.acquire(5)
        print("exiting", flush=True)
        """
    )
    # One run: it aborted every time before the fix.
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=WITHIN)
    assert (out.returncode, out.stdout) == (0, "exiting\n"), out.stderr


# ---------------------------------------------------------------- asyncio


def test_asyncio_acquire_release_and_async_with() -> None:
    async def main() -> None:
        c = client()
        lock = c.lock("a")
        token = await lock.acquire_async(5)
        assert lock.token == token
        await lock.release_async()
        async with c.lock("a") as l2:
            assert l2.state is dlock.State.HOLDING
        assert l2.state is dlock.State.RELEASED

    asyncio.run(main())


def test_asyncio_cancellation_leaves_no_lock() -> None:
    async def main() -> None:
        c = client()
        svc = c.memory
        assert svc is not None
        holder = c.lock("c")
        await holder.acquire_async()
        waiter = c.lock("c")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(waiter.acquire_async(), 0.2)
        # the cancellation ended once the core had answered it
        assert waiter.state is dlock.State.RELEASED
        await holder.release_async()
        # nobody holds it now: a third handle gets it at once
        third = c.lock("c")
        await third.acquire_async(1)
        assert svc.holder("c") == third.token
        # a cancelled acquire that had already won releases too
        t = asyncio.ensure_future(c.lock("d").acquire_async())
        await asyncio.sleep(0)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        probe = c.lock("d")
        await probe.acquire_async(2)

    asyncio.run(main())


def test_asyncio_timeout_error_and_loop_stays_free() -> None:
    async def main() -> None:
        c = client()
        held = c.lock("t")
        held.acquire()
        await times_out_with_the_loop_free(lambda: c.lock("t").acquire_async(0.3))

    asyncio.run(main())


# -------------------------------------------------------------- fork, exit


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # 3.12+: the very case tested
def test_fork_child_raises_forked_and_leaves_the_parent_lock() -> None:
    c = client()
    lock = c.lock("fork")
    token = lock.acquire()
    permit = lock.permit()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report by exit code only
        code = 0
        try:
            if permit.valid():
                code |= 16
            permit.end()
            for call in (
                lock.permit,
                lock.release,
                lock.close,
                lambda: lock.acquire(1),
                lambda: c.lock("x"),
                # issue 32, 4: the getters say so too, and a new client
                # is refused while an inherited one lives
                c.metrics_text,
                lambda: lock.healthy(1.0),
                lambda: dlock.Client(**FAST),  # type: ignore[arg-type]
            ):
                try:
                    call()
                    code |= 1
                except dlock.Forked as e:
                    if e.code != "forked":
                        code |= 2
            if not dlock.forked():
                code |= 4
            del lock
            gc.collect()
        except BaseException:
            code |= 8
        os.write(w, b"x")
        os._exit(code)
    os.close(w)
    os.read(r, 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    # the parent still holds, with the same token
    assert lock.state is dlock.State.HOLDING and lock.token == token
    assert permit.valid()
    permit.end()
    with lock.permit():
        pass
    assert not dlock.forked()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
@pytest.mark.parametrize("before", ["import", "dropped client"])
def test_a_child_forked_after_import_makes_clients(before: str) -> None:
    """Issue 32, 4: a child forked from a process that only imported dlock
    (gunicorn --preload, celery prefork, multiprocessing with fork), or
    whose clients were all dropped, makes clients and locks of its own; it
    is not `forked()`. In a fresh interpreter, so that no client of this
    test process is inherited."""
    code = textwrap.dedent(
        """
        import gc, os, sys
        import dlock
        if sys.argv[1] == "dropped client":
            c = dlock.Client()
            with c.lock("parent"):
                pass
            del c
            gc.collect()
        pid = os.fork()
        if pid == 0:
            try:
                assert not dlock.forked()
                svc = dlock.MemoryService()
                c = dlock.Client(memory=svc)
                lock = c.lock("child")
                token = lock.acquire(5)
                with lock.permit() as p:
                    assert p.token == token and svc.holder("child") == token
                assert "dlock_acquisitions_total" in c.metrics_text()
                assert lock.healthy(1.0)
                lock.release()
                assert svc.holder("child") is None
                code = 0
            except BaseException as e:
                print("child:", repr(e), flush=True)
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
        """
    )
    r = subprocess.run([sys.executable, "-c", code, before], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_exit_while_holding_releases() -> None:
    # The check is registered before dlock is imported, so (atexit runs
    # last-in first-out) it runs after dlock's own exit handler.
    code = textwrap.dedent(
        """
        import atexit
        state = {}
        atexit.register(lambda: print("holder", state["svc"].holder("held"), flush=True))
        import dlock
        svc = state["svc"] = dlock.MemoryService.named("exit")
        lock = dlock.Client(memory=svc).lock("held")
        lock.acquire()
        print("holder", svc.holder("held"), flush=True)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=WITHIN)
    assert out.returncode == 0, out.stderr
    held, after = out.stdout.split("\n")[:2]
    assert held != "holder None" and after == "holder None", out.stdout


def test_shutdown_releases_everything_and_handles_behave_as_closed() -> None:
    # Process-wide, so in a process of its own.
    code = textwrap.dedent(
        """
        import asyncio, dlock
        svc = dlock.MemoryService()
        c = dlock.Client(memory=svc)
        a = c.lock("a"); a.acquire()
        s = c.session(); b = s.lock("b"); b.acquire()
        idle = c.lock("idle")
        dlock.shutdown()
        assert svc.holder("a") is None and svc.holder("b") is None, "still held"
        for lock in (a, b):
            try:
                lock.permit(); raise SystemExit("permit after shutdown")
            except dlock.Released:
                pass
            lock.release(); lock.close()       # harmless
        try:
            idle.acquire(1); raise SystemExit("acquired after shutdown")
        except dlock.Shutdown as e:
            assert e.code == "shutdown"
        try:
            asyncio.run(c.lock("async").acquire_async(1)); raise SystemExit("async acquire after shutdown")
        except dlock.Shutdown:
            pass
        dlock.shutdown()                       # twice is harmless
        # a client made afterwards works
        c2 = dlock.Client(memory=svc)
        with c2.lock("a"):
            pass
        print("ok", flush=True)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=WITHIN)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_client_shutdown_ends_only_its_own_sessions() -> None:
    svc = dlock.MemoryService()
    mine, other = dlock.Client(memory=svc), dlock.Client(memory=svc)
    a, b = mine.lock("mine"), other.lock("other")
    a.acquire()
    b.acquire()
    mine.shutdown()
    assert svc.holder("mine") is None and svc.holder("other") == b.token
    with pytest.raises(dlock.Shutdown):
        mine.lock("again").acquire(1)
    with b.permit():
        pass
    b.release()


def test_no_executor_thread_of_the_face() -> None:
    # Async calls complete through the core's callbacks: no bridge thread.
    async def main() -> None:
        lock = client().lock("threads")
        await lock.acquire_async()
        await lock.release_async()

    asyncio.run(main())
    names = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm") as f:
            names.add(f.read().strip())
    assert "dlock-asyncio" not in names and "dlock-callbacks" in names, names


# ------------------------------------------------------------------ misc


def test_sessions_share_fate_and_close() -> None:
    c = client(**FAST)
    s = c.session()
    a, b = s.lock("s/a"), s.lock("s/b")
    a.acquire()
    b.acquire()
    assert s.stats().locks == 2 and s.lease is not None and a.session.lease == s.lease
    assert not s.is_default and c.default_session.is_default
    with pytest.raises(dlock.InvalidArgument):
        c.default_session.close()
    s.close()
    assert a.state is dlock.State.RELEASED and b.state is dlock.State.RELEASED
    with pytest.raises(dlock.Released):
        s.lock("s/c")


def test_fence_gate_and_guarded_writes_on_memory() -> None:
    gate = dlock.FenceGate()
    gate.admit("n", 2)
    with pytest.raises(dlock.Stale) as e:
        gate.admit("n", 1)
    assert e.value.code == "stale" and e.value.token == 1 and e.value.highest == 2
    assert gate.highest("n") == 2 and gate.highest("m") is None

    c = client()
    lock = c.lock("g")
    token = lock.acquire()
    lock.guarded_put(token, b"g-result", b"v1")
    assert c.memory is not None and c.memory.get(b"g-result") == b"v1"
    with pytest.raises(dlock.Fenced) as f:
        lock.guarded_put(token + 100, "g-result", "v2")
    assert f.value.code == "fenced" and f.value.token == token + 100
    with pytest.raises(dlock.InvalidArgument):
        lock.guarded_put(token, b"g/inside", b"v")
    lock.guarded_delete(token, b"g-result")
    assert c.memory.get(b"g-result") is None


def test_environment_without_endpoints_is_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DLOCK_ENDPOINTS", raising=False)
    c = dlock.Client()
    assert c.link is not None and c.memory is not None
    monkeypatch.setenv("DLOCK_ENDPOINTS", "not a url::")
    with pytest.raises(dlock.InvalidArgument):
        dlock.Client()


def test_memory_stays_flat_over_many_permits_and_locks() -> None:
    def rss_kib() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    c = client()
    lock = c.lock("leak")
    lock.acquire()

    def round_() -> None:
        for _ in range(10_000):
            with lock.permit():
                pass
        for i in range(1_000):
            c.lock(f"leak/{i % 10}")
        gc.collect()

    for _ in range(3):  # warm up allocator pools
        round_()
    before = rss_kib()
    for _ in range(5):
        round_()
    grown = rss_kib() - before
    assert lock.in_flight == 0
    # 50,000 permits and 5,000 locks: a leak of even 100 bytes each would show
    assert grown < 2048, f"RSS grew {grown} KiB"
    assert sys.getrefcount(lock) <= 3


# ----------------------------------------------------------------- holder identity


def test_holder_names_another_clients_identity() -> None:
    svc = dlock.MemoryService()
    a = dlock.Client(memory=svc, description="nightly backup")
    b = dlock.Client(memory=svc)
    seen = b.lock("jobs")
    assert seen.holder() is None
    held = a.lock("jobs")
    token = held.acquire(5)
    h = seen.holder()
    assert h is not None and h["token"] == token and h["key"].startswith("jobs/")
    ident = h["identity"]
    assert ident["description"] == "nightly backup" and ident["pid"] == os.getpid()
    assert ident["face"] == "python" and ident["host"] and ident["started"] > 0
    assert set(ident) == {"host", "pid", "started", "face", "version", "description"}
    held.release()
    assert seen.holder() is None
    with pytest.raises(dlock.InvalidOption, match="description"):
        dlock.Client(memory=svc, description="two\nlines")
