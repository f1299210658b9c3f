"""One round trip per local task: once a session has read its author's pg_task.spi, plain input
travels in the preamble's query string (local_input.one_trip_preamble). Driven here on real executor
sessions, with the round trips counted at the wire; the service-level equivalence is
test_output_and_error_on_a_reused_session in test_output.py."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from support import wait_for, wait_for_async

from pgtask import local_input, wire
from pgtask.connect import group_settings
from pgtask.local_input import run_input
from pgtask.queries import TASK_COLUMNS
from pgtask.session import Session
from pgtask.session_pool import SessionPool
from pgtask.task import NotStarted, Task


def claim(db, input_text: str) -> Task:
    """A new task in TAKE with its attempt and lease, as a claim leaves it."""
    return Task.from_row(db.claim(db.insert(input_text), TASK_COLUMNS))


class Trips:
    """Counts the query strings sent (round trips) by wire.send, which it still calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.sent: list[str] = []
        real = wire.send

        async def send(pgconn, text, encoding, single_row=False):
            self.sent.append(text)
            await real(pgconn, text, encoding, single_row)

        monkeypatch.setattr(wire, "send", send)

    def take(self) -> int:
        n, self.sent = len(self.sent), []
        return n


def run_tasks(db, inputs: list[str], trips: Trips, break_lease_of: int | None = None,
              before=lambda i: None, notices: list[str] | None = None) -> list:
    """Claim and run each input in turn on ONE executor session: [(output, error, round trips)];
    ``notices``: gets the session's notices and warnings (the server logs its warnings too)."""
    oid = db.value("SELECT 'task'::regclass::oid")
    user = db.value("SELECT current_user")

    async def go() -> list:
        pool = SessionPool(db.dsn, user, "login")
        session = await pool.get(user)
        if notices is not None:
            session.conn.add_notice_handler(lambda diag: notices.append(f"{diag.severity}: {diag.message_primary}"))
        results = []
        try:
            for i, text in enumerate(inputs):
                task = claim(db, text)
                before(i)
                if i == break_lease_of:  # another service took the task over meanwhile
                    db.execute("UPDATE task SET lease = gen_random_uuid() WHERE id = %s", (task.id,))
                trips.take()
                try:
                    output, error = await run_input(session, task, "public", "task", oid, 1 << 20)
                except NotStarted:
                    output, error = NotStarted, None
                results.append((output, error, trips.take()))
        finally:
            await pool.retire(session)
        return results

    return asyncio.run(go())


def test_plain_input_takes_one_round_trip_once_the_session_knows_spi(db, monkeypatch):
    trips = Trips(monkeypatch)
    first, second = run_tasks(db, ["SELECT 1 AS a", "SELECT 2 AS a"], trips)
    assert first == ("1", None, 2)   # preamble, then input: this session had not read pg_task.spi
    assert second == ("2", None, 1)  # preamble + COMMIT + input in one query string
    rows = db.execute("SELECT state, start IS NOT NULL, pid IS NOT NULL FROM task ORDER BY id")
    assert rows == [("WORK", True, True)] * 2  # both started themselves (finishing is the service's)


def test_the_one_trip_preamble_says_nothing(db, monkeypatch):
    # Its COMMIT ends a block of its own: a bare COMMIT would end the query string's implicit
    # transaction with a WARNING "there is no transaction in progress", written to the server log
    # for every task. A failed one (lost lease) is rolled back before the session is used again.
    trips, notices = Trips(monkeypatch), []
    results = run_tasks(db, ["SELECT 1", "SELECT 2", "SELECT 3", "SELECT 4"], trips, break_lease_of=2,
                        notices=notices)
    assert [r[2] for r in results] == [2, 1, 3, 1]  # the refused one: + its ROLLBACK, then two trips
    assert results[2][0] is NotStarted and results[3] == ("4", None, 1)
    assert notices == []


