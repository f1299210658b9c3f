"""Local execution: a task's input runs on a connection of its own author (the manual's pg_task).

How a task takes its author's role (``[pgtask] execute_as``):
  login    -- the executor session logs in as task.user; RESET ROLE / SET ROLE / SET SESSION
              AUTHORIZATION inside input cannot leave that role (needs LOGIN and an auth method
              that lets the service in as that role: trust, peer + pg_ident map, .pgpass);
  set_role -- the service's own session runs SET ROLE task.user (the C extension's way): input
              running as a role whose session user is privileged can RESET ROLE.
  auto     -- login where the server allows it, else set_role (logged once per role).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import re
import uuid
from collections.abc import Awaitable, Callable

import pglast
import psycopg
from psycopg import pq, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from . import spi as spi_mode
from . import wire
from .connect import Connection, connection_settings, group_settings
from .inputs import INLINE
from .names import function_name
from .output import DEFAULT_STYLE, ErrorStyle, Output, format_error, reason, simple_error
from .slots import Slots, refused_for_slots
from .task import NotStarted, Task

log = logging.getLogger("pgtask.executor")

_SLOT = object()  # SessionPool: a connection slot handed to a waiting task


_COPY = re.compile("copy", re.IGNORECASE)


def refused_copy(text: str) -> str | None:
    """Local input may not use COPY ... FROM STDIN / TO STDOUT (there is no client to stream to)."""
    if _COPY.search(text) is None:
        return None  # a keyword cannot be quoted, escaped or split: no COPY statement (skips the parse)
    try:
        statements = pglast.parse_sql(text)
    except pglast.parser.ParseError:
        return None  # the server reports the syntax error itself
    for raw in statements:
        stmt = raw.stmt
        if type(stmt).__name__ == "CopyStmt" and stmt.filename is None and not stmt.is_program:
            return "COPY FROM STDIN is not supported" if stmt.is_from else "COPY TO STDOUT is not supported"
    return None


# DISCARD ALL without DISCARD PLANS: everything a task can see of its session is reset (settings,
# role, temporary tables, prepared statements, cursors, LISTEN, advisory locks, sequence state);
# cached plans are not visible state -- keeping them spares re-planning the start function and the
# table's triggers for every task. Unlike DISCARD ALL it may run inside the next task's preamble;
# there the advisory unlock is a column of the preamble's SELECT (one statement less a task).
_RESET_STATEMENTS = ("CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; DEALLOCATE ALL; UNLISTEN *; "
                     "DISCARD TEMP; DISCARD SEQUENCES")
_UNLOCK = "pg_advisory_unlock_all()"
RESET_SESSION = f"{_RESET_STATEMENTS}; SELECT {_UNLOCK}"


class Reloads:
    """How many times the service saw the server read its configuration again (``count``), shared
    by a pool's sessions, each of which reads its error style again when the count moved
    (Session.style); and how many times the ALTER DATABASE / ALTER ROLE settings that reach them
    changed (``settings``): a session that started before the last change is retired (Session.stale)."""

    __slots__ = ("count", "settings")

    def __init__(self) -> None:
        self.count = 0
        self.settings = 0


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
        self.settings = settings  # its own (connection) settings, which a reset restores: see get()
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
        self.error_style = ErrorStyle.of(await (await cur.execute(ErrorStyle.QUERY)).fetchone())
        self.style_reloads = reloads

    @property
    def stale(self) -> bool:
        """Whether ALTER DATABASE / ALTER ROLE settings changed since it started (it still has the
        old ones: a backend reads them once): it runs no more tasks."""
        return self.settings_seen != self.reloads.settings

    async def reset(self) -> None:
        """Back to a clean session now."""
        if not self.needs_reset:
            return
        await self.settled()
        err = await wire.simple(self.pgconn, RESET_SESSION, self.encoding)
        if err is not None:
            raise psycopg.OperationalError(format_error(err, None))
        self.needs_reset = False


class SessionPool:
    """Idle executor sessions per role, opened on demand, the most recently used taken first.

    A role keeps ``idle_per_user`` idle sessions; those beyond are closed once they have been idle
    IDLE_TRIM seconds, so a burst of more tasks at once than that reuses its sessions instead of
    opening a backend per task (about 4 ms of server CPU each), and a burst's sessions do not
    stay open for long after it.

    At most ``connecting`` sessions are being opened at once. A task that finds no idle session
    waits, first come first served, for whichever comes first: a session of its role put back by
    a task that ended, or a free connection slot. A burst of short tasks in many groups then runs
    on the sessions that end meanwhile instead of starting a backend for every task (a thousand
    `SELECT 1` in a thousand groups: a few dozen backends, not a thousand); long tasks each still
    get a session of their own, opened as fast as the server starts backends anyway.

    At most ``slots.cap`` sessions are open at once (see slots.py): a task that finds none idle
    when the cap is reached waits the same way -- an idle session of another role is closed to
    make room -- and so does a task whose session the server refused for want of a slot.
    """

    IDLE_TRIM = 10.0

    def __init__(self, base_conninfo: str, service_user: str, mode: str, idle_per_user: int = 32,
                 connecting: int = 4, slots: Slots | None = None):
        self.base, self.service_user, self.mode = base_conninfo, service_user, mode
        self.connecting_max = connecting
        self.idle: dict[str, list[Session]] = {}
        self.idle_per_user = idle_per_user
        self.no_login: set[str] = set()
        self.chores: set[asyncio.Task] = set()  # resets of idle sessions, closes of trimmed ones
        self.trim: asyncio.TimerHandle | None = None
        self.base_options = conninfo_to_dict(base_conninfo).get("options")
        self.connecting = 0  # sessions being opened now (at most connecting_max)
        self.reloads = Reloads()  # configuration reloads seen (config_reloaded), shared with the sessions
        # tasks waiting for a session: (role, future); the future gets a session of that role put
        # back, or _SLOT (a connection slot handed over: open one)
        self.waiting: collections.deque[tuple[str, asyncio.Future]] = collections.deque()
        self.slots = slots or Slots()
        self.deriving: asyncio.Future | None = None  # the cap being derived again (see _slot_room)
        self.recheck: asyncio.TimerHandle | None = None  # see _grant
        self.evicting = 0  # idle sessions being closed to make room (_make_room)

    def config_reloaded(self) -> None:
        """The server read its configuration again: every session reads its error style again
        before its next task (Session.style)."""
        self.reloads.count += 1

    def settings_changed(self) -> None:
        """The ALTER DATABASE / ALTER ROLE settings that reach the sessions changed: every session
        open now is stale (Session.stale) -- the idle ones are closed now, those running a task
        when it ends -- and the next task gets a new one, which reads them."""
        self.reloads.settings += 1
        for pool in self.idle.values():
            for session in pool:
                self._chore(self.discard(session), "close a stale session")
            pool.clear()

    async def get(self, user: str, settings: tuple[tuple[str, str], ...] = ()) -> Session:
        """An idle session of ``user`` -- one opened with these ``settings`` if there is one (see
        group_settings), else the most recently used -- or a new one opened with them: settings
        given at connection start are the session's own, which its reset restores, so a task
        whose settings they are needs no set_config for them. Waits while ``connecting``
        sessions are being opened, or the pool's sessions are at their cap (see the class)."""
        refused = False
        while True:
            pool = self.idle.get(user)
            while pool:
                i = next((i for i in range(len(pool) - 1, -1, -1) if pool[i].settings == settings), -1)
                session = pool.pop(i)
                if not session.conn.closed and session.pgconn.transaction_status == pq.TransactionStatus.IDLE \
                        and not session.stale:
                    return session
                await session.conn.close()
            room = await self._slot_room()
            if self.connecting >= self.connecting_max or self.waiting or not room:
                got = await self._wait(user, first=refused)
                if got is not _SLOT:
                    return got
            else:
                self.connecting += 1
            try:
                session = await self._open_current(user, settings)
                self.slots.admitted(session)
                return session
            except psycopg.OperationalError as exc:
                if not refused_for_slots(exc):
                    raise
                self._refused(exc)
                refused = True
            finally:
                self._free_slot()

    async def _open_current(self, user: str, settings: tuple[tuple[str, str], ...]) -> Session:
        """A new session (_open) that counts the database and role settings as they were before it
        connected: a change that lands while it connects may have missed its backend, which is
        then stale (Session.stale)."""
        seen = self.reloads.settings
        session = await self._open(user, settings)
        session.settings_seen = seen
        return session

    async def _wait(self, user: str, first: bool = False) -> Session | object:
        """In line for a session of ``user`` put back or a connection slot (see the class);
        ``first``: at the head of the line (its session was refused)."""
        waiter = asyncio.get_running_loop().create_future()
        entry = (user, waiter)
        if first:
            self.waiting.appendleft(entry)
        else:
            self.waiting.append(entry)
        try:
            return await waiter
        except asyncio.CancelledError:
            if entry in self.waiting:
                self.waiting.remove(entry)
            elif not waiter.cancelled():  # handed something just before the cancel
                got = waiter.result()
                if got is _SLOT:
                    self._free_slot()
                else:
                    await self.put(got)
            raise

    def _free_slot(self) -> None:
        """An open is over: the first task waiting may open one (see _grant)."""
        self.connecting -= 1
        self._grant()

    def _grant(self) -> None:
        """Hand the tasks waiting, first come first served, what may be opened now; while the
        cap stops them, close an idle session (the least recently used: of a role none of them
        waits for, else it would have been handed over) and look again once one may have ended,
        the server's refusal is over or the cap is due to be derived again."""
        loop = asyncio.get_running_loop()
        while self.waiting and self.connecting < self.connecting_max:
            if not self.slots.room(self.connecting, loop.time()):
                self._make_room()
                if self.recheck is None:
                    self.recheck = loop.call_later(self.slots.recheck_in(loop.time()), self._rechecked)
                return
            _, waiter = self.waiting.popleft()
            if not waiter.done():
                self.connecting += 1
                waiter.set_result(_SLOT)

    def _rechecked(self) -> None:
        self.recheck = None
        if self.slots.stale(asyncio.get_running_loop().time()):
            self._chore(self._slot_room(), "derive the session cap")
        else:
            self._grant()

    async def _slot_room(self) -> bool:
        """Whether a session may be opened now as far as the cap goes, the cap derived again
        first when it is due (one query for every task that needs it then)."""
        loop = asyncio.get_running_loop()
        if self.slots.stale(loop.time()):
            if self.deriving is None or self.deriving.done():
                self.deriving = asyncio.ensure_future(self._derive())
            await asyncio.shield(self.deriving)
        return self.slots.room(self.connecting, loop.time())

    async def _derive(self) -> None:
        try:
            await self.slots.refresh(asyncio.get_running_loop().time())
        except psycopg.Error as exc:  # the cap stays: the server is slow or away, the open will tell
            log.info("could not derive the executor session cap (%s)", reason(exc))
        self._grant()

    def _make_room(self) -> None:
        """Close the least recently used idle session (it frees a slot for a task waiting), unless
        as many are being closed as tasks wait."""
        oldest = min((pool for pool in self.idle.values() if pool), key=lambda pool: pool[0].idle_since,
                     default=None)
        if oldest is not None and self.evicting < len(self.waiting):
            self.evicting += 1
            self._chore(self._close_for_room(oldest.pop(0)), "close an idle session for room")

    async def _close_for_room(self, session: Session) -> None:
        try:
            await session.conn.close()
        finally:
            self.evicting -= 1
        self._grant()

    def _refused(self, exc: psycopg.OperationalError) -> None:
        """The server refused a session for want of a connection slot: the task never ran; it
        waits, first in line, and no session is opened for a while (Slots.refused)."""
        delay = self.slots.refused(asyncio.get_running_loop().time())
        log.warning("executor session refused (%s) with %d open; the task waits, opening again in %.2fs",
                    reason(exc), self.slots.opened(), delay)

    async def _open(self, user: str, settings: tuple[tuple[str, str], ...]) -> Session:
        use_login = self.mode == "login" or (self.mode == "auto" and user not in self.no_login)
        refused: psycopg.OperationalError | None = None  # the role's own login, refused
        if use_login or user == self.service_user:
            try:
                conn = await psycopg.AsyncConnection.connect(self.session_conninfo(settings, user), autocommit=True)
                return await Session.opened(conn, user, set_role=False, settings=settings, reloads=self.reloads)
            except psycopg.OperationalError as exc:
                if self.mode == "login" or "not permitted to log in" not in str(exc) and \
                        "authentication failed" not in str(exc) and "no pg_hba.conf entry" not in str(exc):
                    raise
                refused = exc
        conn = await psycopg.AsyncConnection.connect(self.session_conninfo(settings), autocommit=True)
        if refused is not None and user != self.service_user:  # auto, and the role's login was refused
            await self._fall_back(conn, user, refused)
        return await Session.opened(conn, user, set_role=True, settings=settings, reloads=self.reloads)

    async def _fall_back(self, conn: psycopg.AsyncConnection, user: str, refused: Exception) -> None:
        """execute_as = auto and ``user`` cannot log in: its tasks run through SET ROLE from the
        service's session ``conn`` only if that gives their input nothing more -- it can RESET ROLE
        to the service role -- i.e. when the role is a superuser or may act as the service role
        already. Otherwise raises (the task fails saying why and what to do), and ``conn`` is closed."""
        cur = await conn.execute("SELECT pg_has_role(%s, current_user, 'USAGE') OR coalesce("
                                 "(SELECT rolsuper FROM pg_roles WHERE rolname = %s), false)", (user, user))
        if (await cur.fetchone())[0]:
            if user not in self.no_login:
                self.no_login.add(user)
                log.warning("role %s cannot log in (%s); its tasks run through SET ROLE from the service role",
                            user, reason(refused))
            return
        await conn.close()
        raise psycopg.OperationalError(
            f"role {user} cannot log in ({reason(refused)}), and its tasks do not run through SET ROLE from "
            f"the service role {self.service_user}, to which their input could RESET ROLE. Give {user} LOGIN "
            f"and a way for the service to log in as it (a peer map, trust on the local socket, .pgpass), "
            f'or set execute_as = "set_role" if every task author is trusted as the service role.')

    def session_conninfo(self, settings: tuple[tuple[str, str], ...], user: str | None = None) -> str:
        """The base connection string as ``user`` with ``settings`` (see connection_settings)."""
        return make_conninfo(self.base, **({"user": user} if user else {}),
                             **connection_settings(settings, self.base_options))

    async def put(self, session: Session) -> None:
        if session.conn.closed:
            self._grant()  # its slot is free
            return
        if session.stale:
            await self.discard(session)
            return
        idle = session.pgconn.transaction_status == pq.TransactionStatus.IDLE  # else get() drops it
        for entry in self.waiting if idle else ():
            if entry[0] == session.user and not entry[1].done():
                # a task waiting for a session of this role takes it (its preamble resets it)
                self.waiting.remove(entry)
                entry[1].set_result(session)
                return
        loop = asyncio.get_running_loop()
        session.idle_since = loop.time()
        pool = self.idle.setdefault(session.user, [])
        pool.append(session)
        if len(pool) > self.idle_per_user and self.trim is None:
            self.trim = loop.call_later(self.IDLE_TRIM, self._trim)
        if session.needs_reset:
            # a timer, not a task per put: most sessions are taken again before it fires
            loop.call_later(Session.RESET_DELAY, self._reset_if_idle, session)
        if self.waiting:
            self._grant()  # tasks of other roles waiting on the cap: this one may make room

    def _trim(self) -> None:
        """Close each role's idle sessions beyond idle_per_user that have been idle IDLE_TRIM
        seconds (the least recently used first); look again when the next one will have been."""
        self.trim = None
        loop = asyncio.get_running_loop()
        now, again = loop.time(), None
        for pool in self.idle.values():
            while len(pool) > self.idle_per_user and now - pool[0].idle_since >= self.IDLE_TRIM:
                self._chore(pool.pop(0).conn.close(), "close an idle session")
            if len(pool) > self.idle_per_user:
                wait = pool[0].idle_since + self.IDLE_TRIM - now
                again = wait if again is None else min(again, wait)
        if again is not None:
            self.trim = loop.call_later(again, self._trim)

    def _chore(self, work: Awaitable, name: str) -> None:
        t = asyncio.ensure_future(work)
        t.set_name(name)
        self.chores.add(t)
        t.add_done_callback(self.chores.discard)

    def _reset_if_idle(self, session: Session) -> None:
        pool = self.idle.get(session.user, [])
        if session not in pool or not session.needs_reset:
            return  # taken meanwhile: its next preamble resets it
        pool.remove(session)
        self._chore(self._reset_idle(session), f"reset session {session.pid}")

    async def _reset_idle(self, session: Session) -> None:
        try:
            await session.reset()
        except psycopg.Error:
            await session.conn.close()
            return
        except asyncio.CancelledError:
            await session.conn.close()  # the pool is closing
            raise
        await self.put(session)

    async def discard(self, session: Session) -> None:
        await session.conn.close()
        self._grant()

    async def close(self) -> None:
        for timer in (self.trim, self.recheck):
            if timer is not None:
                timer.cancel()
        self.trim = self.recheck = None
        for t in list(self.chores):
            t.cancel()
        await asyncio.gather(*self.chores, return_exceptions=True)
        for pool in self.idle.values():
            for session in pool:
                await session.conn.close()
        self.idle.clear()


