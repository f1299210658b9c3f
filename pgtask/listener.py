"""LISTEN on a task table's channel and hand its notifications on as hints, never as the truth.

Any role may NOTIFY any channel with any payload: a payload is parsed defensively (anything
unexpected is ignored), and a 'stop <id>' cancels nothing by itself -- StopHints asks the table
first, and cancels only a task this service runs whose row is STOP under that very claim.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import psycopg
from psycopg import sql

from .restart import Delays

log = logging.getLogger("pgtask.listener")

WAKE, SCHEDULE, STOP = "wake", "schedule", "stop"
_STOP = re.compile(r"stop ([1-9][0-9]{0,18})")
_MAX_ID = 2**63 - 1


def parse(payload: str) -> tuple[str, int] | tuple[str, None] | None:
    """A notification's payload as (WAKE, None), (SCHEDULE, None) or (STOP, task id); None for
    anything else (ignored)."""
    if payload == WAKE:
        return WAKE, None
    if payload == SCHEDULE:
        return SCHEDULE, None
    m = _STOP.fullmatch(payload)
    if m is not None and int(m.group(1)) <= _MAX_ID:
        return STOP, int(m.group(1))
    return None


@dataclass(frozen=True)
class Hints:
    """Where each kind of notification goes (see parse)."""

    on_wake: Callable[[], None]       # "wake", and each (re)connect: a claim pass now
    on_schedule: Callable[[], None]   # "schedule": a schedule pass now
    on_stop: Callable[[int], None]    # "stop <id>": to be checked (StopHints)


class Listener:
    """One LISTEN connection on the channel ``channel()`` names at each connect: reconnects with
    ``delays`` when the connection is lost, at once after reconnect(); anything else that goes wrong
    ends run() with the exception (restart.supervised starts it again)."""

    def __init__(self, conninfo: str, channel: Callable[[], str], label: str, delays: Delays,
                 stopping: Callable[[], bool], hints: Hints):
        self.conninfo, self.channel, self.label, self.delays = conninfo, channel, label, delays
        self.stopping = stopping
        self.handlers = {WAKE: lambda _: hints.on_wake(), SCHEDULE: lambda _: hints.on_schedule(),
                         STOP: hints.on_stop}
        self.conn: psycopg.AsyncConnection | None = None
        self.retarget = False

    async def run(self) -> None:
        while not self.stopping():
            try:
                async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
                    self.conn, self.retarget = conn, False
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel())))
                    self.delays.reset()
                    self.handlers[WAKE](None)  # a (re)connected listener triggers an immediate claim pass
                    async for note in conn.notifies():
                        self.handle(note.payload)
            except psycopg.OperationalError as exc:
                if self.retarget:
                    continue
                delay = self.delays.next()
                log.warning("%s: listener lost (%s); reconnecting in %.1fs", self.label, exc, delay)
                await asyncio.sleep(delay)
            finally:
                self.conn = None

    def reconnect(self) -> None:
        """Listen again, on the channel named now (the table was created again: its oid changed)."""
        self.retarget = True
        if self.conn is not None:
            self.conn.pgconn.finish()  # ends notifies() with an OperationalError: see run

    def handle(self, payload: str) -> None:
        hint = parse(payload)
        if hint is None:
            log.debug("%s: notification ignored: %r", self.label, payload[:80])
            return
        kind, value = hint
        self.handlers[kind](value)


class StopHints:
    """'stop <id>' hints, checked before anything is cancelled. A hint for a task this service does
    not run costs nothing; hints for running ones gather while a check is in flight and are checked
    together, in one query: a storm of hints is a few queries, not one each."""

    def __init__(self, running: Callable[[int], bool],
                 confirm: Callable[[list[int]], Awaitable[Iterable[int]]],
                 cancel: Callable[[int], Awaitable[None]], label: str):
        self.running, self.confirm, self.cancel, self.label = running, confirm, cancel, label
        self.pending: set[int] = set()
        self.checking: asyncio.Task | None = None

    def hint(self, task_id: int) -> None:
        if not self.running(task_id):
            return
        self.pending.add(task_id)
        if self.checking is None:
            self.checking = asyncio.create_task(self._check(), name=f"stop hints {self.label}")

    async def _check(self) -> None:
        try:
            while self.pending:
                ids, self.pending = sorted(self.pending), set()
                try:
                    for task_id in await self.confirm(ids):
                        await self.cancel(task_id)
                except Exception:
                    log.exception("%s: checking stop requests %s failed", self.label, ids)
        finally:
            self.checking = None

    async def close(self) -> None:
        if self.checking is not None:
            self.checking.cancel()
            await asyncio.gather(self.checking, return_exceptions=True)
