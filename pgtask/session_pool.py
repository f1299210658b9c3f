"""The pool of task authors' sessions: idle sessions per role, reused and trimmed; the line of
tasks waiting for one; admission under the connection-slot cap (slots.py).

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
import logging
from collections.abc import Awaitable

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from . import sql as named
from .connect import connection_settings
from .output import reason
from .session import Reloads, Session
from .slots import Slots, refused_for_slots

log = logging.getLogger("pgtask.session_pool")

_SLOT = object()  # a connection slot handed to a waiting task


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
        self.reloads.reloaded()

    def settings_changed(self) -> None:
        """The ALTER DATABASE / ALTER ROLE settings that reach the sessions changed: every session
        open now is stale (Session.stale) -- the idle ones are closed now, those running a task
        when it ends -- and the next task gets a new one, which reads them."""
        self.reloads.settings_changed()
        for pool in self.idle.values():
            for session in pool:
                self._chore(self.retire(session), "close a stale session")
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
        cur = await conn.execute(named.query("session.sql", "set_role_allowed"), {"role": user})
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
            await self.retire(session)
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

    async def retire(self, session: Session) -> None:
        """Close a session that runs no more tasks; its slot goes to a task waiting for one."""
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