@functools.lru_cache(maxsize=4096)
def _set_configs(wanted: tuple[tuple[str, str], ...], own: tuple[tuple[str, str], ...]) -> str:
    """``set_config(...), `` for each of ``wanted`` that the session's ``own`` settings do not
    already give it (quoted once, then cached)."""
    have = dict(own)
    return "".join(
        sql.SQL("set_config({}, {}, false), ").format(sql.Literal(name), sql.Literal(value)).as_string(None)
        for name, value in wanted if have.get(name) != value)


@functools.lru_cache(maxsize=1024)
def _set_role(user: str) -> str:
    return sql.SQL("SET ROLE {}; ").format(sql.Identifier(user)).as_string(None)


@functools.lru_cache(maxsize=64)
def _table_function(schema: str, table: str, kind: str) -> str:
    return sql.Identifier(schema, function_name(table, kind)).as_string(None)


def _start(task: Task, schema: str, table: str) -> str:
    """The task's start: the table's start function (TAKE -> WORK on this session), or for a task
    the claim started on this session already, its check function (see "check" in triggers.sql)."""
    lease = task.lease if isinstance(task.lease, uuid.UUID) else uuid.UUID(str(task.lease))  # into SQL text
    kind = "start" if task.session_pid is None else "check"
    return f"{_table_function(schema, table, kind)}({int(task.id)}, {int(task.attempt)}, '{lease}'::uuid)"


