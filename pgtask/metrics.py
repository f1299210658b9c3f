"""Prometheus metrics and the health endpoint (``[pgtask] metrics_listen``).

Three parts, each with its own state:
- ``EntryMetrics``: what one scheduler reports as it goes (claim passes, finishes, lease lost,
  orphans, reconnects, whether it claims) -- counters and histograms of prometheus-client in
  multiprocess mode, so the worker processes' figures add up in the first process's endpoint.
  A scheduler without metrics gets ``NO_METRICS``, which does nothing.
- ``TableStats``: the first process reads each entry's table (rows by state and group, the oldest
  due row, executor sessions, schedule lag) every ``metrics_refresh`` seconds on a connection of its
  own; a scrape serves the last reading and never queries the database.
- ``Endpoint``: ``GET /metrics`` and ``GET /healthz`` on a thread of its own (prometheus-client's
  WSGI app and server), so a busy event loop does not hold up a scrape.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, make_server

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from . import sql as named
from .config import ConfigError, Entry, parse_listen
from .names import table_names
from .sql import placeholders

log = logging.getLogger("pgtask.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
OTHER_GROUPS = "~other"  # the groups beyond metrics_groups, summed
ALL_GROUPS = "~all"      # finished rows are counted for the whole table (see metrics.sql "ended")
FINISHED = ("DONE", "FAIL", "GONE", "STOP")
# Finished rows are counted while the statistics estimate at most this many; beyond it the estimate
# is the figure (counting them reads every entry of the state index: 10-27 ms per 100,000 rows).
EXACT_FINISHED = 100_000
ENTRY_LABELS = ("data", "schema", "table")
# seconds: from a millisecond claim to a task that waited an hour for its plan
WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
                900, 3600)
PASS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)
# The table readings' connection's settings (see metrics.sql).
READ_SETTINGS = named.query("metrics.sql", "read_settings")


class Sink(Protocol):
    """What a scheduler reports (``Scheduler.options.metrics``)."""

    def claim_pass(self, seconds: float) -> None: ...
    def claiming(self, up: bool) -> None: ...
    def picked_up(self, waited: float) -> None: ...
    def finished(self, state: str, ran: float | None = None) -> None: ...
    def expired(self, count: int) -> None: ...
    def lease_lost(self) -> None: ...
    def orphans_reset(self, count: int) -> None: ...
    def reconnected(self) -> None: ...


class NoMetrics:
    """The sink of a service without metrics_listen: nothing is counted."""

    def claim_pass(self, seconds: float) -> None:
        pass

    def claiming(self, up: bool) -> None:
        pass

    def picked_up(self, waited: float) -> None:
        pass

    def finished(self, state: str, ran: float | None = None) -> None:
        pass

    def expired(self, count: int) -> None:
        pass

    def lease_lost(self) -> None:
        pass

    def orphans_reset(self, count: int) -> None:
        pass

    def reconnected(self) -> None:
        pass


NO_METRICS = NoMetrics()


def entry_labels(entry: Entry) -> tuple[str, str, str]:
    return entry.data, entry.schema, entry.table


class Families:
    """The process's own metrics (prometheus-client objects, registered nowhere: in multiprocess
    mode their values live in files of MULTIPROC_ENV's directory, which the endpoint reads)."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        def counter(name: str, doc: str, *extra: str) -> Counter:
            return Counter(name, doc, (*ENTRY_LABELS, *extra), registry=None)

        self.finished = counter("pgtask_finished", "Tasks this service ended, by the state it wrote", "state")
        self.lease_lost = counter("pgtask_lease_lost", "Results dropped: the row was claimed again meanwhile")
        self.orphans = counter("pgtask_orphans_reset", "Rows of a dead service reset (or ended, if STOP)")
        self.reconnects = counter("pgtask_reconnects", "Control connections opened again after a loss")
        self.pickup = Histogram("pgtask_pickup_seconds", "From a task's plan to its claim",
                                ENTRY_LABELS, buckets=WAIT_BUCKETS, registry=None)
        self.run = Histogram("pgtask_run_seconds", "From a task's claim to its finish",
                             ENTRY_LABELS, buckets=WAIT_BUCKETS, registry=None)
        self.claim_pass = Histogram("pgtask_claim_pass_seconds", "One claim pass, its round trip included",
                                    ENTRY_LABELS, buckets=PASS_BUCKETS, registry=None)
        # the least over the service's processes: one that stopped claiming shows
        self.up = Gauge("pgtask_scheduler_up", "1 while connected and claiming", ENTRY_LABELS,
                        registry=None, multiprocess_mode="livemin")
        self.last_claim = Gauge("pgtask_last_claim_timestamp_seconds", "When the last claim pass ended",
                                ENTRY_LABELS, registry=None, multiprocess_mode="livemin")


