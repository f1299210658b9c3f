"""The supervisor (the manual's pg_conf): entries -> schedulers; restart, SIGHUP, SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from . import config as cfgmod
from . import provision, systemd_notify
from . import sql as named
from .cluster import Cluster, find_bindir
from .config import Config, Entry
from .connect import Backoff, with_liveness, without_timeouts
from .inputs import Budget
from .metrics import NO_METRICS, Monitoring
from .precedence import resolve
from .restart import Every, supervised
from .parts import Options
from .scheduler import Scheduler
from .systemd_notify import Notifier

log = logging.getLogger("pgtask.supervisor")

# A worker process of the service (see Workers) is told which it is ("i/n") and where the server is.
WORKER_ENV = "PGTASK_WORKER"
WORKER_DSN_ENV = "PGTASK_WORKER_DSN"


def worker_from_env() -> tuple[int, int] | None:
    """(i, n) if this process is worker i of the service's n processes, else None (the first)."""
    raw = os.environ.get(WORKER_ENV)
    if not raw:
        return None
    index, _, count = raw.partition("/")
    return int(index), int(count)


def run_share(run: int, index: int, count: int) -> int:
    """Process ``index`` of ``count``'s part of an entry's pg_task.run: the parts add up to ``run``
    (the first processes take the remainder), so the service as a whole keeps the manual's limit.
    A process whose part is 0 runs no scheduler for the entry."""
    return run // count + (1 if index < run % count else 0)


def embedded_cluster(cfg: Config) -> Cluster:
    base = Path(cfg.svc("embedded_dir") or ".pgtask").absolute()
    return Cluster(base=base, bindir=find_bindir("auto"), port=cfg.svc("embedded_port"))


def writable(conninfo: str) -> str:
    """``conninfo`` connecting only to a server that accepts writes (target_session_attrs=read-write),
    unless it or libpq's environment chooses: a standby (a replica behind a proxy, a host of a list)
    is refused at connect, so nothing claims or LISTENs there and the reconnects back off until a
    primary answers; of several hosts, libpq takes the one that is primary now."""
    params = conninfo_to_dict(conninfo) if conninfo else {}
    if "target_session_attrs" in params or "PGTARGETSESSIONATTRS" in os.environ:
        return conninfo
    return make_conninfo(conninfo, target_session_attrs="read-write")


def base_conninfo(cfg: Config) -> tuple[str, Cluster | None]:
    """The service's connection: the dsn, libpq's environment, or the embedded cluster."""
    if cfg.server_configured:
        return with_liveness(writable(cfg.dsn)), None
    cluster = embedded_cluster(cfg)
    if not cluster.initialized():
        log.info("no server configured: creating the embedded cluster in %s", cluster.base)
        cluster.init()
    cluster.start()
    log.info("embedded PostgreSQL running: %s", cluster.conninfo())
    return cluster.conninfo(), cluster


async def provision_entries(cfg: Config, conninfo: str, entries: list[Entry],
                            failed: Callable[[Entry, Exception], None] | None = None) -> provision.Report:
    """Provision every entry. With ``failed``, an entry that cannot be provisioned is reported
    there and the others go on (the service); without it the error propagates (`pgtask provision`)."""
    report = provision.Report()
    conninfo = without_timeouts(conninfo)
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as admin:
        try:
            await provision.ensure_placeholders(admin, report)
        except psycopg.Error as exc:
            if failed is None or isinstance(exc, psycopg.OperationalError):
                raise
            log.warning("cannot give the pg_task settings their placeholders: %s", str(exc).strip())
        for entry in entries:
            try:
                await provision.ensure_role(admin, entry.user, report)
                await provision.ensure_database(admin, entry.data, entry.user, report)
            except psycopg.Error as exc:
                if failed is None or isinstance(exc, psycopg.OperationalError):
                    raise
                failed(entry, exc)
    for entry in entries:
        try:
            async with await psycopg.AsyncConnection.connect(make_conninfo(conninfo, dbname=entry.data)) as conn:
                cur = await conn.execute(named.query("catalog.sql", "on_behalf"), (entry.user, entry.user))
                on_behalf = (await cur.fetchone())[0]
                await provision.provision_table(conn, entry.schema, entry.table, report,
                                                owner=entry.user if on_behalf else None, service=entry.user)
                await conn.commit()
        except psycopg.Error as exc:
            if failed is None:
                raise
            failed(entry, exc)
    return report


