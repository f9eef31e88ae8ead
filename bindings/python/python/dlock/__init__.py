"""dlock: distributed locks whose holders stop working before the lock can
be given to someone else.

A small layer over the Rust core (``dlock._dlock``), which decides
everything about leases, deadlines and tokens::

    import dlock

    client = dlock.Client()                  # embedded, or DLOCK_ENDPOINTS
    with client.lock("orders") as lock:      # acquires or raises
        with lock.permit() as p:             # refused once draining/fenced
            write(p.token)                   # every write carries the token

Durations are seconds as floats. The guide is docs/python.md.
"""

from __future__ import annotations

import asyncio
import atexit
import enum
import threading
import weakref
from types import TracebackType
from typing import Any, Callable, Dict, Optional, Type, TypeVar, Union

from . import _dlock
from ._dlock import (
    MAX_NAME_LEN,
    Event,
    FenceGate,
    Link,
    LockStats,
    MemoryService,
    Permit,
    SessionStats,
    forked,
    now,
    stall_driver,
)
from ._errors import (
    AlreadyHeld,
    BackendError,
    Draining,
    Error,
    Fenced,
    Forked,
    InvalidArgument,
    InvalidOption,
    NotHeld,
    Panic,
    PermitRefused,
    Released,
    Shutdown,
    Stale,
    Timeout,
    WouldBlock,
)

__version__: str = _dlock.__version__

__all__ = [
    "MAX_NAME_LEN",
    "AlreadyHeld",
    "BackendError",
    "Client",
    "Draining",
    "Error",
    "Event",
    "Events",
    "FenceGate",
    "Fenced",
    "Forked",
    "InvalidArgument",
    "InvalidOption",
    "Link",
    "Lock",
    "LockStats",
    "MemoryService",
    "NotHeld",
    "Panic",
    "Permit",
    "PermitRefused",
    "Released",
    "Session",
    "SessionStats",
    "Shutdown",
    "Stale",
    "State",
    "Timeout",
    "WouldBlock",
    "forked",
    "now",
    "stall_driver",
]

F = TypeVar("F", bound=Callable[..., Any])


class State(enum.Enum):
    """A lock's state (docs/design.md §2); the value is the core's name."""

    IDLE = "Idle"
    ACQUIRING = "Acquiring"
    HOLDING = "Holding"
    DRAINING = "Draining"
    FENCED = "Fenced"
    REACQUIRING = "Reacquiring"
    RELEASED = "Released"


# Every live lock, so that an exiting interpreter releases what it holds.
_live: "weakref.WeakSet[Lock]" = weakref.WeakSet()
_live_guard = threading.Lock()


class Client(_dlock.Client):
    """A connection to a lock service.

    ``Client()`` is the embedded backend unless ``DLOCK_ENDPOINTS`` (and the
    other ``DLOCK_*`` variables) name an etcd cluster; ``Client(endpoints)``
    is etcd (a comma-separated string or a list); ``Client(memory=svc)`` is
    the embedded service ``svc``. Timing keywords (``ttl``,
    ``keepalive_interval``, ``keepalive_timeout``, ``retry_interval``,
    ``margin``: seconds; ``reacquire``) default to the core's; the etcd
    keywords are ``ca_file``, ``cert_file``, ``key_file``, ``user``,
    ``password``, ``allow_plaintext_password``, ``connect_timeout``,
    ``request_timeout``. Connecting to etcd blocks.
    """

    def lock(self, name: str) -> "Lock":
        """A handle on the lock ``name`` on the default session, not
        acquired yet: register callbacks, then acquire."""
        return Lock(self, name)

    def session(
        self,
        *,
        ttl: Optional[float] = None,
        keepalive_interval: Optional[float] = None,
        keepalive_timeout: Optional[float] = None,
        retry_interval: Optional[float] = None,
        margin: Optional[float] = None,
        reacquire: Optional[bool] = None,
    ) -> "Session":
        """A new session: its own lease, so its locks fence independently of
        the other sessions'. Settings default to the client's."""
        return Session(
            self._session(
                ttl=ttl,
                keepalive_interval=keepalive_interval,
                keepalive_timeout=keepalive_timeout,
                retry_interval=retry_interval,
                margin=margin,
                reacquire=reacquire,
            )
        )

    @property
    def default_session(self) -> "Session":
        """The session shared by ``client.lock(name)``'s locks."""
        return Session(self._default_session)


