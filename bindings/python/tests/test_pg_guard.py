"""``dlock.guard`` against a real pause (issue 19): examples/python/pg_guard.py
holds the lock, commits a unit of work to the user's own table, and stops
itself with SIGSTOP before the next; its lease runs out on the server; a
contender here takes the lock and writes in its own guarded transaction
(psycopg); the holder resumes (SIGCONT) into its next transaction, which
the database refuses with SQLSTATE DL001. The table then holds the holder's
one unit and the contender's write, nothing after it.

Needs PostgreSQL: DLOCK_TEST_PG_URL (scripts/test-python.sh starts a test
cluster and sets it); skipped without it.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List, Optional

import pytest

import dlock

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "python" / "pg_guard.py"
PG_URL = os.environ.get("DLOCK_TEST_PG_URL", "")
NAME = "examples/pg-guard"  # the example's lock
TABLE = (
    "CREATE TABLE IF NOT EXISTS pg_guard_units"
    " (id bigserial PRIMARY KEY, who text NOT NULL, unit int NOT NULL, token bigint NOT NULL)"
)
EVENT = 20.0  # the longest wait for something that must happen (the example's TTL is 3 s)

pytestmark = pytest.mark.skipif(not PG_URL, reason="needs PostgreSQL: DLOCK_TEST_PG_URL (scripts/test-python.sh)")


def proc_state(pid: int) -> str:
    """The process's state letter in /proc/PID/stat ('T': stopped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]


def test_example_paused_past_its_ttl_is_refused_by_the_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    stamp = time.time_ns()
    old, new = f"python-holder-{stamp}", f"python-contender-{stamp}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(TABLE)

    # 1. The holder: one unit committed, then stopped before the next.
    env = dict(os.environ, DLOCK_ENDPOINTS=PG_URL, DATABASE_URL=PG_URL, PG_GUARD_PAUSE_AT="1")
    holder = subprocess.Popen(
        [sys.executable, str(EXAMPLE), old, "3"], env=env, stdout=subprocess.PIPE, text=True
    )
    lines: "queue.Queue[Optional[str]]" = queue.Queue()
    seen: List[str] = []
    assert holder.stdout is not None
    out = holder.stdout

    def read() -> None:
        for line in out:
            lines.put(line.rstrip("\n"))
        lines.put(None)  # the end of its output

    threading.Thread(target=read, daemon=True).start()

    def wait_for(part: Optional[str]) -> str:
        """The next line containing ``part`` (None: the end of the output)."""
        end = time.monotonic() + EVENT
        while True:
            try:
                line = lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {part!r} from the holder; its output: {seen}") from None
            if line is None:
                if part is None:
                    return ""
                raise AssertionError(f"the holder's output ended before {part!r}: {seen}")
            seen.append(line)
            if part is not None and part in line:
                return line

    try:
        t1 = int(wait_for(" holds ").rsplit(" ", 1)[1])
        wait_for("pausing before unit 1")
        end = time.monotonic() + EVENT
        while proc_state(holder.pid) != "T":
            assert time.monotonic() < end, f"the holder did not stop: {proc_state(holder.pid)}"
            time.sleep(0.01)

        # 2. A contender: it gets the lock once the stopped holder's lease
        # runs out on the server, and writes in its own guarded transaction.
        monkeypatch.setenv("DLOCK_ENDPOINTS", PG_URL)
        client = dlock.Client(ttl=4.0, keepalive_interval=1.0, keepalive_timeout=0.5, margin=1.0, reacquire=False)
        lock = client.lock(NAME)
        t2 = lock.acquire(EVENT)
        assert t2 > t1
        assert proc_state(holder.pid) == "T", "the holder ran before the contender's write"
        with psycopg.connect(PG_URL, autocommit=True) as app:
            with app.transaction():
                app.execute("SELECT dlock.guard(%s, %s)", (NAME, t2))
                app.execute("INSERT INTO pg_guard_units (who, unit, token) VALUES (%s, 0, %s)", (new, t2))

        # 3. The holder resumes into its next transaction: refused.
        os.kill(holder.pid, signal.SIGCONT)
        assert holder.wait(timeout=EVENT) == 0, seen
        wait_for(None)
        refused = f"{old}: refused by the database (SQLSTATE DL001): token {t1} no longer holds {NAME}; stopping"
        assert refused in seen, seen
        assert not any("unit 1 committed" in line for line in seen), seen

        # 4. The table: the holder's unit 0, then the contender's write,
        # nothing of the old holder after it.
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            rows = admin.execute(
                "SELECT who, unit, token FROM pg_guard_units WHERE who IN (%s, %s) ORDER BY id", (old, new)
            ).fetchall()
        assert rows == [(old, 0, t1), (new, 0, t2)]
        lock.release()
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGCONT)
            holder.kill()
            holder.wait()