def dump_tasks() -> None:
    """SIGUSR1: log where every asyncio task of the service is waiting (for diagnosing a stall)."""
    import io
    for task in asyncio.all_tasks():
        buf = io.StringIO()
        task.print_stack(limit=12, file=buf)
        log.warning("task %s:\n%s", task.get_name(), buf.getvalue())


class WorkerExited(Exception):
    """A worker process ended, or could not be started: the message says which."""


class Workers:
    """The service's other processes (``pgtask.processes`` - 1), kept by its first one.

    Each is a ``pgtask run`` of its own on the same configuration and server, told by its
    environment which it is (WORKER_ENV, "i/n") and where the server is (WORKER_DSN_ENV: an embedded
    cluster is the first process's). They claim from the same tables as any two instances do (the
    claim lock, SKIP LOCKED, group counts in the database), each with its part of pg_task.run
    (run_share); the first process alone provisions and runs the maintenance. A worker reads its
    stdin, a pipe from the first process: when that process is gone, it drains and stops. One that
    exits on its own is started again after pg_work.restart seconds.
    """

    def __init__(self, config_path: str | None, conninfo: str, gone: Callable[[int], None] | None = None):
        self.config_path, self.conninfo = config_path, conninfo
        self.gone = gone  # called with a worker's pid once it has exited (metrics: process_gone)
        self.count = 1
        self.restart_after = 60.0
        self.keepers: dict[int, asyncio.Task] = {}
        self.procs: dict[int, asyncio.subprocess.Process] = {}

    async def reconfigure(self, count: int, grace: float, restart_after: float) -> None:
        """A configuration applied: ``count`` processes in all (see resize), each started again
        ``restart_after`` s (pg_work.restart) after it exits."""
        self.restart_after = restart_after
        await self.resize(count, grace)

    async def resize(self, count: int, grace: float) -> None:
        """``count`` processes in all from now on: the workers are started again if that changed."""
        if count == self.count:
            return
        if self.keepers:
            log.info("pgtask.processes %d -> %d: starting the worker processes again", self.count, count)
        await self.stop(grace)
        self.count = count
        for i in range(1, count):
            self.keepers[i] = asyncio.create_task(self._keep(i), name=f"worker {i}/{count}")

    async def _keep(self, i: int) -> None:
        """Worker ``i``, started again ``restart_after`` s after each exit (restart.supervised)."""
        await supervised(f"worker process {i}/{self.count}", lambda: self._run_once(i), lambda: False,
                         Every(lambda: self.restart_after), log, traceback=lambda exc: False)

    async def _run_once(self, i: int) -> None:
        """Start worker ``i`` and wait for it to exit: WorkerExited says how it ended."""
        args = ["--config", str(self.config_path)] if self.config_path else []
        env = {key: value for key, value in os.environ.items() if key not in systemd_notify.ENV}
        env.update({WORKER_ENV: f"{i}/{self.count}", WORKER_DSN_ENV: self.conninfo})
        # Under systemd's watchdog, the first process watches its workers the same way (see systemd_notify.Pings).
        interval = systemd_notify.watchdog_interval(os.environ)
        pings = None
        if interval is not None:
            env["WATCHDOG_USEC"] = str(round(interval * 2e6))
            pings = systemd_notify.Pings()
            env.update(pings.env)
        try:
            try:
                proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "pgtask.cli", "run", *args,
                                                            env=env, stdin=asyncio.subprocess.PIPE)
            except OSError as exc:  # no interpreter there any more, no fork (process or memory limit)
                raise WorkerExited(f"it could not be started ({exc})") from exc
            self.procs[i] = proc
            log.info("worker process %d/%d started (pid %d)", i, self.count, proc.pid)
            if pings is not None and await pings.hung(proc, 2 * interval):
                log.error("worker process %d/%d (pid %d) sent no watchdog ping for %gs: killing it",
                          i, self.count, proc.pid, 2 * interval)
                proc.kill()
            code = await proc.wait()
            if self.gone is not None:
                self.gone(proc.pid)
            raise WorkerExited(f"pid {proc.pid} exited with status {code}")
        finally:
            if pings is not None:
                pings.close()

    def health(self) -> list[str]:
        """The workers not running now (see Supervisor.health)."""
        return [f"worker process {i}/{self.count} is not running" for i in range(1, self.count)
                if (proc := self.procs.get(i)) is None or proc.returncode is not None]

    def signal(self, sig: int) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.send_signal(sig)

    async def stop(self, grace: float) -> None:
        """SIGTERM to every worker (each drains its running tasks for up to ``grace`` s, as on
        SIGTERM); one still running 30 s after that is killed."""
        for keeper in self.keepers.values():
            keeper.cancel()
        await asyncio.gather(*self.keepers.values(), return_exceptions=True)
        self.signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                await asyncio.wait_for(proc.wait(), grace + 30)
            except TimeoutError:
                log.error("worker process pid %d did not stop: killing it", proc.pid)
                proc.kill()
                await proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()
        self.keepers.clear()
        self.procs.clear()


