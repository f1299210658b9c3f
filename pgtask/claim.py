"""The claim loop (the manual's pg_work's heart): claim passes on the control connection, the
statistics they are planned on, the expiry of GONE rows, the orphan reset cadence, and the claim of
a group's next task for a session within count/live. Claimed tasks are handed to ``dispatch`` (the
runner); the finishes waiting to be written ride in the pass's transaction (completer.py's seam)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import psycopg
from psycopg import errors
from psycopg.adapt import Transformer
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from . import wire
from .completer import Completer, resolve
from .config import Entry
from .connect import Backoff
from .metrics import Sink
from .output import DEFAULT_STYLE, ErrorStyle, reason
from .queries import CONTROL_SETTINGS, Queries, matched
from .session import Session
from .session_pool import SessionPool
from .task import InFlight, Lifecycle, Task

log = logging.getLogger("pgtask.claim")


class Claimer:
    """One scheduler's claims. ``control``: its control connection (claims, resets), registered in
    the instance table under ``token``: the tasks it claimed are alive while it is connected (see
    "alive" in queries.sql); one transaction at a time on it (``control_lock``)."""

    def __init__(self, entry: Entry, conninfo: str, options, queries: Queries, completer: Completer,
                 inflight: InFlight, sessions: SessionPool, life: Lifecycle, metrics: Sink,
                 dispatch: Callable[[Task, Session | None], None],
                 adopt_table: Callable[[int | None], Awaitable[None]]):
        self.entry, self.conninfo, self.options, self.queries = entry, conninfo, options, queries
        self.completer, self.inflight, self.sessions, self.life = completer, inflight, sessions, life
        self.metrics, self.dispatch, self.label = metrics, dispatch, entry.label()
        self.adopt_table = adopt_table  # the table was created again (see "same_table")
        # this scheduler's token: the beginning of the lease of every row it claims (see "lease")
        self.token = str(uuid.uuid4())[:18]
        # (id, attempt, lease) of rows under this token that no task of this instance ran at the
        # last orphan check (see reset_own)
        self.lost_rows: set[tuple[int, int, str]] = set()
        self.control: psycopg.AsyncConnection | None = None
        self.control_lock = asyncio.Lock()  # one transaction at a time on the control connection
        self.writers: AsyncConnectionPool | None = None  # the scheduler's, once it started (ANALYZE)
        # the settings remote tasks' errors are written by (pg_task's worker writes them), as this
        # service's control backend has them: read by every claim pass (see "next")
        self.error_style = DEFAULT_STYLE
        self.conf_loaded = None  # the control backend's pg_conf_load_time(): see claim_pass
        self.settings_mark = None  # the database and role settings' fingerprint: see settings_seen
        self.last_pass = 0.0  # time.monotonic() when the last claim pass ended (see Scheduler.health)
        self.last_expiry = 0.0
        self.pass_planned_at = 0.0
        # the pass before found nothing (as none before the first): see claim_pass
        self.pass_idle, self.pass_replan, self.claim_may_start = True, False, True
        # the last pass found a group paused or rate-limited (as if one did before the first): this
        # pass claims under flow control, else with the plain claim (see "claim_plain")
        self.limited = True
        self.analyzing: asyncio.Task | None = None  # see _check_statistics
        self.analyzed_at = -float("inf")
        self.pass_loader: Transformer | None = None

    async def connect(self) -> None:
        """The control connection, connected again until it succeeds (or the scheduler stops)."""
        backoff = Backoff()
        while not self.life.stopping:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    make_conninfo(self.conninfo, application_name=f"pg_work {self.entry.schema} "
                                  f"{self.entry.table} {int(self.options.sleep * 1000)}"),
                    autocommit=True, row_factory=dict_row, prepare_threshold=None)
                await conn.execute(CONTROL_SETTINGS)
                if self.queries.oid:  # a reconnect: the tasks running here are alive on this backend now
                    await self.queries.register(conn, self.token)
                self.control = conn
                return
            except psycopg.OperationalError as exc:
                delay = backoff.next()
                log.warning("%s: cannot connect (%s); retrying in %.1fs", self.label,
                            reason(exc), delay)
                await asyncio.sleep(delay)

    async def run(self) -> None:
        """The claim loop: a claim pass, then sleep until the next planned row, pg_task.sleep at most,
        or until woken; orphans reset every reset_check seconds; the control connection connected
        again when lost."""
        last_reset = time.monotonic()
        refused = Backoff(first=0.5, cap=10.0)  # the database refusing the claim itself (see below)
        lost = Backoff(first=0.05)  # the control connection lost pass after pass
        while not self.life.stopping:
            timeout = self.options.sleep
            try:
                if not self.life.draining:
                    began = time.monotonic()
                    claimed, next_in, again = await self.claim_pass()
                    self.last_pass = time.monotonic()
                    self.metrics.claim_pass(self.last_pass - began)
                    if next_in is not None:
                        timeout = min(timeout, max(next_in, 0.001))
                    if claimed and again:
                        timeout = 0
                if time.monotonic() - last_reset >= self.options.reset_check:
                    last_reset = time.monotonic()
                    await self.reset_orphans()
                    async with self.control_lock:
                        await self.queries.refresh_columns(self.control)
                refused.reset()
                lost.reset()
            except psycopg.OperationalError as exc:
                delay = lost.next()
                log.warning("%s: connection lost (%s); reconnecting in %.2fs", self.label,
                            reason(exc), delay)
                self.metrics.claiming(False)
                await self.close()
                await asyncio.sleep(delay)
                await self.connect()
                self.metrics.reconnected()
                continue
            except psycopg.Error as exc:
                # The database refused a claim pass (a row of a user's making: a CHECK added NOT
                # VALID, a trigger refusing the claim): the running tasks go on, and the pass is
                # tried again, later each time, with the reason in the log until it passes.
                delay = refused.next()
                log.error("%s: a claim pass failed (%s); trying again in %.1fs", self.label,
                          str(exc).strip(), delay)
                self.metrics.claiming(False)
                await asyncio.sleep(delay)
                continue
            if timeout > 0:
                try:
                    await asyncio.wait_for(self.life.wake.wait(), timeout)
                except TimeoutError:
                    pass
            self.life.wake.clear()

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
        tasks: list[Task] = []
        async with self.control_lock:
            if self.claim_may_start:  # do the planner's statistics describe the queue?
                await self._check_statistics()
            # Planned again every reset_check seconds, and when claiming starts after a pass that
            # found nothing: a prepared statement keeps its generic plan until the table is next
            # analyzed, and one planned on an empty queue can be poor for the burst that follows
            # ("next" had one that read every due row, 1 ms a pass). The flushes' statements (here
            # and on the writers) go with them: planned on a small table, a flush kept a hash join
            # over a scan of the whole table through the burst (1.5-2 ms instead of 0.3 at 6,000 rows).
            if self.pass_replan or time.monotonic() - self.pass_planned_at >= self.options.reset_check:
                self.queries.plans, self.pass_planned_at, self.pass_replan = self.queries.plans + 1, time.monotonic(), False
            limited = self.limited
            await self.queries.prepare_pass(self.control, limited)
            if self.pass_loader is None or self.pass_loader.connection is not self.control:
                self.pass_loader = Transformer(self.control)
            pgconn = self.control.pgconn
            batch = self.completer.take_for_pass()
            # the tasks whose finishes it writes first have ended when its claim runs
            room = self.options.run - len(self.inflight) + len(batch)
            offers: dict[int, tuple[Task, Session]] = {}
            try:
                finishes = await self.queries.pass_finishes(self.control, self.pass_loader, batch,
                                                            self.completer.SLOW_FLUSH)
                expiring = time.monotonic() - self.last_expiry >= self.options.sleep
                if expiring:
                    self.last_expiry = time.monotonic()
                claim = room > 0 and self.options.limit > 0
                if claim:
                    offers = self.completer.offers(batch)
                text = self.queries.claim_pass_text(finishes, expiring, (
                    self.token, min(room, self.options.limit), list(offers),
                    [t.id for t, _ in offers.values()]) if claim else None, limited)
                await wire.send(pgconn, text)
                results, error = await wire.results(pgconn)
            except BaseException:
                self.completer.give_back(batch)
                self.completer.unoffer(offers)
                raise
            if error is not None:  # the rest of the string did not run: end the failed transaction
                self.completer.unoffer(offers)
                await wire.simple(pgconn, "ROLLBACK")
                if batch:  # the finishes go to a flusher; the pass runs again without them at once
                    log.info("%s: a claim pass handed its finishes to a writer: %s", self.label,
                             errors.error_from_result(error, encoding=self.control.info.encoding))
                    if wire.sqlstate(error) == wire.CANCELLED:  # the finish ran over SLOW_FLUSH: see pass_finishes
                        self.completer.pass_writes_after = time.monotonic() + self.completer.PASS_WRITES_PAUSE
                    self.completer.give_back(batch)
                    self.life.wake.set()
                    return 0, None, False
                raise errors.error_from_result(error, encoding=self.control.info.encoding)
            if batch:
                for write in batch:
                    write.task.by_pass = True
                resolve(batch, matched([results.pop(0)]))
            if expiring:  # its rows come first (the rows expired: metrics)
                self.metrics.expired(results[0].ntuples)
            loader = self.pass_loader
            if claim:
                res = results[-2]  # the claim's rows; next's last
                loader.set_pgresult(res)
                names = [res.fname(i).decode() for i in range(res.nfields)]
                tasks = Task.from_rows(names, loader.load_rows(0, res.ntuples, tuple))
            loader.set_pgresult(results[-1])
            next_in, due, settings_mark, table_oid, self.limited, conf_loaded, *style = loader.load_row(0, tuple)
        self.error_style = ErrorStyle.of(style)
        if claim and self.limited and not limited:
            # a group became paused or rate-limited: the plain claim may have claimed nothing
            # because of it (see "claim_plain"); the next pass claims under flow control, now
            self.life.wake.set()
        if table_oid != self.queries.oid:
            await self.adopt_table(table_oid)
        self.settings_seen(settings_mark)  # before the claimed tasks take their sessions
        if conf_loaded != self.conf_loaded:  # the server's configuration was read again
            if self.conf_loaded is not None:
                self.sessions.config_reloaded()
            self.conf_loaded = conf_loaded
        # claiming again after an empty pass: plan again for the queue as it is now (see above);
        # a table taken up anew in this pass (adopt_table) has asked for it already
        self.pass_replan = self.pass_replan or (bool(tasks) and self.pass_idle)
        self.pass_idle = not tasks and not self.inflight
        # the next claim may start a burst: this pass claimed nothing and nothing runs once its
        # finishes are written -- also when it wrote the last ones, which pass_idle does not count
        # (planning the pass again there too cost each task of a trickle 1.5 ms of pickup latency)
        self.claim_may_start = not tasks and self.inflight.keys() <= {w.task.id for w in batch}
        for finished, _ in offers.values():  # its input is over: nothing of it to cancel on the session
            self.inflight.detach(finished.id)
        self.completer.cohort.update(t.id for t in tasks)
        for task in tasks:
            self.metrics.picked_up(task.waited)
            _, session = offers.pop(task.session_pid, (None, None))
            self.dispatch(task, session)
        for _, session in offers.values():  # offered, not taken: idle (the finish is written)
            await self.sessions.put(session)
        # (claimed, seconds to the next planned row, claim again at once): again when this claim left
        # room (the tasks whose finishes it wrote counted as ended) and no due row waits for it, or
        # its row limit (pg_task.limit) cut it
        return len(tasks), next_in, room > len(tasks) and (not due or len(tasks) >= self.options.limit)

    # The statistics are looked at (_check_statistics) no more often than STATISTICS_EVERY seconds;
    # the table is analyzed when at least STATISTICS_DUE rows are due and the statistics count fewer
    # PLAN rows than are due (counted up to STATISTICS_BOUND); the claim waits up to ANALYZE_WAIT
    # seconds for the ANALYZE.
    STATISTICS_EVERY = 60.0
    STATISTICS_DUE = 256
    STATISTICS_BOUND = 1000
    ANALYZE_WAIT = 0.25

    async def _check_statistics(self) -> None:
        """Before a claim that may start a burst (the pass before claimed nothing and left nothing
        running: claim_may_start, one round trip on each task of a trickle, 0.3 ms): if the table's
        statistics count fewer PLAN rows than are due -- analyzed while it held only finished rows,
        or never analyzed, with a burst inserted since -- analyze it (on a writer) and plan the pass
        again. On such statistics the planner estimates almost no PLAN row, and the claim chose
        plans whose cost grows with the due rows times the groups: each group's head read through
        the plan index, every due row for every group (1,000 groups of a task each: 0.2-0.45 s for
        one claim, 3,000 groups 3.7 s, holding the claim lock), or each group's whole backlog sorted
        (44 ms a claim for 16 rows instead of 1) -- until autovacuum analyzed the table, up to a
        minute later. The claim waits for the ANALYZE up to ANALYZE_WAIT (a large table's sample
        can take longer; the pass after it is planned again then). Below STATISTICS_DUE due rows
        even those plans cost a few milliseconds, once: no ANALYZE for a trickle of tasks."""
        if self.analyzing is not None or time.monotonic() - self.analyzed_at < self.STATISTICS_EVERY:
            return
        try:  # prepared like the pass's statements: planning the pg_stats view took 1.1 ms, running it 0.2
            row = await self.queries.statistics(self.control, self.STATISTICS_BOUND)
        except psycopg.OperationalError:
            raise  # the connection: the run loop reconnects
        except psycopg.Error as exc:  # a statistic the claims can do without: claim as they are
            log.warning("%s: could not read the table's statistics (%s)", self.label, reason(exc))
            return
        if row is None or row["due"] < self.STATISTICS_DUE or row["planned"] >= row["due"]:
            return
        self.analyzed_at = time.monotonic()
        self.analyzing = asyncio.create_task(self._analyze(row["planned"], row["due"]),
                                             name=f"statistics {self.label}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.analyzing), self.ANALYZE_WAIT)

    async def _analyze(self, planned: float, due: int) -> None:
        """ANALYZE the table on a writer (SKIP_LOCKED: if autovacuum holds it, it is analyzing or
        vacuuming it now) and have the next pass planned again."""
        try:
            async with self.writers.connection() as conn:
                await self.queries.analyze(conn)
            log.info("%s: analyzed the table (its statistics counted %d planned rows, %s%d were due)",
                     self.label, planned, "at least " if due >= self.STATISTICS_BOUND else "", due)
            self.pass_planned_at = -float("inf")
        except psycopg.Error as exc:
            log.warning("%s: could not analyze the table (%s)", self.label, reason(exc))
        finally:
            self.analyzing = None

    async def next_of_group(self, task: Task, spawner_max: int, done: int, born) -> Task | None:
        """The next task of the group for this session (caller holds control_lock)."""
        if self.life.draining or self.life.stopping or task.max < 0 or born is None:
            return None
        if len(self.inflight) >= self.options.run:
            return None
        try:
            async with self.control.transaction():
                row = await self.queries.claim_next(self.control, {
                    "token": self.token, "group": task.group, "remote": task.remote, "user": task.user,
                    "max": spawner_max, "done": done, "born": born})
        except (psycopg.OperationalError, AttributeError):
            return None
        if row is None:
            return None
        self.settings_seen(row["settings_mark"])  # a stale session leaves its task to a new one
        nxt = Task.from_row(row)
        self.metrics.picked_up(nxt.waited)
        self.inflight[nxt.id] = (nxt, None)
        return nxt

    def settings_seen(self, mark: int) -> None:
        """``mark``: the fingerprint of the ALTER DATABASE / ALTER ROLE settings that reach this
        database's sessions (settings_mark in queries.sql), read by every claim pass and count/live
        claim. When it moves, the pooled sessions, which started with the old settings, are retired:
        a task claimed after the change committed runs with the new ones, as on the manual's new
        backend per task."""
        if mark != self.settings_mark:
            if self.settings_mark is not None:
                log.info("%s: database or role settings changed; executor sessions open now are retired",
                         self.label)
                self.sessions.settings_changed()
            self.settings_mark = mark

    async def reset_orphans(self) -> None:
        async with self.control_lock:
            rows = await self.queries.reset(self.control)
        self.metrics.orphans_reset(len(rows))
        for row in rows:
            if row["state"] == "STOP":  # stopped while it ran: it ended with its service, stays STOP
                log.warning("%s: stopped id = %s ended (its executor is gone)", self.label, row["id"])
            else:
                log.warning("%s: reset id = %s (its executor is gone)", self.label, row["id"])
        await self.reset_own()

    async def reset_own(self) -> None:
        """Rows this instance's claims hold that it does not run -- a claim or a write whose answer
        was lost with its connection (a failover) -- are alive while it is connected: no other
        instance's orphan check resets them. Seen at two checks in a row under the same claim, they
        are reset here (the second look is what keeps a claim whose task is being dispatched right
        now from counting)."""
        async with self.control_lock:
            held = await self.queries.own(self.control, self.token)
        running = {(task.id, task.attempt, str(task.lease)) for task, _ in list(self.inflight.values())}
        lost = held - running
        again, self.lost_rows = lost & self.lost_rows, lost
        if not again:
            return
        async with self.control_lock:
            rows = await self.queries.reset_own(self.control, again)
        self.lost_rows -= again
        self.metrics.orphans_reset(len(rows))
        for row in rows:
            log.warning("%s: %s id = %s (claimed here, its task is no longer run here)", self.label,
                        "stopped" if row["state"] == "STOP" else "reset", row["id"])

    async def close(self, unregister: bool = False) -> None:
        """``unregister``: the service stops; the rows it claimed are no longer alive (any left are
        reset by the next orphan check)."""
        if self.control is not None:
            if unregister:
                with contextlib.suppress(Exception):  # a broken connection
                    await self.queries.unregister(self.control, self.token)
            with contextlib.suppress(Exception):  # closing a broken connection
                await self.control.close()
            self.control = None

    async def stop_analyzing(self) -> None:
        if self.analyzing is not None:
            self.analyzing.cancel()
            await asyncio.gather(self.analyzing, return_exceptions=True)
