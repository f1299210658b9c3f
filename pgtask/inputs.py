"""Task input held in memory: large inputs run within a byte budget ([pgtask] input_budget).

An input of up to INLINE bytes comes with its claim (no extra round trip). A larger one is left
out of the claim -- a claim of eight 50 MB inputs would hold them all at once, several times over
(the result, the strings, the query text sent) -- and is read on a connection of its own once the
budget has room for it, just before it runs; its memory is given back when its run is over. The
budget counts the bytes of the large inputs held at once (per process); one larger than the whole
budget runs alone. Large inputs take their turns first come, first served, so none waits forever
behind a stream of smaller ones; small inputs never wait.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from .task import Task

INLINE = 64 * 1024  # bytes: an input up to this size comes with its claim


class Budget:
    """Bytes of large input held at once, at most ``limit`` (one larger than that: alone)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        self.waiting: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    def resize(self, limit: int) -> None:
        self.limit = limit
        self._grant()

    def _fits(self, size: int) -> bool:
        return self.held == 0 or self.held + size <= self.limit

    async def acquire(self, size: int) -> None:
        if not self.waiting and self._fits(size):
            self.held += size
            return
        waiter = asyncio.get_running_loop().create_future()
        entry = (size, waiter)
        self.waiting.append(entry)
        try:
            await waiter
        except asyncio.CancelledError:
            if entry in self.waiting:
                self.waiting.remove(entry)
                self._grant()  # the ones behind it may fit now
            elif not waiter.cancelled():  # granted just before the cancel
                self.release(size)
            raise

    def release(self, size: int) -> None:
        self.held -= size
        self._grant()

    def _grant(self) -> None:
        while self.waiting and self._fits(self.waiting[0][0]):
            size, waiter = self.waiting.popleft()
            if not waiter.done():
                self.held += size
                waiter.set_result(None)


class Held:
    """``async with Held(budget, task, read):`` -- a large input (left out of its claim) is read
    with ``read`` once ``budget`` has room, and given back after the block (``large`` then says
    so). An input that came with its claim passes straight through."""

    __slots__ = ("budget", "large", "read", "size", "task")

    def __init__(self, budget: Budget, task: Task, read: Callable[[Task], Awaitable[str]]):
        self.budget, self.task, self.read, self.size, self.large = budget, task, read, 0, False

    async def __aenter__(self) -> Self:
        task = self.task
        if task.input is not None or task.input_bytes is None:
            return self
        await self.budget.acquire(task.input_bytes)
        self.size, self.large = task.input_bytes, True
        try:
            task.hold_input(await self.read(task))
        except BaseException:
            self._give_back()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        if self.size:
            self._give_back()

    def _give_back(self) -> None:
        self.task.drop_input()
        self.budget.release(self.size)
        self.size = 0