class Supervisor:
    def __init__(self, cfg: Config, config_path: str | None = None):
        self.cfg, self.config_path = cfg, config_path
        self.conninfo = ""
        self.cluster: Cluster | None = None
        self.schedulers: dict[tuple, tuple[Scheduler, asyncio.Task]] = {}
        self.stop_event = asyncio.Event()
        self.reload_event = asyncio.Event()
        self.worker = worker_from_env()  # (i, n) in a worker process (see Workers), None in the first
        self.workers: Workers | None = None  # the first process's workers
        self.inputs = Budget(cfg.svc("input_budget"))  # shared by this process's schedulers
        self.monitoring: Monitoring | None = None  # [pgtask] metrics_listen

    def place(self) -> tuple[int, int]:
        """(this process's index, the service's process count)."""
        return self.worker if self.worker is not None else (0, self.cfg.svc("processes"))

    def options(self, entry: Entry, values: dict[str, Any]) -> Options:
        reset_check = self.cfg.svc("reset_check")
        index, count = self.place()
        return Options(sleep=entry.sleep / 1000.0, run=run_share(entry.run, index, count),
                       limit=int(values["pg_task.limit"]),
                       reset_check=reset_check, output_limit=self.cfg.svc("output_limit"),
                       execute_as=self.cfg.svc("execute_as"), grace=self.cfg.svc("grace"),
                       connecting=self.cfg.svc("connecting"), max_sessions=self.cfg.svc("max_sessions"),
                       remote_attempts=self.cfg.svc("remote_attempts"),
                       remote_backoff=self.cfg.svc("remote_backoff"), inputs=self.inputs,
                       metrics=self.monitoring.sink(entry) if self.monitoring is not None else NO_METRICS,
                       maintenance={k: self.cfg.svc(k) for k in cfgmod.MAINTENANCE_KEYS} if index == 0 else None)

    async def apply(self) -> None:
        resolved = await resolve(self.cfg, self.conninfo)
        self.inputs.resize(self.cfg.svc("input_budget"))
        entries = {e.key: e for e in resolved.entries}
        options = {key: self.options(e, resolved.values) for key, e in entries.items()}
        wanted = {key: e for key, e in entries.items() if options[key].run > 0}  # see run_share
        def failed(entry: Entry, exc: Exception) -> None:
            log.error("%s: cannot provision: %s (its scheduler retries every pg_work.restart s)",
                      entry.label(), str(exc).strip())

        if self.worker is None:  # the workers' first process provisions for them
            report = await provision_entries(self.cfg, self.conninfo, resolved.entries, failed)
            for action in report.actions:
                log.info("provision: %s", action)
        for key in list(self.schedulers):
            if key not in wanted:
                sched, task = self.schedulers.pop(key)
                if key in entries:  # still configured: this process's part of its pg_task.run is 0
                    log.info("%s: no part of pg_task.run left for this process (run %d, %d processes): "
                             "stopping its scheduler", sched.entry.label(), entries[key].run, self.place()[1])
                else:
                    log.info("entry removed: stopping %s", sched.entry.label())
                await sched.drain()
                await asyncio.gather(task, return_exceptions=True)
                await sched.close()
        for key, entry in wanted.items():
            current = self.schedulers.get(key)
            # (its part of pg_task.run changes with pgtask.processes: started again then too)
            if current is None or current[0].entry != entry or current[0].options.run != options[key].run:
                if current is not None:
                    await current[0].drain()
                    await asyncio.gather(current[1], return_exceptions=True)
                    await current[0].close()
                self.start_scheduler(entry, options[key])
        if self.monitoring is not None:
            self.monitoring.track(self.conninfo, entries.values())
        self.restart_after = float(resolved.values["pg_work.restart"])
        self.conf_restart = float(resolved.values["pg_conf.restart"])
        if self.workers is not None:
            await self.workers.reconfigure(self.place()[1], self.cfg.svc("grace"), self.restart_after)

    def start_scheduler(self, entry: Entry, options: Options) -> None:
        sched = Scheduler(entry, self.conninfo, options)
        task = asyncio.create_task(self.guard(sched), name=f"scheduler {entry.label()}")
        self.schedulers[entry.key] = (sched, task)
        log.info("scheduler starting: %s", entry.label())

    async def guard(self, sched: Scheduler) -> None:
        """Run a scheduler until it is drained; if it fails, close it and run a new one (fresh
        connections and state) after pg_work.restart seconds."""
        current = sched

        async def replace() -> None:
            nonlocal current
            await current.close()
            # registered before the wait, so that a drain meanwhile stops it from starting
            current = Scheduler(current.entry, self.conninfo, current.options)
            self.schedulers[current.entry.key] = (current, asyncio.current_task())

        await supervised(f"{sched.entry.label()}: scheduler", lambda: current.run(),
                         lambda: current.life.stopping, Every(lambda: self.restart_after), log,
                         traceback=lambda exc: not isinstance(exc, psycopg.OperationalError),
                         before_restart=replace)

    def health(self) -> list[str]:
        """What keeps the service from claiming (the metrics endpoint's /healthz): a scheduler not
        connected or without a recent claim pass, a worker process not running."""
        problems = [p for sched, _ in list(self.schedulers.values()) if (p := sched.health())]
        if self.workers is not None:
            problems += self.workers.health()
        return problems

    async def reload(self) -> None:
        try:
            self.cfg = cfgmod.load(self.config_path)
        except cfgmod.ConfigError as exc:
            log.error("configuration not reloaded, the old one stays in force: %s", exc)
            return
        try:
            await self.apply()
        except (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction) as exc:
            # a server gone or read-only for now (a failover): the next re-read (pg_conf.restart) applies it
            log.warning("configuration not applied yet, the server is unavailable or read-only (tried again "
                        "in %gs): %s", self.conf_restart, exc)
        except (cfgmod.ConfigError, psycopg.Error) as exc:
            log.error("configuration not applied: %s", exc)

    def _watch_first_process(self) -> None:
        """A worker stops (drains) when the first process is gone: its stdin, a pipe from that
        process, reaches its end (see Workers)."""
        loop = asyncio.get_running_loop()

        def readable() -> None:
            try:
                data = os.read(sys.stdin.fileno(), 512)
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(sys.stdin.fileno())
                if not self.stop_event.is_set():
                    log.warning("the service's first process is gone: stopping")
                self.stop_event.set()

        loop.add_reader(sys.stdin.fileno(), readable)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop_event.set)
        loop.add_signal_handler(signal.SIGINT, self.stop_event.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload_event.set)
        loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
        notifier = Notifier()
        pinger = asyncio.create_task(notifier.watchdog(), name="watchdog")
        try:
            return await self._run(notifier)
        finally:
            pinger.cancel()
            await asyncio.gather(pinger, return_exceptions=True)
            notifier.close()

    async def _run(self, notifier: Notifier) -> int:
        await self._connect()
        if not await self._apply_first(notifier):
            return 0
        log.info("pgtask running: %d scheduler(s)%s", len(self.schedulers),
                 f" (worker process {self.worker[0]}/{self.worker[1]})" if self.worker else
                 f", {self.workers.count} processes" if self.workers.count > 1 else "")
        notifier.ready(f"running {len(self.schedulers)} scheduler(s)")
        await self._serve()
        await self._drain(notifier)
        return 0

    async def _connect(self) -> None:
        """Where the server is (a worker: where the first process says), and what serves beside the
        schedulers: the metrics endpoint, the first process's workers."""
        if self.cfg.svc("metrics_listen"):
            self.monitoring = Monitoring(self.cfg.svc("metrics_listen"), self.worker is None, self.health,
                                         self.cfg.svc("metrics_groups"), self.cfg.svc("metrics_refresh"))
        if self.worker is not None:
            self.conninfo = os.environ[WORKER_DSN_ENV]
            self._watch_first_process()
        else:
            self.conninfo, self.cluster = await asyncio.to_thread(base_conninfo, self.cfg)
            self.workers = Workers(self.config_path, self.conninfo,
                                   self.monitoring.process_gone if self.monitoring is not None else None)
        self.restart_after, self.conf_restart = 60.0, 60.0

    async def _apply_first(self, notifier: Notifier) -> bool:
        """Apply the configuration, waiting for the server with a backoff; False: stopped meanwhile."""
        backoff = Backoff()
        while True:
            try:
                await self.apply()
                return True
            except cfgmod.ConfigError:
                raise
            except psycopg.OperationalError as exc:
                delay = backoff.next()
                log.warning("cannot reach the server (%s); retrying in %.1fs", str(exc).strip(), delay)
                # started all the same: it answers signals and waits for the server (no start timeout)
                notifier.ready("waiting for the server")
                try:
                    await asyncio.wait_for(self.stop_event.wait(), delay)
                    return False
                except TimeoutError:
                    pass

    async def _serve(self) -> None:
        """Until SIGTERM: re-read the configuration on SIGHUP and every pg_conf.restart seconds."""
        while not self.stop_event.is_set():
            waiters = [asyncio.create_task(self.stop_event.wait()), asyncio.create_task(self.reload_event.wait())]
            _, pending = await asyncio.wait(waiters, timeout=self.conf_restart,
                                            return_when=asyncio.FIRST_COMPLETED)
            for w in pending:
                w.cancel()
            if self.stop_event.is_set():
                break
            if self.reload_event.is_set() and self.workers is not None:
                self.workers.signal(signal.SIGHUP)  # each worker re-reads the file too
            self.reload_event.clear()
            log.info("re-reading configuration")
            await self.reload()

    async def _drain(self, notifier: Notifier) -> None:
        """Drain the schedulers and the workers, then stop what serves beside them."""
        log.info("SIGTERM: draining")
        notifier.stopping()
        if self.workers is not None:
            self.workers.signal(signal.SIGTERM)  # they drain meanwhile
        scheds = [s for s, _ in self.schedulers.values()]
        await asyncio.gather(*(s.drain() for s in scheds), return_exceptions=True)
        await asyncio.gather(*(t for _, t in self.schedulers.values()), return_exceptions=True)
        await asyncio.gather(*(s.close() for s in scheds), return_exceptions=True)
        if self.workers is not None:
            await self.workers.stop(self.cfg.svc("grace"))
        if self.monitoring is not None:
            await self.monitoring.close()
        if self.cluster is not None:
            log.info("stopping the embedded PostgreSQL")
            await asyncio.to_thread(self.cluster.stop, "fast")
        log.info("stopped")
