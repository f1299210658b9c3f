"""Maintenance services of one task table, each a small class with a ``run_once`` that returns what
it did (testable without the loop), and ``Maintenance``, the loop the scheduler starts beside its
claim loop:

  Materialiser  due schedule occurrences -> task rows, and the cursor advance, in one transaction
  Retention     finished task rows older than the retention, in bounded batches, children first
  KeyExpiry     expired idempotency reservations and stale occurrence keys, in bounded batches

A failed pass is logged and leaves its rows for the next pass; it never blocks claiming (the loop
runs on its own connection, as its own asyncio task).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from . import sql as named
from .cron import Cron, CronError
from .names import table_names
from .sql import placeholders

log = logging.getLogger("pgtask.maintenance")

PREVIEW = 20          # run times kept in a schedule's preview (schedule_next)
LIVE = ("PLAN", "TAKE", "WORK")
CAPACITY_SQLSTATE = "PT001"


@dataclass
class MaintenanceOptions:
    """The [pgtask] keys of the maintenance services (config.SERVICE_KEYS holds the same defaults)."""

    schedule_interval: float = 1.0    # seconds between schedule passes at most (a change wakes it)
    schedule_batch: int = 100         # schedules looked at per pass
    retention: str = ""               # finished task rows older than this are deleted; "" = never
    retention_interval: float = 60.0  # seconds between retention passes
    retention_batch: int = 1000       # rows per DELETE
    retention_batches: int = 10       # DELETEs per pass at most
    key_interval: float = 60.0        # seconds between reservation-expiry passes
    key_batch: int = 1000             # reservations (and occurrence keys) per DELETE

    @classmethod
    def from_service(cls, values: dict[str, Any]) -> MaintenanceOptions:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


class _Queries:
    def __init__(self, schema: str, table: str):
        self.schema, self.table = schema, table
        self.ids = table_names(schema, table)
        self._cache: dict[str, sql.Composed] = {}

    def __call__(self, name: str) -> sql.Composed:
        if name not in self._cache:
            self._cache[name] = placeholders.render(named.query("maintenance.sql", name), self.schema,
                                                    self.table, extra=self.ids)
        return self._cache[name]


# -- schedules ---------------------------------------------------------------------------------
@dataclass
class MaterialiseResult:
    created: list[tuple[int, datetime]] = field(default_factory=list)  # (task id, scheduled_for)
    initialised: int = 0     # new / changed / resumed schedules given a cursor and a preview
    skipped_overlap: int = 0  # occurrences not run because the previous task still runs
    duplicates: int = 0      # occurrences already materialised (the occurrence key held)
    waiting: int = 0         # schedules whose group is full (PT001): they stay at their cursor
    invalid: int = 0         # schedules with a bad expression or time zone
    failed: int = 0          # schedules whose transaction failed (logged; retried next pass)

    def merge(self, other: MaterialiseResult) -> None:
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            setattr(self, f.name, mine + theirs)


@dataclass
class Advance:
    """Where a schedule goes at the end of its pass: its cursor (the latest occurrence dealt with),
    the preview of its next run times, its last task, and the error noted on it (None: none)."""

    cursor: datetime
    upcoming: list[datetime]
    last_task: int | None
    error: str | None = None


def occurrences(cron: Cron, s: dict) -> tuple[list[datetime], Advance]:
    """A schedule's due occurrences by its misfire policy (``s``: its locked row, with the
    database's ``now``), and the advance past them."""
    now = s["now"]
    latest = cron.prev(now, 1, after=s["cursor"])
    if s["misfire"] == "catchup":
        due = cron.prev(now, s["catchup"], after=s["cursor"])
    elif s["misfire"] == "skip":
        due = [t for t in latest if t >= now - s["grace"]]
    else:
        due = latest
    cursor = latest[-1] if latest else now
    return due, Advance(cursor, cron.next(cursor, PREVIEW), s["last_task"])


