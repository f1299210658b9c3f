"""Start and finish writes of the tasks a scheduler runs (river's JobCompleter): TAKE -> WORK, DONE/
FAIL with the next repeat and delete, back to PLAN, STOP; group commit of the writes of tasks that
start or finish at the same time, by flushers on the writers or by the next claim pass (the seam:
take_for_pass and the PassBatch it returns); each write fenced on attempt + lease.

A runner submits what it needs (start_work, finish, requeue, not_started) and learns whether its
row was written; the claim pass takes plain finishes to write first in its own transaction."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import psycopg

from .connect import Backoff, Connection
from .output import simple_error
from .parts import Parts
from .queries import flush_params
from .task import FinishWrite, StartWrite, Task, Write

log = logging.getLogger("pgtask.completer")
T = TypeVar("T")

REFUSED = "refused"  # a finish the database refused, its failure too (see Completer._finish_one)


def resolve(batch: list[Write], matched: set[tuple[str, int]]) -> None:
    """Each pending write of ``batch`` learns whether its row was written (its lease still held):
    ``matched``, the (kind, id) rows its statement returned (see "flush" in queries.sql)."""
    for write in batch:
        if not write.done.done():  # cancelled meanwhile (shutdown)
            write.done.set_result((write.KIND, write.task.id) in matched)


def _plain(write: Write) -> bool:
    """A finish that only finishes (no repeat, no delete) of a task that does not keep its session
    (count/live: its finish is awaited under the control lock, see runner.Runner.complete)."""
    return (isinstance(write, FinishWrite) and not write.task.repeats and not write.deletes
            and not write.task.keeps_session)


class Completer:
    # Writes of tasks starting or finishing at the same time share one statement and one commit: a
    # flusher takes everything pending, and while its commit is in flight the next batch gathers.
    # One flusher at a time (bigger batches: fewer statements and commits); a second one only while
    # the one in flight has been writing its batch for SLOW_FLUSH seconds -- a row lock someone else
    # holds must not hold up every other task's writes.
    # Every row stays fenced on attempt + lease; if a batch fails for a reason of the database (a
    # user's trigger refusing one row), each of its rows is written on its own.
    MAX_FLUSHERS = 2
    SLOW_FLUSH = 0.05
    PASS_WRITES_PAUSE = 1.0
    MAX_BATCH = 256
    # The claim pass that writes finishes waits up to COHORT_WAIT after the first of them for the rest
    # of the tasks the passes before started (their cohort), once: their finishes arrive within a
    # millisecond or two of each other, and a pass costs about as much (1.3-1.5 ms) for 2 of them as
    # for 16. Without the wait, a 16-group burst's passes split into a few small ones and a big one
    # (11 finishes a pass on average instead of 15-16). (uvloop's timers count whole milliseconds.)
    COHORT_WAIT = 0.002

    def __init__(self, parts: Parts):
        self.queries, self.inflight, self.life = parts.queries, parts.inflight, parts.life
        self.metrics, self.label, self.writers = parts.metrics, parts.label, parts.writers
        self.pending: list[Write] = []
        self.flushers: dict[asyncio.Task, float] = {}  # flusher -> since when it writes its batch
        self.flush_check: asyncio.TimerHandle | None = None
        self.pending_since = 0.0  # when the oldest of the pending writes was submitted
        self.pending_plain = True  # every pending write is one a claim pass may write (_plain)
        self.pass_writes_after = 0.0  # claim passes write no finishes before this (see claim_pass)
        # task id -> its session, idle, while the task's finish waits to be written (see offers)
        self.finishing: dict[int, Connection] = {}
        # the tasks claim passes started that have not finished yet, less those a claim pass gave up
        # waiting for, and the timer that ends a claim pass's wait for them (see spawn_flusher)
        self.cohort: set[int] = set()
        self.cohort_check: asyncio.TimerHandle | None = None
        self.refused_writes: set[asyncio.Task] = set()  # see _write_refused
        self.writes_failing = False  # a write failed and none went through since: see write

    # -- what a runner asks for ----------------------------------------------------------------
    def start_work(self, task: Task, pid: int) -> asyncio.Future:
        """The fenced TAKE -> WORK write (group-committed): resolves to False if the lease was lost."""
        return self._submit(StartWrite(task, self._future(), pid))

    async def not_started(self, task: Task) -> None:
        """The task's start was refused: it was set to STOP before its input began (its stop is
        written: see "stopped"), or its lease was lost."""
        if await self.write("stopped", task.fence) is not None:
            log.info("task %s: stopped before its input began; not running it", task.id)
            self.metrics.finished("STOP")
        else:
            log.warning("task %s: lease lost before start (attempt %s); not running it", task.id, task.attempt)
            self.metrics.lease_lost()
        self.release(task)

    async def requeue(self, task: Task) -> None:
        """Back to PLAN to run again -- or, set to STOP meanwhile, ended for good (see "stopped")."""
        if await self.write("requeue", task.fence) is None and await self.write("stopped", task.fence):
            self.metrics.finished("STOP")
        self.release(task)

    async def finish(self, task: Task, output: str | None, error: str | None) -> None:
        """DONE/FAIL (STOP stays), the next repeat, delete: one fenced transaction shared with other
        tasks' finishes (group commit); a task pausing its group (negative max) has its own."""
        alone = task.max < 0
        written = await (self._finish_one(task, output, error) if alone
                         else self._submit(FinishWrite(task, self._future(), output, error)))
        if written is REFUSED:  # still WORK, its lock held (see _write_refused); its session moves on
            return
        self._count_finish(task, error, bool(written))
        if alone:
            return  # released by _finish_one
        # written by a claim pass: that pass claimed after it, counting its room (see claim.Claimer.claim_pass),
        # and a pass now would find nothing more
        self.release(task, wake=not task.by_pass)

    def _count_finish(self, task: Task, error: str | None, written: bool) -> None:
        """A finish in the metrics; one not written (its lease lost) in the log too."""
        if not written:
            log.warning("task %s: lease lost (attempt %s): result dropped", task.id, task.attempt)
            self.metrics.lease_lost()
            return
        state = "STOP" if task.stopped else "DONE" if error is None else "FAIL"
        self.metrics.finished(state, time.monotonic() - task.claimed_at)

    def release(self, task: Task, wake: bool = True) -> None:
        """The task ended here: the next claim pass, which ``wake`` runs now, has room for another
        of its group."""
        self.inflight.end(task.id)
        self.cohort.discard(task.id)
        if wake:
            self.life.wake.set()

    async def write(self, name: str, params: dict, fetch: bool = True):
        """The named statement ``name`` on a writer, tried again while the connection is lost (unless
        the service stops): its first row when ``fetch``."""
        async def statement(conn: Connection):
            cur = await conn.execute(self.queries.text(name), params)
            return await cur.fetchone() if fetch else None

        row, _ = await self._on_writer(statement, f"{name}: write", once_per_outage=True)
        return row

    async def _on_writer(self, statements: Callable[[Connection], Awaitable[T]], what: str, *,
                         once_per_outage: bool = False, stops_with_service: bool = True) -> tuple[T, bool]:
        """``statements`` on a writer connection, run again on another one while the connection is
        lost -- unless the service stops (and does not drain), when ``stops_with_service``: (their
        result, whether they ran again: an earlier try may have committed, only its answer lost)."""
        backoff = Backoff()
        retried = False
        while True:
            try:
                async with self.writers.connection() as conn:
                    result = await statements(conn)
            except psycopg.OperationalError as exc:
                if stops_with_service and self.life.stopping and not self.life.draining:
                    raise
                delay = backoff.next()
                # One warning per outage (once_per_outage: each task's own write): during a failover
                # every task whose session was lost waits here, each retrying on its own; the rest
                # of their retries are logged at debug.
                quiet = once_per_outage and self.writes_failing
                self.writes_failing = self.writes_failing or once_per_outage
                log.log(logging.DEBUG if quiet else logging.WARNING, "%s failed (%s); retrying in %.1fs%s",
                        what, exc, delay, " (until writes go through again, further failures at debug)"
                        if once_per_outage and not quiet else "")
                await asyncio.sleep(delay)
                retried = True
                continue
            if once_per_outage and self.writes_failing:
                self.writes_failing = False
                log.info("%s: writes go through again", self.label)
            return result, retried

    # -- the claim pass's seam -----------------------------------------------------------------
    def take_for_pass(self) -> PassBatch:
        """The pending writes for this claim pass to write (see claim.Claimer.claim_pass), taken out of pending:
        all of them (up to MAX_BATCH) if the pass may write them, else none."""
        if not self.pending or self.flushers or not self._pass_may_write():
            return PassBatch(self, [])
        if self.cohort_check is not None:  # the wait for the cohort is over (see spawn_flusher)
            self.cohort_check.cancel()
            self.cohort_check = None
        batch, self.pending = self.pending[:self.MAX_BATCH], self.pending[self.MAX_BATCH:]
        return PassBatch(self, batch)

    def offer_session(self, task_id: int, session: Connection) -> None:
        """``session``, idle, may take the group's next task when a claim pass writes the finish of
        ``task_id`` (see PassBatch.offer)."""
        self.finishing[task_id] = session

    def withdraw_session(self, task_id: int) -> bool:
        """The session offered for ``task_id`` back to its runner -- False: a claim pass that wrote
        the task's finish started the group's next task on it."""
        return self._take_session(task_id) is not None

    def _take_session(self, task_id: int) -> Connection | None:
        return self.finishing.pop(task_id, None)

    def _pause_pass_writes(self) -> None:
        """A pass's finish ran over SLOW_FLUSH: claim passes write none for PASS_WRITES_PAUSE."""
        self.pass_writes_after = time.monotonic() + self.PASS_WRITES_PAUSE

    def _joined_cohort(self, tasks: list[Task]) -> None:
        """Tasks a claim pass started (see spawn_flusher)."""
        self.cohort.update(t.id for t in tasks)

    def _give_back(self, batch: list[Write]) -> None:
        """Writes a claim pass took and did not write: to a flusher, now."""
        if batch:
            self.pending[:0] = batch
            self.pending_since = 0.0  # due: a flusher takes them (see spawn_flusher)
            self.spawn_flusher()

    # -- group commit --------------------------------------------------------------------------
    @staticmethod
    def _future() -> asyncio.Future:
        return asyncio.get_running_loop().create_future()

    def _submit(self, write: Write) -> asyncio.Future:
        if isinstance(write, FinishWrite):
            self.cohort.discard(write.task.id)
        if not self.pending:
            self.pending_since, self.pending_plain = time.monotonic(), True
        self.pending_plain = self.pending_plain and _plain(write)
        self.pending.append(write)
        self.spawn_flusher()
        return write.done

    def spawn_flusher(self) -> None:
        """A flusher for what is pending -- unless the next claim pass can write it (finishes only,
        no flusher writing, pending for less than SLOW_FLUSH: see claim.Claimer.claim_pass), or a flusher is
        writing and not slow yet (it takes the pending writes itself when its batch is done); then
        look again when either would be late. A claim pass for the pending finishes is woken once
        the tasks claim passes started have all finished (their cohort), or COHORT_WAIT after the
        first of those finishes."""
        if not self.pending or len(self.flushers) >= self.MAX_FLUSHERS:
            return
        now = time.monotonic()
        if not self.flushers and self._pass_may_write() and now - self.pending_since < self.SLOW_FLUSH:
            if self.cohort and now - self.pending_since < self.COHORT_WAIT:
                if self.cohort_check is None:
                    self.cohort_check = asyncio.get_running_loop().call_later(
                        self.pending_since + self.COHORT_WAIT - now, self._cohort_waited)
                return
            self.life.wake.set()
            self._check_flushes(self.pending_since + self.SLOW_FLUSH - now)
            return
        writing = [since for since in self.flushers.values() if now - since < self.SLOW_FLUSH]
        if writing:
            self._check_flushes(max(writing) + self.SLOW_FLUSH - now)
            return
        t = asyncio.create_task(self._flush_loop(), name=f"flush {self.label}")
        self.flushers[t] = now

    def _pass_may_write(self) -> bool:
        """Whether a claim pass may write the pending writes (see claim.Claimer.claim_pass): all plain (_plain),
        while claim passes run (not draining), and not just after a pass's finish ran over
        SLOW_FLUSH (see claim.Claimer.claim_pass)."""
        return (self.pending_plain and not (self.life.draining or self.life.stopping)
                and time.monotonic() >= self.pass_writes_after)

    def _check_flushes(self, delay: float) -> None:
        if self.flush_check is None:
            self.flush_check = asyncio.get_running_loop().call_later(max(delay, 0), self._flush_checked)

    def _flush_checked(self) -> None:
        self.flush_check = None
        self.spawn_flusher()

    def _cohort_waited(self) -> None:
        """COHORT_WAIT after the first of the pending finishes and no claim pass took them: the rest
        of the cohort runs longer, and is not waited for again."""
        self.cohort_check = None
        self.cohort.clear()
        self.spawn_flusher()

    async def _flush_loop(self) -> None:
        me = asyncio.current_task()
        try:
            await asyncio.sleep(0)  # let tasks ready in this loop iteration join the batch
            while self.pending:
                batch, self.pending = self.pending[:self.MAX_BATCH], self.pending[self.MAX_BATCH:]
                self.flushers[me] = time.monotonic()  # writing a batch since
                try:
                    await self.flush(batch)
                except BaseException as exc:
                    for write in batch:
                        if not write.done.done():
                            write.done.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
                    if not isinstance(exc, Exception):
                        raise
        finally:
            # Leave `flushers` in the same step as the last look at `pending` (no await in between): a
            # write submitted after that look finds room for a new flusher instead of waiting forever
            # on one that is already on its way out.
            self.flushers.pop(me, None)
            self.spawn_flusher()

    async def flush(self, batch: list[Write]) -> None:
        works = [w for w in batch if isinstance(w, StartWrite)]
        finishes = [w for w in batch if isinstance(w, FinishWrite)]
        params = flush_params(works, finishes)
        deletes = [w.task for w in finishes if w.deletes]
        repeats = any(w.task.repeats for w in finishes)

        async def statements(conn: Connection) -> set:
            if repeats:
                await self.queries.refresh_columns(conn)  # a repeat copies the columns the table has now
            if deletes:
                async with conn.transaction():
                    cur = await conn.execute(self.queries.text("flush"), params)
                    matched = set(await cur.fetchall())
                    await conn.execute(self.queries.text("flush_delete"), {
                        "id": [t.id for t in deletes], "attempt": [t.attempt for t in deletes],
                        "lease": [t.lease for t in deletes]})
                return matched
            if works or repeats:
                return await self.queries.run_flush(conn, "flush", params)
            return await self.queries.run_flush(conn, "flush_finish", params)

        try:
            matched, retried = await self._on_writer(statements, "flush")
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            log.info("batched write failed (%s); writing its %d rows one by one", str(exc).strip(),
                     len(batch))
            for w in works:
                w.done.set_result(await self.write("work", {**w.task.fence, "pid": w.pid}) is not None)
            for w in finishes:
                w.done.set_result(await self._finish_one(w.task, w.output, w.error, release=False))
            return
        if retried:
            unmatched = [(w.task, w.task in deletes) for w in finishes if (w.KIND, w.task.id) not in matched]
            matched |= {(FinishWrite.KIND, i) for i in await self._finished_already(unmatched)}
        if any(kind == "r" for kind, _ in matched):
            self.life.wake.set()  # a repeat was inserted: its plan may be the next deadline
        resolve(batch, matched)

    async def _finished_already(self, tasks: list[tuple[Task, bool]]) -> set[int]:
        """Of (task, its finish deletes the row) whose finish was written again after the connection
        was lost and did not match, the ids the first attempt finished: it committed, only its answer
        was lost -- the result is in the table, not dropped (see "finished_already")."""
        if not tasks:
            return set()
        row = await self.write("finished_already", {
            "id": [t.id for t, _ in tasks], "attempt": [t.attempt for t, _ in tasks],
            "lease": [t.lease for t, _ in tasks], "gone": [gone for _, gone in tasks]})
        return set(row[0])

    async def _finish_one(self, task: Task, output: str | None, error: str | None,
                          release: bool = True) -> bool | str:
        """One task's finish in its own transaction (negative max, or a batch that failed).
        Returns False when the lease was lost (released here when ``release``; _count_finish logs
        it), REFUSED when the database refused the finish and the failure (see _write_refused)."""
        params = {**task.fence, "output": output, "error": error, "group": task.group, "remote": task.remote}
        refused = 0
        retried = False

        async def statements(conn: Connection):
            if task.repeats:
                await self.queries.refresh_columns(conn)
            async with conn.transaction():
                cur = await conn.execute(self.queries.text("finish"), params)
                row = await cur.fetchone()
                if row is not None and refused == 0:
                    await conn.execute(self.queries.text("finish_repeat"), params)
                    if task.deleted_by(output, error):
                        await conn.execute(self.queries.text("finish_delete"), params)
                    if task.max < 0:
                        await conn.execute(self.queries.text("finish_pause"), params)
            return row

        while True:
            try:
                row, again = await self._on_writer(statements, f"task {task.id}: finish",
                                                   stops_with_service=False)
                retried = retried or again
                break
            except psycopg.Error as exc:
                # Something in the database (a user's trigger on the table, most likely) refused the
                # finish. Record why, without repeat/delete/pause. If even that is refused, the task
                # stays WORK, alive with this instance (never reset and run again) and
                # _write_refused writes the failure again, later each time.
                refused += 1
                log.error("task %s: finishing failed: %s", task.id, str(exc).strip())
                if refused > 1:
                    break
                # a value the database cannot store (DataError: a NUL byte, an untranslatable
                # character) is the output's own: the failure is written without it
                kept = "" if isinstance(exc, psycopg.DataError) else output or ""
                params = {**params, "output": kept, "error": (error + "\n" if error else "") +
                          simple_error(f"finishing the task failed: {str(exc).strip()}")}
        if refused > 1:
            t = asyncio.create_task(self._write_refused(task, params), name=f"refused finish {task.id}")
            self.refused_writes.add(t)
            t.add_done_callback(self.refused_writes.discard)
            return REFUSED
        lost = row is None and not refused
        if lost and retried:
            lost = task.id not in await self._finished_already([(task, task.deleted_by(output, error))])
        if release:
            self.release(task)
        return not lost

    async def _write_refused(self, task: Task, params: dict) -> None:
        """A task whose finish and failure the database refused (see _finish_one): its failure is
        written again, later each time (up to a minute apart), until the database takes it --
        someone mended the trigger -- or the service stops; only then is the task released."""
        backoff = Backoff(first=1.0, cap=60.0)
        retried = False
        while not self.life.stopping:
            delay = backoff.next()
            log.error("task %s: its failure was refused too; it stays WORK, writing it again in %.1fs",
                      task.id, delay)
            await asyncio.sleep(delay)
            try:
                async with self.writers.connection() as conn, conn.transaction():
                    row = await (await conn.execute(self.queries.text("finish"), params)).fetchone()
            except psycopg.Error as exc:
                log.error("task %s: finishing failed: %s", task.id, str(exc).strip())
                retried = retried or isinstance(exc, psycopg.OperationalError)
                continue
            lost = row is None and not (retried and await self._finished_already([(task, False)]))
            self._count_finish(task, params["error"], not lost)
            self.release(task)
            return

    async def close(self) -> None:
        for timer in (self.flush_check, self.cohort_check):
            if timer is not None:
                timer.cancel()
        self.flush_check = self.cohort_check = None
        for t in [*self.flushers, *self.refused_writes]:
            t.cancel()
        await asyncio.gather(*self.flushers, *self.refused_writes, return_exceptions=True)


