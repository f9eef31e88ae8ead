"""The exceptions of dlock: one class per code word of the core's table.

Every class has ``.code``, the word the C, Node and Rust faces use too.
"""

from __future__ import annotations

from typing import ClassVar, Dict, Optional, Type

from . import _dlock

_WORDS = frozenset(_dlock.codes())


def _word(w: str) -> str:
    """``w``, checked against the core's code table at import."""
    if w not in _WORDS:
        raise ImportError(f"dlock: the core has no code word {w!r}")
    return w


class Error(Exception):
    """Any dlock failure; ``.code`` is the core's code word."""

    code: ClassVar[str] = "error"


class PermitRefused(Error):
    """``lock.permit()`` refused: no new unit of work may start."""


class Draining(PermitRefused):
    """A keepalive failed; no new work until one is confirmed."""

    code: ClassVar[str] = _word("draining")


class Fenced(PermitRefused):
    """The lock must be assumed lost (permit refused, or a guarded write
    refused: ``.token`` is the token that no longer holds)."""

    code: ClassVar[str] = _word("fenced")
    token: Optional[int] = None


class Released(PermitRefused):
    """The lock was released (or closed)."""

    code: ClassVar[str] = _word("released")


class NotHeld(PermitRefused):
    """The lock is not held (not acquired yet)."""

    code: ClassVar[str] = _word("not_held")


class Timeout(Error, TimeoutError):
    """The wait for one's turn ran out."""

    code: ClassVar[str] = _word("timeout")


class WouldBlock(Error):
    """``try_acquire``: another holder has the lock."""

    code: ClassVar[str] = _word("would_block")


class AlreadyHeld(Error):
    """This handle holds the lock, or an acquire of it is in progress."""

    code: ClassVar[str] = _word("already_held")


class InvalidOption(Error, ValueError):
    """A setting breaks a rule (docs/design.md §14)."""

    code: ClassVar[str] = _word("invalid_option")


class InvalidArgument(Error, ValueError):
    """An argument is not acceptable."""

    code: ClassVar[str] = _word("invalid_argument")


class BackendError(Error):
    """The lock service failed or could not be reached (for a guarded write
    the outcome is unknown)."""

    code: ClassVar[str] = _word("backend")


class Shutdown(Error):
    """The session was shut down (``dlock.shutdown()``, ``client.shutdown()``,
    the exit hook) or dlock's driver thread is gone."""

    code: ClassVar[str] = _word("shutdown")


class Forked(Error):
    """Called in a child of ``os.fork()``: the handles belong to the parent."""

    code: ClassVar[str] = _word("forked")


class Stale(Error):
    """``FenceGate.admit``: a higher token was already seen (``.token``,
    ``.highest``)."""

    code: ClassVar[str] = _word("stale")
    token: Optional[int] = None
    highest: Optional[int] = None


class Panic(Error):
    """A bug in dlock: a panic was caught at the boundary."""

    code: ClassVar[str] = _word("panic")


BY_CODE: Dict[str, Type[Error]] = {
    c.code: c
    for c in (
        Draining,
        Fenced,
        Released,
        NotHeld,
        Timeout,
        WouldBlock,
        AlreadyHeld,
        InvalidOption,
        InvalidArgument,
        BackendError,
        Shutdown,
        Forked,
        Stale,
        Panic,
    )
}

# Shown as dlock.Fenced etc., where users import them from.
for _c in (Error, PermitRefused, *BY_CODE.values()):
    _c.__module__ = "dlock"
del _c
