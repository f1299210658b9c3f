"""ALTER SYSTEM SET / RESET of the manual's settings from a fresh session, as the manual has it: on
PostgreSQL 15 and 16 it works through the placeholders provisioning writes (docs/execution.md,
"pg_task settings in the server"). A cluster of the module's own: the test cluster's server may
know the settings from other tests already (one that read a pg_task setting in a reload knows it
until it restarts)."""

from __future__ import annotations

import json
import signal
import tempfile
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from support import Service, wait_for

from pgtask.cluster import Cluster, free_port
from pgtask.config import SETTINGS
from pgtask.provision import PLACEHOLDERS

SERVICE = '[pgtask]\nreset_check = 0.5\ngrace = 5\nlog_level = "debug"\n'


# The manual's settings (its GUC table) but pg_task.id, which only a task's own session sets.
MANUAL = ("pg_task.delete", "pg_task.drift", "pg_task.header", "pg_task.save", "pg_task.spi",
          "pg_task.string", "pg_conf.fetch", "pg_conf.max", "pg_conf.restart", "pg_task.count",
          "pg_task.fetch", "pg_task.limit", "pg_task.max", "pg_task.run", "pg_task.sleep", "pg_work.fetch",
          "pg_work.idle", "pg_work.restart", "pg_task.active", "pg_task.data", "pg_task.delimiter",
          "pg_task.escape", "pg_task.group", "pg_task.json", "pg_task.live", "pg_task.null", "pg_task.plan",
          "pg_task.quote", "pg_task.repeat", "pg_task.reset", "pg_task.schema", "pg_task.table",
          "pg_task.timeout", "pg_task.user")


@pytest.fixture(scope="module")
def own(cluster):
    """A cluster no pg_task setting was ever set in but pg_task.group, set in postgresql.conf."""
    c = Cluster(base=Path(tempfile.mkdtemp(prefix="pgtask-alter-system-")), bindir=cluster.bindir,
                port=free_port())
    c.init({"fsync": "off", "synchronous_commit": "off"})
    with open(c.data / "postgresql.conf", "a") as f:
        f.write("pg_task.group = 'from_file'\n")
    c.start()
    yield c
    c.destroy()


@pytest.fixture
def own_db(own, tmp_path):
    """(a database of the own cluster, a function starting the service on it)."""
    name = f"alter_{tmp_path.name}"[:63]
    with psycopg.connect(own.conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    services: list[Service] = []

    def start() -> Service:
        services.append(Service(own, name, SERVICE, tmp=tmp_path).start())
        wait_for(lambda: knows(own, "pg_task.spi"), message="a new session to know pg_task.spi")
        return services[-1]

    yield name, start
    for svc in services:
        if svc.proc.poll() is None:
            svc.kill()
    with psycopg.connect(own.conninfo(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def fresh(c: Cluster, dbname: str | None = None) -> psycopg.Connection:
    """A new session that has set nothing."""
    return psycopg.connect(c.conninfo(dbname) if dbname else c.conninfo(), autocommit=True)


def setting(c: Cluster, name: str, dbname: str | None = None) -> str | None:
    """The setting in a new session; None: the session does not know it."""
    with fresh(c, dbname) as conn:
        return conn.execute("SELECT current_setting(%s, true)", (name,)).fetchone()[0]


def knows(c: Cluster, name: str) -> bool:
    """Whether a new session knows the setting (PostgreSQL 17 and later take any in ALTER SYSTEM)."""
    with fresh(c) as conn:
        return (conn.info.server_version >= 170000
                or conn.execute("SELECT current_setting(%s, true) IS NOT NULL", (name,)).fetchone()[0])


def run(c: Cluster, dbname: str, input_text: str) -> dict:
    with fresh(c, dbname) as conn:
        conn.row_factory = psycopg.rows.dict_row
        task_id = conn.execute("INSERT INTO task (input) VALUES (%s) RETURNING id",
                               (input_text,)).fetchone()["id"]
        return wait_for(lambda: (row := conn.execute("SELECT * FROM task WHERE id = %s",
                                                     (task_id,)).fetchone())
                        and row["state"] in ("DONE", "FAIL") and row, message=f"task {task_id}")


def test_alter_system_set_and_reset_spi_from_a_fresh_session(own, own_db):
    """The manual's way to turn SPI mode on for the whole server, from a session that set nothing:
    the next task runs in SPI mode (its error has SPI's CONTEXT line, COPY is SPI_ERROR_COPY) on
    the same service; RESET from another fresh session turns it off again."""
    dbname, start = own_db
    svc = start()
    copy = "COPY (SELECT 1) TO STDOUT"
    assert run(own, dbname, copy)["error"] == f"ERROR:  COPY TO STDOUT is not supported\nSTATEMENT:  {copy}"
    with fresh(own) as conn:
        conn.execute("ALTER SYSTEM SET pg_task.spi = true")
        conn.execute("SELECT pg_reload_conf()")
    try:
        # a reload reaches each backend asynchronously: wait until a new session sees it
        wait_for(lambda: setting(own, "pg_task.spi", dbname) == "true", message="the reload")
        failed = "CREATE TABLE t (x int); INSERT INTO t VALUES (4); SELECT 1/0"
        row = run(own, dbname, failed)
        assert row["error"] == (f'ERROR:  division by zero\nCONTEXT:  SQL statement "{failed}"\n'
                                f"STATEMENT:  {failed}"), row
        assert run(own, dbname, copy)["error"] == f"ERROR:  SPI_ERROR_COPY\nSTATEMENT:  {copy}"
    finally:
        with fresh(own) as conn:
            conn.execute("ALTER SYSTEM RESET pg_task.spi")
            conn.execute("SELECT pg_reload_conf()")
    wait_for(lambda: not setting(own, "pg_task.spi", dbname), message="the reload")
    assert run(own, dbname, copy)["error"] == f"ERROR:  COPY TO STDOUT is not supported\nSTATEMENT:  {copy}"
    assert svc.proc.poll() is None


def manual_value(name: str) -> str:
    """The manual's default of a setting, as its value in postgresql.conf."""
    default = {**{s.name: s.default for s in SETTINGS}, "pg_conf.max": 8}[name]
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, list):
        return json.dumps(default)
    return "statement_timestamp()" if default is None else str(default)


def test_every_setting_of_the_manual_is_accepted(own, own_db):
    """ALTER SYSTEM SET, then RESET from another fresh session, for each of the manual's settings
    but pg_task.id; the value postgresql.conf sets stays in force (no placeholder covers it)."""
    _, start = own_db
    start()
    assert sorted(PLACEHOLDERS) == sorted(MANUAL)
    assert setting(own, "pg_task.group") == "from_file"
    for name in MANUAL:
        with fresh(own) as conn:
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name),
                                                                     sql.Literal(manual_value(name))))
        with fresh(own) as conn:
            conn.execute(sql.SQL("ALTER SYSTEM RESET {}").format(sql.Identifier(name)))