class EntryMetrics:
    """One scheduler's sink: the families with its entry's labels bound."""

    def __init__(self, families: Families, entry: Entry):
        labels = entry_labels(entry)
        self._finished = {state: families.finished.labels(*labels, state)
                          for state in ("DONE", "FAIL", "GONE", "STOP")}
        self._lease_lost = families.lease_lost.labels(*labels)
        self._orphans = families.orphans.labels(*labels)
        self._reconnects = families.reconnects.labels(*labels)
        self._pickup = families.pickup.labels(*labels)
        self._run = families.run.labels(*labels)
        self._pass = families.claim_pass.labels(*labels)
        self._up = families.up.labels(*labels)
        self._last_claim = families.last_claim.labels(*labels)
        self._up.set(0)

    def claim_pass(self, seconds: float) -> None:
        self._pass.observe(seconds)
        self._last_claim.set(time.time())
        self._up.set(1)

    def claiming(self, up: bool) -> None:
        self._up.set(1 if up else 0)

    def picked_up(self, waited: float) -> None:
        self._pickup.observe(max(waited, 0.0))

    def finished(self, state: str, ran: float | None = None) -> None:
        self._finished[state].inc()
        if ran is not None:
            self._run.observe(ran)

    def expired(self, count: int) -> None:
        if count:
            self._finished["GONE"].inc(count)

    def lease_lost(self) -> None:
        self._lease_lost.inc()

    def orphans_reset(self, count: int) -> None:
        if count:
            self._orphans.inc(count)

    def reconnected(self) -> None:
        self._reconnects.inc()


# -- the table's figures (first process) ---------------------------------------------------------
@dataclass
class Reading:
    """One reading of an entry's table (TableStats.refresh)."""

    tasks: dict[tuple[str, str], float] = field(default_factory=dict)  # (group, state) -> rows
    due: dict[str, float] = field(default_factory=dict)                 # group -> due PLAN rows
    oldest_due: dict[str, float] = field(default_factory=dict)          # group -> seconds
    sessions: dict[str, float] = field(default_factory=dict)            # role -> sessions
    schedule_lag: dict[str, float] = field(default_factory=dict)        # schedule -> seconds
    # (last successful maintenance run's end, its schedule's period or None): none while none ran
    maintenance: tuple[float, float | None] | None = None


def fold_groups(queue: list[tuple], held: list[tuple], keep: int) -> Reading:
    """The reading's per-group figures (``held``: (group, state, rows) of the rows running or
    waiting), the ``keep`` busiest groups (rows queued, running or waiting, then by name) by name
    and the rest summed into OTHER_GROUPS (the oldest due: the oldest of them)."""
    busy: dict[str, float] = {}
    for group, planned, _, _ in queue:
        busy[group] = busy.get(group, 0) + planned
    for group, _, count in held:
        busy[group] = busy.get(group, 0) + count
    kept = {g for g, _ in sorted(busy.items(), key=lambda item: (-item[1], item[0]))[:keep]}

    def name(group: str) -> str:
        return group if group in kept else OTHER_GROUPS

    reading = Reading()
    for group, planned, due, oldest in queue:
        g = name(group)
        reading.tasks[(g, "PLAN")] = reading.tasks.get((g, "PLAN"), 0) + planned
        reading.due[g] = reading.due.get(g, 0) + due
        if oldest is not None:
            reading.oldest_due[g] = max(reading.oldest_due.get(g, 0.0), oldest)
    for group, state, count in held:
        g = name(group)
        reading.tasks[(g, state)] = reading.tasks.get((g, state), 0) + count
    return reading