def _session_settings(task: Task, schema: str, table: str, oid: int, reset: bool, own: tuple) -> str:
    """The preamble's settings: pg_task.id, the group's settings the session does not have of its
    own, statement_timeout; synchronous_commit off for the preamble's own commit."""
    return (f"set_config('pg_task.id', '{int(task.id)}', false), "
            f"{_set_configs(group_settings(task.group, schema, table, oid), own)}"
            f"set_config('statement_timeout', '{int(task.timeout_ms)}', false), "
            f"set_config('synchronous_commit', 'off', true){', ' + _UNLOCK if reset else ''}")


def _lead(task: Task, set_role: bool, reset: bool) -> str:
    """The statements before the preamble's SELECT: the reset (its advisory unlock is in the
    SELECT, see _session_settings), then SET ROLE in set_role mode."""
    return f"{_RESET_STATEMENTS + '; ' if reset else ''}{_set_role(task.user) if set_role else ''}"


def preamble(task: Task, schema: str, table: str, oid: int, set_role: bool, reset: bool,
             own: tuple[tuple[str, str], ...]) -> str:
    """What the manual's pg_task worker sets before input (session settings pg_task.id, .group,
    .schema, .table, .oid, application_name, statement_timeout), then, in the same statement: the
    task's start (the table's start function: the fenced TAKE -> WORK write, see triggers.sql) and
    the author's pg_task.spi. One round trip and one transaction, which commits without waiting for
    the WAL flush, as the service's own TAKE -> WORK writes. Its one row: (started, spi, ...).
    ``reset``: the session is first reset from its previous task (RESET_SESSION); ``own``: the
    session's own settings (Session.settings), which need no set_config. Its transaction is READ
    WRITE (first, before any statement takes a snapshot) whatever the author's
    default_transaction_read_only: the start is pgtask's write, not the author's.
    """
    return (f"SET TRANSACTION READ WRITE; {_lead(task, set_role, reset)}SELECT {_start(task, schema, table)}, "
            f"{spi_mode.setting(set_role)}, {_session_settings(task, schema, table, oid, reset, own)}")