@pytest.mark.quick
def test_one_round_trip_keeps_output_and_error_text(db, monkeypatch):
    trips = Trips(monkeypatch)
    results = run_tasks(db, ["SELECT 1", "SELECT * FROM missing_table", "SELECT 1 AS a; SELECT 1/0",
                             "CREATE TEMP TABLE t (a int); INSERT INTO t VALUES (7) RETURNING a",
                             "SELECT pg_sleep(0) AS x, current_setting('pg_task.id')::bigint = max(id) AS y FROM task"],
                       trips)
    assert [r[2] for r in results] == [2, 1, 1, 1, 1]
    assert results[1][:2] == ("", ('ERROR:  relation "missing_table" does not exist at character 15\n'
                                   "STATEMENT:  SELECT * FROM missing_table"))
    assert results[2][:2] == ("1", "ERROR:  division by zero\nSTATEMENT:  SELECT 1 AS a; SELECT 1/0")
    assert results[3][:2] == ("CREATE TABLE\n7\nINSERT 0 1", None)
    assert results[4][:2] == ("x\ty\n\tt", None)  # this task's pg_task.id was set before its input ran


def test_the_next_task_in_the_same_round_trip_finds_the_session_reset(db, monkeypatch):
    """What a task leaves on its session (an advisory lock, a temporary table, a setting, a role,
    a LISTEN, a prepared statement) is gone for the next task, whose preamble resets the session in
    the same query string."""
    role = db.role("leftover_role")
    trips = Trips(monkeypatch)
    results = run_tasks(db, [
        "SELECT 1",
        (f"SELECT pg_advisory_lock(4243); CREATE TEMP TABLE left_over (a int); SET work_mem = '7MB'; "
         f"SET ROLE {role}; LISTEN somewhere; PREPARE p AS SELECT 1"),
        ("SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()), "
         "to_regclass('pg_temp.left_over'), current_setting('work_mem'), current_user = session_user, "
         "(SELECT count(*) FROM pg_listening_channels()), (SELECT count(*) FROM pg_prepared_statements)")],
        trips)
    assert [r[2] for r in results] == [2, 2, 1]  # PREPARE takes its own round trip; the check does not
    assert results[1][1] is None, results[1]
    assert results[2][:2] == (("count\tto_regclass\tcurrent_setting\t?column?\tcount\tcount\n"
                               "0\t\\N\t4MB\tt\t0\t0"), None)


@pytest.mark.parametrize("mode", ["login", "set_role"])
def test_a_session_runs_each_groups_task_with_that_groups_settings(db, mode):
    """A session is opened with its first group's settings as connection options (pg_task.group,
    .schema, .table, .oid, application_name), which its reset restores: a task of another group on
    it sets its own, and the next task of the first group finds the first group's again. In
    set_role mode the session is the service's, running as the task's author."""
    oid = db.value("SELECT 'task'::regclass::oid")
    service_user = db.value("SELECT current_user")
    author = service_user if mode == "login" else db.role("settings_author")
    probe = ("SELECT current_setting('pg_task.group'), current_setting('application_name'), "
             "current_setting('pg_task.schema'), current_setting('pg_task.table'), current_setting('pg_task.oid')")

    def claim_as_author(group: str) -> Task:
        with db.connect(author) as conn:
            task_id = conn.execute('INSERT INTO task (input, "group", header) VALUES (%s, %s, false) RETURNING id',
                                   (probe, group)).fetchone()[0]
        return Task.from_row(db.claim(task_id, TASK_COLUMNS))

    async def go() -> list:
        pool = SessionPool(db.dsn, service_user, mode)
        session = await pool.get(author, group_settings("g 1", "public", "task", oid))
        assert session.set_role == (mode == "set_role")
        results = []
        try:
            for group in ("g 1", "g2", "g 1"):
                results.append(await run_input(session, claim_as_author(group), "public", "task", oid, 1 << 20))
        finally:
            await pool.retire(session)
        return results

    assert asyncio.run(go()) == [(f"{g}\tpg_task public task {g}\tpublic\ttask\t{oid}", None)
                                 for g in ("g 1", "g2", "g 1")]


@pytest.mark.parametrize("text,output", [
    ("VACUUM", "VACUUM"),                                    # refuses to run in a transaction block
    ("LOCK TABLE task", ""),                                 # would work only inside one
    ("SELECT CASE WHEN true THEN 1 END AS a", "1"),          # a word of the list: costs, changes nothing
    ("-- a comment\nSELECT 1 AS a", "1"),
])
def test_input_that_needs_its_own_round_trip(db, monkeypatch, text, output):
    trips = Trips(monkeypatch)
    results = run_tasks(db, ["SELECT 1", text], trips)
    assert results[1][2] == 2
    assert results[1][0] == output
    if text == "LOCK TABLE task":
        assert results[1][1].startswith("ERROR:  LOCK TABLE can only be used in transaction blocks")
    else:
        assert results[1][1] is None


