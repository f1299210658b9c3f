"""One scheduler per entry (the manual's pg_work): the composition root that wires its parts and
runs them -- provision the table, listen, claim, run, finish, reset -- from start to drain and close.

One task's path: listener.py (NOTIFY wakes the claim loop) -> claim.py (a claim pass claims it) ->
runner.py (runs it) -> local_input.py | remote.py (its input, locally or on its remote server) ->
completer.py (its start and finish, group-committed). queries.py holds the SQL of all of them.

Connections (all as the entry's role, in the entry's database):
  control  -- claims (claim.Claimer); registered in the instance table: the tasks this scheduler
              claimed are alive while it is connected (see "alive" in queries.sql)
  listener -- LISTEN on the table's channel: wake-ups and STOP requests (hints only: listener.py)
  writers  -- a small pool for fenced TAKE->WORK and finish transactions (completer.Completer)
  sessions -- executor sessions of task authors (session_pool.SessionPool)
"""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from . import names, provision
from .claim import Claimer
from .completer import Completer
from .config import Entry
from .connect import Backoff, with_liveness, without_timeouts
from .control import Control, ServerSettings
from .listener import Hints, Listener, StopHints
from .maintenance import Maintenance, MaintenanceOptions
from .parts import Options, Parts
from .queries import WRITER_SETTINGS, Queries, connection_slots
from .restart import supervised
from .runner import Runner
from .session_pool import SessionPool
from .slots import Slots
from .task import InFlight, Lifecycle

log = logging.getLogger("pgtask.scheduler")