class TableStats:
    """Reads one entry's table every ``refresh`` seconds (run in the first process only)."""

    def __init__(self, conninfo: str, entry: Entry, groups: int, refresh: float):
        self.entry, self.groups, self.refresh = entry, groups, refresh
        self.conninfo = make_conninfo(conninfo, dbname=entry.data, user=entry.user,
                                      application_name=f"pgtask metrics {entry.schema} {entry.table}")
        names = table_names(entry.schema, entry.table)
        texts = dict(named.queries("metrics.sql"))  # a copy: the parsed file is shared
        estimate = texts.pop("ended_estimate")
        del texts["read_settings"]  # the connection's (READ_SETTINGS), run once at connect
        self.queries = {name: placeholders.render(text, entry.schema, entry.table, extra=names)
                        for name, text in texts.items()}
        self.estimates = {state: placeholders.render(estimate, entry.schema, entry.table,
                                                     extra={"finished": sql.Literal(state)})
                          for state in FINISHED}
        # executor sessions' application_name: "pg_task <schema> <table> <group>" (connect.group_settings)
        self.session_prefix = f"pg_task {entry.schema} {entry.table} "
        self.reading = Reading()
        self.read_at = 0.0  # time.time() of the last reading (0: none yet)

    async def connect(self) -> psycopg.AsyncConnection:
        """A connection for refresh_once, set up with READ_SETTINGS."""
        conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
        await conn.execute(READ_SETTINGS)
        return conn

    async def refresh_once(self, conn: psycopg.AsyncConnection) -> Reading:
        async def rows(name: str, params: dict | None = None) -> list[tuple]:
            cur = await conn.execute(self.queries[name], params)
            return await cur.fetchall()

        reading = fold_groups(await rows("queue"), await rows("held"), self.groups)
        finished = await self.finished_estimate(conn)
        if sum(finished.values()) <= EXACT_FINISHED:
            finished = dict.fromkeys(FINISHED, 0) | dict(await rows("ended"))
        for state, count in finished.items():
            reading.tasks[(ALL_GROUPS, state)] = count
        reading.sessions = dict(await rows("sessions", {"prefix": self.session_prefix}))
        try:
            async with conn.transaction():
                reading.schedule_lag = dict(await rows("schedule_lag"))
        except psycopg.errors.UndefinedTable:
            pass
        try:
            async with conn.transaction():
                found = await rows("maintenance")
                reading.maintenance = found[0] if found else None
        except psycopg.errors.UndefinedTable:
            pass
        return reading

    async def finished_estimate(self, conn: psycopg.AsyncConnection) -> dict[str, float]:
        """The planner's estimate of the rows in each finished state."""
        estimate = {}
        for state, query in self.estimates.items():
            plan = (await (await conn.execute(query)).fetchone())[0]
            estimate[state] = float(round(plan[0]["Plan"]["Plan Rows"]))
        return estimate

    async def run(self) -> None:
        conn: psycopg.AsyncConnection | None = None
        while True:
            try:
                if conn is None or conn.closed:
                    conn = await self.connect()
                self.reading = await self.refresh_once(conn)
                self.read_at = time.time()
            except psycopg.Error as exc:
                log.warning("%s: metrics: could not read the table (%s)", self.entry.label(), str(exc).strip())
                if conn is not None:
                    await conn.close()
                conn = None
            await asyncio.sleep(self.refresh)