def test_a_syntax_error_the_screen_lets_through_falls_back_before_anything_ran(db, monkeypatch):
    # The whole query string is parsed before any of it runs: the preamble did nothing, the task
    # starts in two round trips and reports the position within its own input.
    trips = Trips(monkeypatch)
    results = run_tasks(db, ["SELECT 1", "SELECT 1 FROM", "SELEC 1"], trips)
    assert results[1] == ("", 'ERROR:  syntax error at end of input at character 14\nSTATEMENT:  SELECT 1 FROM', 3)
    assert results[2] == ("", 'ERROR:  syntax error at or near "SELEC" at character 1\nSTATEMENT:  SELEC 1', 3)


def test_a_lost_lease_runs_nothing(db, monkeypatch):
    db.execute("CREATE TABLE marker (a int)")
    trips = Trips(monkeypatch)
    results = run_tasks(db, ["SELECT 1", "INSERT INTO marker VALUES (1)"], trips, break_lease_of=1)
    assert results[1][0] is NotStarted
    assert results[1][2] == 3  # the one-trip preamble refused (and rolled back), then the two-trip one said not started
    assert db.value("SELECT count(*) FROM marker") == 0
    assert db.value("SELECT state FROM task ORDER BY id DESC LIMIT 1") == "TAKE"


def test_a_changed_spi_setting_is_seen_before_the_input_runs(db, monkeypatch):
    # The session last read pg_task.spi unset; then the server says on (ALTER SYSTEM + reload): the
    # one-trip preamble refuses, and the input runs in SPI mode, whose errors name the statement.
    trips = Trips(monkeypatch)
    try:
        first, second = run_tasks(db, ["SELECT 1", "SELECT 1/0"], trips, before=lambda i: i == 1 and spi_on(db))
    finally:
        db.execute("SET pg_task.spi = off")  # before PostgreSQL 17, ALTER SYSTEM wants a placeholder
        db.execute("ALTER SYSTEM RESET pg_task.spi")
        db.execute("SELECT pg_reload_conf()")
    assert first == ("1", None, 2)
    assert second[1] == 'ERROR:  division by zero\nCONTEXT:  SQL statement "SELECT 1/0"\nSTATEMENT:  SELECT 1/0'
    assert second[2] >= 3  # the refused one-trip preamble, the preamble, then SPI's own


def spi_on(db) -> None:
    db.execute("SET pg_task.spi = off")  # before PostgreSQL 17, ALTER SYSTEM wants a placeholder
    db.execute("ALTER SYSTEM SET pg_task.spi = on")
    db.execute("SELECT pg_reload_conf()")
    # The postmaster signals every backend at once: when a new one sees the value, the idle
    # executor session has its reload pending and reads it before its next command.
    wait_for(lambda: db.connect().execute("SELECT current_setting('pg_task.spi', true)").fetchone()[0] == "on",
             10, message="the reloaded pg_task.spi")


def test_screen():
    session = Session.__new__(Session)
    session.spi, session.spi_known = None, True
    assert local_input.one_trip(session, "SELECT 1", False)
    assert local_input.one_trip(session, "INSERT INTO t SELECT g FROM generate_series(1, 3) g", False)
    assert local_input.one_trip(session, "SELECT pg_advisory_lock(1), current_database()", False)
    assert not local_input.one_trip(session, "SELECT 1", True)       # the entry says SPI
    assert not local_input.one_trip(session, "   ", False)
    for text in ("vacuum t", "CREATE INDEX CONCURRENTLY i ON t (a)", "CALL p()", "DO $$BEGIN END$$",
                 "CREATE DATABASE x", "ALTER SYSTEM SET a = 1", "BEGIN; SELECT 1", "SELECT 1; COMMIT",
                 "SELECT current_query()", "SELECT 1 /* c */", "COPY t TO '/tmp/x'"):
        assert not local_input.one_trip(session, text, False), text
    session.spi_known = False
    assert not local_input.one_trip(session, "SELECT 1", False)