class Materialiser:
    """Turns due schedule occurrences into task rows. Per schedule, one transaction: lock the row
    (SKIP LOCKED), insert each occurrence's key and task, advance the cursor, commit. Two
    materialisers never create the same occurrence twice (row lock + occurrence key); a failure
    anywhere before the commit leaves neither the tasks nor the advance."""

    def __init__(self, schema: str, table: str, batch: int = 100):
        self.q = _Queries(schema, table)
        self.batch = batch
        # test hook: awaited after the inserts and before the cursor advance
        self.before_advance: Callable[[psycopg.AsyncConnection, dict], Awaitable[None]] | None = None

    async def run_once(self, conn: psycopg.AsyncConnection, now: datetime | None = None) -> MaterialiseResult:
        """``conn`` is in autocommit mode; ``now`` overrides the database's clock (tests)."""
        result = MaterialiseResult()
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(self.q("schedule_due"), {"now": now, "limit": self.batch})
        for row in await cur.fetchall():
            try:
                result.merge(await self.one(conn, row["id"], now))
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:
                result.failed += 1
                reason = f"materialising failed: {str(exc).strip()}"
                log.warning("schedule %s: %s", row["id"], reason)
                await conn.execute(self.q("schedule_note"), {"id": row["id"], "error": reason})
        return result

    async def one(self, conn: psycopg.AsyncConnection, schedule_id: int, now: datetime | None) -> MaterialiseResult:
        res = MaterialiseResult()
        cur = conn.cursor(row_factory=dict_row)
        async with conn.transaction():
            await cur.execute(self.q("schedule_lock"), {"id": schedule_id, "now": now})
            s = await cur.fetchone()
            if s is None:
                return res  # another materialiser has it, or it is no longer due
            try:
                cron = Cron(s["cron"], s["timezone"])
                if s["next_run"] is None:
                    await self._advance(cur, s, Advance(s["now"], cron.next(s["now"], PREVIEW), s["last_task"]))
                    res.initialised += 1
                    return res
                due, advance = occurrences(cron, s)
            except CronError as exc:
                await cur.execute(self.q("schedule_error"), {"id": schedule_id, "error": str(exc)})
                res.invalid += 1
                return res
            await self._enqueue(conn, cur, s, due, advance, res)
            if self.before_advance is not None:
                await self.before_advance(conn, s)
            await self._advance(cur, s, advance)
        return res

    async def _enqueue(self, conn: psycopg.AsyncConnection, cur, s: dict, due: list[datetime], advance: Advance,
                       res: MaterialiseResult) -> None:
        """The due occurrences' tasks, in order, each in a savepoint, until a full group (PT001)
        holds back the rest: ``advance`` then stops before them."""
        running = s["overlap"] == "skip" and s["last_state"] in LIVE
        for i, at in enumerate(due):
            if running:
                res.skipped_overlap += 1
                continue
            try:
                async with conn.transaction():  # a savepoint: a full group undoes this occurrence only
                    task = await self._occurrence(cur, s, at)
            except psycopg.Error as exc:
                if exc.sqlstate != CAPACITY_SQLSTATE:
                    raise
                # Backpressure: this occurrence and the later ones wait at the cursor.
                advance.error = f"waiting for capacity: {exc.diag.message_primary}"
                res.waiting += 1
                advance.cursor = due[i - 1] if i > 0 else s["cursor"]
                advance.upcoming = [at] + [t for t in advance.upcoming if t > at]
                break
            if task is None:
                res.duplicates += 1
                continue
            res.created.append((task["id"], at))
            advance.last_task = task["id"]
            running = s["overlap"] == "skip"

    async def _occurrence(self, cur, s: dict, at: datetime) -> dict | None:
        """One occurrence's key and task: the task's row, or None when the occurrence was
        materialised already."""
        await cur.execute(self.q("schedule_occurrence"), {"id": s["id"], "at": at})
        if await cur.fetchone() is None:
            return None
        await cur.execute(self.q("schedule_enqueue"), {
            "input": s["input"], "columns": Jsonb(s["columns"]), "at": at, "user": s["user"]})
        task = await cur.fetchone()
        await cur.execute(self.q("schedule_task_user"), {"task": task["id"]})
        if (await cur.fetchone())["user"] != s["user"]:
            raise _RoleRefused(f"the service's role cannot insert tasks as role {s['user']!r} "
                               f"(it is not a member of it)")
        await cur.execute(self.q("schedule_occurrence_task"), {"id": s["id"], "at": at, "task": task["id"]})
        return task

    async def _advance(self, cur, s: dict, advance: Advance) -> None:
        await cur.execute(self.q("schedule_advance"), {
            "id": s["id"], "cursor": advance.cursor, "next_run": advance.upcoming[0],
            "preview": advance.upcoming[:PREVIEW], "last_task": advance.last_task, "error": advance.error})

    async def seconds_to_next(self, conn: psycopg.AsyncConnection) -> float | None:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(self.q("schedule_next_due"))
        return (await cur.fetchone())["seconds"]


class _RoleRefused(psycopg.Error):
    """The task insert trigger replaced the schedule's role: never run a schedule as another role."""

    sqlstate = "42501"


