"""dlock: distributed locks whose holders stop working before the lock can
be given to someone else.

A small layer over the Rust core (``dlock._dlock``), which decides
everything about leases, deadlines and tokens::

    import dlock

    client = dlock.Client()                  # embedded, or DLOCK_ENDPOINTS
    with client.lock("orders") as lock:      # acquires or raises
        with lock.permit() as p:             # refused once draining/fenced
            write(p.token)                   # every write carries the token

    gpus = client.semaphore("gpu", 4)        # at most 4 holders, each on a slot
    with gpus.acquire(timeout=30) as held:   # a held Lock: held.slot, held.name
        ...

    rw = client.rwlock("config")             # many readers or one writer
    with rw.reader() as r:                   # a Lock: r.mode == "read"
        ...

    election = client.election("leaders")    # leader election (etcd's keys)
    with election.campaign(b"host-a", timeout=30) as lead:   # or raises
        with lead.permit() as p:
            lead_work(p.token)
    for leader in client.observe("leaders"): # a Leader, or None: nobody leads
        ...

Durations are seconds as floats. The guide is docs/python.md.
"""

from __future__ import annotations

import asyncio
import atexit
import enum
from typing import Any, Awaitable, Callable, Dict, Generator, Generic, Optional, TypeVar, Union

from . import _dlock
from ._dlock import (
    MAX_KEY_LEN,
    MAX_NAME_LEN,
    MAX_SEMAPHORE_LIMIT,
    MAX_VALUE_LEN,
    Event,
    FenceGate,
    Leader,
    Link,
    LockStats,
    MemoryService,
    Observed,
    Permit,
    SessionStats,
    forked,
    now,
    shutdown,
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
    "DEFAULT_MAX_OVERDUE",
    "MAX_KEY_LEN",
    "MAX_NAME_LEN",
    "MAX_SEMAPHORE_LIMIT",
    "MAX_VALUE_LEN",
    "AlreadyHeld",
    "BackendError",
    "Client",
    "Draining",
    "Election",
    "Error",
    "Event",
    "Events",
    "FenceGate",
    "Fenced",
    "Forked",
    "InvalidArgument",
    "InvalidOption",
    "Leader",
    "Leadership",
    "Link",
    "Lock",
    "LockStats",
    "MemoryService",
    "NotHeld",
    "Observed",
    "Observer",
    "Panic",
    "Permit",
    "PermitRefused",
    "RESIGN_GRACE",
    "Released",
    "RwLock",
    "Semaphore",
    "Session",
    "SessionStats",
    "Shutdown",
    "Stale",
    "State",
    "Timeout",
    "WouldBlock",
    "forked",
    "now",
    "shutdown",
    "stall_driver",
]

F = TypeVar("F", bound=Callable[..., Any])

#: Seconds leaving a ``with election.campaign(...)`` block gives the permits
#: still in flight (ones handed to other threads) before the leader's key is
#: deleted, unless ``campaign(..., grace=...)`` says otherwise: the core's
#: value (5 s), the same in every face.
RESIGN_GRACE: float = _dlock.RESIGN_GRACE

#: Seconds ``Lock.healthy()`` allows past the deadline when given none: the
#: core's value (0), the same in every face.
DEFAULT_MAX_OVERDUE: float = _dlock.DEFAULT_MAX_OVERDUE


_E = TypeVar("_E", bound="_EndsOnLeaving")


class _EndsOnLeaving:
    """``with`` for a handle that leaving the block ends: ``_end()``. One
    place for the protocol of every such handle."""

    __slots__ = ()

    def _end(self) -> None:
        raise NotImplementedError

    def __enter__(self: _E) -> _E:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._end()


_A = TypeVar("_A", bound="_AlsoAsync")


class _AlsoAsync(_EndsOnLeaving):
    """``async with`` too, leaving by ``_end_async()`` (by default
    ``_end()``)."""

    __slots__ = ()

    async def _end_async(self) -> None:
        self._end()

    async def __aenter__(self: _A) -> _A:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._end_async()


_R = TypeVar("_R", bound=_AlsoAsync)