# Input that may not share its query string with the preamble: statements that refuse to run in a
# transaction block or a multi-statement string (VACUUM, CREATE DATABASE, ... CONCURRENTLY, a CALL
# or DO that commits), that act differently inside one (LOCK, DECLARE), transaction control, and
# whatever shows the query string itself. Matched as words anywhere, so some plain input (a CASE
# ... END) takes the two round trips too: that costs time, never a difference in behaviour.
_OWN_TRIP = re.compile(
    r"\b(vacuum|concurrently|database|tablespace|system|cluster|subscription|prepared?|discard|"
    r"call|do|reindex|lock|declare|savepoint|release|begin|start|commit|rollback|end|abort|copy|"
    r"current_query|pg_stat_activity)\b|--|/\*", re.IGNORECASE)


def one_trip(session: Session, text: str, spi_default: bool) -> bool:
    """Whether the task's input can follow its preamble in the same round trip (see
    one_trip_preamble). A large input takes two: it is sent as it is, not copied behind a preamble."""
    return (len(text) <= INLINE and session.spi_known and not spi_mode.use_spi(session.spi, spi_default)[0]
            and not text.isspace() and text != "" and _OWN_TRIP.search(text) is None)


def one_trip_preamble(task: Task, schema: str, table: str, oid: int, session: Session,
                      reset: bool) -> tuple[str, int]:
    """(preamble, its statement count) to send in the same query string before the input.

    The preamble is a transaction block of its own (BEGIN ... COMMIT) that commits before the input
    runs, as in two round trips. (A COMMIT without the BEGIN would end the string's implicit
    transaction too, but with a WARNING "there is no transaction in progress" -- in the server log
    for every task.) It fails -- and then nothing of it, nor the input, runs -- when the task cannot
    start (its lease was lost) or the author's pg_task.spi is no longer the value this session last
    read (the input would run in the wrong mode): the caller then rolls the block back and takes
    the two round trips. The block is READ WRITE whatever the author's default_transaction_read_only
    (as the preamble of two round trips): the start is pgtask's write, the input runs as the author
    set it.
    """
    expected = sql.Literal(session.spi).as_string(None) if session.spi is not None else "NULL"
    # 1 / false::int: an error (division by zero) computed at run time, after the start function
    text = (f"BEGIN READ WRITE; {_lead(task, session.set_role, reset)}SELECT 1 / ({_start(task, schema, table)} "
            f"AND {spi_mode.setting(session.set_role)} IS NOT DISTINCT FROM {expected})::int, "
            f"{_session_settings(task, schema, table, oid, reset, session.settings)}; COMMIT; ")
    statements = 1 + (_RESET_STATEMENTS.count(";") + 1 if reset else 0) + int(session.set_role) + 2
    return text, statements