class TableCollector:
    """The first process's table readings as Prometheus families (a custom collector)."""

    def __init__(self, stats: Callable[[], Iterable[TableStats]]):
        self.stats = stats

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        tasks = GaugeMetricFamily("pgtask_tasks", "Rows of the table by state (finished ones: group ~all)",
                                  labels=(*ENTRY_LABELS, "group", "state"))
        due = GaugeMetricFamily("pgtask_due_tasks", "PLAN rows due now", labels=(*ENTRY_LABELS, "group"))
        oldest = GaugeMetricFamily("pgtask_oldest_due_seconds", "Age of the oldest due PLAN row",
                                   labels=(*ENTRY_LABELS, "group"))
        sessions = GaugeMetricFamily("pgtask_sessions", "Open executor sessions (every instance)",
                                     labels=(*ENTRY_LABELS, "role"))
        lag = GaugeMetricFamily("pgtask_schedule_lag_seconds", "Due schedule occurrence not materialised yet",
                                labels=(*ENTRY_LABELS, "schedule"))
        read = GaugeMetricFamily("pgtask_table_read_timestamp_seconds", "When these figures were read",
                                 labels=ENTRY_LABELS)
        maintained = GaugeMetricFamily("pgtask_maintenance_last_success_timestamp_seconds",
                                       "When the last successful scheduled maintenance run ended (0: none yet)",
                                       labels=ENTRY_LABELS)
        period = GaugeMetricFamily("pgtask_maintenance_period_seconds",
                                   "The scheduled maintenance's period (its latest run's schedule)",
                                   labels=ENTRY_LABELS)
        for stats in self.stats():
            labels = entry_labels(stats.entry)
            reading = stats.reading
            for (group, state), count in sorted(reading.tasks.items()):
                tasks.add_metric((*labels, group, state), count)
            for group, count in sorted(reading.due.items()):
                due.add_metric((*labels, group), count)
            for group, seconds in sorted(reading.oldest_due.items()):
                oldest.add_metric((*labels, group), seconds)
            for role, count in sorted(reading.sessions.items()):
                sessions.add_metric((*labels, role), count)
            for name, seconds in sorted(reading.schedule_lag.items()):
                lag.add_metric((*labels, name), seconds)
            read.add_metric(labels, stats.read_at)
            if reading.maintenance is not None:
                maintained.add_metric(labels, reading.maintenance[0])
                if reading.maintenance[1] is not None:
                    period.add_metric(labels, reading.maintenance[1])
        yield from (tasks, due, oldest, sessions, lag, read, maintained, period)


# -- the process's metrics and the endpoint -----------------------------------------------------
def process_collector(registry) -> None:
    """prometheus-client's standard process metrics, with the boot time they add to the process's
    start taken from the clocks: the unit's ProcSubset=pid hides /proc/stat, where the library reads
    it (and without it the library collects nothing)."""
    from prometheus_client import ProcessCollector

    class Process(ProcessCollector):
        def _boot_time(self) -> float:
            return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)

    Process(registry=registry)