class _StartsWhenAwaited(Generic[_R]):
    """An acquire that starts when awaited: ``await`` it for the held
    handle, or ``async with`` it (the handle ends on leaving)."""

    __slots__ = ("_result",)

    def __init__(self) -> None:
        self._result: Optional[_R] = None

    def _wait(self) -> Awaitable[_R]:
        raise NotImplementedError

    def __await__(self) -> Generator[Any, None, _R]:
        return self._wait().__await__()

    async def __aenter__(self) -> _R:
        self._result = await self
        return self._result

    async def __aexit__(self, *exc_info: object) -> None:
        if self._result is not None:
            await self._result._end_async()


# The core's state names by their upper-case spelling: a name the core
# renames fails here, at import, instead of drifting.
_STATE_WORDS = {w.upper(): w for w in _dlock.states()}


class State(enum.Enum):
    """A lock's state (docs/design.md §2); the value is the core's name."""

    IDLE = _STATE_WORDS["IDLE"]
    ACQUIRING = _STATE_WORDS["ACQUIRING"]
    HOLDING = _STATE_WORDS["HOLDING"]
    DRAINING = _STATE_WORDS["DRAINING"]
    FENCED = _STATE_WORDS["FENCED"]
    REACQUIRING = _STATE_WORDS["REACQUIRING"]
    RELEASED = _STATE_WORDS["RELEASED"]


class Client(_dlock.Client):
    """A connection to a lock service.

    ``Client()`` is the embedded backend unless ``DLOCK_ENDPOINTS`` (and the
    other ``DLOCK_*`` variables) name a service; ``Client(endpoints)`` is
    etcd (a comma-separated string or a list) or, for one ``postgres://``
    URL, PostgreSQL (the core decides); ``Client(memory=svc)`` is the
    embedded service ``svc``. Timing keywords (``ttl``,
    ``keepalive_interval``, ``keepalive_timeout``, ``retry_interval``,
    ``margin``: seconds; ``reacquire``) default to the core's; the
    connection keywords are ``ca_file``, ``cert_file``, ``key_file``, ``user``,
    ``password``, ``allow_plaintext_password``, ``connect_timeout``,
    ``request_timeout``. ``description`` (at most 256 bytes, one line) is
    recorded beside each of its sessions' leases with the host, pid and
    process start: ``lock.holder()`` and ``dlock show`` in other processes
    read it. Connecting to etcd blocks.
    """

    def lock(self, name: str) -> "Lock":
        """A handle on the lock ``name`` on the default session, not
        acquired yet: register callbacks, then acquire."""
        return Lock(self, name)

    def election(self, name: str) -> "Election":
        """A candidate in the election ``name`` on the default session, not
        campaigning yet (see ``Election``)."""
        return Election(self, name)

    def semaphore(self, name: str, limit: int) -> "Semaphore":
        """The semaphore ``name`` of ``limit`` slots on the default session
        (see ``Semaphore``). Its first handle anywhere records ``limit``;
        another limit on the same name is ``InvalidArgument`` (naming both),
        as are 0 and limits over ``MAX_SEMAPHORE_LIMIT``. Blocks for that one
        request (without the GIL)."""
        return Semaphore(self, name, limit)

    def rwlock(self, name: str) -> "RwLock":
        """The read/write lock ``name`` on the default session (see
        ``RwLock``). Readers that share a name need sessions (or clients)
        of their own: two holders on one session exclude each other."""
        return RwLock(self, name)

    def observe(self, name: str) -> "Observer":
        """Observes the election ``name`` (no lease, no key of its own):
        ``for leader in client.observe(name):`` yields the current
        ``Leader`` (or None: nobody leads), then one per change. Raises
        ``Shutdown`` on a shut-down client."""
        return Observer(self, name)

    def metrics_text(self) -> str:
        """Every session and lock of the client in the Prometheus text
        format (docs/metrics.md)."""
        return _dlock.metrics_text(self)

    def session(
        self,
        *,
        ttl: Optional[float] = None,
        keepalive_interval: Optional[float] = None,
        keepalive_timeout: Optional[float] = None,
        retry_interval: Optional[float] = None,
        margin: Optional[float] = None,
        reacquire: Optional[bool] = None,
        **unknown: Any,
    ) -> "Session":
        """A new session: its own lease, so its locks fence independently of
        the other sessions'. Settings default to the client's; an unknown
        keyword is ``InvalidOption`` (the core's, as in every face)."""
        return Session(
            self._session(
                ttl=ttl,
                keepalive_interval=keepalive_interval,
                keepalive_timeout=keepalive_timeout,
                retry_interval=retry_interval,
                margin=margin,
                reacquire=reacquire,
                **unknown,
            )
        )

    @property
    def default_session(self) -> "Session":
        """The session shared by ``client.lock(name)``'s locks."""
        return Session(self._default_session)


