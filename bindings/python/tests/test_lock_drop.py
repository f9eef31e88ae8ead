"""A dropped Lock lets go of the core's lock, whatever was called on it.

Regression tests of a bug the soak found (scripts/soak.sh; docs/testing.md
"Soak"): `release`, `close`, `guarded_put` and `guarded_delete` cloned the
native lock as a `ManuallyDrop` that never dropped, so the core's lock
outlived its Python object: ~770 bytes and a session entry per lock, and a
lock dropped while held after a guarded write stayed held (its keepalives
going on) until the process exited.
"""

import gc
import time

import dlock


def fresh_client() -> dlock.Client:
    return dlock.Client(memory=dlock.MemoryService())


def test_a_held_lock_dropped_after_a_guarded_write_is_released() -> None:
    client = fresh_client()
    for call in ("guarded_put", "guarded_delete"):
        name = f"drop/{call}"
        lock = client.lock(name)
        token = lock.acquire(5.0)
        if call == "guarded_put":
            lock.guarded_put(token, b"k", b"v")
        else:
            lock.guarded_delete(token, b"k")
        del lock
        gc.collect()
        other = client.lock(name)
        assert other.try_acquire() > token, call
        other.release()


def test_released_and_closed_locks_leave_the_session() -> None:
    client = fresh_client()
    session = client.default_session
    before = session.stats().locks
    for i in range(100):
        lock = client.lock(f"drop/{i}")
        lock.acquire(5.0)
        if i % 2:
            lock.release()
        else:
            lock.close()
        del lock
    gc.collect()
    # The core lets go of a dropped lock on its driver thread: no event
    # says when, so wait for the count (the bug left all 100 for ever).
    deadline = time.monotonic() + 5.0
    while session.stats().locks != before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert session.stats().locks == before
