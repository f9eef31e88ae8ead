"""The Python face of the shared scenario runner.

The runner (``libdlock_scenarios.so``, the C ABI of ``scenarios/runner``,
header ``ffi-c/tests/c/scenario_runner.h``) parses the files, keeps the
time, does the waits, judges every expectation and the trace. This file is
only the step dispatch, through dlock's public Python API, bound with
``ctypes``. Nothing of it is in the wheel.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import threading
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_bool,
    c_char_p,
    c_int,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import Callable, Dict, List, Optional, Tuple

import dlock


class Settings(Structure):
    _fields_ = [
        ("ttl_ms", c_uint64),
        ("keepalive_interval_ms", c_uint64),
        ("keepalive_timeout_ms", c_uint64),
        ("retry_interval_ms", c_uint64),
        ("margin_ms", c_uint64),
    ]


class Scenario(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("about", c_char_p),
        ("settings", Settings),
        ("holders", POINTER(c_char_p)),
        ("n_holders", c_size_t),
        ("holder_client", POINTER(c_char_p)),
        ("holder_session", POINTER(c_char_p)),
        ("holder_lock", POINTER(c_char_p)),
        ("holder_role", POINTER(c_char_p)),
        ("holder_limit", POINTER(c_uint32)),
    ]


class StepC(Structure):
    _fields_ = [
        ("what", c_int),
        ("do_name", c_char_p),
        ("holder", c_char_p),
        ("label", c_char_p),
        ("fault", c_int),
        ("fault_name", c_char_p),
        ("ms", c_uint64),
        ("value", c_char_p),
    ]


class Observed(Structure):
    _fields_ = [
        ("kind", c_int),
        ("word", c_char_p),
        ("flag", c_bool),
        ("has_token", c_bool),
        ("token", c_uint64),
        ("lines", POINTER(c_char_p)),
        ("n_lines", c_size_t),
        ("error", c_char_p),
    ]


WARM_UP = CFUNCTYPE(None, c_void_p)
SETUP = CFUNCTYPE(c_int, c_void_p, POINTER(Scenario), c_void_p, POINTER(c_char_p))
PERFORM = CFUNCTYPE(c_int, c_void_p, POINTER(StepC), POINTER(Observed))
TEARDOWN = CFUNCTYPE(None, c_void_p)


class FaceC(Structure):
    _fields_ = [
        ("ctx", c_void_p),
        ("warm_up", WARM_UP),
        ("setup", SETUP),
        ("perform", PERFORM),
        ("teardown", TEARDOWN),
    ]


# enum lks_do / lks_fault / lks_saw
(
    ACQUIRE,
    TRY_ACQUIRE,
    PERMIT,
    END,
    VALID,
    STATE,
    TOKEN,
    RELEASE,
    FAULT,
    STALL,
    CLOSE,
    EVENTS,
    ACQUIRE_START,
    CANCEL,
    SHUTDOWN,
    CAMPAIGN,
    PROCLAIM,
    RESIGN,
    LEADER,
    OBSERVE,
    DOWNGRADE,
    MODE,
    SLOT,
    SEMAPHORE,
) = range(24)
SAW_DONE, SAW_WORD, SAW_BOOL, SAW_TOKEN, SAW_PERMIT, SAW_EVENTS, SAW_UNSUPPORTED, SAW_LEADER, SAW_SLOT = range(9)
# lks_play_dir_with's `plays`: this face plays elections, read/write locks and semaphores
PLAYS_ELECTIONS, PLAYS_RWLOCKS, PLAYS_SEMAPHORES = 1, 2, 4
WAIT_LIMIT = 10.0


class Holder:
    def __init__(
        self,
        client: dlock.Client,
        lock: Optional[dlock.Lock],
        link: dlock.Link,
        events: Optional[dlock.Events],
        election: str = "",
        semaphore: Optional[dlock.Semaphore] = None,
        session: Optional[dlock.Session] = None,
    ) -> None:
        self.client = client
        self._lock = lock
        self.link = link
        self._events = events
        self.election = election  # an observer's election
        # a semaphore holder's handle; _lock is the slot it won, None before
        self.semaphore = semaphore
        self.session = session  # a semaphore holder's (another handle's)
        self.observer: Optional[dlock.Observer] = None
        # the last acquire_start: its task on the face's loop, its acquisition
        self.task: Optional["concurrent.futures.Future[None]"] = None
        self.acquisition: Optional[dlock._dlock.Acquisition] = None

    @property
    def lock(self) -> dlock.Lock:
        """The holder's lock, its election (which is a lock), or the slot
        its semaphore won (a lock too)."""
        if self._lock is None:
            raise ValueError("no slot won yet" if self.semaphore else "an observer has no lock")
        return self._lock

    @property
    def candidate(self) -> dlock.Election:
        if not isinstance(self._lock, dlock.Election):
            raise ValueError("the holder is not an election candidate")
        return self._lock

    @property
    def events(self) -> dlock.Events:
        if self._events is None:
            raise ValueError("an observer has no lock events")
        return self._events


class PythonFace:
    """Plays steps through the public API of ``dlock``."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.lib.lks_trace.argtypes = [c_void_p, c_char_p]
        self.lib.lks_trace.restype = None
        self.service: Optional[dlock.MemoryService] = None
        self.holders: Dict[str, Holder] = {}
        self.permits: Dict[str, dlock.Permit] = {}
        self.threads: List[threading.Thread] = []
        self.keep: List[object] = []  # strings the runner reads until perform returns
        self.error: Optional[bytes] = None
        self.sink: int = 0  # the runner's trace sink of the scenario played
        # the asyncio loop of acquire_start's tasks (started when first needed)
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.loop_thread: Optional[threading.Thread] = None

    # -- the vtable

    def warm_up(self, _ctx: Optional[int]) -> None:
        # Every path once (driver, callback thread, asyncio completion), before
        # any scenario's clock starts.
        c = dlock.Client(memory=dlock.MemoryService())
        lock = c.lock("warm-up")
        lock.on_event(lambda e: None)
        lock.acquire(WAIT_LIMIT)
        with lock.permit():
            pass
        lock.close()

    def setup(self, _ctx: Optional[int], sp: "ctypes._Pointer[Scenario]", sink: int, err: "ctypes._Pointer[c_char_p]") -> int:
        try:
            self._setup(sp.contents, sink)
            return 0
        except Exception as e:  # reported by the runner as the scenario's failure
            self.error = f"setup: {type(e).__name__}: {e}".encode()
            err[0] = self.error
            return 1

    def _setup(self, s: Scenario, sink: int) -> None:
        st = s.settings
        timing = dict(
            ttl=st.ttl_ms / 1000,
            keepalive_interval=st.keepalive_interval_ms / 1000,
            keepalive_timeout=st.keepalive_timeout_ms / 1000,
            retry_interval=st.retry_interval_ms / 1000,
            margin=st.margin_ms / 1000,
            reacquire=True,
        )
        service = dlock.MemoryService()
        clients: Dict[str, dlock.Client] = {}
        sessions: Dict[Tuple[str, str], dlock.Session] = {}
        lib = self.lib
        for i in range(s.n_holders):
            name = s.holders[i].decode()
            cw, sw, lock_name = (s.holder_client[i].decode(), s.holder_session[i].decode(), s.holder_lock[i].decode())
            client = clients.get(cw)
            if client is None:
                client = clients[cw] = dlock.Client(memory=service, **timing)  # type: ignore[arg-type]
            session = sessions.get((cw, sw))
            if session is None:
                session = client.default_session if sw == "default" else client.session(**timing)  # type: ignore[arg-type]
                sessions[(cw, sw)] = session
            prefix = name + " "
            role = s.holder_role[i].decode()
            link = client.link
            assert link is not None
            if role == "observe":
                self.holders[name] = Holder(client, None, link, None, lock_name)
                continue
            if role == "semaphore":  # no lock until its acquire wins a slot (_took)
                sem = session.semaphore(lock_name, s.holder_limit[i])
                self.holders[name] = Holder(client, None, link, None, semaphore=sem, session=session)
                continue
            lock: dlock.Lock
            if role == "election":
                lock = session.election(lock_name)
            elif role in ("read", "write"):  # a read/write lock's reader or writer: a Lock
                rw = session.rwlock(lock_name)
                lock = rw.reader() if role == "read" else rw.writer()
            else:
                lock = session.lock(lock_name)

            def push(e: dlock.Event, prefix: str = prefix) -> None:
                lib.lks_trace(sink, (prefix + str(e)).encode())

            lock.on_event(push)
            self.holders[name] = Holder(client, lock, link, lock.events())
        self.service = service
        self.sink = sink

    def perform(self, _ctx: Optional[int], stp: "ctypes._Pointer[StepC]", op: "ctypes._Pointer[Observed]") -> int:
        self.keep = []
        try:
            self._perform(stp.contents, op.contents)
            return 0
        except Exception as e:
            self.error = f"{stp.contents.do_name.decode()}: {type(e).__name__}: {e}".encode()
            op.contents.error = self.error
            return 1

    def word(self, out: Observed, kind: int, w: str) -> None:
        b = w.encode()
        self.keep.append(b)
        out.kind = kind
        out.word = b

    def ok_or_code(self, out: Observed, call: Callable[[], object]) -> None:
        """The word of a step answered "ok" or the status word: the error's
        ``code``."""
        try:
            call()
            self.word(out, SAW_WORD, "ok")
        except dlock.Error as e:
            self.word(out, SAW_WORD, e.code)

    def _perform(self, step: StepC, out: Observed) -> None:
        holder = step.holder.decode() if step.holder else ""
        label = step.label.decode() if step.label else None
        what = step.what
        if holder and self.holders[holder].semaphore is not None and self._semaphore_step(holder, step, out):
            return
        if what == ACQUIRE:
            lock = self.holders[holder].lock

            def acquire() -> None:
                try:
                    lock.acquire(WAIT_LIMIT)
                except dlock.Error:
                    pass  # the outcome shows in the trace

            t = threading.Thread(target=acquire, daemon=True)
            t.start()
            self.threads.append(t)
        elif what == TRY_ACQUIRE:
            self.ok_or_code(out, self.holders[holder].lock.try_acquire)
        elif what == PERMIT:
            try:
                p = self.holders[holder].lock.permit()
            except dlock.PermitRefused as r:
                self.word(out, SAW_PERMIT, r.code)
                return
            self.word(out, SAW_PERMIT, "granted")
            out.token = p.token
            out.has_token = True
            if label is not None:
                self.permits[label] = p
            else:
                p.end()
        elif what == END:
            assert label is not None
            self.permits.pop(label).end()
        elif what == VALID:
            assert label is not None
            out.kind = SAW_BOOL
            out.flag = self.permits[label].valid()
        elif what == STATE:
            self.word(out, SAW_WORD, self.holders[holder].lock.state.value)
        elif what == TOKEN:
            out.kind = SAW_TOKEN
            token = self.holders[holder].lock.token
            out.has_token = token is not None
            out.token = token or 0
        elif what == RELEASE:
            self.holders[holder].lock.release()
        elif what == STALL:
            dlock.stall_driver(step.ms / 1000)
        elif what == FAULT:
            self._fault(holder, step)
        elif what == CLOSE:
            self.holders[holder].lock.close()
        elif what == EVENTS:
            # Read as many events as the step expects: the runner passes that
            # count in `ms`.
            h = self.holders[holder]
            lines = []
            for _ in range(step.ms):
                e = h.events.next(WAIT_LIMIT)
                if e is None:
                    break
                lines.append(str(e).encode())
            arr = (c_char_p * max(1, len(lines)))(*lines)
            self.keep += [lines, arr]
            out.kind = SAW_EVENTS
            out.lines = arr
            out.n_lines = len(lines)
        elif what == ACQUIRE_START:
            self._acquire_start(self.holders[holder])
        elif what == CANCEL:
            h = self.holders[holder]
            if h.task is not None and not h.task.done():
                h.task.cancel()  # the task's CancelledError cancels the acquisition
            elif h.acquisition is not None:
                # Finished: asyncio ignores cancel() on a finished task, so this
                # is the acquisition's cancel as a cancellation that meets a
                # just-arrived result calls it (the core releases the token).
                h.acquisition.cancel()
        elif what == SHUTDOWN:
            self.holders[holder].client.shutdown()
        elif what == CAMPAIGN:
            self._background(lambda e=self.holders[holder].candidate, v=step.value: e.campaign(v, WAIT_LIMIT))
        elif what == PROCLAIM:
            self.ok_or_code(out, lambda: self.holders[holder].candidate.proclaim(step.value))
        elif what == RESIGN:
            self._background(lambda e=self.holders[holder].candidate, g=step.ms / 1000: e.resign(g))
        elif what == LEADER:
            leader = self.holders[holder].candidate.leader()
            out.kind = SAW_LEADER
            if leader is not None:
                self.keep.append(leader.value)
                out.word = leader.value
                out.has_token = True
                out.token = leader.token
        elif what == OBSERVE:
            self._observe(holder, self.holders[holder])
        elif what == DOWNGRADE:
            self.ok_or_code(out, self.holders[holder].lock.downgrade)
        elif what == MODE:
            mode = self.holders[holder].lock.mode
            if mode is None:
                raise ValueError(f"{holder} is not a read/write lock holder")
            self.word(out, SAW_WORD, mode)
        else:
            raise ValueError(f"unknown step {what}")

    def _took(self, name: str, lock: dlock.Lock) -> None:
        """A semaphore holder's slot won: kept (a step on it may follow a
        ``wait`` on the line at once), traced ``took slot=I lock=NAME``, then
        its events traced as a lock's."""
        h = self.holders[name]
        if h._lock is not None:
            lock.release()
            raise ValueError(f"{name} won a second slot")
        h._lock = lock
        self.lib.lks_trace(self.sink, f"{name} took slot={lock.slot} lock={lock.name}".encode())
        lib, sink, prefix = self.lib, self.sink, name + " "
        lock.on_event(lambda e: lib.lks_trace(sink, (prefix + str(e)).encode()))

    def _semaphore_step(self, name: str, step: StepC, out: Observed) -> bool:
        """The steps a semaphore holder takes through its handle; False for
        the others (a lock step on the slot won, a fault on its link)."""
        h = self.holders[name]
        sem = h.semaphore
        assert sem is not None
        what = step.what
        if what == ACQUIRE:

            def acquire() -> None:
                try:
                    lock = sem.acquire(WAIT_LIMIT)
                except dlock.Error as e:
                    self.lib.lks_trace(self.sink, f"{name} acquire failed: {e.code}".encode())
                    return
                self._took(name, lock)

            t = threading.Thread(target=acquire, daemon=True)
            t.start()
            self.threads.append(t)
        elif what == TRY_ACQUIRE:
            # A refusal is no acquire that failed: not traced.
            self.ok_or_code(out, lambda: self._took(name, sem.try_acquire()))
        elif what == SLOT:
            out.kind = SAW_SLOT
            if h._lock is not None:
                slot = h._lock.slot
                if slot is None:
                    raise ValueError(f"{name}'s lock is no semaphore slot")
                out.has_token = True
                out.token = slot
                self.word(out, SAW_SLOT, h._lock.name)
        elif what == SEMAPHORE:
            # Another handle of the name on the holder's session.
            session = h.session
            assert session is not None
            self.ok_or_code(out, lambda: session.semaphore(sem.name, step.ms))
        else:
            return False
        return True

    def _background(self, work: Callable[[], object]) -> None:
        """``work`` on a thread of its own, as an acquire step; its outcome
        shows in the trace."""

        def run() -> None:
            try:
                work()
            except dlock.Error:
                pass

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.threads.append(t)

    def _observe(self, name: str, h: Holder) -> None:
        """``client.observe(name)``: each event a trace line, read by a
        thread until the observer is closed."""
        o = h.observer = h.client.observe(h.election)
        prefix = f"{name} observed "
        lib, sink = self.lib, self.sink

        def read() -> None:
            while True:
                e = o.next_event(None)
                if e is None:
                    return
                leader = e.leader
                line = e.kind
                if leader is not None:
                    line += f" value={leader.value.decode()} token={leader.token}"
                lib.lks_trace(sink, (prefix + line).encode())

        t = threading.Thread(target=read, daemon=True)
        t.start()
        self.threads.append(t)

    def _face_loop(self) -> asyncio.AbstractEventLoop:
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
            self.loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True)
            self.loop_thread.start()
        return self.loop

    def _acquire_start(self, h: Holder) -> None:
        """An acquire task on the face's loop: ``acquire_async``'s own body,
        keeping the Acquisition for a cancel after success."""
        loop = self._face_loop()
        started = threading.Event()

        async def acquire() -> None:
            fut: "asyncio.Future[int]" = loop.create_future()
            acquisition = h.acquisition = h.lock._acquire_start(WAIT_LIMIT, loop, fut)
            started.set()
            try:
                await fut
            except dlock.Error:
                pass  # the outcome shows in the trace
            except asyncio.CancelledError:
                acquisition.cancel()
                raise

        h.task = asyncio.run_coroutine_threadsafe(acquire(), loop)
        if not started.wait(WAIT_LIMIT):
            raise RuntimeError("acquire_start: the task did not start")

    def _fault(self, holder: str, step: StepC) -> None:
        h = self.holders[holder]
        link, service = h.link, self.service
        assert service is not None
        f = step.fault_name.decode()
        ms = step.ms / 1000
        simple = {
            "partition": link.partition,
            "heal": link.heal,
            "drop_replies": lambda: link.drop_keepalive_replies(True),
            "keep_replies": lambda: link.drop_keepalive_replies(False),
            "delay_replies": lambda: link.delay_keepalive_replies(ms),
            "fail_keepalives": lambda: link.fail_keepalives("injected failure"),
            "stop_failing": lambda: link.fail_keepalives(None),
            "lease_lost": link.declare_lease_lost,
            "freeze_expiry": lambda: service.freeze_expiry(True),
            "thaw_expiry": lambda: service.freeze_expiry(False),
        }
        if f in simple:
            simple[f]()
        elif f == "delete_key":
            if not service.delete_lock_key(h.lock.name):
                raise RuntimeError(f"delete_key: nobody holds {h.lock.name!r}")
        elif f == "revoke_lease":
            lease = h.lock.session.lease
            if lease is None:
                raise RuntimeError("revoke_lease: the holder's session has no lease")
            if not service.revoke_lease(lease):
                raise RuntimeError(f"revoke_lease: no lease {lease} on the service")
        else:
            raise ValueError(f"unknown fault {f}")

    def teardown(self, _ctx: Optional[int]) -> None:
        for p in self.permits.values():
            p.end()
        self.permits.clear()
        for h in self.holders.values():
            if h.observer is not None:
                h.observer.close()  # its reader returns
            if h._lock is None:
                continue
            try:
                h.lock.close()  # pending acquires return; no callback after
            except dlock.Error:
                pass
        for t in self.threads:
            t.join(WAIT_LIMIT)
        self.threads.clear()
        tasks = [h.task for h in self.holders.values() if h.task is not None]
        for task in tasks:
            task.cancel()
        concurrent.futures.wait(tasks, WAIT_LIMIT)
        if self.loop is not None and self.loop_thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.loop_thread.join(WAIT_LIMIT)
            self.loop.close()
            self.loop = self.loop_thread = None
        self.holders.clear()
        self.service = None


def play(lib_path: str, directory: str) -> int:
    """Plays every scenario of ``directory``; the number of failures."""
    lib = ctypes.CDLL(lib_path)
    lib.lks_play_dir_with.argtypes = [c_char_p, POINTER(FaceC), ctypes.c_uint]
    lib.lks_play_dir_with.restype = c_int
    face = PythonFace(lib)
    vt = FaceC(
        None,
        WARM_UP(face.warm_up),
        SETUP(face.setup),
        PERFORM(face.perform),
        TEARDOWN(face.teardown),
    )
    plays = PLAYS_ELECTIONS | PLAYS_RWLOCKS | PLAYS_SEMAPHORES
    return int(lib.lks_play_dir_with(directory.encode(), ctypes.byref(vt), plays))