class Session(_EndsOnLeaving):
    """One lease shared by any number of locks: they drain and fence
    together."""

    __slots__ = ("_native",)

    def __init__(self, native: _dlock.Session) -> None:
        self._native = native

    def lock(self, name: str) -> "Lock":
        """A handle on the lock ``name`` on this session."""
        return Lock(self._native, name)

    def election(self, name: str) -> "Election":
        """A candidate in the election ``name`` on this session (its lease
        holds the candidate key)."""
        return Election(self._native, name)

    def semaphore(self, name: str, limit: int) -> "Semaphore":
        """The semaphore ``name`` of ``limit`` slots whose slots are held on
        this session (see ``Client.semaphore``)."""
        return Semaphore(self._native, name, limit)

    def rwlock(self, name: str) -> "RwLock":
        """The read/write lock ``name`` whose holders are held on this
        session (see ``Client.rwlock``)."""
        return RwLock(self._native, name)

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

    def _end(self) -> None:
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


class Lock(_dlock.Lock, _AlsoAsync):
    """One named lock; made by ``client.lock(name)`` or
    ``session.lock(name)``.

    ``with client.lock(name) as lock:`` acquires (waiting as long as it
    takes) or raises, and releases on exit; ``async with`` does the same
    without blocking the loop. Callbacks run on dlock's callback thread
    with the GIL taken; an exception in one goes to the logger ``dlock``.

    A semaphore's ``acquire`` returns its slot's ``Lock`` already held
    (``lock.slot`` is the slot, ``lock.name`` the slot's lock name): its
    first ``with`` (or ``async with``) enters without acquiring again.
    """

    def _came_held(self) -> bool:
        """Whether this lock came held from a semaphore and was not entered,
        released or closed since (then entering does not acquire)."""
        return bool(self.__dict__.pop("_held", False))

    def release(self) -> None:
        """Releases the lock (deletes its key); no permit is valid from now
        on."""
        self.__dict__.pop("_held", None)
        super().release()

    def close(self) -> None:
        """Releases and ends the lock's callbacks and event streams."""
        self.__dict__.pop("_held", None)
        super().close()

    def healthy(self, max_overdue: float = DEFAULT_MAX_OVERDUE) -> bool:
        """For a health endpoint: False once the lock is still holding or
        draining more than ``max_overdue`` seconds (default
        ``DEFAULT_MAX_OVERDUE``, the core's 0) past its deadline (the fence
        that was due did not happen); a lock not held is healthy."""
        return _dlock.lock_healthy(self, max_overdue)

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
        returns ``fn`` (usable as a decorator). Handlers add up."""
        if not callable(fn):
            raise TypeError(f"on_state_change needs a callable, not {type(fn).__name__}")

        def words(old: str, new: str, reason: str) -> None:
            fn(State(old), State(new), reason)

        self._on_state_change_words(words)
        return fn

    def events(self) -> Events:
        """The lock's events from now on (see ``Events``)."""
        return Events(self._events())

    async def acquire_async(self, timeout: Optional[float] = None) -> int:
        """Acquires without blocking the loop; returns the token. Cancelling
        the awaiting task cancels the acquisition in the core, which leaves
        nothing held (even if the lock was won just then); the cancellation
        ends once the core has answered it (a queued wait: the state is
        ``RELEASED`` by then)."""
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[int]" = loop.create_future()
        acquisition = self._acquire_start(timeout, loop, fut)
        return await _won(self, acquisition, fut)

    async def release_async(self) -> None:
        """Releases without blocking the loop."""
        self.__dict__.pop("_held", None)
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[None]" = loop.create_future()
        self._release_start(loop, fut)
        await fut

    async def downgrade_async(self) -> None:
        """``downgrade`` without blocking the loop."""
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[None]" = loop.create_future()
        self._downgrade_start(loop, fut)
        await fut

    async def close_async(self) -> None:
        """Closes without blocking the loop."""
        self.__dict__.pop("_held", None)
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[None]" = loop.create_future()
        self._close_start(loop, fut)
        await fut

    def __enter__(self) -> "Lock":
        if not self._came_held():
            self.acquire()
        return self

    async def __aenter__(self) -> "Lock":
        if not self._came_held():
            await self.acquire_async()
        return self

    def _end(self) -> None:
        self.release()

    async def _end_async(self) -> None:
        await self.release_async()


