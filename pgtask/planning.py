"""When the claim pass's statements are planned again, and whether the planner's statistics describe
the queue they claim from (an ANALYZE before a burst). See claim.Claimer.claim_pass."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import psycopg

from .output import reason
from .parts import Parts

log = logging.getLogger("pgtask.claim")


class Planning:
    """The claim pass's planning state: ``replan_due`` (plan the pass again before it runs),
    ``idle`` (the pass before found nothing, as none before the first), ``may_start`` (the next
    claim may start a burst: look at the statistics first), and the ANALYZE in flight."""

    # The statistics are looked at (check_statistics) no more often than STATISTICS_EVERY seconds;
    # the table is analyzed when at least STATISTICS_DUE rows are due and the statistics count fewer
    # PLAN rows than are due (counted up to STATISTICS_BOUND); the claim waits up to ANALYZE_WAIT
    # seconds for the ANALYZE.
    STATISTICS_EVERY = 60.0
    STATISTICS_DUE = 256
    STATISTICS_BOUND = 1000
    ANALYZE_WAIT = 0.25

    def __init__(self, parts: Parts):
        self.parts = parts
        self.planned_at = 0.0
        self.replan_due, self.idle, self.may_start = False, True, True
        self.analyzing: asyncio.Task | None = None  # see check_statistics
        self.analyzed_at = -float("inf")

    def replan(self) -> None:
        """Plan the next pass again (the table was taken up anew: see Scheduler.adopt_table)."""
        self.replan_due = True

    async def before_pass(self, control: psycopg.AsyncConnection) -> None:
        """Before a claim pass: the statistics when it may start a burst, and a new planning round
        when one is due.

        Planned again every reset_check seconds, and when claiming starts after a pass that found
        nothing: a prepared statement keeps its generic plan until the table is next analyzed, and
        one planned on an empty queue can be poor for the burst that follows ("next" had one that
        read every due row, 1 ms a pass). The flushes' statements (here and on the writers) go with
        them: planned on a small table, a flush kept a hash join over a scan of the whole table
        through the burst (1.5-2 ms instead of 0.3 at 6,000 rows)."""
        if self.may_start:  # do the planner's statistics describe the queue?
            await self.check_statistics(control)
        if self.replan_due or time.monotonic() - self.planned_at >= self.parts.options.reset_check:
            self.parts.queries.next_planning_round()
            self.planned_at, self.replan_due = time.monotonic(), False

    def after_pass(self, claimed: bool, idle: bool, may_start: bool) -> None:
        """After a claim pass that ``claimed`` tasks or none; ``idle``: nothing runs now;
        ``may_start``: it claimed nothing and nothing runs once its finishes are written -- also
        when it wrote the last ones, which ``idle`` does not count (planning the pass again there
        too cost each task of a trickle 1.5 ms of pickup latency)."""
        # claiming again after an empty pass: plan again for the queue as it is now (see
        # before_pass); a table taken up anew in this pass (replan) has asked for it already
        self.replan_due = self.replan_due or (claimed and self.idle)
        self.idle, self.may_start = idle, may_start

    async def check_statistics(self, control: psycopg.AsyncConnection) -> None:
        """Before a claim that may start a burst (the pass before claimed nothing and left nothing
        running: may_start, one round trip on each task of a trickle, 0.3 ms): if the table's
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
            row = await self.parts.queries.statistics(control, self.STATISTICS_BOUND)
        except psycopg.OperationalError:
            raise  # the connection: the run loop reconnects
        except psycopg.Error as exc:  # a statistic the claims can do without: claim as they are
            log.warning("%s: could not read the table's statistics (%s)", self.parts.label, reason(exc))
            return
        if row is None or row["due"] < self.STATISTICS_DUE or row["planned"] >= row["due"]:
            return
        self.analyzed_at = time.monotonic()
        self.analyzing = asyncio.create_task(self._analyze(row["planned"], row["due"]),
                                             name=f"statistics {self.parts.label}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.analyzing), self.ANALYZE_WAIT)

    async def _analyze(self, planned: float, due: int) -> None:
        """ANALYZE the table on a writer (SKIP_LOCKED: if autovacuum holds it, it is analyzing or
        vacuuming it now) and have the next pass planned again."""
        try:
            async with self.parts.writers.connection() as conn:
                await self.parts.queries.analyze(conn)
            log.info("%s: analyzed the table (its statistics counted %d planned rows, %s%d were due)",
                     self.parts.label, planned, "at least " if due >= self.STATISTICS_BOUND else "", due)
            self.planned_at = -float("inf")
        except psycopg.Error as exc:
            log.warning("%s: could not analyze the table (%s)", self.parts.label, reason(exc))
        finally:
            self.analyzing = None

    async def stop(self) -> None:
        if self.analyzing is not None:
            self.analyzing.cancel()
            await asyncio.gather(self.analyzing, return_exceptions=True)
