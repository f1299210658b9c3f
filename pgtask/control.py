"""The scheduler's control connection (claims, resets: one transaction at a time on it) and what its
backend tells of the server (the settings' fingerprint, a configuration reload, the error style);
the claim of a group's next task for a session within count/live (runner.Runner.complete) is made
on it, as the claim passes are (claim.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from .connect import Backoff
from .output import DEFAULT_STYLE, ErrorStyle, reason
from .parts import Parts
from .queries import CONTROL_SETTINGS
from .task import Task

log = logging.getLogger("pgtask.claim")


class ServerSettings:
    """What the control backend reports of the server, read by every claim pass (see "next") and
    count/live claim: the sessions of task authors are retired or restyled when it changes.
    ``error_style``: the settings remote tasks' errors are written by (pg_task's worker writes
    them), as this service's control backend has them."""

    def __init__(self, parts: Parts):
        self.parts = parts
        self.error_style = DEFAULT_STYLE
        self.conf_loaded = None  # the control backend's pg_conf_load_time()
        self.settings_mark = None  # the database and role settings' fingerprint: see settings_seen

    def seen(self, settings_mark: int, conf_loaded, style: tuple[str, str]) -> None:
        """A claim pass's view of the server (queries.NextInfo)."""
        self.error_style = ErrorStyle.of(style)
        self.settings_seen(settings_mark)  # before the claimed tasks take their sessions
        if conf_loaded != self.conf_loaded:  # the server's configuration was read again
            if self.conf_loaded is not None:
                self.parts.sessions.config_reloaded()
            self.conf_loaded = conf_loaded

    def settings_seen(self, mark: int) -> None:
        """``mark``: the fingerprint of the ALTER DATABASE / ALTER ROLE settings that reach this
        database's sessions (settings_mark in queries.sql), read by every claim pass and count/live
        claim. When it moves, the pooled sessions, which started with the old settings, are retired:
        a task claimed after the change committed runs with the new ones, as on the manual's new
        backend per task."""
        if mark != self.settings_mark:
            if self.settings_mark is not None:
                log.info("%s: database or role settings changed; executor sessions open now are retired",
                         self.parts.label)
                self.parts.sessions.settings_changed()
            self.settings_mark = mark


class Control:
    """One scheduler's control connection (``conn``: claims, resets), registered in the instance
    table under ``token``: the tasks it claimed are alive while it is connected (see "alive" in
    queries.sql); one transaction at a time on it (``lock``)."""

    def __init__(self, parts: Parts, server: ServerSettings):
        self.parts, self.server = parts, server
        # this scheduler's token: the beginning of the lease of every row it claims (see "lease")
        self.token = str(uuid.uuid4())[:18]
        self.conn: psycopg.AsyncConnection | None = None
        self.lock = asyncio.Lock()

    async def connect(self) -> None:
        """The control connection, connected again until it succeeds (or the scheduler stops)."""
        parts = self.parts
        backoff = Backoff()
        while not parts.life.stopping:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    make_conninfo(parts.conninfo, application_name=f"pg_work {parts.entry.schema} "
                                  f"{parts.entry.table} {int(parts.options.sleep * 1000)}"),
                    autocommit=True, row_factory=dict_row, prepare_threshold=None)
                await conn.execute(CONTROL_SETTINGS)
                if parts.queries.oid:  # a reconnect: the tasks running here are alive on this backend now
                    await parts.queries.register(conn, self.token)
                self.conn = conn
                return
            except psycopg.OperationalError as exc:
                delay = backoff.next()
                log.warning("%s: cannot connect (%s); retrying in %.1fs", parts.label,
                            reason(exc), delay)
                await asyncio.sleep(delay)

    async def next_of_group(self, task: Task, spawner_max: int, done: int, born) -> Task | None:
        """The next task of the group for this session (caller holds ``lock``, and registers the
        task in flight before it lets go of it)."""
        parts = self.parts
        if parts.life.draining or parts.life.stopping or task.max < 0 or born is None:
            return None
        if len(parts.inflight) >= parts.options.run:
            return None
        try:
            async with self.conn.transaction():
                row = await parts.queries.claim_next(self.conn, {
                    "token": self.token, "group": task.group, "remote": task.remote, "user": task.user,
                    "max": spawner_max, "done": done, "born": born})
        except (psycopg.OperationalError, AttributeError):
            return None
        if row is None:
            return None
        self.server.settings_seen(row["settings_mark"])  # a stale session leaves its task to a new one
        nxt = Task.from_row(row)
        parts.metrics.picked_up(nxt.waited)
        return nxt

    async def close(self, unregister: bool = False) -> None:
        """``unregister``: the service stops; the rows it claimed are no longer alive (any left are
        reset by the next orphan check)."""
        if self.conn is not None:
            if unregister:
                with contextlib.suppress(Exception):  # a broken connection
                    await self.parts.queries.unregister(self.conn, self.token)
            with contextlib.suppress(Exception):  # closing a broken connection
                await self.conn.close()
            self.conn = None