# -- retention ---------------------------------------------------------------------------------
class Retention:
    """Deletes finished task rows (DONE, FAIL, GONE, STOP) older than the retention."""

    STATES = ("DONE", "FAIL", "GONE", "STOP")

    def __init__(self, schema: str, table: str, retention: str, batch: int = 1000, batches: int = 10):
        self.q = _Queries(schema, table)
        self.retention, self.batch, self.batches = retention, batch, batches

    async def run_once(self, conn: psycopg.AsyncConnection, now: datetime | None = None) -> int:
        """Returns the number of rows deleted; each batch commits on its own."""
        if not self.retention:
            return 0
        total = 0
        for _ in range(self.batches):
            cur = await conn.execute(self.q("retention_delete"),
                                     {"now": now, "retention": self.retention, "limit": self.batch,
                                      "states": list(self.STATES)})
            total += cur.rowcount
            if cur.rowcount == 0:
                break
        return total


class KeyExpiry:
    """Deletes expired idempotency reservations (whose task is not queued or running) and
    occurrence keys a day behind their schedule's cursor."""

    def __init__(self, schema: str, table: str, batch: int = 1000, batches: int = 10):
        self.q = _Queries(schema, table)
        self.batch, self.batches = batch, batches

    async def run_once(self, conn: psycopg.AsyncConnection, now: datetime | None = None) -> dict[str, int]:
        out = {"keys": 0, "occurrences": 0}
        for kind, query in (("keys", "keys_expire"), ("occurrences", "occurrences_expire")):
            for _ in range(self.batches):
                cur = await conn.execute(self.q(query), {"now": now, "limit": self.batch})
                out[kind] += cur.rowcount
                if cur.rowcount < self.batch:
                    break
        return out


# -- the loop ----------------------------------------------------------------------------------
class Maintenance:
    """Runs the three services at their own intervals on one connection of its own."""

    def __init__(self, conninfo: str, schema: str, table: str, options: MaintenanceOptions, label: str = ""):
        self.conninfo = make_conninfo(conninfo, application_name=f"pg_task maintenance {schema} {table}")
        self.options, self.label = options, label or f"{schema}.{table}"
        self.materialiser = Materialiser(schema, table, options.schedule_batch)
        self.retention = Retention(schema, table, options.retention, options.retention_batch,
                                   options.retention_batches)
        self.keys = KeyExpiry(schema, table, options.key_batch)
        self.poked = asyncio.Event()
        self.conn: psycopg.AsyncConnection | None = None
        self.unreachable = False  # a pass failed for want of a connection, none passed since

    def poke(self) -> None:
        """A schedule changed: run the materialiser now."""
        self.poked.set()

    async def _connection(self) -> psycopg.AsyncConnection:
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
        return self.conn

    async def _pass(self, name: str, fn: Callable[[psycopg.AsyncConnection], Awaitable[Any]]) -> Any:
        try:
            conn = await self._connection()
            done = await fn(conn)
            if done:
                log.debug("%s: %s: %s", self.label, name, done)
            if self.unreachable:
                self.unreachable = False
                log.info("%s: maintenance reaches the server again", self.label)
            return done
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed pass leaves its rows for the next one
            # The server out of reach (a failover): the passes fail every second until it is back,
            # one warning says so; any other failure is a warning each time.
            lost = isinstance(exc, psycopg.OperationalError)
            level = logging.DEBUG if lost and self.unreachable else logging.WARNING
            log.log(level, "%s: %s pass failed (%s); rows stay for the next pass%s", self.label, name,
                    str(exc).strip() or type(exc).__name__,
                    " (until the server is back, further failures at debug)" if lost and level == logging.WARNING else "")
            self.unreachable = self.unreachable or lost
            if isinstance(exc, psycopg.OperationalError) and self.conn is not None:
                await self.conn.close()
                self.conn = None
            return None

    async def run(self) -> None:
        o = self.options
        next_at = {"schedule": 0.0, "retention": 0.0 if o.retention else float("inf"), "keys": 0.0}
        try:
            while True:
                now = time.monotonic()
                if self.poked.is_set() or now >= next_at["schedule"]:
                    self.poked.clear()
                    res = await self._pass("schedules", self.materialiser.run_once)
                    for task_id, at in (res.created if res else []):
                        log.info("%s: schedule occurrence %s -> task %s", self.label, at.isoformat(), task_id)
                    wait = o.schedule_interval
                    nxt = await self._pass("next schedule", self.materialiser.seconds_to_next)
                    if nxt is not None:
                        wait = min(wait, max(nxt, 0.005))
                    next_at["schedule"] = time.monotonic() + wait
                if now >= next_at["retention"]:
                    await self._pass("retention", self.retention.run_once)
                    next_at["retention"] = time.monotonic() + o.retention_interval
                if now >= next_at["keys"]:
                    await self._pass("key expiry", self.keys.run_once)
                    next_at["keys"] = time.monotonic() + o.key_interval
                timeout = max(min(next_at.values()) - time.monotonic(), 0.0)
                try:
                    await asyncio.wait_for(self.poked.wait(), timeout)
                except TimeoutError:
                    pass
        finally:
            if self.conn is not None:
                await self.conn.close()