_T = TypeVar("_T")


async def _won(
    lock: Union[_dlock.Lock, _dlock.Semaphore],
    acquisition: Union[_dlock.Acquisition, _dlock.SemaphoreAcquisition],
    fut: "asyncio.Future[_T]",
) -> _T:
    """What ``fut`` gets (a token); a cancelled wait cancels ``acquisition``
    in the core (nothing stays held) and ends once the core answered it."""
    try:
        # shielded: a cancelled task leaves `fut` for the core's answer
        return await asyncio.shield(fut)
    except Error:
        raise
    except BaseException:  # cancelled (or the loop interrupted): nothing stays held
        acquisition.cancel()
        # The core answers a cancel through the same completion (Released,
        # or the token it won and now releases), decided on its driver:
        # wait for that, at most one keepalive timeout.
        bound = float(lock._session.options()["keepalive_timeout"])
        await asyncio.wait({fut}, timeout=bound)
        if fut.done() and not fut.cancelled():
            fut.exception()  # retrieved: the answer to a cancel is no news
        raise


class Semaphore(_dlock.Semaphore):
    """A counting semaphore (docs/design.md §26): at most ``limit`` holders
    at once, each holding one slot, an ordinary lock named
    ``<name>/slot/<i>`` with its own tokens (a resource fences per slot:
    ``FenceGate``, guarded writes and ``dlock.guard`` take the slot's name
    and token). Made by ``client.semaphore(name, limit)`` or
    ``session.semaphore(name, limit)``; holds nothing itself.

    ``held = sem.acquire(timeout=5.0)`` returns the slot's ``Lock``, held
    (``held.slot``, ``held.name``, ``held.permit()``, ``held.release()``:
    the whole lock API); ``with sem.acquire(timeout=5.0) as held:`` releases
    it on leaving. The core decides everything: which slot, the wait, the
    cancel.
    """

    def acquire(self, timeout: Optional[float] = None) -> Lock:
        """Takes a slot, waiting up to ``timeout`` seconds for one to be free
        (None: as long as it takes; 0: one try, as ``try_acquire``); returns
        its ``Lock``, held. Raises ``Timeout`` (nothing held). Releases the
        GIL; Ctrl-C interrupts it and cancels the acquire (nothing held)."""
        return _slot_lock(self._acquire(timeout))

    def try_acquire(self) -> Lock:
        """Takes a free slot (its ``Lock``, held), else raises
        ``WouldBlock``."""
        return _slot_lock(self._try_acquire())

    def acquire_async(self, timeout: Optional[float] = None) -> "SlotAcquire":
        """``acquire`` without blocking the loop: ``held = await
        sem.acquire_async(timeout)``, or ``async with sem.acquire_async(t)
        as held:`` (releases on leaving). Cancelling the awaiting task
        cancels the acquire in the core, which leaves nothing held (even a
        slot won just then), as ``Lock.acquire_async``."""
        return SlotAcquire(self, timeout)

    async def _acquire_wait(self, timeout: Optional[float]) -> Lock:
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[None]" = loop.create_future()
        acquisition = self._acquire_start(timeout, loop, fut)
        await _won(self, acquisition, fut)
        return _slot_lock(acquisition._take())


class SlotAcquire(_StartsWhenAwaited[Lock]):
    """``sem.acquire_async(...)``: await it for the slot's held ``Lock``, or
    ``async with`` it (releases on leaving). Starts when awaited."""

    __slots__ = ("_sem", "_timeout")

    def __init__(self, sem: Semaphore, timeout: Optional[float]) -> None:
        super().__init__()
        self._sem = sem
        self._timeout = timeout

    def _wait(self) -> Awaitable[Lock]:
        return self._sem._acquire_wait(self._timeout)


