"""What several test files share: the test cluster's etcdctl, a child
interrupted with SIGINT while it waits, and the event loop left free while
an `acquire_async` waits."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Awaitable, Callable, List, Tuple

import pytest

import dlock


def etcdctl(members: str, *args: str, timeout: float = 15.0) -> str:
    """`etcdctl ARGS` on the cluster of `members`: its stdout."""
    return subprocess.run(
        ["etcdctl", f"--endpoints={members}", *args],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "ETCDCTL_API": "3"},
        timeout=timeout,
    ).stdout


def interrupted(code: str, within: float) -> Tuple[List[str], float]:
    """Runs `code` in a child Python, which prints "waiting" once it waits,
    and sends it SIGINT then: the lines it printed after (it must exit 0
    within `within` s) and the seconds from the signal to its exit."""
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "waiting"
    started = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=within)
    took = time.monotonic() - started
    assert p.returncode == 0, out
    return out.split("\n"), took


async def times_out_with_the_loop_free(acquire: Callable[[], Awaitable[object]]) -> None:
    """`acquire()` must end in dlock.Timeout while the event loop runs on:
    a ticker on the loop ticks at least five times meanwhile."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    tk = asyncio.ensure_future(ticker())
    with pytest.raises(dlock.Timeout):
        await acquire()
    tk.cancel()
    assert ticks >= 5
