"""Connection slots: executor sessions stay under a cap with headroom below max_connections, and a
session the server refuses for want of a slot makes its task wait, not fail (pgtask/slots.py).

A cluster of its own with a small max_connections: 20, 3 of them reserved for superusers."""

from __future__ import annotations

import tempfile
from pathlib import Path

import psycopg
import pytest
from support import Service, wait_for

from pgtask.cluster import Cluster, free_port
from pgtask.config import ConfigError, from_dict
from pgtask.slots import derived_cap

MAX_CONNECTIONS = 20
RESERVED = 3
SERVICE = '[pgtask]\nreset_check = 0.5\ngrace = 5\nlog_level = "debug"\n'


@pytest.fixture(scope="module")
def small(cluster):
    c = Cluster(base=Path(tempfile.mkdtemp(prefix="pgtask-slots-")), bindir=cluster.bindir, port=free_port())
    c.init({"max_connections": str(MAX_CONNECTIONS), "superuser_reserved_connections": str(RESERVED),
            "fsync": "off", "synchronous_commit": "off"})
    c.start()
    with psycopg.connect(c.conninfo(), autocommit=True) as conn:
        conn.execute("CREATE ROLE author LOGIN")
        conn.execute("CREATE ROLE bystander LOGIN")
    yield c
    c.destroy()