class RwLock(_dlock.RwLock):
    """Many readers or one writer on a name (docs/design.md §27); made by
    ``client.rwlock(name)`` or ``session.rwlock(name)``, holds nothing
    itself. ``reader()`` and ``writer()`` are ordinary ``Lock`` objects, not
    acquired yet, with ``.mode`` ``"read"`` or ``"write"``: acquire,
    permits, fencing and callbacks are a lock's. A held writer's
    ``downgrade()`` makes it a reader with the same token. A resource
    fences them with ``FenceGate.admit_read`` / ``admit_write``.
    """

    def reader(self) -> Lock:
        """A reader: holds together with other readers, never with a
        writer."""
        return Lock(self._reader(), self.name)

    def writer(self) -> Lock:
        """A writer: holds alone."""
        return Lock(self._writer(), self.name)


def _slot_lock(held: _dlock.HeldSlot) -> Lock:
    """The ``Lock`` of a slot won: held, so its first ``with`` does not
    acquire."""
    lock = Lock(held, held.name)
    lock.__dict__["_held"] = True
    return lock


_Value = Union[bytes, bytearray, str]


class Election(_dlock.Election, Lock):
    """A candidate in a leader election (docs/elections.md); made by
    ``client.election(name)`` or ``session.election(name)``.

    An election is a lock that carries a value, on etcd's election keys
    (``etcdctl elect`` and Go's ``concurrency.Election`` take part in the
    same election). The whole ``Lock`` API works on it: ``permit()``,
    ``on_fence``, ``events()``, ``state``, ``stats()``, ``close()``.
    Values are ``bytes`` (or ``str``, put as UTF-8). With the session's
    ``reacquire`` (the default) a fenced leader campaigns again with its
    last value and leads again with a higher token.

    ``with election.campaign(value, timeout=30) as lead:`` runs the block
    only as the leader (``Timeout`` otherwise) and resigns on leaving it.
    """

    def campaign(self, value: _Value, timeout: Optional[float] = None, *, grace: float = RESIGN_GRACE) -> "Leadership":
        """Campaigns with ``value``, waiting up to ``timeout`` seconds (None:
        as long as it takes; 0: one try), and returns the ``Leadership``
        (``lead.token``); raises ``Timeout`` (nothing held), ``Released`` on
        a closed session. The wait re-reads the candidate's own key, so a
        candidate whose key went meanwhile is never told it leads. Leaving
        ``with ... as lead:`` resigns with ``grace``, checked first (a bad one
        is ``InvalidArgument`` before anything is held). Ctrl-C cancels it."""
        grace = _dlock.check_grace(grace)
        return Leadership(self, self._campaign(value, timeout), grace)

    def campaign_async(
        self, value: _Value, timeout: Optional[float] = None, *, grace: float = RESIGN_GRACE
    ) -> "Campaign":
        """``campaign`` without blocking the loop: ``lead = await
        election.campaign_async(v)``, or ``async with
        election.campaign_async(v) as lead:`` (resigns on leaving).
        Cancelling the awaiting task cancels the campaign in the core, as
        ``Lock.acquire_async``: nothing stays held."""
        grace = _dlock.check_grace(grace)
        return Campaign(self, value, timeout, grace)

    async def _campaign_wait(self, value: _Value, timeout: Optional[float], grace: float) -> "Leadership":
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[int]" = loop.create_future()
        acquisition = self._campaign_start(value, timeout, loop, fut)
        return Leadership(self, await _won(self, acquisition, fut), grace)

    def resign(self, grace: float = RESIGN_GRACE) -> None:
        """Steps down: no permit from now on; the key is deleted once the
        permits in flight end, or after ``grace`` seconds with some still
        running, so the next leader starts only after this one's work.
        Campaigning again is allowed."""
        super().resign(grace)

    async def proclaim_async(self, value: _Value) -> None:
        """``proclaim`` without blocking the loop."""
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[None]" = loop.create_future()
        self._proclaim_start(value, loop, fut)
        await fut

    async def resign_async(self, grace: float = RESIGN_GRACE) -> None:
        """``resign`` without blocking the loop."""
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[None]" = loop.create_future()
        self._resign_start(grace, loop, fut)
        await fut

    def __enter__(self) -> "Election":
        raise TypeError("an election is entered through its campaign: with election.campaign(value) as lead:")

    async def __aenter__(self) -> "Election":
        raise TypeError(
            "an election is entered through its campaign: async with election.campaign_async(value) as lead:"
        )