async def run_preamble(session: Session, text: str) -> tuple[pq.abc.PGresult | None, bool, str | None]:
    """(error result, started?, the author's pg_task.spi) of preamble(); on an error nothing of it
    took effect (one implicit transaction)."""
    await wire.send(session.pgconn, text, session.encoding)
    rows, error = await wire.results(session.pgconn)
    if error is not None or not rows:
        return error, False, None
    res = rows[-1]  # the SELECT: the only statement with rows
    raw = res.get_value(0, 1)
    return None, res.get_value(0, 0) == b"t", raw.decode(session.encoding) if raw is not None else None


async def run_input(session: Session, task: Task, schema: str, table: str, oid: int,
                    output_limit: int, spi: bool = False,
                    start_work: Callable[[], Awaitable[bool]] | None = None) -> tuple[str | None, str | None]:
    """Run one task's input on ``session``; returns (output, error).

    ``spi`` is the entry's pg_task.spi; the author's session value (ALTER SYSTEM/DATABASE/ROLE)
    wins when set, and is read in the preamble's round trip.
    The task's fenced TAKE -> WORK write (state, start, this session's pid) is made by the session
    itself in the preamble's round trip; if the lease was lost, NotStarted is raised and the input
    never runs. If the preamble fails, ``start_work`` writes it the service's way first.
    Once the session has read the author's pg_task.spi, plain input travels in the preamble's
    query string (one round trip, see one_trip_preamble); anything else takes two.
    Raises psycopg.OperationalError if the connection was lost (the outcome is unknown).
    """
    await session.settled()  # a cancel meant for the task before must not reach this one
    await session.style()  # read again after a configuration reload
    if session.needs_reset and session.encoding_changed():
        # The previous task changed the session's client encoding: the server would read this
        # task's text in that encoding. The reset (ASCII) first, on its own, restores it.
        await session.reset()
    out = Output(task.format(), output_limit, session.encoding)
    if not one_trip(session, task.input, spi):
        return await _two_trips(session, task, schema, table, oid, out, spi, start_work)
    lead, statements = one_trip_preamble(task, schema, table, oid, session, session.needs_reset)
    try:
        err = await wire.run(session.pgconn, lead + task.input, out, local=True,
                             encoding=session.encoding, skip=statements)
    except wire.LeadFailed as failed:
        # Nothing of it ran: two round trips -- unless it was cancelled (STOP, shutdown): then the
        # input must not run at all, and the task ends as a cancelled two-trip preamble does.
        wire.raise_if_lost(failed.result, session.pgconn)
        if session.pgconn.transaction_status == pq.TransactionStatus.INERROR:  # the preamble's block
            wire.raise_if_lost(await wire.simple(session.pgconn, "ROLLBACK", session.encoding), session.pgconn)
        session.needs_reset = True
        cancelled = failed.result if wire.sqlstate(failed.result) == wire.CANCELLED else None
        return await _two_trips(session, task, schema, table, oid, out, spi, start_work, cancelled)
    session.needs_reset = True
    return await _end_input(session, task, out, err, offset=len(lead))