@pytest.fixture
def small_db(small, tmp_path):
    """(a database of the small cluster, a superuser connection to it, a function starting the
    service on it with the given [pgtask] lines)."""
    name = f"slots_{tmp_path.name}"[:63]
    with psycopg.connect(small.conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    conn = psycopg.connect(small.conninfo(name), autocommit=True)
    services: list[Service] = []

    def start(extra: str = "") -> Service:
        services.append(Service(small, name, SERVICE + extra, tmp=tmp_path).start())
        conn.execute("GRANT ALL ON TABLE task TO author")
        conn.execute("CREATE TABLE IF NOT EXISTS runs (id bigint)")
        conn.execute("GRANT ALL ON TABLE runs TO author")
        return services[-1]

    yield conn, start
    for svc in services:
        if svc.proc.poll() is None:
            svc.kill()
    conn.close()
    with psycopg.connect(small.conninfo(), autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def burst(conn, n: int, sleep: float) -> None:
    """``n`` tasks of ``author``, each ``sleep`` s, each in a group of its own: each wants a session."""
    conn.execute("""INSERT INTO task (input, "group", "user")
                    SELECT format('INSERT INTO runs VALUES (current_setting(''pg_task.id'')::bigint); '
                                  'SELECT pg_sleep(%%s)', %s::text), 'g' || i, 'author'
                    FROM generate_series(1, %s) i""", (sleep, n))


def states(conn) -> dict[str, int]:
    return dict(conn.execute("SELECT state::text, count(*) FROM task GROUP BY 1").fetchall())


def ended(conn, n: int) -> bool:
    return sum(states(conn).get(state, 0) for state in ("DONE", "FAIL")) == n


def ran_once_each(conn, n: int) -> None:
    assert conn.execute("SELECT count(*), count(DISTINCT id) FROM runs").fetchone() == (n, n)
    # none was given back to run again: a task waiting for its session was never requeued
    assert conn.execute("SELECT max(attempt) FROM task").fetchone()[0] == 1


@pytest.mark.parametrize(("key", "value", "message"), [
    ("max_sessions", -1, "must be >= 0, got -1"), ("max_sessions", True, "expected int, got True"),
    ("remote_attempts", 0, "must be >= 1, got 0"), ("remote_backoff", 0, "must be > 0, got 0.0"),
    ("remote_backoff", float("inf"), "must be a finite number, got inf"),
    ("remote_backoff", "1", "expected float, got '1'")])
def test_a_wrong_slot_or_retry_setting_is_refused_naming_the_key(key, value, message):
    with pytest.raises(ConfigError, match=f"^pgtask.{key}: {message}$"):
        from_dict({"pgtask": {key: value}})
    assert [from_dict({}).svc(k) for k in ("max_sessions", "remote_attempts", "remote_backoff")] == [0, 6, 1.0]


def test_derived_cap_leaves_headroom_and_counts_what_others_hold():
    assert derived_cap(297, 7, 0) == 297 - 29 - 7  # a tenth of the usable slots left free
    assert derived_cap(297, 107, 100) == 297 - 29 - 7  # its own sessions are not others'
    assert derived_cap(17, 5, 0) == 17 - 3 - 5  # at least 3
    assert derived_cap(17, 40, 0) == 1  # never none: it opens one and waits when refused


def test_a_burst_wider_than_max_connections_waits_for_slots_and_leaves_others_room(small, small_db):
    """More tasks that each want a session at once than the server has connection slots: every
    one runs, once, none fails; the service stays under its cap, so another role can connect
    all the while (no task fails with "remaining connection slots are reserved", no other role is
    refused)."""
    conn, start = small_db
    start()
    n = 30
    burst(conn, n, 0.4)
    refused = []

    def done() -> bool:
        try:
            psycopg.connect(small.conninfo(conn.info.dbname, user="bystander")).close()
        except psycopg.OperationalError as exc:
            refused.append(str(exc))
        return ended(conn, n)

    wait_for(done, 30, interval=0.05, message="every task to end")
    assert states(conn) == {"DONE": n}, conn.execute("SELECT error FROM task WHERE state = 'FAIL'").fetchone()
    assert not refused, refused[:3]
    ran_once_each(conn, n)


def test_sessions_the_full_server_refuses_wait_and_run_once_slots_free(small, small_db):
    """Every slot taken by another client: the service's sessions are refused, its tasks wait
    (logged) instead of failing, and run -- each once -- when the slots are free again."""
    conn, start = small_db
    svc = start()
    # the service connected and claiming (its control, listener and writers open) before the slots
    # are taken: "running" is logged before the scheduler connects
    conn.execute("INSERT INTO task (input) VALUES ('SELECT 1')")
    wait_for(lambda: states(conn) == {"DONE": 1}, 30, message="a first task DONE")
    conn.execute("DELETE FROM task")
    fillers = []
    try:
        while True:  # a superuser can take every slot, the reserved ones too
            fillers.append(psycopg.connect(small.conninfo(conn.info.dbname), autocommit=True))
    except psycopg.OperationalError:
        pass
    # one slot for the insert; the service, retrying, may take a freed slot first: free another
    inserter = None
    while inserter is None:
        fillers.pop().close()
        try:
            inserter = psycopg.connect(small.conninfo(conn.info.dbname), autocommit=True)
        except psycopg.OperationalError:
            assert fillers, "the service took every slot freed"
    fillers.append(inserter)
    burst(fillers[-1], 5, 0)
    try:
        wait_for(lambda: "executor session refused" in svc.output() or "FAIL" in states(fillers[-1]), 15,
                 message="a refused session")
        assert "FAIL" not in states(fillers[-1]), fillers[-1].execute("SELECT error FROM task").fetchone()
    finally:
        for filler in fillers:
            filler.close()
    wait_for(lambda: states(conn) == {"DONE": 5}, 20, message="every task DONE")
    ran_once_each(conn, 5)


def test_max_sessions_caps_the_sessions_open_at_once(small_db):
    """``[pgtask] max_sessions`` overrides the derived cap: with 2, never more than 2 executor
    sessions at once, and the other tasks wait for theirs."""
    conn, start = small_db
    start("max_sessions = 2\n")
    n = 6
    burst(conn, n, 0.3)
    most = 0

    def done() -> bool:
        nonlocal most
        most = max(most, conn.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = 'author'"
                                       ).fetchone()[0])
        return ended(conn, n)

    wait_for(done, 20, interval=0.02, message="every task to end")
    assert states(conn) == {"DONE": n}
    assert most == 2, most
    ran_once_each(conn, n)