def test_the_placeholders_come_back_after_a_reset_and_a_restart(own, own_db):
    """RESET removes a placeholder's line; the server knows the setting until it restarts, and the
    service's next provisioning writes the placeholder again."""
    _, start = own_db
    svc = start()
    with fresh(own) as conn:
        conn.execute("ALTER SYSTEM RESET pg_task.spi")
    with fresh(own) as conn:
        conn.execute("ALTER SYSTEM SET pg_task.spi = on")
        conn.execute("ALTER SYSTEM RESET pg_task.spi")
    svc.stop()  # no provisioning of its own between the restart and the check below
    own.restart()
    with fresh(own) as conn:
        if conn.info.server_version < 170000:
            with pytest.raises(psycopg.errors.UndefinedObject, match='unrecognized .* "pg_task.spi"'):
                conn.execute("ALTER SYSTEM SET pg_task.spi = on")
    start()
    with fresh(own) as conn:
        conn.execute("ALTER SYSTEM SET pg_task.spi = on")
        conn.execute("ALTER SYSTEM RESET pg_task.spi")


def test_a_value_a_file_sets_later_is_not_covered_by_its_placeholder(own, own_db):
    """postgresql.auto.conf is read last: the placeholder of a setting that postgresql.conf sets
    after it was written would override that value. The next provisioning (here: the service's
    SIGHUP) removes it, and the file's value is in force."""
    _, start = own_db
    svc = start()
    with fresh(own) as conn:
        placeholders = conn.info.server_version < 170000
        assert setting(own, "pg_task.timeout") == ("" if placeholders else None)
        with open(own.data / "postgresql.conf", "a") as f:
            f.write("pg_task.timeout = '7 min'\n")
        conn.execute("SELECT pg_reload_conf()")  # as the DBA who edited the file does
    svc.signal(signal.SIGHUP)
    wait_for(lambda: setting(own, "pg_task.timeout") == "7 min", message="the file's value in force")
    with fresh(own) as conn:  # still known to every session: ALTER SYSTEM takes it
        conn.execute("ALTER SYSTEM SET pg_task.timeout = '9 min'")
        conn.execute("ALTER SYSTEM RESET pg_task.timeout")
    assert svc.proc.poll() is None