class Scheduler:
    def __init__(self, entry: Entry, base_conninfo: str, options: Options):
        self.entry, self.options, self.metrics = entry, options, options.metrics
        base_conninfo = with_liveness(base_conninfo)
        self.conninfo = without_timeouts(make_conninfo(base_conninfo, dbname=entry.data, user=entry.user))
        self.base_for_sessions = without_timeouts(make_conninfo(base_conninfo, dbname=entry.data),
                                                  ("statement_timeout",))
        self.life = Lifecycle()
        self.wake = self.life.wake
        self.inflight = InFlight()
        self.queries = Queries(entry.schema, entry.table)
        # opened by start(); handed to the parts that write now
        self.writers = AsyncConnectionPool(self.conninfo, min_size=1, max_size=4, open=False,
                                           kwargs={"autocommit": True, "prepare_threshold": None},
                                           timeout=10, configure=_writer)
        self.sessions = SessionPool(self.base_for_sessions, entry.user, options.execute_as,
                                    connecting=options.connecting,
                                    slots=Slots(options.max_sessions, self.connection_slots))
        parts = Parts(entry, self.conninfo, options, self.queries, self.inflight, self.life, self.metrics,
                      self.sessions, self.writers, entry.label())
        server = ServerSettings(parts)
        self.control = Control(parts, server)
        self.completer = Completer(parts)
        self.runner = Runner(parts, self.completer, self.control, server)
        self.claimer = Claimer(parts, self.control, server, self.completer, self.runner.dispatch,
                               self.adopt_table)
        self.stop_hints = StopHints(lambda task_id: task_id in self.inflight, self.runner.stop_requested,
                                    self.runner.cancel, entry.label())
        self.listener = Listener(
            make_conninfo(self.conninfo, application_name=f"pgtask listen {entry.schema} {entry.table}"),
            lambda: names.channel(self.queries.oid), entry.label(), Backoff(), lambda: self.life.stopping,
            Hints(on_wake=self.wake.set, on_schedule=self._schedule_hint, on_stop=self.stop_hints.hint))
        self.ready = asyncio.Event()
        self.maintenance = None if options.maintenance is None else Maintenance(
            self.conninfo, entry.schema, entry.table, MaintenanceOptions.from_service(options.maintenance),
            entry.label())

    def health(self) -> str | None:
        """Why this scheduler is not claiming, or None: it is connected and a claim pass ended within
        max(2 x pg_task.sleep, 10 s) -- it runs one at least every pg_task.sleep. (Read from the
        metrics endpoint's thread: plain attribute reads.)"""
        if self.life.draining or self.life.stopping:
            return f"{self.entry.label()}: draining"
        control = self.control.conn
        if control is None or control.closed:
            return f"{self.entry.label()}: not connected"
        last_pass = self.claimer.last_pass
        age = time.monotonic() - last_pass
        if age > max(2 * self.options.sleep, 10.0):
            return f"{self.entry.label()}: no claim pass for {age:.0f} s" if last_pass else \
                f"{self.entry.label()}: no claim pass yet"
        return None

    async def start(self) -> None:
        """Connect, provision the table, register this instance, open the writers, reset orphans."""
        await self.control.connect()
        await self.provision()
        await self.queries.register(self.control.conn, self.control.token)
        await self.queries.refresh_columns(self.control.conn)
        await self.writers.open(wait=True, timeout=30)
        await self.claimer.reset_orphans()

    async def provision(self) -> None:
        """Provision the task table (create or upgrade it, see provision.py) and take up its oid."""
        control = self.control.conn
        report = provision.Report()
        await control.set_autocommit(False)
        control.row_factory = psycopg.rows.tuple_row
        try:
            self.queries.take_up(await provision.provision_table(control, self.entry.schema, self.entry.table, report))
        finally:
            await control.commit()
            await control.set_autocommit(True)
            control.row_factory = dict_row
        for action in report.actions:
            log.info("%s: %s", self.entry.label(), action)

    async def adopt_table(self, oid: int | None) -> None:
        """The task table is another one now (dropped and provisioned again: its oid changed, see
        "same_table"): take it up as a new table -- provisioned, its columns read, every statement
        prepared again, its channel listened to."""
        log.warning("%s: the task table was created again (oid %s, was %s): taking up the new one",
                    self.entry.label(), oid, self.queries.oid)
        async with self.control.lock:
            await self.provision()
            # the instance table may have been created again too
            await self.queries.register(self.control.conn, self.control.token)
            await self.queries.refresh_columns(self.control.conn)
        self.queries.forget()
        self.claimer.replan()
        self.listener.reconnect()

    async def run(self) -> None:
        await self.start()
        beside = [asyncio.create_task(self.listen(), name=f"listen {self.entry.label()}")]
        if self.maintenance is not None:
            # schedules, retention, key expiry: their own connection and timers, never in the claim path
            beside.append(asyncio.create_task(self.maintenance.run(), name=f"maintenance {self.entry.label()}"))
        self.ready.set()
        # logged here, not when the task is created: only now is the table provisioned and claimed from
        log.info("claiming: %s (sleep %d ms)", self.entry.label(), self.entry.sleep)
        try:
            await self.claimer.run()
        finally:
            for task in beside:
                task.cancel()
            await asyncio.gather(*beside, return_exceptions=True)

    async def listen(self) -> None:
        """The listener (listener.py), started again whenever it fails (restart.py)."""
        await supervised(f"{self.entry.label()}: the listener", self.listener.run, lambda: self.life.stopping,
                         Backoff(first=0.5, cap=30.0), log)

    def _schedule_hint(self) -> None:
        if self.maintenance is not None:
            self.maintenance.poke()
        self.wake.set()

    async def connection_slots(self) -> tuple[int, int]:
        """(usable connection slots, client backends connected now): see slots.py."""
        async with self.writers.connection() as conn:
            return await connection_slots(conn)

    async def drain(self) -> None:
        """Stop claiming; let running tasks finish within the grace period; cancel the rest."""
        self.life.drain()
        self.completer.spawn_flusher()  # pending finishes: no claim pass writes them any more
        await self.runner.drain(self.options.grace)
        self.life.stop()
        self.wake.set()

    async def close(self) -> None:
        self.life.stop()
        await self.claimer.stop_analyzing()
        await self.runner.close()
        await self.completer.close()
        await self.stop_hints.close()
        await self.sessions.close()
        await self.writers.close()
        await self.control.close(unregister=True)


async def _writer(conn: psycopg.AsyncConnection) -> None:
    await conn.execute(WRITER_SETTINGS)
