"""Supervision of the service's internal loops: a loop that fails or ends while the service runs is
logged and started again after a backoff -- never left dead, unnoticed."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol


class Delays(Protocol):
    """How long to wait before each restart (connect.Backoff)."""

    def next(self) -> float: ...

    def reset(self) -> None: ...


# A loop that ran this long before it failed is started again after the shortest delay.
HEALTHY_AFTER = 60.0


async def supervised(name: str, loop: Callable[[], Awaitable[None]], stopping: Callable[[], bool],
                     delays: Delays, log: logging.Logger) -> None:
    """Run ``loop()`` until ``stopping()``: when it raises (a bug, an error it does not handle) or
    returns while the service runs on, log it -- with the traceback -- and start it again after
    ``delays.next()`` seconds. Cancelling this cancels the loop."""
    while not stopping():
        began = time.monotonic()
        try:
            await loop()
        except asyncio.CancelledError:
            raise
        except Exception:
            if stopping():
                return
            if time.monotonic() - began >= HEALTHY_AFTER:
                delays.reset()
            delay = delays.next()
            log.exception("%s failed; starting it again in %.1fs", name, delay)
        else:
            if stopping():
                return
            delay = delays.next()
            log.error("%s ended; starting it again in %.1fs", name, delay)
        await asyncio.sleep(delay)
