"""Running claimed tasks: one run-then-complete loop over a target -- a local session of the task's
author (local_input.py) or a connection to the task's remote server (remote.py) -- that runs a task,
has the completer write its finish, and within count/live takes the group's next task on the same
connection. The targets hold what differs: how a connection is had, what a lost one means, what
happens to it after a task."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Callable

import psycopg

from . import remote
from .completer import Completer
from .connect import group_settings
from .control import Control, ServerSettings
from .inputs import Held
from .local_input import run_input
from .output import message, reason, simple_error
from .parts import Parts
from .queries import local_facts, ping
from .session import Session
from .task import NotStarted, Task

log = logging.getLogger("pgtask.runner")

# A task whose session ends while it runs runs again (the server restarted, someone ended the
# backend), up to its LOST_ATTEMPTS-th attempt: then it fails with the reason (an input that ends
# its own session, or crashes its backend, would otherwise run for ever).
LOST_ATTEMPTS = 10
# Seconds a remote task whose connection failed before its input was sent waits, at most, before it
# connects again (see RemoteTarget.again).
REMOTE_BACKOFF_CAP = 60.0
DRAIN_CHECK = 0.5  # seconds between looks, while it waits, at whether the service drains


class Ends(Exception):
    """A target's outcome for a task it could not run to its end (its connection could not be had,
    or was lost): the runner ends the task here -- back to PLAN to run later (``requeue``), or
    finished with ``output`` and ``error``."""

    def __init__(self, output: str | None = None, error: str | None = None, requeue: bool = False):
        super().__init__(error)
        self.output, self.error, self.requeue = output, error, requeue


class Runner:
    """The tasks of one scheduler while they run: ``dispatch`` starts one (the claim loop's
    callback), ``cancel`` stops one (STOP, the grace period over). ``control`` claims a group's
    next task for a session within count/live, under its lock (see complete)."""

    def __init__(self, parts: Parts, completer: Completer, control: Control, server: ServerSettings):
        self.entry, self.conninfo, self.options, self.queries = parts.entry, parts.conninfo, parts.options, parts.queries
        self.inflight, self.writers = parts.inflight, parts.writers
        self.parts, self.completer, self.control, self.server = parts, completer, control, server
        self.tasks: set[asyncio.Task] = set()
        self.drain_cancelled: set[int] = set()
        self.remote_facts = remote.LocalFacts(self._local_facts)

    def dispatch(self, task: Task, session: Session | None = None) -> None:
        """Run a claimed task; ``session``: the one the claim started it on (see "claim" in queries.sql)."""
        self.inflight.add(task)
        target = (RemoteTarget(self.parts, self.remote_facts, self.server) if task.remote is not None
                  else LocalTarget(self.parts, self.completer, session))
        t = asyncio.create_task(self.execute(task, target), name=f"task {task.id}")
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    async def execute(self, task: Task, target: LocalTarget | RemoteTarget) -> None:
        """Run one task and, within count/live, further tasks of its group on the same connection."""
        chain = Chain(task)
        try:
            while task is not None:
                try:
                    conn = await target.connect(task)
                except Ends as end:  # the task ends, or goes back to PLAN, without a connection
                    await self.end(task, end)
                    return
                self.inflight.add(task, conn)
                try:
                    async with Held(self.options.inputs, task, self.read_input) as held:
                        output, error = await target.run(
                            task, functools.partial(self.completer.start_work, task, conn.pid))
                except NotStarted:
                    await self.completer.not_started(task)
                    return
                except target.Lost as exc:
                    try:
                        await target.lost(task, exc)
                    except Ends as end:
                        await self.end(task, end)
                        return
                    continue  # on a new connection
                except Exception as exc:  # noqa: BLE001 -- any bug of ours: see failed_in_service
                    await target.drop()
                    await self.failed_in_service(task, exc)
                    return
                self.inflight.detach(task.id)  # its input is over: a STOP now cancels nothing on conn
                chain.done += 1
                finished, more = task, target.finishing(task, chain, held.large)
                try:
                    task = await self.complete(task, output, error, chain, more)
                finally:
                    target.withdraw(finished)
                task = await target.reuse(finished, task, held.large)
        finally:
            await target.close()

    async def complete(self, task: Task, output: str | None, error: str | None, chain: Chain,
                       more: bool) -> Task | None:
        """After a run: finish the task and return the group's next task for the same connection
        (within count/live, unless not ``more``: see the targets' finishing), or None. A run cancelled by SIGTERM's grace
        deadline is put back -- unless its input succeeded all the same (it ended just then, or
        handled the cancel): its work is committed, and it is finished as any other.

        Within count/live the finish and the next task's claim hold the control lock, so a claim
        pass cannot hand that task to another session in between (the manual's task_live); a
        finish that takes longer than SLOW_FLUSH (a row lock someone else holds, a slow trigger)
        lets go of it -- claim passes for every other group wait on that lock -- and the session
        takes no next task."""
        if task.id in self.drain_cancelled and error is not None:
            await self.completer.requeue(task)
            return None
        if task.keeps_session:
            async with self.control.lock:
                finishing = asyncio.ensure_future(self.completer.finish(task, output, error))
                try:
                    await asyncio.wait_for(asyncio.shield(finishing), self.completer.SLOW_FLUSH)
                except TimeoutError:
                    pass
                except BaseException:
                    finishing.cancel()
                    raise
                else:
                    if not more:
                        return None
                    nxt = await self.control.next_of_group(task, chain.max, chain.done, chain.born)
                    if nxt is not None:  # in flight while the lock is held: claim passes count it for their room
                        self.inflight.add(nxt)
                    return nxt
            await finishing
            return None
        await self.completer.finish(task, output, error)
        return None

    async def end(self, task: Task, end: Ends) -> None:
        """A task its target could not run to its end (see Ends)."""
        if end.requeue:
            await self.completer.requeue(task)
        else:
            await self.completer.finish(task, end.output, end.error)

    async def read_input(self, task: Task) -> str:
        """A large input (see inputs.py), read on a connection of its own: libpq keeps the buffer
        a value arrived in for as long as its connection lives. NotStarted: the lease was lost."""
        async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
            text = await self.queries.read_input(conn, task.fence)
        if text is None:
            raise NotStarted(task.id)
        return text

    async def failed_in_service(self, task: Task, exc: Exception) -> None:
        """Running ``task`` failed in the service itself (a bug, not the task's input nor a lost
        connection): the task fails with the reason instead of staying WORK for as long as the
        service runs, and the service goes on."""
        log.error("task %s: the service failed running it", task.id, exc_info=exc)
        await self.completer.finish(task, "", simple_error(
            f"pgtask failed running the task: {type(exc).__name__}: {exc}", statement=task.input))

    async def _local_facts(self, user: str) -> tuple[bool, str]:
        async with self.writers.connection() as conn:
            return await local_facts(conn, user)

    async def stop_requested(self, ids: list[int]) -> list[int]:
        """Of the tasks ``ids`` (running here when their stop hint came), those whose row is STOP
        under the claim this service runs (see "stop_requested")."""
        tasks = [entry[0] for i in ids if (entry := self.inflight.get(i)) is not None]
        if not tasks:
            return []
        row = await self.completer.write("stop_requested", {
            "id": [t.id for t in tasks], "attempt": [t.attempt for t in tasks], "lease": [t.lease for t in tasks]})
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

    async def drain(self, grace: float) -> None:
        """Let running tasks finish within ``grace`` seconds; cancel the rest."""
        if self.tasks:
            _, pending = await asyncio.wait(set(self.tasks), timeout=grace)
            if pending:
                log.warning("%s: grace period over, cancelling %d task(s)", self.entry.label(), len(pending))
                for task_id in list(self.inflight):
                    self.drain_cancelled.add(task_id)
                    await self.cancel(task_id)
                await asyncio.wait(pending, timeout=10)

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class Chain:
    """The tasks one run of Runner.execute takes on its connection: the manual's worker, which
    starts from zero with the task that spawned it. count and live are counted here, not on the
    connection: a pooled session that ran other tasks before starts a chain from zero all the same.

    ``max``: the spawner's (its next tasks have max >= it); ``done``: tasks run; ``born``: the
    spawner's claim time (the database's clock, for claim_next); ``born_at``: the loop's, for spent."""

    __slots__ = ("max", "done", "born", "born_at")

    def __init__(self, spawner: Task):
        self.max, self.done, self.born = spawner.max, 0, spawner.now
        self.born_at = asyncio.get_running_loop().time()

    def spent(self, task: Task) -> bool:
        """Whether the chain has lived out ``task``'s count or live (the manual: how many tasks, or
        how long, a worker runs before it exits)."""
        return (task.count > 0 and self.done >= task.count
                or task.live_s > 0 and asyncio.get_running_loop().time() - self.born_at >= task.live_s)


class LocalTarget:
    """A task's author's session (session.py), from the pool or the one the claim started it on;
    pooled again after the group's last task on it."""

    Lost = psycopg.OperationalError  # the session ended while the task ran (its outcome unknown)

    __slots__ = ("parts", "completer", "session", "spent", "offered")

    def __init__(self, parts: Parts, completer: Completer, session: Session | None):
        self.parts, self.completer, self.session = parts, completer, session
        self.spent = self.offered = False  # the last task's: see finishing

    async def connect(self, task: Task) -> Session:
        """The session for ``task``; raises Ends (see open_session)."""
        if self.session is not None and (self.session.conn.closed or self.session.stale):  # stale: see control.ServerSettings.settings_seen
            await self.parts.sessions.retire(self.session)
            self.session = None
            task.session_pid = None  # its start function sets the pid of the session it gets
        if self.session is None:
            self.session = await self.open_session(task)
        return self.session

    async def open_session(self, task: Task) -> Session:
        """A session for the task's author. If the server itself is unreachable (restarting, shutting
        down) the task goes back to PLAN to run later; a failure of the role (it does not exist, may
        not log in, authentication refused) fails the task with the reason (both: raises Ends)."""
        parts = self.parts
        settings = group_settings(task.group, parts.entry.schema, parts.entry.table, parts.queries.oid)
        for attempt in (1, 2):
            try:
                return await parts.sessions.get(task.user, settings)
            except psycopg.Error as exc:
                if not await self._server_up():
                    log.warning("task %s: the server is unreachable (%s); it will run later", task.id,
                                reason(exc))
                    raise Ends(requeue=True) from exc
                if attempt == 2:
                    raise Ends("", simple_error(
                        f"could not connect as role {task.user}", str(exc).strip())) from exc

    async def _server_up(self) -> bool:
        try:
            async with self.parts.writers.connection() as conn:
                await ping(conn)
            return True
        except psycopg.OperationalError:
            return False

    async def run(self, task: Task, start_work: Callable[[], asyncio.Future]) -> tuple[str | None, str | None]:
        parts = self.parts
        return await run_input(self.session, task, parts.entry.schema, parts.entry.table, parts.queries.oid,
                               parts.options.output_limit, spi=parts.entry.spi, start_work=start_work)

    async def lost(self, task: Task, exc: psycopg.OperationalError) -> None:
        """The session ended while the task ran: it runs again, up to LOST_ATTEMPTS. False: the
        task is over here."""
        await self.drop()
        if task.attempt >= LOST_ATTEMPTS:  # most likely the input's own doing
            log.error("task %s: executor connection lost (%s), attempt %s: it fails", task.id,
                      reason(exc), task.attempt)
            raise Ends("", simple_error(
                f"the task's session ended while it ran, {task.attempt} times in a row",
                message(exc), statement=task.input))
        log.warning("task %s: executor connection lost (%s); it will run again", task.id, reason(exc))
        raise Ends(requeue=True)

    def finishing(self, task: Task, chain: Chain, large: bool) -> bool:
        """Before ``task``'s finish: whether the session may take the group's next task. A chain that
        lived out count/live ends its session, as the manual's worker exits; so does a large input:
        libpq keeps the buffer it went out in while the session lives. The session of a task that
        does not keep it is offered to the claim pass that writes its finish, which may start the
        group's next task on it (completer.PassBatch.offer)."""
        self.spent = chain.spent(task) or (large and not task.save)
        self.offered = not self.spent and not task.keeps_session
        if self.offered:
            self.completer.offer_session(task.id, self.session)
        return not self.spent

    def withdraw(self, finished: Task) -> None:
        """After the finish: the offered session back, unless the pass that wrote the finish
        started another task on it."""
        if self.offered and not self.completer.withdraw_session(finished.id):
            self.session = None

    async def reuse(self, finished: Task, task: Task | None, large: bool) -> Task | None:
        """After the finish: the session for the group's next ``task`` (returned), or ended."""
        if self.spent:
            await self.drop()
        elif finished.save and task is not None:
            self.session.keep_as_is()  # save
        return task

    async def drop(self) -> None:
        await self.parts.sessions.retire(self.session)
        self.session = None

    async def close(self) -> None:
        if self.session is not None:
            await self.parts.sessions.put(self.session)


class RemoteTarget:
    """A connection to the task's remote server (remote.py), for the group's tasks on it within
    count/live; one whose connect failed before its input was sent connects again (see again)."""

    Lost = remote.Lost

    __slots__ = ("parts", "facts", "server", "remote", "tries")

    def __init__(self, parts: Parts, facts: remote.LocalFacts, server: ServerSettings):
        self.parts, self.facts, self.server = parts, facts, server
        self.remote: remote.RemoteConnection | None = None
        self.tries = 1  # connections of the running task so far (see again)

    async def connect(self, task: Task) -> remote.RemoteConnection:
        """The task's remote connection, connected again after a failure before its input was sent
        (see again); raises Ends."""
        parts = self.parts
        while self.remote is None:
            try:
                self.remote, error = await remote.connect(task, self.facts, parts.entry.schema,
                                                          parts.entry.table, parts.queries.oid)
            except remote.Unsent as unsent:
                await self.again(task, unsent.error)
                self.tries += 1
                continue
            if self.remote is None:
                log.info("task %s: remote connection refused or failed: %s", task.id,
                         error.splitlines()[-1] if error else "")
                raise Ends("", error)
        return self.remote

    async def run(self, task: Task, start_work: Callable[[], asyncio.Future]) -> tuple[str | None, str | None]:
        return await remote.run(self.remote, task, self.parts.options.output_limit, started=start_work(),
                                style=self.server.error_style)

    async def lost(self, task: Task, lost: remote.Lost) -> None:
        """The connection broke while the task ran: it runs again on a new one, or raises Ends."""
        log.warning("task %s: remote connection lost (%s)", task.id, reason(lost.exc))
        await self.drop()
        error = simple_error("PQconsumeInput failed", message(lost.exc), statement=task.input,
                             style=self.server.error_style)
        if lost.sent:  # its input may have run: it is not run again (pg_task's rule)
            raise Ends(lost.output or "", error)
        await self.again(task, error)
        self.tries += 1

    def finishing(self, task: Task, chain: Chain, large: bool) -> bool:
        """Before ``task``'s finish: the connection may take the group's next task (count/live are
        the claim's to check: see "claim_next")."""
        self.tries = 1
        return True

    def withdraw(self, finished: Task) -> None:
        pass  # a remote connection is never offered to a claim pass

    async def reuse(self, finished: Task, task: Task | None, large: bool) -> Task | None:
        """After the finish: the connection reset for the group's next ``task`` (returned) --
        DISCARD ALL, unless the finished task had save -- or closed."""
        if task is not None and not finished.save and self.remote is not None and large:
            await self.drop()  # libpq keeps the buffer the input went out in while it lives
        elif task is not None and not finished.save and self.remote is not None:
            err = await remote.discard(self.remote)
            if err is not None:
                log.warning("task %s: DISCARD ALL failed (%s); reconnecting", finished.id, err)
                await self.drop()
        return task

    async def again(self, task: Task, error: str) -> None:
        """The ``tries``-th connection of ``task`` failed before its input was sent: connect again
        (returns), after waiting ``remote_backoff`` seconds, doubling with every try up to
        REMOTE_BACKOFF_CAP, with jitter (the tasks a server restart turned away do not all come back
        at once). The task keeps its claim meanwhile (TAKE, its group's slot: the group's next task
        would meet the same server). After ``remote_attempts`` connections it fails with ``error``,
        the last reason; when the service drains, it goes back to PLAN (both: raises Ends)."""
        parts, tries = self.parts, self.tries
        attempts = parts.options.remote_attempts
        if tries >= attempts:
            log.warning("task %s: remote connection failed before its input was sent (%s), %s of %s: it fails",
                        task.id, error.splitlines()[-1].strip(), tries, attempts)
            raise Ends("", error)
        parts.inflight.detach(task.id)  # no query of it to cancel meanwhile
        delay = min(parts.options.remote_backoff * 2 ** (tries - 1), REMOTE_BACKOFF_CAP) * (0.5 + random.random() / 2)
        log.info("task %s: remote connection failed before its input was sent (%s), %s of %s; again in %.1fs",
                 task.id, error.splitlines()[-1].strip(), tries, attempts, delay)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + delay
        while not parts.life.draining and (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(left, DRAIN_CHECK))  # a drain does not wait out the delay
        if parts.life.draining:
            raise Ends(requeue=True)

    async def drop(self) -> None:
        if self.remote is not None:
            await self.remote.close()
        self.remote = None

    async def close(self) -> None:
        await self.drop()