def test_a_cancelled_preamble_does_not_fall_back_to_running_the_input(db, monkeypatch):
    # A cancel (STOP, shutdown's grace period over) that lands on the one-trip preamble: the input
    # must not run -- not in this round trip, and not in a second one either.
    db.execute("CREATE TABLE marker (a int)")
    user = db.value("SELECT current_user")
    oid = db.value("SELECT 'task'::regclass::oid")
    trips = Trips(monkeypatch)

    async def go():
        pool = SessionPool(db.dsn, user, "login")
        session = await pool.get(user)
        try:
            await run_input(session, claim(db, "SELECT 1"), "public", "task", oid, 1 << 20)
            task = claim(db, "INSERT INTO marker VALUES (1)")
            with db.connect() as blocker, db.connect() as watcher:
                blocker.execute("BEGIN")
                blocker.execute("SELECT FROM task WHERE id = %s FOR UPDATE", (task.id,))  # the start waits
                trips.take()

                released = asyncio.Event()

                async def start_work() -> bool:  # the service's own TAKE -> WORK, as completer.Completer.start_work
                    await released.wait()  # (the row is still locked until then)
                    async with await psycopg.AsyncConnection.connect(db.dsn, autocommit=True) as conn:
                        cur = await conn.execute("UPDATE task SET state = 'WORK' WHERE id = %s AND lease = %s "
                                                 "RETURNING id", (task.id, task.lease))
                        return await cur.fetchone() is not None

                running = asyncio.ensure_future(run_input(session, task, "public", "task", oid, 1 << 20,
                                                          start_work=start_work))
                await wait_for_async(lambda: watcher.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (session.pid,)).fetchone()[0] == "Lock",
                    timeout=5, message="the one-trip preamble to wait for the row lock")
                await session.conn.cancel_safe()
                blocker.execute("ROLLBACK")
                released.set()
                return await running
        finally:
            await pool.retire(session)

    output, error = asyncio.run(go())
    assert trips.sent[1:] == ["ROLLBACK"]  # after the one-trip string only its block's end: no preamble, no input
    assert output == ""
    assert error.startswith("ERROR:  canceling statement due to user request"), error
    assert db.value("SELECT count(*) FROM marker") == 0


def test_a_task_the_claim_started_on_a_session_runs_there_only_while_it_is_still_its_own(db, monkeypatch):
    """A claim that starts a task on an offered session (PLAN -> WORK with that session's pid) leaves
    its preamble only a check (the table's check function, fenced like the start function): the
    input runs if the row is still WORK on this backend under this lease -- not once it was set
    to STOP, nor if it was started on another backend -- in one round trip or two alike."""
    db.execute("CREATE TABLE ran (id bigint)")
    oid = db.value("SELECT 'task'::regclass::oid")
    user = db.value("SELECT current_user")
    trips = Trips(monkeypatch)

    def started_on(pid: int) -> Task:
        task_id = db.insert("INSERT INTO ran VALUES (current_setting('pg_task.id')::bigint)")
        row = db.claim(task_id, TASK_COLUMNS)
        db.execute("UPDATE task SET state = 'WORK', pid = %s, start = now() WHERE id = %s", (pid, task_id))
        return Task.from_row(row)

    async def go() -> list:
        pool = SessionPool(db.dsn, user, "login")
        session, other = await pool.get(user), await pool.get(user)
        results = []
        try:
            for case in ("runs", "runs", "stopped", "on another backend", "runs"):
                task = started_on(other.pid if case == "on another backend" else session.pid)
                task.session_pid = session.pid
                if case == "stopped":
                    db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (task.id,))
                trips.take()
                try:
                    outcome = await run_input(session, task, "public", "task", oid, 1 << 20)
                except NotStarted:
                    outcome = NotStarted
                results.append((task.id, outcome, trips.take()))
        finally:
            await pool.retire(session)
            await pool.retire(other)
        return results

    results = asyncio.run(go())
    assert [(r[1], r[2]) for r in results] == [
        # refused: the one-trip string, its block's ROLLBACK, the two-trip preamble
        (("INSERT 0 1", None), 2), (("INSERT 0 1", None), 1), (NotStarted, 3), (NotStarted, 3),
        (("INSERT 0 1", None), 1)], results
    assert sorted(r[0] for r in db.execute("SELECT id FROM ran")) == [results[i][0] for i in (0, 1, 4)]
    assert db.task(results[2][0])["state"] == "STOP"