async def _two_trips(session: Session, task: Task, schema: str, table: str, oid: int, out: Output, spi: bool,
                     start_work: Callable[[], Awaitable[bool]] | None,
                     cancelled: pq.abc.PGresult | None = None) -> tuple[str | None, str | None]:
    """The preamble (which reads the author's pg_task.spi), then the input; ``cancelled``: the
    preamble already failed that way (see run_input)."""
    error: str | None = None
    if cancelled is not None:
        err, started, spi_value = cancelled, False, None
    else:
        err, started, spi_value = await run_preamble(
            session, preamble(task, schema, table, oid, session.set_role, reset=session.needs_reset,
                              own=session.settings))
    wire.raise_if_lost(err, session.pgconn)
    session.needs_reset = True  # it holds this task's settings now (or still the previous task's)
    if err is None:
        session.spi, session.spi_known = spi_value, True
    use_spi, bad_setting = spi_mode.use_spi(spi_value, spi) if err is None else (spi, None)
    if err is not None and start_work is not None:
        started = await start_work()
    if not started:
        raise NotStarted(task.id)
    if err is not None:
        error = format_error(err, task.input, session.encoding, style=session.error_style)
    elif bad_setting is not None:
        error = bad_setting
    elif use_spi:
        error = await spi_mode.run(session.pgconn, task.input, out, session.encoding, session.error_style)
    elif (refusal := refused_copy(task.input)) is not None:
        error = simple_error(refusal, statement=task.input, style=session.error_style)
    else:
        err = await wire.run(session.pgconn, task.input, out, local=True, encoding=session.encoding)
        return await _end_input(session, task, out, err)
    return out.outcome(session.encoding_now(), error)


async def _end_input(session: Session, task: Task, out: Output, err: pq.abc.PGresult | None,
                     offset: int = 0) -> tuple[str | None, str | None]:
    """After the input ran: its error (positions counted from the input's start, ``offset``
    characters into the query string), a transaction it left open ended; (output, error)."""
    wire.raise_if_lost(err, session.pgconn)
    encoding = session.encoding_now()  # the input may have changed it
    style = session.error_style
    error = format_error(err, task.input, encoding, style=style, offset=offset) if err is not None else None
    status = session.pgconn.transaction_status
    if status in (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR):
        # A transaction left open by input is committed (a failed one rolls back); tag not printed.
        end = await wire.simple(session.pgconn, "COMMIT", encoding)
        wire.raise_if_lost(end, session.pgconn)
        if end is not None and error is None:
            error = format_error(end, task.input, encoding, style=style)
    return out.outcome(encoding, error)
