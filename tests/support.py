"""Helpers the tests import (a module of its own: several conftest.py files exist under tests/)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal as signals
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from pgtask.cluster import Cluster
from pgtask.patterns.notebook import wait_until
from pgtask.session import RESET_SESSION

_counter = itertools.count()


def wait_for(predicate: Callable[[], object], timeout: float = 15.0, interval: float = 0.02,
             message: str = "condition") -> object:
    """Poll ``predicate`` until it returns something truthy, or fail the test after ``timeout`` s."""
    try:
        return wait_until(predicate, timeout, message, interval)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None


async def wait_for_async(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.01,
                         message: str = "condition") -> object:
    """wait_for inside an event loop: between tries the loop runs (the code under test with it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (result := predicate()):
        assert loop.time() < deadline, f"timed out after {timeout:g}s waiting for {message}"
        await asyncio.sleep(interval)
    return result


def sessions_reset_and_idle(db, where: str, params: tuple = ()) -> int:
    """How many of the service's sessions matching ``where`` (a pg_stat_activity condition) are
    idle with the session reset as their last query: back in the pool. A session is reset on its
    own RESET_DELAY after its task and is out of the pool while that runs, so a task claimed then
    opens a new session instead."""
    return db.value(f"SELECT count(*) FROM pg_stat_activity WHERE ({where}) AND state = 'idle' AND query = %s",
                    (*params, RESET_SESSION))


def provision_again(db, schema: str = "public", table: str = "task"):
    """Provision schema.table in the test database once more; returns provisioning's Report."""
    import psycopg

    from pgtask import provision

    async def go():
        report = provision.Report()
        async with await psycopg.AsyncConnection.connect(db.dsn) as conn:
            await provision.provision_table(conn, schema, table, report)
            await conn.commit()
        return report
    return asyncio.run(go())


def killed_mid_task(db, service_factory) -> int:
    """A service SIGKILLed while its task runs, whose first run hangs (and dies with its service,
    uncommitted) and whose later runs record its id in table ran at once. Returns the task's id."""
    db.execute("CREATE TABLE ran (id bigint)")
    svc = service_factory(db.name)
    task_id = db.insert("SELECT pg_sleep(CASE WHEN (SELECT attempt FROM task WHERE id = "
                        "current_setting('pg_task.id')::bigint) = 1 THEN 60 ELSE 0 END); "
                        "INSERT INTO ran VALUES (current_setting('pg_task.id')::bigint)")
    db.wait_state(task_id, states=("WORK",))
    svc.kill()
    return task_id


def spi_on(db) -> None:
    """pg_task.spi = on for the test database (ALTER DATABASE): sessions opened from now on run SPI mode."""
    db.execute(f'ALTER DATABASE "{db.name}" SET pg_task.spi = on')


def hold_claims(sched) -> dict:
    """Tasks an in-process scheduler claims stay in flight, not run: its dispatch only records them.
    Returns that record (task id -> Task), for a test that finishes them itself."""
    claimed = {}

    def dispatch(task, session=None) -> None:
        claimed[task.id] = task
        sched.inflight[task.id] = (task, None)

    sched.claimer.dispatch = dispatch
    return claimed


@contextlib.asynccontextmanager
async def holding_scheduler(db, run: int = 4):
    """An in-process scheduler of ``db``, started, whose claims stay in flight for the test to finish
    itself (hold_claims): yields (scheduler, that record); closed after."""
    sched = db.scheduler(run=run)
    await sched.start()
    claimed = hold_claims(sched)
    try:
        yield sched, claimed
    finally:
        await sched.close()


def race(n: int, work: Callable[[Callable[[], object]], object]) -> tuple[list, list]:
    """Run ``work(start)`` in ``n`` threads; each calls ``start()`` where the threads should be let
    go together. Returns (results, errors), errors being the exceptions the threads raised."""
    barrier = threading.Barrier(n)
    results: list = []
    errors: list = []

    def run() -> None:
        try:
            results.append(work(barrier.wait))
        except Exception as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


class Service:
    """``pgtask run`` as a real subprocess."""

    def __init__(self, cluster: Cluster, dbname: str, config: str = "", env: dict | None = None,
                 tmp: Path | None = None):
        self.cluster, self.dbname = cluster, dbname
        self.tmp = Path(tmp or tempfile.mkdtemp(prefix="pgtask-svc-"))
        self.config_path = self.tmp / f"pgtask-{next(_counter)}.toml"
        self.log_path = self.config_path.with_suffix(".log")
        self.write_config(config)
        self.env = {**os.environ, **cluster.env(), "PGDATABASE": dbname, **(env or {})}
        self.proc: subprocess.Popen | None = None

    def write_config(self, config: str) -> None:
        base = "\n[pgtask]\nreset_check = 0.5\ngrace = 5\nlog_level = \"debug\"\n"
        if "[pgtask]" in config:
            base = ""
        self.config_path.write_text(config + base)

    def start(self, wait: bool = True) -> Service:
        with open(self.log_path, "ab") as log:  # the service writes to its own copy of the descriptor
            self.proc = subprocess.Popen([sys.executable, "-m", "pgtask.cli", "run", "--config",
                                          str(self.config_path)],
                                         env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp)
        if wait:
            wait_for(self.ready, 30, message=f"pgtask run to be ready:\n{self.output()}")
        return self

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"pgtask run exited with {self.proc.returncode}:\n{self.output()}")
        return "pgtask running" in self.output()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, sig: int = signals.SIGTERM, timeout: float = 30) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"pgtask run did not stop within {timeout}s:\n{self.output()}")

    def workers(self) -> list[int]:
        """The pids of the service's worker processes (pgtask.processes > 1)."""
        pid = self.proc.pid
        try:
            return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except FileNotFoundError:
            return []

    def running_workers(self, count: int) -> list[int]:
        """The worker pids once all ``count`` of them say they are running, else []. A pid alone is
        not enough to stop a worker: one stopped between fork and exec stops the first process too."""
        workers = self.workers()
        if len(workers) == count and self.output().count("pgtask running") >= count + 1:
            return workers
        return []

    def kill(self) -> None:
        """SIGKILL the service, its worker processes too."""
        workers = self.workers()
        self.proc.kill()
        self.proc.wait()
        for pid in workers:
            try:
                os.kill(pid, signals.SIGKILL)
            except ProcessLookupError:
                pass