class PassBatch:
    """What one claim pass and the completer share (see claim.Claimer.claim_pass): the plain
    finishes it writes first in its transaction (``writes``), and the sessions of their tasks it
    offers its claim, by pid: a session is offered only in the transaction that finishes its task,
    so a STOP of that task can never cancel the next one on it (see "offered" in the claim)."""

    __slots__ = ("completer", "writes", "offers")

    def __init__(self, completer: Completer, writes: list[Write]):
        self.completer, self.writes = completer, writes
        self.offers: dict[int, tuple[Task, Connection]] = {}

    def __len__(self) -> int:
        return len(self.writes)

    @property
    def lock_timeout(self) -> float:
        """Seconds the pass's finishes wait for any lock (SLOW_FLUSH): then they go to a flusher."""
        return self.completer.SLOW_FLUSH

    def ids(self) -> set[int]:
        return {w.task.id for w in self.writes}

    def offer(self) -> tuple[list[int], list[int]]:
        """Offer the claim the idle sessions of the tasks whose finishes the pass writes (see
        Completer.offer_session): (their pids, those tasks' ids)."""
        take = self.completer._take_session
        self.offers = {session.pid: (w.task, session) for w in self.writes
                       if (session := take(w.task.id)) is not None}
        return list(self.offers), [t.id for t, _ in self.offers.values()]

    def unoffer(self) -> None:
        """The pass failed: its offers stand again, their finishes are not written yet."""
        for finished, session in self.offers.values():
            self.completer.offer_session(finished.id, session)
        self.offers.clear()

    def give_back(self, slow: bool = False) -> None:
        """The pass failed: its finishes go to a flusher; ``slow``, one of them ran over SLOW_FLUSH:
        claim passes write none for PASS_WRITES_PAUSE."""
        if slow:
            self.completer._pause_pass_writes()
        self.completer._give_back(self.writes)

    def written(self, matched: set[tuple[str, int]]) -> None:
        """The pass committed: each finish learns whether its row was written (``matched``)."""
        for write in self.writes:
            write.task.by_pass = True
        resolve(self.writes, matched)

    def claimed(self, tasks: list[Task]) -> Iterator[tuple[Task, Connection | None]]:
        """The tasks the pass claimed, each with the offered session the claim started it on (or
        None); they join the cohort (see Completer.spawn_flusher). The offered sessions not taken
        are left in ``offers`` (see untaken)."""
        self.completer._joined_cohort(tasks)
        offers = self.offers
        for task in tasks:
            yield task, offers.pop(task.session_pid, (None, None))[1]

    def untaken(self) -> list[Connection]:
        """The offered sessions no claimed task took: idle, their finishes written."""
        return [session for _, session in self.offers.values()]