class Session:
    """One lease shared by any number of locks: they drain and fence
    together."""

    __slots__ = ("_native",)

    def __init__(self, native: _dlock.Session) -> None:
        self._native = native

    def lock(self, name: str) -> "Lock":
        """A handle on the lock ``name`` on this session."""
        return Lock(self._native, name)

    @property
    def lease(self) -> Optional[int]:
        """The lease, while one is granted."""
        return self._native.lease

    @property
    def is_default(self) -> bool:
        """Whether this is its client's default session."""
        return self._native.is_default

    def options(self) -> Dict[str, Union[float, bool]]:
        """The session's timing settings (seconds)."""
        return self._native.options()

    def stats(self) -> SessionStats:
        """The lease, keepalives sent, locks, last keepalive round trip."""
        return self._native.stats()

    def close(self) -> None:
        """Releases every lock of the session and revokes its lease."""
        self._native.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._native)


class Events:
    """A lock's events in order, from the moment ``lock.events()`` was
    called; ends when the lock is closed. ``for ev in lock.events():`` and
    ``async for ev in lock.events():``."""

    __slots__ = ("_stream",)

    def __init__(self, stream: _dlock.EventStream) -> None:
        self._stream = stream

    def next(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event, waiting up to ``timeout`` seconds (None: as long
        as it takes); None once the stream ended; raises ``Timeout``."""
        return self._stream.next_event(timeout)

    def __iter__(self) -> "Events":
        return self

    def __next__(self) -> Event:
        e = self._stream.next_event(None)
        if e is None:
            raise StopIteration
        return e

    def __aiter__(self) -> "Events":
        return self

    async def __anext__(self) -> Event:
        loop = asyncio.get_running_loop()
        while True:
            fut: "asyncio.Future[None]" = loop.create_future()
            self._stream._next_start(loop, fut)
            await fut
            e = self._stream._take_ready()
            if e is not None:
                return e
            if self._stream._ended:
                raise StopAsyncIteration
            # joined a read that another (cancelled) step began: read again


async def _settle(lock: "Lock", loop: asyncio.AbstractEventLoop) -> None:
    """Releases ``lock`` after a cancelled acquire; the release goes on even
    if this is cancelled too."""
    fut: "asyncio.Future[None]" = loop.create_future()
    lock._release_start(loop, fut)
    try:
        await asyncio.shield(fut)
    except (asyncio.CancelledError, Error):
        pass


class Lock(_dlock.Lock):
    """One named lock; made by ``client.lock(name)`` or
    ``session.lock(name)``.

    ``with client.lock(name) as lock:`` acquires (waiting as long as it
    takes) or raises, and releases on exit; ``async with`` does the same
    without blocking the loop. Callbacks run on dlock's callback thread
    with the GIL taken; an exception in one goes to the logger ``dlock``.
    """

    def __init__(self, owner: Union[_dlock.Client, _dlock.Session], name: str) -> None:
        with _live_guard:
            _live.add(self)

    @property
    def state(self) -> State:
        """The current state."""
        return State(self.state_name)

    @property
    def session(self) -> Session:
        """The session the lock is held under."""
        return Session(self._session)

    def on_state_change(self, fn: F) -> F:
        """``fn(old: State, new: State, reason: str)`` on every state change;
        returns ``fn`` (usable as a decorator)."""

        def words(old: str, new: str, reason: str) -> None:
            fn(State(old), State(new), reason)

        self._on_state_change_words(words)
        return fn

    def events(self) -> Events:
        """The lock's events from now on (see ``Events``)."""
        return Events(self._events())

    async def acquire_async(self, timeout: Optional[float] = None) -> int:
        """Acquires without blocking the loop; returns the token. Cancelling
        the awaiting task cancels the acquire and leaves no lock behind."""
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[int]" = loop.create_future()
        self._acquire_start(timeout, loop, fut)
        try:
            return await fut
        except asyncio.CancelledError:
            await _settle(self, loop)
            raise

    async def release_async(self) -> None:
        """Releases without blocking the loop."""
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[None]" = loop.create_future()
        self._release_start(loop, fut)
        await fut

    async def close_async(self) -> None:
        """Closes without blocking the loop."""
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[None]" = loop.create_future()
        self._close_start(loop, fut)
        await fut

    def __enter__(self) -> "Lock":
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.release()

    async def __aenter__(self) -> "Lock":
        await self.acquire_async()
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.release_async()


def _release_all_at_exit() -> None:
    """Closes every live lock (releasing what is held) so the next holder
    does not wait a whole TTL; a forked child leaves the parent's alone."""
    if forked():
        return
    with _live_guard:
        locks = list(_live)
    for lock in locks:
        try:
            lock.close()
        except Error:
            pass


atexit.register(_release_all_at_exit)

