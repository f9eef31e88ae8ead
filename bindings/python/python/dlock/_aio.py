"""The asyncio end of the core's completions: the core calls back once on
its callback thread, which hands the outcome to the loop with
``loop.call_soon_threadsafe(complete, fut, value, exc)``."""

from __future__ import annotations

import asyncio
from typing import Any, Optional


def complete(fut: "asyncio.Future[Any]", value: Any, exc: Optional[BaseException]) -> None:
    """Completes ``fut`` unless it was cancelled meanwhile."""
    if fut.done():
        return
    if exc is None:
        fut.set_result(value)
    else:
        fut.set_exception(exc)
