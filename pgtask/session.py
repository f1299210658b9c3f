"""A task author's session: one executor connection (the author's, or the service's in set_role
mode), its reset between tasks, and the error style its tasks' errors are written in."""

from __future__ import annotations

import psycopg

from . import sql as named
from . import wire
from .connect import Connection
from .output import DEFAULT_STYLE, ErrorStyle, format_error

# DISCARD ALL without DISCARD PLANS ("reset_session" in session.sql): everything a task can see of
# its session is reset (settings, role, temporary tables, prepared statements, cursors, LISTEN,
# advisory locks, sequence state); cached plans are not visible state -- keeping them spares
# re-planning the start function and the table's triggers for every task. Unlike DISCARD ALL it may
# run inside the next task's preamble (local_input.py).
RESET_SESSION = named.query("session.sql", "reset_session")
_ERROR_STYLE = named.query("session.sql", "error_style")  # see output.ErrorStyle


class Reloads:
    """How many times the service saw the server read its configuration again (``count``), shared
    by a pool's sessions, each of which reads its error style again when the count moved
    (Session.style); and how many times the ALTER DATABASE / ALTER ROLE settings that reach them
    changed (``settings``): a session that started before the last change is retired (Session.stale)."""

    __slots__ = ("count", "settings")

    def __init__(self) -> None:
        self.count = 0
        self.settings = 0

    def reloaded(self) -> None:
        """The server read its configuration again."""
        self.count += 1

    def settings_changed(self) -> None:
        """The ALTER DATABASE / ALTER ROLE settings that reach the sessions changed."""
        self.settings += 1


class Session(Connection):
    """One executor connection: a task author's session (or the service's, in set_role mode).

    A session a task ran on needs a reset before the next task (the manual: unless save, nothing
    carries over). When the next task follows at once, the reset travels in its preamble's round
    trip; a session left idle is reset on its own after RESET_DELAY seconds, so what a task left
    behind (an advisory lock, a LISTEN) does not outlive it for longer than that.
    """

    RESET_DELAY = 0.02

    def __init__(self, conn: psycopg.AsyncConnection, user: str, set_role: bool,
                 settings: tuple[tuple[str, str], ...], reloads: Reloads):
        super().__init__(conn)
        self.user, self.set_role = user, set_role
        self.settings = settings  # its own (connection) settings, which a reset restores: see SessionPool.get
        self.needs_reset = False
        self.idle_since = 0.0  # loop time it was last put back into the pool
        # the author's pg_task.spi as the last preamble read it (spi_known: one has read it)
        self.spi: str | None = None
        self.spi_known = False
        self.error_style = DEFAULT_STYLE  # how its tasks' errors are written: see style
        self.reloads = reloads  # the pool's count of configuration reloads (SessionPool)
        self.style_reloads = -1  # that count when error_style was read
        self.settings_seen = reloads.settings  # the database and role settings it started with

    @classmethod
    async def opened(cls, conn: psycopg.AsyncConnection, user: str, set_role: bool,
                     settings: tuple[tuple[str, str], ...], reloads: Reloads) -> Session:
        """A new session, with the error style its settings give (see style)."""
        session = cls(conn, user, set_role, settings, reloads)
        try:
            await session.style()
        except BaseException:
            await conn.close()
            raise
        return session

    async def style(self) -> None:
        """Read the session's error style (log_error_verbosity and log_min_error_statement, as ALTER
        SYSTEM, DATABASE and ROLE have them) when it opens, and again before its next task once the
        server's configuration was reloaded since (SessionPool.config_reloaded): as the manual's
        worker, whose settings follow a reload, writes the next error."""
        if self.style_reloads == self.reloads.count:
            return
        reloads = self.reloads.count
        cur = self.conn.cursor(row_factory=psycopg.rows.tuple_row)
        self.error_style = ErrorStyle.of(await (await cur.execute(_ERROR_STYLE)).fetchone())
        self.style_reloads = reloads

    @property
    def stale(self) -> bool:
        """Whether ALTER DATABASE / ALTER ROLE settings changed since it started (it still has the
        old ones: a backend reads them once): it runs no more tasks."""
        return self.settings_seen != self.reloads.settings

    def keep_as_is(self) -> None:
        """The next task inherits what this one left (save): no reset before it."""
        self.needs_reset = False

    async def reset(self) -> None:
        """Back to a clean session now."""
        if not self.needs_reset:
            return
        await self.settled()
        err = await wire.simple(self.pgconn, RESET_SESSION, self.encoding)
        if err is not None:
            raise psycopg.OperationalError(format_error(err, None))
        self.needs_reset = False
