"""A worker doing units of work under ``with lock.permit()``, committing each
to SQLite with a fenced UPDATE (``... WHERE token <= ?``), and a stale write
refused by the database after the lock moved on.

Runs on the embedded backend (cutting its own link to show the fence), or on
etcd when ``DLOCK_ENDPOINTS`` is set (there the first holder releases and its
late write is the stale one). ``python examples/python/worker.py``
"""

from __future__ import annotations

import sqlite3
import threading

import dlock

NAME = "examples/sqlite-worker"
TIMING = dict(ttl=2.0, keepalive_interval=0.5, keepalive_timeout=0.2, retry_interval=0.2, margin=0.5)


def open_db() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.execute("CREATE TABLE result (id INTEGER PRIMARY KEY, value TEXT, token INTEGER)")
    db.execute("INSERT INTO result VALUES (1, '', 0)")
    return db


def commit(db: sqlite3.Connection, token: int, value: str) -> bool:
    """The resource's own fence: the row takes a write only from a token at
    least as high as the last one it took."""
    cur = db.execute(
        "UPDATE result SET value = ?, token = ? WHERE id = 1 AND token <= ?",
        (value, token, token),
    )
    db.commit()
    return cur.rowcount == 1


def make_client() -> dlock.Client:
    return dlock.Client(
        ttl=TIMING["ttl"],
        keepalive_interval=TIMING["keepalive_interval"],
        keepalive_timeout=TIMING["keepalive_timeout"],
        retry_interval=TIMING["retry_interval"],
        margin=TIMING["margin"],
    )


def main() -> None:
    db = open_db()
    first = make_client()
    lock = first.lock(NAME)
    fenced = threading.Event()

    @lock.on_fence
    def stop(token: int, in_flight: int) -> None:
        print(f"a: fenced, token {token}, {in_flight} unit(s) in flight: stop")
        fenced.set()

    token = lock.acquire(10)
    print(f"a: holding, token {token}")
    for unit in range(3):
        with lock.permit() as p:
            value = f"unit {unit} by a"
            if p.valid() and commit(db, p.token, value):
                print(f"a: committed {value!r} with token {p.token}")

    # One unit still in flight when a is cut off (or lets go, on etcd).
    late = lock.permit()
    if first.link is not None:
        first.link.partition()
        fenced.wait(10)
    else:
        lock.release()
    print(f"a: permit still valid? {late.valid()}")

    second = make_client()
    with second.lock(NAME) as b:
        with b.permit() as p:
            assert commit(db, p.token, "unit 0 by b")
            print(f"b: holding, token {p.token}, committed 'unit 0 by b'")

    # a's late write, as a paused process would send it: refused by the row.
    ok = commit(db, late.token, "late unit by a")
    print(f"a: late write with token {late.token}: {'committed' if ok else 'refused (stale)'}")
    late.end()
    row = db.execute("SELECT value, token FROM result").fetchone()
    print(f"row: {row[0]!r} token {row[1]}")
    if first.link is not None:
        first.link.heal()
    lock.close()


if __name__ == "__main__":
    main()