class Metrics:
    """The service's metrics in one process. The first process creates the multiprocess directory
    (``first=True``) before prometheus-client is imported -- it reads the variable at import -- and
    its worker processes inherit it through their environment."""

    def __init__(self, first: bool):
        self.first = first
        self.own_dir = None
        if first:
            self.own_dir = tempfile.mkdtemp(prefix="pgtask-metrics-")
            os.environ[MULTIPROC_ENV] = self.own_dir
        elif not os.environ.get(MULTIPROC_ENV):
            raise RuntimeError(f"a worker process with metrics needs {MULTIPROC_ENV} from its first process")
        self.families = Families()
        self.stats: dict[tuple, TableStats] = {}

    def sink(self, entry: Entry) -> EntryMetrics:
        return EntryMetrics(self.families, entry)

    def add_table(self, key: tuple, stats: TableStats) -> None:
        """Serve the readings of ``stats`` (the table of the entry ``key``) at every scrape."""
        self.stats[key] = stats

    def drop_table(self, key: tuple) -> None:
        """The table of the entry ``key`` is no longer read: its figures go."""
        self.stats.pop(key, None)

    def process_gone(self, pid: int) -> None:
        """A worker process ended: its live gauges no longer count."""
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)

    def registry(self):
        from prometheus_client import CollectorRegistry, multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        process_collector(registry)
        registry.register(TableCollector(lambda: list(self.stats.values())))
        return registry

    def close(self) -> None:
        if self.own_dir is not None:
            shutil.rmtree(self.own_dir, ignore_errors=True)


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class Endpoint:
    """``/metrics`` (the registry) and ``/healthz`` (``health()`` -> a list of problems, [] when
    healthy) on a thread of its own."""

    def __init__(self, listen: str, registry, health: Callable[[], list[str]]):
        from prometheus_client import make_wsgi_app
        from prometheus_client.exposition import ThreadingWSGIServer

        self.metrics_app = make_wsgi_app(registry)
        self.health = health
        host, port = parse_listen(listen)
        server_class = ThreadingWSGIServer
        if ":" in host:  # an IPv6 address: the server's socket of that family
            server_class = type("ThreadingWSGIServer6", (ThreadingWSGIServer,), {"address_family": socket.AF_INET6})
        self.server = make_server(host, port, self.app, server_class, handler_class=_Quiet)
        self.thread = threading.Thread(target=self.server.serve_forever, name="pgtask metrics", daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def app(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            try:
                problems = self.health()
            except Exception as exc:  # noqa: BLE001 -- a probe must get an answer, not a hang-up
                problems = [f"health check failed: {exc}"]
            body = json.dumps({"status": "ok" if not problems else "unhealthy", "problems": problems}).encode()
            start_response("200 OK" if not problems else "503 Service Unavailable",
                           [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        return self.metrics_app(environ, start_response)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Monitoring:
    """The metrics of one process of the service, as the supervisor drives them: the sinks of its
    schedulers and, in the first process, the endpoint and the tables' readings."""

    def __init__(self, listen: str, first: bool, health: Callable[[], list[str]], groups: int, refresh: float):
        self.metrics = Metrics(first)
        self.groups, self.refresh = groups, refresh
        self.readers: dict[tuple, asyncio.Task] = {}
        self.endpoint = None
        if first:
            try:
                self.endpoint = Endpoint(listen, self.metrics.registry(), health)
            except OSError as exc:
                self.metrics.close()
                raise ConfigError(f"pgtask.metrics_listen: cannot listen on {listen}: {exc}") from None
            self.endpoint.start()
            log.info("metrics on http://%s:%d/metrics, health on /healthz", *self.endpoint.server.server_address[:2])

    def sink(self, entry: Entry) -> EntryMetrics:
        return self.metrics.sink(entry)

    def track(self, conninfo: str, entries: Iterable[Entry]) -> None:
        """Read these entries' tables (the first process's; a worker reads none), and no others."""
        if self.endpoint is None:
            return
        wanted = {e.key: e for e in entries}
        for key in [k for k in self.readers if k not in wanted]:
            self.readers.pop(key).cancel()
            self.metrics.drop_table(key)
        for key, entry in wanted.items():
            if key not in self.readers:
                stats = TableStats(conninfo, entry, self.groups, self.refresh)
                self.metrics.add_table(key, stats)
                self.readers[key] = asyncio.create_task(stats.run(), name=f"metrics {entry.label()}")

    def process_gone(self, pid: int) -> None:
        self.metrics.process_gone(pid)

    async def close(self) -> None:
        for task in self.readers.values():
            task.cancel()
        await asyncio.gather(*self.readers.values(), return_exceptions=True)
        if self.endpoint is not None:
            await asyncio.to_thread(self.endpoint.stop)
        self.metrics.close()
