"""The asyncio variant of worker.py: ``async with`` a lock, units of work
under permits, a fenced SQLite UPDATE per unit, and a waiter whose
``asyncio.wait_for`` timeout cancels its acquire without leaving a lock
behind. ``python examples/python/worker_async.py``
"""

from __future__ import annotations

import asyncio

import dlock
from worker import NAME, commit, open_db


async def main() -> None:
    db = open_db()
    # The library's default timings: nothing here waits for a fence, so
    # worker.py's short TTL (a 0.2 s keepalive timeout) would only let a
    # busy machine drain the lock between two units.
    client = dlock.Client()
    async with client.lock(NAME) as lock:
        for unit in range(3):
            with lock.permit() as p:
                await asyncio.sleep(0.01)  # the unit's own async work
                if p.valid() and commit(db, p.token, f"unit {unit}"):
                    print(f"committed 'unit {unit}' with token {p.token}")
        waiter = client.lock(NAME)
        try:
            await asyncio.wait_for(waiter.acquire_async(), 0.2)
        except asyncio.TimeoutError:
            print(f"waiter gave up after 0.2 s; its state: {waiter.state.value}")
    # Released: a new holder gets it at once, with a higher token.
    nxt = client.lock(NAME)
    token = await nxt.acquire_async(5)
    print(f"next holder: token {token}")
    await nxt.close_async()
    row = db.execute("SELECT value, token FROM result").fetchone()
    print(f"row: {row[0]!r} token {row[1]}")


if __name__ == "__main__":
    asyncio.run(main())
