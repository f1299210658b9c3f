"""The claim loop (the manual's pg_work's heart): claim passes on the control connection
(control.py), planned as planning.py says, the expiry of GONE rows, the orphan reset cadence.
Claimed tasks are handed to ``dispatch`` (the runner); the finishes waiting to be written ride in
the pass's transaction (completer.py's seam)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import psycopg
from psycopg import errors
from psycopg.adapt import Transformer

from . import wire
from .completer import Completer, PassBatch
from .connect import Backoff
from .control import Control, ServerSettings
from .output import reason
from .parts import Parts
from .planning import Planning
from .queries import PassResult, read_pass
from .session import Session
from .task import Task

log = logging.getLogger("pgtask.claim")


class Claimer:
    """One scheduler's claims, on its control connection (``control``)."""

    def __init__(self, parts: Parts, control: Control, server: ServerSettings, completer: Completer,
                 dispatch: Callable[[Task, Session | None], None],
                 adopt_table: Callable[[int | None], Awaitable[None]]):
        self.parts, self.control, self.server, self.completer = parts, control, server, completer
        self.dispatch = dispatch
        self.adopt_table = adopt_table  # the table was created again (see "same_table")
        self.planning = Planning(parts)
        # (id, attempt, lease) of rows under this token that no task of this instance ran at the
        # last orphan check (see reset_own)
        self.lost_rows: set[tuple[int, int, str]] = set()
        self.last_pass = 0.0  # time.monotonic() when the last claim pass ended (see Scheduler.health)
        self.last_expiry = 0.0
        # the last pass found a group paused or rate-limited (as if one did before the first): this
        # pass claims under flow control, else with the plain claim (see "claim_plain")
        self.limited = True
        self.pass_loader: Transformer | None = None

    def replan(self) -> None:
        """Plan the next pass again (see Scheduler.adopt_table and queries.Queries.flush_version)."""
        self.planning.replan()

    async def run(self) -> None:
        """The claim loop: a claim pass, then sleep until the next planned row, pg_task.sleep at most,
        or until woken; orphans reset every reset_check seconds; the control connection connected
        again when lost."""
        last_reset = time.monotonic()
        refused = Backoff(first=0.5, cap=10.0)  # the database refusing the claim itself (see below)
        lost = Backoff(first=0.05)  # the control connection lost pass after pass
        while not self.parts.life.stopping:
            timeout = self.parts.options.sleep
            try:
                if not self.parts.life.draining:
                    began = time.monotonic()
                    claimed, next_in, again = await self.claim_pass()
                    self.last_pass = time.monotonic()
                    self.parts.metrics.claim_pass(self.last_pass - began)
                    if next_in is not None:
                        timeout = min(timeout, max(next_in, 0.001))
                    if claimed and again:
                        timeout = 0
                if time.monotonic() - last_reset >= self.parts.options.reset_check:
                    last_reset = time.monotonic()
                    await self.reset_orphans()
                    async with self.control.lock:
                        await self.parts.queries.refresh_columns(self.control.conn)
                refused.reset()
                lost.reset()
            except psycopg.OperationalError as exc:
                delay = lost.next()
                log.warning("%s: connection lost (%s); reconnecting in %.2fs", self.parts.label,
                            reason(exc), delay)
                self.parts.metrics.claiming(False)
                await self.control.close()
                await asyncio.sleep(delay)
                await self.control.connect()
                self.parts.metrics.reconnected()
                continue
            except psycopg.Error as exc:
                # The database refused a claim pass (a row of a user's making: a CHECK added NOT
                # VALID, a trigger refusing the claim): the running tasks go on, and the pass is
                # tried again, later each time, with the reason in the log until it passes.
                delay = refused.next()
                log.error("%s: a claim pass failed (%s); trying again in %.1fs", self.parts.label,
                          str(exc).strip(), delay)
                self.parts.metrics.claiming(False)
                await asyncio.sleep(delay)
                continue
            await self.parts.life.sleep(timeout)

    async def claim_pass(self) -> tuple[int, float | None, bool]:
        """One round trip: BEGIN, [finishes,] expire (once per sleep), claim lock + unlock, claim,
        next, COMMIT.

        One simple-protocol query string of EXECUTEs of statements prepared once per control
        session (planned once, parameters are numbers only), its results read straight from libpq:
        the service's own CPU per pass is a third of what a psycopg pipeline costs.
        The commit does not wait for the WAL flush (synchronous_commit is off on this session): a
        claim lost in a server crash leaves its rows PLAN, and nothing of a claimed task can become
        durable before it (the first synchronous commit after it -- the task's own input or its
        finish -- flushes the WAL up to the claim): so the claim is never the reason a task runs twice.

        The pass also writes the finishes waiting to be written when no flusher is writing (see
        completer.Completer.spawn_flusher), first in its transaction: a group whose task finished
        has room in the claim that follows, so its next task is claimed in the commit that finishes
        the previous one -- one round trip and one commit instead of a flush and a pass. That commit
        waits for the WAL flush (the finishes' durability). A pass carrying finishes waits at most
        SLOW_FLUSH for any lock (a row lock on a finished row, another instance's claim lock): then,
        or if it fails in any other way, the finishes go to a flusher (see completer.Completer.flush)
        and the pass runs again without them.
        """
        parts = self.parts
        async with self.control.lock:
            await self.planning.before_pass(self.control.conn)
            limited = self.limited
            conn = self.control.conn
            await parts.queries.prepare_pass(conn, limited)
            if self.pass_loader is None or self.pass_loader.connection is not conn:
                self.pass_loader = Transformer(conn)
            batch = self.completer.take_for_pass()
            # the tasks whose finishes it writes first have ended when its claim runs
            room = parts.options.run - len(parts.inflight) + len(batch)
            claim = room > 0 and parts.options.limit > 0
            got = await self._exchange(batch, room if claim else 0, limited)
            if got is None:
                return 0, None, False
            if batch.writes:
                batch.written(got.written)
            if got.expired is not None:  # its rows come first (the rows expired: metrics)
                parts.metrics.expired(got.expired)
            self.limited = got.next.limited
        if claim and self.limited and not limited:
            # a group became paused or rate-limited: the plain claim may have claimed nothing
            # because of it (see "claim_plain"); the next pass claims under flow control, now
            parts.life.wake.set()
        await self._take_up(got, batch)
        tasks, info = got.tasks, got.next
        # (claimed, seconds to the next planned row, claim again at once): again when this claim left
        # room (the tasks whose finishes it wrote counted as ended) and no due row waits for it, or
        # its row limit (pg_task.limit) cut it
        return len(tasks), info.next_in, room > len(tasks) and (not info.due or len(tasks) >= parts.options.limit)

    async def _exchange(self, batch: PassBatch, room: int, limited: bool) -> PassResult | None:
        """Send the pass's query string -- its claim for ``room`` tasks at most (0: no claim), on
        the sessions ``batch`` offers -- and read what it returned. None: it failed on a finish,
        which a flusher writes now (see _failed)."""
        parts, conn, loader = self.parts, self.control.conn, self.pass_loader
        try:
            finishes = await parts.queries.pass_finishes(conn, loader, batch.writes, batch.lock_timeout)
            expiring = time.monotonic() - self.last_expiry >= parts.options.sleep
            if expiring:
                self.last_expiry = time.monotonic()
            claim = None
            if room:
                claim = (self.control.token, min(room, parts.options.limit), *batch.offer())
            text = parts.queries.claim_pass_text(finishes, expiring, claim, limited)
            await wire.send(conn.pgconn, text)
            results, error = await wire.results(conn.pgconn)
        except BaseException:
            batch.give_back()
            batch.unoffer()
            raise
        if error is not None:  # the rest of the string did not run: end the failed transaction
            batch.unoffer()
            await self._failed(batch, error)
            return None
        return read_pass(results, loader, bool(batch.writes), expiring, bool(room))

    async def _failed(self, batch: PassBatch, error) -> None:
        """The pass's query string failed (``error``): rolled back. When it carried finishes they go
        to a flusher and the pass runs again without them at once; else the error is raised."""
        conn = self.control.conn
        await wire.simple(conn.pgconn, "ROLLBACK")
        if not batch.writes:
            raise errors.error_from_result(error, encoding=conn.info.encoding)
        log.info("%s: a claim pass handed its finishes to a writer: %s", self.parts.label,
                 errors.error_from_result(error, encoding=conn.info.encoding))
        # a finish that ran over SLOW_FLUSH is cancelled (see pass_finishes)
        batch.give_back(slow=wire.sqlstate(error) == wire.CANCELLED)
        self.parts.life.wake.set()

    async def _take_up(self, got: PassResult, batch: PassBatch) -> None:
        """After a pass's commit: what it learnt of the table and the server taken up, its claimed
        tasks dispatched (each on the session offered for it, if any), the rest of the offered
        sessions pooled."""
        parts, info, tasks = self.parts, got.next, got.tasks
        if info.table_oid != parts.queries.oid:
            await self.adopt_table(info.table_oid)
        self.server.seen(info.settings_mark, info.conf_loaded, info.style)  # before the tasks take sessions
        inflight = parts.inflight
        self.planning.after_pass(bool(tasks), not tasks and not inflight,
                                 not tasks and inflight.keys() <= batch.ids())
        for task, session in batch.claimed(tasks):
            parts.metrics.picked_up(task.waited)
            self.dispatch(task, session)
        for session in batch.untaken():  # offered, not taken: idle (the finish is written)
            await parts.sessions.put(session)

    async def reset_orphans(self) -> None:
        async with self.control.lock:
            rows = await self.parts.queries.reset(self.control.conn)
        self.parts.metrics.orphans_reset(len(rows))
        for row in rows:
            if row["state"] == "STOP":  # stopped while it ran: it ended with its service, stays STOP
                log.warning("%s: stopped id = %s ended (its executor is gone)", self.parts.label, row["id"])
            else:
                log.warning("%s: reset id = %s (its executor is gone)", self.parts.label, row["id"])
        await self.reset_own()

    async def reset_own(self) -> None:
        """Rows this instance's claims hold that it does not run -- a claim or a write whose answer
        was lost with its connection (a failover) -- are alive while it is connected: no other
        instance's orphan check resets them. Seen at two checks in a row under the same claim, they
        are reset here (the second look is what keeps a claim whose task is being dispatched right
        now from counting)."""
        async with self.control.lock:
            held = await self.parts.queries.own(self.control.conn, self.control.token)
        running = {(task.id, task.attempt, str(task.lease)) for task, _ in list(self.parts.inflight.values())}
        lost = held - running
        again, self.lost_rows = lost & self.lost_rows, lost
        if not again:
            return
        async with self.control.lock:
            rows = await self.parts.queries.reset_own(self.control.conn, again)
        self.lost_rows -= again
        self.parts.metrics.orphans_reset(len(rows))
        for row in rows:
            log.warning("%s: %s id = %s (claimed here, its task is no longer run here)", self.parts.label,
                        "stopped" if row["state"] == "STOP" else "reset", row["id"])

    async def stop_analyzing(self) -> None:
        await self.planning.stop()
