"""Writes to your own PostgreSQL table only while your dlock token still
holds: ``SELECT dlock.guard(name, token)`` first in every transaction
(docs/postgres.md).

Why: a holder paused past its TTL (a GC pause, swap, a frozen VM) resumes
not knowing that the lock moved on; any check it made before the pause
(``lock.permit()``, the fence) is stale by then. ``dlock.guard`` checks
inside the write's own transaction: it holds the lock's row until commit, so
a takeover waits for this transaction, and it raises SQLSTATE DL001 when the
token no longer holds, so the stale transaction rolls back instead of
landing after the new holder's writes.

    pip install dlock-fence 'psycopg[binary]'
    export DLOCK_ENDPOINTS='postgresql://app:secret@db.internal:5432/app'
    python examples/python/pg_guard.py [WHO] [UNITS]

``DATABASE_URL`` is the application's own connection (default
``DLOCK_ENDPOINTS``; set it when that URL carries dlock's own parameters,
such as ``dlock_single_node``). It must be the database holding the dlock
schema: the guard runs there, in your transaction. ``PG_GUARD_PAUSE_AT=N``
stops this process (SIGSTOP) before unit N, the pause the guard is for;
resume it with ``kill -CONT``.
"""

from __future__ import annotations

import os
import signal
import sys

import dlock
import psycopg

NAME = "examples/pg-guard"
# dlock's own error code for "this token no longer holds the lock".
GUARD_SQLSTATE = "DL001"


def main() -> int:
    who = sys.argv[1] if len(sys.argv) > 1 else f"worker-{os.getpid()}"
    units = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    pause_at = int(os.environ.get("PG_GUARD_PAUSE_AT", "-1"))
    db_url = os.environ.get("DATABASE_URL") or os.environ["DLOCK_ENDPOINTS"]

    # Client() reads DLOCK_ENDPOINTS: a postgres:// URL selects PostgreSQL.
    # reacquire=False: once this worker loses the lock it stops for good.
    client = dlock.Client(ttl=3.0, keepalive_interval=1.0, keepalive_timeout=0.5, margin=1.0, reacquire=False)
    lock = client.lock(NAME)
    token = lock.acquire(30)
    print(f"{who}: holds {NAME}, token {token}", flush=True)

    # autocommit: each `with db.transaction()` below is one explicit
    # transaction, committed at the end of the block, rolled back on error.
    with psycopg.connect(db_url, autocommit=True) as db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS pg_guard_units"
            " (id bigserial PRIMARY KEY, who text NOT NULL, unit int NOT NULL, token bigint NOT NULL)"
        )
        try:
            for unit in range(units):
                if unit == pause_at:
                    print(f"{who}: pausing before unit {unit}", flush=True)
                    os.kill(os.getpid(), signal.SIGSTOP)
                    print(f"{who}: resumed", flush=True)
                with db.transaction():
                    # First statement: from here to COMMIT no one else can
                    # take the lock, or we get DL001 and write nothing.
                    db.execute("SELECT dlock.guard(%s, %s)", (NAME, token))
                    db.execute(
                        "INSERT INTO pg_guard_units (who, unit, token) VALUES (%s, %s, %s)",
                        (who, unit, token),
                    )
                print(f"{who}: unit {unit} committed with token {token}", flush=True)
        except psycopg.Error as e:
            if e.sqlstate != GUARD_SQLSTATE:
                raise
            # The transaction was rolled back: nothing of it landed.
            print(f"{who}: refused by the database (SQLSTATE {e.sqlstate}): token {token} no longer holds {NAME}; stopping", flush=True)
            return 0
        finally:
            lock.release()
    print(f"{who}: {units} units done with token {token}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
