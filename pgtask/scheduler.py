"""One scheduler per entry (the manual's pg_work): provision, listen, claim, run, finish, reset.

Connections (all as the entry's role, in the entry's database):
  control  -- claims; registered in the instance table: the tasks this scheduler claimed are alive
              while it is connected (see "alive" in queries.sql)
  listener -- LISTEN on the table's channel: wake-ups and STOP requests (hints only: listener.py)
  writers  -- a small pool for fenced TAKE->WORK and finish transactions
  sessions -- executor sessions of task authors (executor.SessionPool)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import errors, pq, sql
from psycopg.adapt import PyFormat, Transformer
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from . import provision, remote, wire
from . import sql as named
from .config import SERVICE_KEYS, Entry
from .executor import CANCELLED, NotStarted, Session, SessionPool, Task, group_settings, run_input
from .inputs import INLINE, Budget, Held
from .listener import Listener, StopHints
from .maintenance import Maintenance, MaintenanceOptions
from .metrics import NO_METRICS, Sink
from .output import DEFAULT_STYLE, ErrorStyle, message, reason, simple_error
from .slots import Slots
from .supervise import supervised

log = logging.getLogger("pgtask.scheduler")

# An input larger than inputs.INLINE is left out (octet_length reads a TOASTed value's size without
# detoasting it): it is read when its budget allows (inputs.Held, Scheduler.read_input).
TASK_COLUMNS = f"""t."id", t."attempt", t."lease", t."group", t."remote", t."max", t."user",
    CASE WHEN octet_length(t."input") <= {INLINE} THEN t."input" END AS input,
    octet_length(t."input") AS input_bytes, t."repeat" > '0 sec' AS repeats,
    least(round(extract(epoch FROM t."timeout")) * 1000, 2147483647)::int4 AS timeout_ms, t."header", t."string", t."null",
    t."delimiter"::text AS delimiter, t."quote"::text AS quote, t."escape"::text AS escape, t."save",
    t."count", extract(epoch FROM t."live")::float8 AS live_s, t."delete", statement_timestamp() AS now,
    extract(epoch FROM statement_timestamp() - t."plan")::float8 AS waited"""


# How the service's own statements on the task table (the control connection's, the writers') are
# planned: never a sequential scan of the table, nor a bitmap scan (it would read a group's whole
# backlog, see "claim" in queries.sql), and no JIT (none of them runs long enough to gain from
# compiling; a plan estimated on a large table would be compiled on every run).
PLANNER_SETTINGS = "SET enable_seqscan = off; SET enable_bitmapscan = off; SET jit = off"
REFUSED = "refused"  # a finish the database refused, its failure too (see Scheduler._finish_one)

# The claim pass's statements, PREPAREd on the control connection ($n: the parameters in this order);
# its claim lock (a LOCK TABLE) is sent as text.
PASS_STATEMENTS = (("expire", ()), ("claim", ("token", "limit", "offer_pid", "offer_id")), ("next", ()))
# the statistics looked at before claiming starts (see Scheduler._check_statistics)
STATISTICS_PARAMS = ("oid", "bound")
# claim_next's, for a session reusing its executor (count/live): see next_of_group
CLAIM_NEXT_PARAMS = ("token", "group", "remote", "user", "max", "done", "born")


# The flushes' parameters, in the order of their prepared statements' $n: "flush", and
# "flush_finish" for a batch of finishes none of which repeats (see queries.sql).
FINISH_PARAMS = ("f_id", "f_attempt", "f_lease", "f_output", "f_error")
FLUSH_PARAMS = ("w_id", "w_attempt", "w_lease", "w_pid", *FINISH_PARAMS, "sync")


def _dump(tx: Transformer, names: tuple[str, ...], params: dict) -> list[bytes]:
    """The flush parameters ``names`` of ``params`` in text, as psycopg writes them for the
    connection of ``tx`` (in its client encoding: a database need not be UTF8)."""
    return [v.encode() if isinstance(v, str) else bytes(tx.get_dumper(v, PyFormat.TEXT).dump(v))
            for v in (params[n] for n in names)]


def _matched(results: list[pq.abc.PGresult]) -> set[tuple[str, int]]:
    """The (kind, id) rows a flush statement returned: what it wrote (see "flush" in queries.sql)."""
    return {(res.get_value(i, 0).decode(), int(res.get_value(i, 1))) for res in results for i in range(res.ntuples)}


def _resolve(batch: list, matched: set[tuple[str, int]]) -> None:
    """Each pending write of ``batch`` learns whether its row was written (its lease still held)."""
    for kind, task, _, fut in batch:
        if not fut.done():  # cancelled meanwhile (shutdown)
            fut.set_result((kind, task.id) in matched)


def render_query(name: str, schema: str, table: str, copy_columns: str = "") -> str:
    """The named query of queries.sql for the task table ``schema``.``table``; ``copy_columns``: the
    columns a repeat copies (see "columns")."""
    ident = sql.Identifier(schema, table)
    cols_t = ", ".join(f"t.{c.strip()}" for c in copy_columns.split(",")) if copy_columns else ""
    beside = {f"rel_{kind}": sql.Identifier(schema, provision.liveness_table(table, kind))
              for kind in provision.LIVENESS_TABLES}
    return sql.SQL(named.query("queries.sql", name)).format(
        table=ident, task_columns=sql.SQL(TASK_COLUMNS), state=sql.Identifier(schema, "state"), **beside,
        copy_columns=sql.SQL(copy_columns), copy_columns_t=sql.SQL(cols_t),
    ).as_string(None)


def numbered(text: str, params: tuple[str, ...]) -> str:
    """A named query's text with its %(param)s as $1, $2, ... in the order of ``params``: the text of
    a statement to PREPARE."""
    for i, param in enumerate(params, 1):
        text = text.replace(f"%({param})s", f"${i}")
    return text


def _int_array(values) -> str:
    """An array literal of integers, for a statement's text (the claim pass's EXECUTEs)."""
    return "'{" + ",".join(str(int(v)) for v in values) + "}'"


def _finish_arrays(finishes: list) -> dict[str, list]:
    """FINISH_PARAMS of pending finishes (kind, task, (output, error), future)."""
    return {"f_id": [t.id for _, t, _, _ in finishes], "f_attempt": [t.attempt for _, t, _, _ in finishes],
            "f_lease": [t.lease for _, t, _, _ in finishes], "f_output": [p[0] for _, _, p, _ in finishes],
            "f_error": [p[1] for _, _, p, _ in finishes]}


@dataclass
class Options:
    sleep: float          # seconds: the poll floor (pg_task.sleep)
    run: int              # tasks in flight at most (pg_task.run)
    limit: int            # rows per claim (pg_task.limit)
    reset_check: float    # seconds between orphan checks
    output_limit: int
    execute_as: str
    grace: float
    connecting: int = 4   # executor sessions being opened at once, at most (SessionPool)
    max_sessions: int = 0  # executor sessions open at once, at most; 0: derived from the server (slots.py)
    remote_attempts: int = 6  # connections a remote task tries while each fails before its input is sent
    remote_backoff: float = 1.0  # seconds before the second of them, doubling (see remote.again)
    # the process's budget for large inputs (shared by its schedulers: see inputs.py)
    inputs: Budget = field(default_factory=lambda: Budget(SERVICE_KEYS["input_budget"][1]))
    # config.MAINTENANCE_KEYS; None: no maintenance in this process (a worker: supervisor.Workers)
    maintenance: dict[str, Any] | None = field(default_factory=dict)
    metrics: Sink = NO_METRICS  # what it reports (pgtask/metrics.py)


def with_liveness(conninfo: str) -> str:
    """Let the server notice a vanished service: TCP keepalives, and a running query checks its client
    every second (client_connection_check_interval) so an orphaned task is cancelled, not finished."""
    params = conninfo_to_dict(conninfo) if conninfo else {}
    extra = {k: v for k, v in (("keepalives", "1"), ("keepalives_idle", "10"), ("keepalives_interval", "5"),
                               ("keepalives_count", "3")) if k not in params}
    options = params.get("options", "")
    if "client_connection_check_interval" not in options:
        extra["options"] = (options + " -c client_connection_check_interval=1000").strip()
    return make_conninfo(conninfo, **extra)


# The service's own connections (control, writers, listener, maintenance) set the timeouts their
# statements need themselves: a role's or database's statement_timeout or lock_timeout (ALTER ROLE
# ... SET) would cancel claims and finishes -- read as a lost connection -- over and over. Executor
# sessions start with no statement_timeout either (their preamble would run under it): each task's
# input gets its own (the row's timeout); the author's lock_timeout and the rest stay theirs.
OWN_TIMEOUTS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")


def without_timeouts(conninfo: str, names: tuple[str, ...] = OWN_TIMEOUTS) -> str:
    """``conninfo`` with the timeouts ``names`` off (0) in its options, unless the options set them."""
    options = conninfo_to_dict(conninfo).get("options", "") if conninfo else ""
    extra = " ".join(f"-c {name}=0" for name in names if name not in options)
    return make_conninfo(conninfo, options=f"{options} {extra}".strip()) if extra else conninfo


class Backoff:
    """Bounded exponential backoff with jitter for reconnects."""

    def __init__(self, first: float = 0.1, cap: float = 3.0):
        self.first, self.cap, self.delay = first, cap, first

    def next(self) -> float:
        delay = self.delay * (0.5 + random.random() / 2)
        self.delay = min(self.delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        self.delay = self.first


class Scheduler:
    def __init__(self, entry: Entry, base_conninfo: str, options: Options):
        self.entry, self.options = entry, options
        base_conninfo = with_liveness(base_conninfo)
        self.conninfo = without_timeouts(make_conninfo(base_conninfo, dbname=entry.data, user=entry.user))
        self.base_for_sessions = without_timeouts(make_conninfo(base_conninfo, dbname=entry.data),
                                                  ("statement_timeout",))
        self.table = sql.Identifier(entry.schema, entry.table)
        self.oid = 0
        self.copy_columns = ""
        self.wake = asyncio.Event()
        self.stopping = False
        self.draining = False
        self.inflight: dict[int, tuple[Task, Session | None]] = {}
        # this scheduler's token: the beginning of the lease of every row it claims (see "lease")
        self.token = str(uuid.uuid4())[:18]
        self.stop_hints = StopHints(lambda task_id: task_id in self.inflight, self.stop_requested, self.cancel,
                                    entry.label())
        self.drain_cancelled: set[int] = set()
        self.remote_facts: dict = {}  # role -> (when, future of (superuser, encoding)); see remote.py
        self.tasks: set[asyncio.Task] = set()
        self.control: psycopg.AsyncConnection | None = None
        # the settings remote tasks' errors are written by (pg_task's worker writes them), as this
        # service's control backend has them: read by every claim pass (see "next")
        self.error_style = DEFAULT_STYLE
        self.conf_loaded = None  # the control backend's pg_conf_load_time(): see claim_pass
        self.settings_mark = None  # the database and role settings' fingerprint: see settings_seen
        self.control_lock = asyncio.Lock()  # one transaction at a time on the control connection
        self.writers: AsyncConnectionPool | None = None
        self.sessions = SessionPool(self.base_for_sessions, entry.user, options.execute_as,
                                    connecting=options.connecting,
                                    slots=Slots(options.max_sessions, self.connection_slots))
        self.ready = asyncio.Event()
        self.metrics = options.metrics
        self.last_pass = 0.0  # time.monotonic() when the last claim pass ended (see health)
        self.last_expiry = 0.0
        # connection -> {statement name: what it was prepared for}: see _prepared
        self.prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.pass_plans = 0  # the claim pass's statements are prepared for this; see claim_pass
        self.pass_planned_at = 0.0
        # the pass before found nothing (as none before the first): see claim_pass
        self.pass_idle, self.pass_replan, self.claim_may_start = True, False, True
        self.analyzing: asyncio.Task | None = None  # see _check_statistics
        self.analyzed_at = -float("inf")
        self.pass_loader: Transformer | None = None
        self._queries: dict[str, str] = {}
        # group commit of WORK transitions and finishes: (kind, task, payload, future)
        self.pending: list[tuple[str, Task, Any, asyncio.Future]] = []
        self.flushers: dict[asyncio.Task, float] = {}  # flusher -> since when it writes its batch
        self.flush_check: asyncio.TimerHandle | None = None
        self.pending_since = 0.0  # when the oldest of the pending writes was submitted
        self.pending_plain = True  # every pending write is one a claim pass may write (_plain)
        self.pass_writes_after = 0.0  # claim passes write no finishes before this (see claim_pass)
        # task id -> its session, idle, while the task's finish waits to be written (see _offers)
        self.finishing: dict[int, Session] = {}
        # the tasks claim passes started that have not finished yet, less those a claim pass gave up
        # waiting for, and the timer that ends a claim pass's wait for them (see _spawn_flusher)
        self.cohort: set[int] = set()
        self.cohort_check: asyncio.TimerHandle | None = None
        self.refused_writes: set[asyncio.Task] = set()  # see _write_refused
        self.writes_failing = False  # a write failed and none went through since: see _write
        self.maintenance = None if options.maintenance is None else Maintenance(
            self.conninfo, entry.schema, entry.table, MaintenanceOptions.from_service(options.maintenance),
            entry.label())

    def health(self) -> str | None:
        """Why this scheduler is not claiming, or None: it is connected and a claim pass ended within
        max(2 x pg_task.sleep, 10 s) -- it runs one at least every pg_task.sleep. (Read from the
        metrics endpoint's thread: plain attribute reads.)"""
        if self.draining or self.stopping:
            return f"{self.entry.label()}: draining"
        if self.control is None or self.control.closed:
            return f"{self.entry.label()}: not connected"
        age = time.monotonic() - self.last_pass
        if age > max(2 * self.options.sleep, 10.0):
            return f"{self.entry.label()}: no claim pass for {age:.0f} s" if self.last_pass else \
                f"{self.entry.label()}: no claim pass yet"
        return None

    # -- queries -------------------------------------------------------------------------------
    def q(self, name: str) -> str:
        """A named query of queries.sql for this table, rendered once (psycopg then caches its parse)."""
        if name not in self._queries:
            self._queries[name] = render_query(name, self.entry.schema, self.entry.table, self.copy_columns)
        return self._queries[name]

    async def refresh_columns(self, conn: psycopg.AsyncConnection) -> None:
        cur = conn.cursor(row_factory=psycopg.rows.tuple_row)
        await cur.execute(self.q("columns"), {"oid": self.oid})
        cols = (await cur.fetchone())[0] or ""
        if cols != self.copy_columns:
            self.copy_columns = cols
            self._queries.clear()

    # -- connections ---------------------------------------------------------------------------
    async def connect_control(self) -> None:
        backoff = Backoff()
        while not self.stopping:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    make_conninfo(self.conninfo, application_name=f"pg_work {self.entry.schema} "
                                  f"{self.entry.table} {int(self.options.sleep * 1000)}"),
                    autocommit=True, row_factory=dict_row, prepare_threshold=None)
                # Its statements are planned with PLANNER_SETTINGS. Nothing this connection writes
                # needs to wait for the WAL flush (claims, resets: see claim_pass).
                await conn.execute(f"{PLANNER_SETTINGS}; SET synchronous_commit = off")
                if self.oid:  # a reconnect: the tasks running here are alive on this backend now
                    await self.register(conn)
                self.control = conn
                return
            except psycopg.OperationalError as exc:
                delay = backoff.next()
                log.warning("%s: cannot connect (%s); retrying in %.1fs", self.entry.label(),
                            reason(exc), delay)
                await asyncio.sleep(delay)

    async def start(self) -> None:
        await self.connect_control()
        report = provision.Report()
        await self.control.set_autocommit(False)
        self.control.row_factory = psycopg.rows.tuple_row
        try:
            self.oid = await provision.provision_table(self.control, self.entry.schema, self.entry.table, report)
        finally:
            await self.control.commit()
            await self.control.set_autocommit(True)
            self.control.row_factory = dict_row
        for action in report.actions:
            log.info("%s: %s", self.entry.label(), action)
        await self.register(self.control)
        await self.refresh_columns(self.control)
        self.writers = AsyncConnectionPool(self.conninfo, min_size=1, max_size=4, open=False,
                                           kwargs={"autocommit": True, "prepare_threshold": None},
                                           timeout=10, configure=self._writer)
        await self.writers.open(wait=True, timeout=30)
        await self.reset_orphans()

    async def register(self, conn: psycopg.AsyncConnection) -> None:
        """This scheduler's control backend ``conn``, in the instance table (see "register")."""
        await conn.execute(self.q("register"), {"token": self.token})

    @staticmethod
    async def _writer(conn: psycopg.AsyncConnection) -> None:
        # The batched writes take their rows as arrays: the planner's custom plans for them cost
        # more than running them (and look no better than the generic plan).
        await conn.execute(f"{PLANNER_SETTINGS}; SET plan_cache_mode = force_generic_plan")

    # -- the loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        await self.start()
        beside = [asyncio.create_task(self.listen(), name=f"listen {self.entry.label()}")]
        if self.maintenance is not None:
            # schedules, retention, key expiry: their own connection and timers, never in the claim path
            beside.append(asyncio.create_task(self.maintenance.run(), name=f"maintenance {self.entry.label()}"))
        self.ready.set()
        last_reset = time.monotonic()
        refused = Backoff(first=0.5, cap=10.0)  # the database refusing the claim itself (see below)
        lost = Backoff(first=0.05)  # the control connection lost pass after pass
        try:
            while not self.stopping:
                timeout = self.options.sleep
                try:
                    if not self.draining:
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
                            await self.refresh_columns(self.control)
                    refused.reset()
                    lost.reset()
                except psycopg.OperationalError as exc:
                    delay = lost.next()
                    log.warning("%s: connection lost (%s); reconnecting in %.2fs", self.entry.label(),
                                reason(exc), delay)
                    self.metrics.claiming(False)
                    await self._close_control()
                    await asyncio.sleep(delay)
                    await self.connect_control()
                    self.metrics.reconnected()
                    continue
                except psycopg.Error as exc:
                    # The database refused a claim pass (a row of a user's making: a CHECK added NOT
                    # VALID, a trigger refusing the claim): the running tasks go on, and the pass is
                    # tried again, later each time, with the reason in the log until it passes.
                    delay = refused.next()
                    log.error("%s: a claim pass failed (%s); trying again in %.1fs", self.entry.label(),
                              str(exc).strip(), delay)
                    self.metrics.claiming(False)
                    await asyncio.sleep(delay)
                    continue
                if timeout > 0:
                    try:
                        await asyncio.wait_for(self.wake.wait(), timeout)
                    except TimeoutError:
                        pass
                self.wake.clear()
        finally:
            for task in beside:
                task.cancel()
            await asyncio.gather(*beside, return_exceptions=True)

    async def _prepared(self, conn: psycopg.AsyncConnection, name: str, params: tuple[str, ...],
                        version: object) -> None:
        """Have the named query ``name`` prepared on ``conn`` as pgtask_<name> (its %(param)s as $n, in
        the order of ``params``), for ``version``: prepared again when that changed (a new column
        set for the flush, a new planning round: see claim_pass), once per connection otherwise.
        The connections they live on (control, writers) have psycopg's own automatic preparation
        off (prepare_threshold=None): once psycopg has prepared a statement on a connection, it
        sends DEALLOCATE ALL there after any rolled-back transaction, which dropped these too."""
        have = self.prepared.setdefault(conn, {})
        if name in have and have[name] == version:
            return
        ident = sql.Identifier(f"pgtask_{name}")
        if name in have:
            await conn.execute(sql.SQL("DEALLOCATE {}").format(ident))
            del have[name]
        await conn.execute(sql.SQL("PREPARE {} AS ").format(ident) + sql.SQL(numbered(self.q(name), params)))
        have[name] = version

    def _flush_version(self) -> tuple[str, int]:
        """What a flush statement is prepared for (see _prepared): the columns a repeat copies, and
        the claim pass's planning round (planned on a small table, a flush's generic plan went bad)."""
        return self.copy_columns, self.pass_plans

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
        _spawn_flusher), first in its transaction: a group whose task finished has room in the claim
        that follows, so its next task is claimed in the commit that finishes the previous one -- one
        round trip and one commit instead of a flush and a pass. That commit waits for the WAL flush
        (the finishes' durability). A pass carrying finishes waits at most SLOW_FLUSH for any lock
        (a row lock on a finished row, another instance's claim lock): then, or if it fails in any
        other way, the finishes go to a flusher (see _flush) and the pass runs again without them.
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
                self.pass_plans, self.pass_planned_at, self.pass_replan = self.pass_plans + 1, time.monotonic(), False
            for name, params in PASS_STATEMENTS:
                await self._prepared(self.control, name, params, self.pass_plans)
            if self.pass_loader is None or self.pass_loader.connection is not self.control:
                self.pass_loader = Transformer(self.control)
            pgconn = self.control.pgconn
            batch = self._take_for_pass()
            # the tasks whose finishes it writes first have ended when its claim runs
            room = self.options.run - len(self.inflight) + len(batch)
            offers: dict[int, tuple[Task, Session]] = {}
            try:
                text = [b"BEGIN", *(await self._pass_finishes(batch))]
                expiring = time.monotonic() - self.last_expiry >= self.options.sleep
                if expiring:
                    self.last_expiry = time.monotonic()
                    text.append(b"EXECUTE pgtask_expire")
                claim = room > 0 and self.options.limit > 0
                if claim:
                    offers = self._offers(batch)
                    text.append(self.q("claim_lock").encode())
                    text.append(f"EXECUTE pgtask_claim('{self.token}', {int(min(room, self.options.limit))}, "
                                f"{_int_array(offers)}, {_int_array(t.id for t, _ in offers.values())})".encode())
                text.append(b"EXECUTE pgtask_next; COMMIT")
                await wire.send(pgconn, b"; ".join(text))
                results, error = await wire.results(pgconn)
            except BaseException:
                self._give_back(batch)
                self._unoffer(offers)
                raise
            if error is not None:  # the rest of the string did not run: end the failed transaction
                self._unoffer(offers)
                await wire.simple(pgconn, "ROLLBACK")
                if batch:  # the finishes go to a flusher; the pass runs again without them at once
                    log.info("%s: a claim pass handed its finishes to a writer: %s", self.entry.label(),
                             errors.error_from_result(error, encoding=self.control.info.encoding))
                    if wire.sqlstate(error) == CANCELLED:  # the finish ran over SLOW_FLUSH: see _pass_finishes
                        self.pass_writes_after = time.monotonic() + self.PASS_WRITES_PAUSE
                    self._give_back(batch)
                    self.wake.set()
                    return 0, None, False
                raise errors.error_from_result(error, encoding=self.control.info.encoding)
            if batch:
                for _, task, _, _ in batch:
                    task.by_pass = True
                _resolve(batch, _matched([results.pop(0)]))
            if expiring:  # its rows come first (the rows expired: metrics)
                self.metrics.expired(results[0].ntuples)
            loader = self.pass_loader
            if claim:
                res = results[-2]  # the claim's rows; next's last
                loader.set_pgresult(res)
                names = [res.fname(i).decode() for i in range(res.nfields)]
                tasks = Task.from_rows(names, loader.load_rows(0, res.ntuples, tuple))
            loader.set_pgresult(results[-1])
            next_in, due, settings_mark, conf_loaded, *style = loader.load_row(0, tuple)
        self.error_style = ErrorStyle.of(style)
        self.settings_seen(settings_mark)  # before the claimed tasks take their sessions
        if conf_loaded != self.conf_loaded:  # the server's configuration was read again
            if self.conf_loaded is not None:
                self.sessions.config_reloaded()
            self.conf_loaded = conf_loaded
        # claiming again after an empty pass: plan again for the queue as it is now (see above)
        self.pass_replan = bool(tasks) and self.pass_idle
        self.pass_idle = not tasks and not self.inflight
        # the next claim may start a burst: this pass claimed nothing and nothing runs once its
        # finishes are written -- also when it wrote the last ones, which pass_idle does not count
        # (planning the pass again there too cost each task of a trickle 1.5 ms of pickup latency)
        self.claim_may_start = not tasks and self.inflight.keys() <= {t.id for _, t, _, _ in batch}
        for finished, _ in offers.values():  # its input is over: nothing of it to cancel on the session
            if (entry := self.inflight.get(finished.id)) is not None:
                self.inflight[finished.id] = (entry[0], None)
        self.cohort.update(t.id for t in tasks)
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
            await self._prepared(self.control, "statistics", STATISTICS_PARAMS, self.pass_plans)
            cur = await self.control.execute(
                f"EXECUTE pgtask_statistics({int(self.oid)}, {int(self.STATISTICS_BOUND)})")
            row = await cur.fetchone()
        except psycopg.OperationalError:
            raise  # the connection: the run loop reconnects
        except psycopg.Error as exc:  # a statistic the claims can do without: claim as they are
            log.warning("%s: could not read the table's statistics (%s)", self.entry.label(), reason(exc))
            return
        if row is None or row["due"] < self.STATISTICS_DUE or row["planned"] >= row["due"]:
            return
        self.analyzed_at = time.monotonic()
        self.analyzing = asyncio.create_task(self._analyze(row["planned"], row["due"]),
                                             name=f"statistics {self.entry.label()}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.analyzing), self.ANALYZE_WAIT)

    async def _analyze(self, planned: float, due: int) -> None:
        """ANALYZE the table on a writer (SKIP_LOCKED: if autovacuum holds it, it is analyzing or
        vacuuming it now) and have the next pass planned again."""
        try:
            async with self.writers.connection() as conn:
                await conn.execute(sql.SQL("ANALYZE (SKIP_LOCKED) {}").format(self.table))
            log.info("%s: analyzed the table (its statistics counted %d planned rows, %s%d were due)",
                     self.entry.label(), planned, "at least " if due >= self.STATISTICS_BOUND else "", due)
            self.pass_planned_at = -float("inf")
        except psycopg.Error as exc:
            log.warning("%s: could not analyze the table (%s)", self.entry.label(), reason(exc))
        finally:
            self.analyzing = None

    def _offers(self, batch: list) -> dict[int, tuple[Task, Session]]:
        """The sessions of the tasks whose finishes this claim pass writes, by pid, for the claim to
        start the next tasks of those groups on (see "offered" in the claim): a session is offered
        only in the transaction that finishes its task, so a STOP of that task can never cancel
        the next one on it."""
        return {session.pid: (t, session) for _, t, _, _ in batch
                if (session := self.finishing.pop(t.id, None)) is not None}

    def _unoffer(self, offers: dict[int, tuple[Task, Session]]) -> None:
        """Offers of a claim pass that failed: their finishes are not written yet."""
        for finished, session in offers.values():
            self.finishing[finished.id] = session
        offers.clear()

    def _take_for_pass(self) -> list:
        """The pending writes for this claim pass to write (see claim_pass), taken out of pending:
        all of them (up to MAX_BATCH) if the pass may write them, else none."""
        if not self.pending or self.flushers or not self._pass_may_write():
            return []
        if self.cohort_check is not None:  # the wait for the cohort is over (see _spawn_flusher)
            self.cohort_check.cancel()
            self.cohort_check = None
        batch, self.pending = self.pending[:self.MAX_BATCH], self.pending[self.MAX_BATCH:]
        return batch

    async def _pass_finishes(self, batch: list) -> list[bytes]:
        """The claim pass's statements writing ``batch`` (finishes only): the lean flush with its
        arrays as literals, after a lock_timeout of SLOW_FLUSH for the pass's transaction, and a
        statement_timeout of SLOW_FLUSH for the flush alone: a user's trigger on the finish that
        takes longer (a webhook) fails the pass, whose finishes then go to a writer, instead of
        holding up every group's claims for as long as it runs; claim passes then write no finishes
        for PASS_WRITES_PAUSE seconds (such a trigger is likely to be as slow for the next ones).
        Its generic plan, as on the writers (see _writer); the claim's statements keep the session's
        plan_cache_mode."""
        if not batch:
            return []
        await self._prepared(self.control, "flush_finish", FINISH_PARAMS, self._flush_version())
        escape = pq.Escaping(self.control.pgconn)
        values = _dump(self.pass_loader, FINISH_PARAMS, _finish_arrays(batch))
        args = b", ".join(escape.escape_literal(v) for v in values)
        slow = b"%d" % int(self.SLOW_FLUSH * 1000)
        return [b"SET LOCAL lock_timeout = " + slow, b"SET LOCAL plan_cache_mode = force_generic_plan",
                b"SET LOCAL statement_timeout = " + slow, b"EXECUTE pgtask_flush_finish(" + args + b")",
                b"SET LOCAL statement_timeout = DEFAULT", b"SET LOCAL plan_cache_mode = DEFAULT"]

    def _give_back(self, batch: list) -> None:
        """Writes a claim pass took and did not write: to a flusher, now."""
        if batch:
            self.pending[:0] = batch
            self.pending_since = 0.0  # due: a flusher takes them (see _spawn_flusher)
            self._spawn_flusher()

    def dispatch(self, task: Task, session: Session | None = None) -> None:
        self.inflight[task.id] = (task, None)
        t = asyncio.create_task(self.execute(task, session), name=f"task {task.id}")
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    async def execute(self, task: Task, session: Session | None = None) -> None:
        """Run one task (and, within count/live, further tasks of its group on the same session);
        ``session``: the one the claim started it on (see "claim" in queries.sql)."""
        spawner_max = task.max
        if task.remote is not None:
            await remote.execute(self, task)  # its own connection, driven on this event loop
            return
        try:
            while task is not None:
                if session is not None and (session.conn.closed or session.stale):  # stale: see settings_seen
                    await self.sessions.discard(session)
                    session = None
                    task.session_pid = None  # its start function sets the pid of the session it gets
                if session is None:
                    session = await self.open_session(task)
                    if session is None:
                        return
                self.inflight[task.id] = (task, session)
                session.starts(task)
                try:
                    async with Held(self.options.inputs, task, self.read_input) as held:
                        output, error = await run_input(
                            session, task, self.entry.schema, self.entry.table, self.oid,
                            self.options.output_limit, spi=self.entry.spi,
                            start_work=functools.partial(self.start_work, task, session.pid))
                except NotStarted:
                    await self.not_started(task)
                    return
                except psycopg.OperationalError as exc:
                    await self.sessions.discard(session)
                    session = None
                    if task.attempt >= self.LOST_ATTEMPTS:  # most likely the input's own doing
                        log.error("task %s: executor connection lost (%s), attempt %s: it fails", task.id,
                                  reason(exc), task.attempt)
                        await self.finish(task, "", simple_error(
                            f"the task's session ended while it ran, {task.attempt} times in a row",
                            message(exc), statement=task.input))
                        return
                    log.warning("task %s: executor connection lost (%s); it will run again", task.id,
                                reason(exc))
                    await self.requeue(task)
                    return
                except Exception as exc:  # noqa: BLE001 -- any bug of ours: see failed_in_service
                    await self.sessions.discard(session)
                    session = None
                    await self.failed_in_service(task, exc)
                    return
                session.tasks += 1
                keep_session = task.save
                # a session that lived out count/live ends, as the manual's worker exits; so does one a
                # large input went out on: libpq keeps the buffer it went out in while the session lives
                spent = session.spent(task) or (held.large and not keep_session)
                finished, offerable = task, not spent and not self._keeps_session(task)
                if offerable:
                    self.finishing[task.id] = session  # see _offers
                try:
                    task = await self.complete(task, output, error, spawner_max, session.tasks, session.born,
                                               more=not spent)
                finally:
                    if offerable and self.finishing.pop(finished.id, None) is None:
                        session = None  # the pass that wrote its finish started another task on it
                if spent:
                    await self.sessions.discard(session)
                    session = None
                elif keep_session and task is not None:
                    session.needs_reset = False  # save: the group's next task inherits the session as is
        finally:
            if session is not None:
                await self.sessions.put(session)

    @staticmethod
    def _keeps_session(task: Task) -> bool:
        """Whether the task's session may run the group's next task after it (count/live)."""
        return task.max >= 0 and (task.count > 0 or task.live_s > 0)

    async def read_input(self, task: Task) -> str:
        """A large input (see inputs.py), read on a connection of its own: libpq keeps the buffer
        a value arrived in for as long as its connection lives. NotStarted: the lease was lost."""
        async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
            cur = await conn.execute(self.q("input"), task.fence)
            row = await cur.fetchone()
        if row is None or row[0] is None:
            raise NotStarted(task.id)
        return row[0]

    async def failed_in_service(self, task: Task, exc: Exception) -> None:
        """Running ``task`` failed in the service itself (a bug, not the task's input nor a lost
        connection): the task fails with the reason instead of staying WORK for as long as the
        service runs, and the service goes on."""
        log.error("task %s: the service failed running it", task.id, exc_info=exc)
        await self.finish(task, "", simple_error(f"pgtask failed running the task: {type(exc).__name__}: {exc}",
                                                 statement=task.input))

    async def open_session(self, task: Task) -> Session | None:
        """A session for the task's author. If the server itself is unreachable (restarting, shutting
        down) the task goes back to PLAN to run later; a failure of the role (it does not exist, may
        not log in, authentication refused) fails the task with the reason."""
        settings = group_settings(task.group, self.entry.schema, self.entry.table, self.oid)
        for attempt in (1, 2):
            try:
                return await self.sessions.get(task.user, settings)
            except psycopg.Error as exc:
                if not await self._server_up():
                    log.warning("task %s: the server is unreachable (%s); it will run later", task.id,
                                reason(exc))
                    await self.requeue(task)
                    return None
                if attempt == 2:
                    await self.finish(task, "", simple_error(
                        f"could not connect as role {task.user}", str(exc).strip()))
        return None

    async def connection_slots(self) -> tuple[int, int]:
        """(usable connection slots, client backends connected now): see "slots" in slots.sql."""
        async with self.writers.connection() as conn:
            cur = await conn.execute(named.query("slots.sql", "slots"))
            usable, connected = await cur.fetchone()
        return usable, connected

    async def _server_up(self) -> bool:
        try:
            async with self.writers.connection() as conn:
                await conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    async def complete(self, task: Task, output: str | None, error: str | None, spawner_max: int, done: int,
                       born, more: bool = True) -> Task | None:
        """After a run: finish the task and return the group's next task for the same session
        (within count/live, unless not ``more``), or None. A run cancelled by SIGTERM's grace
        deadline is put back -- unless its input succeeded all the same (it ended just then, or
        handled the cancel): its work is committed, and it is finished as any other.

        Within count/live the finish and the next task's claim hold the control lock, so a claim
        pass cannot hand that task to another session in between (the manual's task_live); a
        finish that takes longer than SLOW_FLUSH (a row lock someone else holds, a slow trigger)
        lets go of it -- claim passes for every other group wait on that lock -- and the session
        takes no next task."""
        if task.id in self.drain_cancelled and error is not None:
            await self.requeue(task)
            return None
        if self._keeps_session(task):
            async with self.control_lock:
                finishing = asyncio.ensure_future(self.finish(task, output, error))
                try:
                    await asyncio.wait_for(asyncio.shield(finishing), self.SLOW_FLUSH)
                except TimeoutError:
                    pass
                except BaseException:
                    finishing.cancel()
                    raise
                else:
                    return await self.next_of_group(task, spawner_max, done, born) if more else None
            await finishing
            return None
        await self.finish(task, output, error)
        return None

    async def _write(self, name: str, params: dict, fetch: bool = True):
        backoff = Backoff()
        while True:
            try:
                async with self.writers.connection() as conn:
                    cur = await conn.execute(self.q(name), params)
                    row = await cur.fetchone() if fetch else None
                if self.writes_failing:
                    self.writes_failing = False
                    log.info("%s: writes go through again", self.entry.label())
                return row
            except psycopg.OperationalError as exc:
                if self.stopping and not self.draining:
                    raise
                delay = backoff.next()
                # One warning per outage: during a failover every task whose session was lost waits
                # here, each retrying on its own; the rest of their retries are logged at debug.
                level = logging.DEBUG if self.writes_failing else logging.WARNING
                self.writes_failing = True
                log.log(level, "%s: write failed (%s); retrying in %.1fs%s", name, exc, delay,
                        "" if level == logging.DEBUG else " (until writes go through again, further failures at debug)")
                await asyncio.sleep(delay)

    def start_work(self, task: Task, pid: int) -> asyncio.Future:
        """The fenced TAKE -> WORK write (group-committed): resolves to False if the lease was lost."""
        return self._submit("w", task, pid)

    async def not_started(self, task: Task) -> None:
        """The task's start was refused: it was set to STOP before its input began (its stop is
        written: see "stopped"), or its lease was lost."""
        if await self._write("stopped", task.fence) is not None:
            log.info("task %s: stopped before its input began; not running it", task.id)
            self.metrics.finished("STOP")
        else:
            log.warning("task %s: lease lost before start (attempt %s); not running it", task.id, task.attempt)
            self.metrics.lease_lost()
        self._release(task)

    async def requeue(self, task: Task) -> None:
        """Back to PLAN to run again -- or, set to STOP meanwhile, ended for good (see "stopped")."""
        if await self._write("requeue", task.fence) is None and await self._write("stopped", task.fence):
            self.metrics.finished("STOP")
        self._release(task)

    async def finish(self, task: Task, output: str | None, error: str | None) -> None:
        """DONE/FAIL (STOP stays), the next repeat, delete: one fenced transaction shared with other
        tasks' finishes (group commit); a task pausing its group (negative max) has its own."""
        alone = task.max < 0
        written = await (self._finish_one(task, output, error) if alone else self._submit("f", task, (output, error)))
        if written is REFUSED:  # still WORK, its lock held (see _write_refused); its session moves on
            if task.id in self.inflight:
                self.inflight[task.id] = (task, None)
            return
        self._count_finish(task, error, bool(written))
        if alone:
            return  # released by _finish_one
        if not written:
            log.warning("task %s: lease lost (attempt %s): result dropped", task.id, task.attempt)
        # written by a claim pass: that pass claimed after it, counting its room (see claim_pass),
        # and a pass now would find nothing more
        self._release(task, wake=not task.by_pass)

    def _count_finish(self, task: Task, error: str | None, written: bool) -> None:
        if not written:
            self.metrics.lease_lost()
            return
        state = "STOP" if task.stopped else "DONE" if error is None else "FAIL"
        self.metrics.finished(state, time.monotonic() - task.claimed_at)

    # -- group commit ----------------------------------------------------------------------------
    # Writes of tasks starting or finishing at the same time share one statement and one commit: a
    # flusher takes everything pending, and while its commit is in flight the next batch gathers.
    # One flusher at a time (bigger batches: fewer statements and commits); a second one only while
    # the one in flight has been writing its batch for SLOW_FLUSH seconds -- a row lock someone else
    # holds must not hold up every other task's writes.
    # Every row stays fenced on attempt + lease; if a batch fails for a reason of the database (a
    # user's trigger refusing one row), each of its rows is written on its own, as before.
    # A task whose session ends while it runs runs again (the server restarted, someone ended the
    # backend), up to its LOST_ATTEMPTS-th attempt: then it fails with the reason (an input that
    # ends its own session, or crashes its backend, would otherwise run for ever).
    LOST_ATTEMPTS = 10
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

    def _submit(self, kind: str, task: Task, payload: Any) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        if kind == "f":
            self.cohort.discard(task.id)
        if not self.pending:
            self.pending_since, self.pending_plain = time.monotonic(), True
        self.pending_plain = self.pending_plain and self._plain(kind, task, payload)
        self.pending.append((kind, task, payload, fut))
        self._spawn_flusher()
        return fut

    def _spawn_flusher(self) -> None:
        """A flusher for what is pending -- unless the next claim pass can write it (finishes only,
        no flusher writing, pending for less than SLOW_FLUSH: see claim_pass), or a flusher is
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
            self.wake.set()
            self._check_flushes(self.pending_since + self.SLOW_FLUSH - now)
            return
        writing = [since for since in self.flushers.values() if now - since < self.SLOW_FLUSH]
        if writing:
            self._check_flushes(max(writing) + self.SLOW_FLUSH - now)
            return
        t = asyncio.create_task(self._flush_loop(), name=f"flush {self.entry.label()}")
        self.flushers[t] = now

    def _pass_may_write(self) -> bool:
        """Whether a claim pass may write the pending writes (see claim_pass): all plain (_plain),
        while claim passes run (not draining), and not just after a pass's finish ran over
        SLOW_FLUSH (see _pass_finishes)."""
        return (self.pending_plain and not (self.draining or self.stopping)
                and time.monotonic() >= self.pass_writes_after)

    @staticmethod
    def _plain(kind: str, task: Task, payload: Any) -> bool:
        """A finish that only finishes (no repeat, no delete) of a task that does not keep its
        session (count/live: its finish is awaited under the control lock, see complete)."""
        return (kind == "f" and not task.repeats and not task.deleted_by(*payload)
                and not Scheduler._keeps_session(task))

    def _check_flushes(self, delay: float) -> None:
        if self.flush_check is None:
            self.flush_check = asyncio.get_running_loop().call_later(max(delay, 0), self._flush_checked)

    def _flush_checked(self) -> None:
        self.flush_check = None
        self._spawn_flusher()

    def _cohort_waited(self) -> None:
        """COHORT_WAIT after the first of the pending finishes and no claim pass took them: the rest
        of the cohort runs longer, and is not waited for again."""
        self.cohort_check = None
        self.cohort.clear()
        self._spawn_flusher()

    async def _flush_loop(self) -> None:
        me = asyncio.current_task()
        try:
            await asyncio.sleep(0)  # let tasks ready in this loop iteration join the batch
            while self.pending:
                batch, self.pending = self.pending[:self.MAX_BATCH], self.pending[self.MAX_BATCH:]
                self.flushers[me] = time.monotonic()  # writing a batch since
                try:
                    await self._flush(batch)
                except BaseException as exc:
                    for *_, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
                    if not isinstance(exc, Exception):
                        raise
        finally:
            # Leave `flushers` in the same step as the last look at `pending` (no await in between): a
            # write submitted after that look finds room for a new flusher instead of waiting forever
            # on one that is already on its way out.
            self.flushers.pop(me, None)
            self._spawn_flusher()

    async def _flush(self, batch: list) -> None:
        works = [b for b in batch if b[0] == "w"]
        finishes = [b for b in batch if b[0] == "f"]
        params = {
            "w_id": [t.id for _, t, _, _ in works], "w_attempt": [t.attempt for _, t, _, _ in works],
            "w_lease": [t.lease for _, t, _, _ in works], "w_pid": [p for _, _, p, _ in works],
            **_finish_arrays(finishes),
            # Only TAKE -> WORK: no need to wait for the WAL flush. Lost in a server crash, the rows
            # are TAKE again (reset, run again -- as for a crash mid-run); nothing of the input is
            # durable before this (its own commits flush the WAL up to it).
            "sync": "on" if finishes else "off"}
        deletes = [t for _, t, result, _ in finishes if t.deleted_by(*result)]
        repeats = any(t.repeats for _, t, _, _ in finishes)
        backoff = Backoff()
        retried = False
        while True:
            try:
                async with self.writers.connection() as conn:
                    if repeats:
                        await self.refresh_columns(conn)  # a repeat copies the columns the table has now
                    if deletes:
                        async with conn.transaction():
                            cur = await conn.execute(self.q("flush"), params)
                            matched = set(await cur.fetchall())
                            await conn.execute(self.q("flush_delete"), {
                                "id": [t.id for t in deletes], "attempt": [t.attempt for t in deletes],
                                "lease": [t.lease for t in deletes]})
                    elif works or repeats:
                        matched = await self._run_flush(conn, "flush", FLUSH_PARAMS, params)
                    else:
                        matched = await self._run_flush(conn, "flush_finish", FINISH_PARAMS, params)
                break
            except psycopg.OperationalError as exc:
                if self.stopping and not self.draining:
                    raise
                delay = backoff.next()
                log.warning("flush failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                retried = True
            except psycopg.Error as exc:
                log.info("batched write failed (%s); writing its %d rows one by one", str(exc).strip(),
                         len(batch))
                for _, task, pid, fut in works:
                    fut.set_result(await self._write("work", {**task.fence, "pid": pid}) is not None)
                for _, task, (output, error), fut in finishes:
                    fut.set_result(await self._finish_one(task, output, error, release=False))
                return
        if retried:
            unmatched = [(t, t in deletes) for _, t, _, _ in finishes if ("f", t.id) not in matched]
            matched |= {("f", i) for i in await self._finished_already(unmatched)}
        if any(kind == "r" for kind, _ in matched):
            self.wake.set()  # a repeat was inserted: its plan may be the next deadline
        _resolve(batch, matched)

    async def _finished_already(self, tasks: list[tuple[Task, bool]]) -> set[int]:
        """Of (task, its finish deletes the row) whose finish was written again after the connection
        was lost and did not match, the ids the first attempt finished: it committed, only its answer
        was lost -- the result is in the table, not dropped (see "finished_already")."""
        if not tasks:
            return set()
        row = await self._write("finished_already", {
            "id": [t.id for t, _ in tasks], "attempt": [t.attempt for t, _ in tasks],
            "lease": [t.lease for t, _ in tasks], "gone": [gone for _, gone in tasks]})
        return set(row[0])

    async def _run_flush(self, conn: psycopg.AsyncConnection, name: str, names: tuple[str, ...],
                         params: dict) -> set[tuple[str, int]]:
        """A flush statement (``name``, its parameters ``names``) on a writer, prepared once per
        connection (and per column set), its parameters sent as text and its rows read from libpq:
        half the service's CPU of psycopg's execute. Returns the (kind, id) rows; a failure raises
        the psycopg error."""
        await self._prepared(conn, name, names, self._flush_version())
        await wire.send_prepared(conn.pgconn, f"pgtask_{name}".encode(), _dump(Transformer(conn), names, params))
        results, error = await wire.results(conn.pgconn)
        if error is not None:
            raise errors.error_from_result(error, encoding=conn.info.encoding)
        return _matched(results)

    async def _finish_one(self, task: Task, output: str | None, error: str | None,
                          release: bool = True) -> bool | str:
        """One task's finish in its own transaction (negative max, or a batch that failed).
        Returns False when the lease was lost (logged and released here when ``release``), REFUSED
        when the database refused the finish and the failure (see _write_refused)."""
        params = {**task.fence, "output": output, "error": error, "group": task.group, "remote": task.remote}
        backoff = Backoff()
        refused = 0
        row = None
        retried = False
        while True:
            try:
                async with self.writers.connection() as conn:
                    if task.repeats:
                        await self.refresh_columns(conn)
                    async with conn.transaction():
                        cur = await conn.execute(self.q("finish"), params)
                        row = await cur.fetchone()
                        if row is not None and refused == 0:
                            await conn.execute(self.q("finish_repeat"), params)
                            if task.deleted_by(output, error):
                                await conn.execute(self.q("finish_delete"), params)
                            if task.max < 0:
                                await conn.execute(self.q("finish_pause"), params)
                break
            except psycopg.OperationalError as exc:
                delay = backoff.next()
                log.warning("task %s: finish failed (%s); retrying in %.1fs", task.id, exc, delay)
                await asyncio.sleep(delay)
                retried = True
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
            if lost:
                log.warning("task %s: lease lost (attempt %s): result dropped", task.id, task.attempt)
            self._release(task)
        return not lost


    async def _write_refused(self, task: Task, params: dict) -> None:
        """A task whose finish and failure the database refused (see _finish_one): its failure is
        written again, later each time (up to a minute apart), until the database takes it --
        someone mended the trigger -- or the service stops; only then is the task released."""
        backoff = Backoff(first=1.0, cap=60.0)
        retried = False
        while not self.stopping:
            delay = backoff.next()
            log.error("task %s: its failure was refused too; it stays WORK, writing it again in %.1fs",
                      task.id, delay)
            await asyncio.sleep(delay)
            try:
                async with self.writers.connection() as conn, conn.transaction():
                    row = await (await conn.execute(self.q("finish"), params)).fetchone()
            except psycopg.Error as exc:
                log.error("task %s: finishing failed: %s", task.id, str(exc).strip())
                retried = retried or isinstance(exc, psycopg.OperationalError)
                continue
            lost = row is None and not (retried and await self._finished_already([(task, False)]))
            if lost:
                log.warning("task %s: lease lost (attempt %s): result dropped", task.id, task.attempt)
            self._count_finish(task, params["error"], not lost)
            self._release(task)
            return

    def _release(self, task: Task, wake: bool = True) -> None:
        """The task ended here: the next claim pass, which ``wake`` runs now, has room for another
        of its group."""
        self.inflight.pop(task.id, None)
        self.cohort.discard(task.id)
        if wake:
            self.wake.set()

    async def next_of_group(self, task: Task, spawner_max: int, done: int, born) -> Task | None:
        """The next task of the group for this session (caller holds control_lock)."""
        if self.draining or self.stopping or task.max < 0 or born is None:
            return None
        if len(self.inflight) >= self.options.run:
            return None
        try:
            async with self.control.transaction():
                # the claim lock (as a claim pass takes it) and the claim, in one round trip
                await self._prepared(self.control, "claim_next", CLAIM_NEXT_PARAMS, self.pass_plans)
                values = {"token": self.token, "group": task.group, "remote": task.remote, "user": task.user,
                          "max": spawner_max, "done": done, "born": born}
                cur = await self.control.execute(sql.Composed([
                    sql.SQL(self.q("claim_lock") + "; EXECUTE pgtask_claim_next("),
                    sql.SQL(", ").join(sql.Literal(values[name]) for name in CLAIM_NEXT_PARAMS), sql.SQL(")")]))
                cur.nextset()  # the lock's result first
                row = await cur.fetchone()
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
                         self.entry.label())
                self.sessions.settings_changed()
            self.settings_mark = mark

    async def reset_orphans(self) -> None:
        async with self.control_lock:
            cur = await self.control.execute(self.q("reset"), {"oid": self.oid})
            rows = await cur.fetchall()
        self.metrics.orphans_reset(len(rows))
        for row in rows:
            if row["state"] == "STOP":  # stopped while it ran: it ended with its service, stays STOP
                log.warning("%s: stopped id = %s ended (its executor is gone)", self.entry.label(), row["id"])
            else:
                log.warning("%s: reset id = %s (its executor is gone)", self.entry.label(), row["id"])

    async def listen(self) -> None:
        """The listener (listener.py), started again whenever it fails (supervise.py)."""
        listener = Listener(
            make_conninfo(self.conninfo, application_name=f"pgtask listen {self.entry.schema} {self.entry.table}"),
            provision.channel(self.oid), self.entry.label(), Backoff(), lambda: self.stopping,
            on_wake=self.wake.set, on_schedule=self._schedule_hint, on_stop=self.stop_hints.hint)
        await supervised(f"{self.entry.label()}: the listener", listener.run, lambda: self.stopping,
                         Backoff(first=0.5, cap=30.0), log)

    def _schedule_hint(self) -> None:
        if self.maintenance is not None:
            self.maintenance.poke()
        self.wake.set()

    async def stop_requested(self, ids: list[int]) -> list[int]:
        """Of the tasks ``ids`` (running here when their stop hint came), those whose row is STOP
        under the claim this service runs (see "stop_requested")."""
        tasks = [entry[0] for i in ids if (entry := self.inflight.get(i)) is not None]
        if not tasks:
            return []
        row = await self._write("stop_requested", {"id": [t.id for t in tasks], "attempt": [t.attempt for t in tasks],
                                                   "lease": [t.lease for t in tasks]})
        return list(row[0])

    async def cancel(self, task_id: int) -> None:
        """Cancel the task's run: its row is STOP (see stop_requested), or the grace period is over."""
        entry = self.inflight.get(task_id)
        if entry and entry[1] is not None:
            entry[0].stopped = True
            try:
                await entry[1].cancel()
            except psycopg.Error as exc:
                log.warning("task %s: cancel failed: %s", task_id, exc)

    async def drain(self) -> None:
        """Stop claiming; let running tasks finish within the grace period; cancel the rest."""
        self.draining = True
        self.wake.set()
        self._spawn_flusher()  # pending finishes: no claim pass writes them any more
        if self.tasks:
            _, pending = await asyncio.wait(set(self.tasks), timeout=self.options.grace)
            if pending:
                log.warning("%s: grace period over, cancelling %d task(s)", self.entry.label(), len(pending))
                for task_id in list(self.inflight):
                    self.drain_cancelled.add(task_id)
                    await self.cancel(task_id)
                await asyncio.wait(pending, timeout=10)
        self.stopping = True
        self.wake.set()

    async def _close_control(self, unregister: bool = False) -> None:
        """``unregister``: the service stops; the rows it claimed are no longer alive (any left are
        reset by the next orphan check)."""
        if self.control is not None:
            if unregister:
                with contextlib.suppress(Exception):  # a broken connection
                    await self.control.execute(self.q("unregister"), {"token": self.token})
            with contextlib.suppress(Exception):  # closing a broken connection
                await self.control.close()
            self.control = None

    async def close(self) -> None:
        self.stopping = True
        if self.analyzing is not None:
            self.analyzing.cancel()
            await asyncio.gather(self.analyzing, return_exceptions=True)
        for t in [*self.tasks, *self.refused_writes]:
            t.cancel()
        await asyncio.gather(*self.tasks, *self.refused_writes, return_exceptions=True)
        for timer in (self.flush_check, self.cohort_check):
            if timer is not None:
                timer.cancel()
        self.flush_check = self.cohort_check = None
        for t in list(self.flushers):
            t.cancel()
        await asyncio.gather(*self.flushers, return_exceptions=True)
        await self.stop_hints.close()
        await self.sessions.close()
        if self.writers is not None:
            await self.writers.close()
        await self._close_control(unregister=True)
