"""Restarting the service's internal loops: a loop that fails or ends while the service runs is
logged and started again after a backoff -- never left dead, unnoticed."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol


class Delays(Protocol):
    """How long to wait before each restart (connect.Backoff, Every)."""

    def next(self) -> float: ...

    def reset(self) -> None: ...


class Every:
    """The same delay before each restart, read when it is due (a reload may change it)."""

    def __init__(self, seconds: Callable[[], float]):
        self.seconds = seconds

    def next(self) -> float:
        return self.seconds()

    def reset(self) -> None:
        pass


# A loop that ran this long before it failed is started again after the shortest delay.
HEALTHY_AFTER = 60.0


async def supervised(name: str, loop: Callable[[], Awaitable[None]], stopping: Callable[[], bool],
                     delays: Delays, log: logging.Logger, *,
                     traceback: Callable[[Exception], bool] = lambda exc: True,
                     before_restart: Callable[[], Awaitable[None]] | None = None) -> None:
    """Run ``loop()`` until ``stopping()``: when it raises (a bug, an error it does not handle) or
    returns while the service runs on, log it -- with the traceback unless ``traceback(exc)`` says
    the exception's text is enough -- await ``before_restart()`` and start it again after
    ``delays.next()`` seconds. Cancelling this cancels the loop."""
    while not stopping():
        began = time.monotonic()
        try:
            await loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if stopping():
                return
            if time.monotonic() - began >= HEALTHY_AFTER:
                delays.reset()
            delay = delays.next()
            if traceback(exc):
                log.exception("%s failed; starting it again in %.1fs", name, delay)
            else:
                log.error("%s failed: %s; starting it again in %.1fs", name, exc, delay)
        else:
            if stopping():
                return
            delay = delays.next()
            log.error("%s ended; starting it again in %.1fs", name, delay)
        if before_restart is not None:
            await before_restart()
        await asyncio.sleep(delay)
