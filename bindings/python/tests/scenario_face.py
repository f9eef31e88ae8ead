"""The Python face of the shared scenario runner.

The runner (``libdlock_scenarios.so``, the C ABI of ``scenarios/runner``,
header ``ffi-c/tests/c/scenario_runner.h``) parses the files, keeps the
time, does the waits, judges every expectation and the trace. This file is
only the step dispatch, through dlock's public Python API, bound with
``ctypes``. Nothing of it is in the wheel.
"""

from __future__ import annotations

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
    c_uint64,
    c_void_p,
)
from typing import Dict, List, Optional, Tuple

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
(ACQUIRE, TRY_ACQUIRE, PERMIT, END, VALID, STATE, TOKEN, RELEASE, FAULT, STALL, CLOSE, EVENTS) = range(12)
SAW_DONE, SAW_WORD, SAW_BOOL, SAW_TOKEN, SAW_PERMIT, SAW_EVENTS = range(6)
WAIT_LIMIT = 10.0


class Holder:
    def __init__(self, lock: dlock.Lock, link: dlock.Link, events: dlock.Events) -> None:
        self.lock = lock
        self.link = link
        self.events = events


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

    # -- the vtable

    def warm_up(self, _ctx: Optional[int]) -> None:
        # Every path once (driver, callback thread, asyncio bridge), before
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
            lock = session.lock(lock_name)
            prefix = name + " "

            def push(e: dlock.Event, prefix: str = prefix) -> None:
                lib.lks_trace(sink, (prefix + str(e)).encode())

            lock.on_event(push)
            link = client.link
            assert link is not None
            self.holders[name] = Holder(lock, link, lock.events())
        self.service = service

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

    def _perform(self, step: StepC, out: Observed) -> None:
        holder = step.holder.decode() if step.holder else ""
        label = step.label.decode() if step.label else None
        what = step.what
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
            try:
                self.holders[holder].lock.try_acquire()
                self.word(out, SAW_WORD, "ok")
            except dlock.Error as e:
                self.word(out, SAW_WORD, e.code)
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
        else:
            raise ValueError(f"unknown step {what}")

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
            try:
                h.lock.close()  # pending acquires return; no callback after
            except dlock.Error:
                pass
        for t in self.threads:
            t.join(WAIT_LIMIT)
        self.threads.clear()
        self.holders.clear()
        self.service = None


def play(lib_path: str, directory: str) -> int:
    """Plays every scenario of ``directory``; the number of failures."""
    lib = ctypes.CDLL(lib_path)
    lib.lks_play_dir.argtypes = [c_char_p, POINTER(FaceC)]
    lib.lks_play_dir.restype = c_int
    face = PythonFace(lib)
    vt = FaceC(
        None,
        WARM_UP(face.warm_up),
        SETUP(face.setup),
        PERFORM(face.perform),
        TEARDOWN(face.teardown),
    )
    return int(lib.lks_play_dir(directory.encode(), ctypes.byref(vt)))