class Leadership(_AlsoAsync):
    """A won campaign: ``lead.token`` (the leader key's create revision,
    the fencing token of this term), ``lead.permit()``,
    ``lead.proclaim(v)``, ``lead.resign()``. A context manager (sync and
    async) that resigns with its ``grace`` on leaving."""

    __slots__ = ("election", "token", "grace")

    def __init__(self, election: Election, token: int, grace: float) -> None:
        self.election = election
        self.token = token
        self.grace = grace

    def permit(self) -> Permit:
        """Permission for one unit of leader work (refused once draining,
        fenced or resigned); its token is the election's current one,
        higher than ``lead.token`` after a recampaign."""
        return self.election.permit()

    def proclaim(self, value: _Value) -> None:
        """Puts a new value in the leader's key (same token); ``Fenced`` once
        the leadership was lost, ``NotHeld`` after a resign."""
        self.election.proclaim(value)

    async def proclaim_async(self, value: _Value) -> None:
        """``proclaim`` without blocking the loop."""
        await self.election.proclaim_async(value)

    def resign(self, grace: Optional[float] = None) -> None:
        """``Election.resign`` with ``grace`` (default: this leadership's)."""
        self.election.resign(self.grace if grace is None else grace)

    async def resign_async(self, grace: Optional[float] = None) -> None:
        """``resign`` without blocking the loop."""
        await self.election.resign_async(self.grace if grace is None else grace)

    def _end(self) -> None:
        self.resign()

    async def _end_async(self) -> None:
        await self.resign_async()

    def __repr__(self) -> str:
        return f"Leadership(election={self.election.name!r}, token={self.token}, grace={self.grace})"


class Campaign(_StartsWhenAwaited[Leadership]):
    """``election.campaign_async(...)``: await it for the ``Leadership``, or
    ``async with`` it (resigns on leaving). Starts when awaited."""

    __slots__ = ("_election", "_value", "_timeout", "_grace")

    def __init__(self, election: Election, value: _Value, timeout: Optional[float], grace: float) -> None:
        super().__init__()
        self._election = election
        self._value = value
        self._timeout = timeout
        self._grace = grace

    def _wait(self) -> Awaitable[Leadership]:
        return self._election._campaign_wait(self._value, self._timeout, self._grace)


class Observer(_dlock.Observer, _AlsoAsync):
    """An election's leaders as they change; made by
    ``client.observe(name)``. Needs no lease and puts no key.

    ``for leader in observer:`` and ``async for leader in observer:`` yield
    the current state first, then one item per change: a ``Leader`` (a new
    leader, or the same one with a proclaimed value) or None (nobody leads:
    the leader's key is gone and no candidate holds). A leader whose key is
    already gone is never yielded. A reconnect of the watch is not yielded
    (the state after it is, even if unchanged); ``next_event()`` gives every
    event with its kind, reconnects included. ``close()`` (or leaving
    ``with``) ends the watch and the iteration.
    """

    def __iter__(self) -> "Observer":
        return self

    def __next__(self) -> Optional[Leader]:
        while True:
            e = self.next_event(None)
            if e is None:
                raise StopIteration
            if e.kind != "reconnecting":
                return e.leader

    def __aiter__(self) -> "Observer":
        return self

    async def next_event_async(self) -> Optional[Observed]:
        """``next_event()`` without blocking the loop (None once ended)."""
        loop = asyncio.get_running_loop()
        while True:
            fut: "asyncio.Future[None]" = loop.create_future()
            self._next_start(loop, fut)
            await fut
            e = self._take_ready()
            if e is not None:
                return e
            if self._ended:
                return None
            # joined a read that another (cancelled) step began: read again

    async def __anext__(self) -> Optional[Leader]:
        while True:
            e = await self.next_event_async()
            if e is None:
                raise StopAsyncIteration
            if e.kind != "reconnecting":
                return e.leader

    def _end(self) -> None:
        self.close()


# The core's one exit path: every held lock of the process is released at
# once, bounded by one keepalive timeout (nothing in a forked child); then
# no callback or completion enters Python while it finalizes.
atexit.register(_dlock._at_exit)

# The core's log goes to `logging`, logger "dlock" (docs/python.md). Not
# when another tracing subscriber is the process's (then it has the log).
try:
    _dlock.route_logs(True)
except Error:
    pass
