"""Remote tasks (``remote`` set): spec section 6 and the manual's restriction table, remote column.

Remote targets: another database of the test cluster (trust over its socket), and for the password
rule a second cluster of our own that asks TCP clients for a SCRAM password.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from support import wait_for

from pgtask import remote
from pgtask.cluster import Cluster, free_port


@pytest.fixture
def far(cluster):
    """Another database of the test cluster: the remote side (conninfo, a connection to it)."""
    name = f"far_{os.getpid()}_{time.monotonic_ns()}"
    with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    conn = psycopg.connect(cluster.conninfo(name), autocommit=True)
    yield cluster.conninfo(name), conn
    conn.close()
    with psycopg.connect(cluster.conninfo(), autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def scram(cluster):
    """A second cluster: local socket trust, TCP on 127.0.0.1 with scram-sha-256 passwords."""
    base = Path(tempfile.mkdtemp(prefix="pgtask-scram-"))
    c = Cluster(base=base, bindir=cluster.bindir, port=free_port())
    c.init({"listen_addresses": "'127.0.0.1'", "password_encryption": "'scram-sha-256'",
            "fsync": "off", "max_connections": "50"})
    hba = c.data / "pg_hba.conf"
    hba.write_text("local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
    c.start()
    with psycopg.connect(c.conninfo(), autocommit=True) as conn:
        conn.execute("CREATE ROLE bob LOGIN PASSWORD 'bob secret'")
    yield c
    c.destroy()


def scram_conninfo(c: Cluster, password: str = "bob secret") -> str:
    return f"host=127.0.0.1 port={c.port} dbname=postgres user=bob password='{password}'"


# One connection a task (no connecting again after a failed one, see runner.RemoteTarget.again): pg_task's way,
# for the tests of what a failed connection leaves in the row.
ONE_CONNECTION = '[pgtask]\nreset_check = 0.5\ngrace = 5\nlog_level = "debug"\nremote_attempts = 1\n'


def remote_activity(conn, pid: int) -> tuple | None:
    rows = conn.execute("SELECT state, query FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchall()
    return rows[0] if rows else None


def test_conninfo_quotes_every_value():
    """The connection string the service builds reads back, through libpq's parser, as the exact
    values it was built from: quotes, backslashes, spaces, '=', empty, non-ASCII."""
    params = {"application_name": "pg_task public task it's a \\group", "options": "-c pg_task.group=a\\ b",
              "password": "p'w\\\\d = x", "dbname": "", "user": "björk", "host": "/tmp"}
    assert conninfo_to_dict(remote.conninfo(params)) == params


# -- the manual's restriction table, remote column ------------------------------------------------

def test_restriction_table_remote(db, service, far):
    dsn, fconn = far
    fconn.execute("CREATE TABLE t (x int)")
    ids = {
        # several statements: every result appended
        "multi": db.insert("SELECT 1 AS a; SELECT 2 AS a, 3 AS b; CREATE TABLE m (x int); "
                           "INSERT INTO m VALUES (1), (2); UPDATE m SET x = x + 1; "
                           "INSERT INTO m VALUES (9) RETURNING x", remote=dsn),
        # COPY TO STDOUT is supported: streamed raw, its tag suppressed
        "copy_out": db.insert("COPY (SELECT 1 UNION ALL SELECT 2) TO STDOUT; SELECT 3", remote=dsn),
        # COPY FROM STDIN is refused, by the server with pg_task's put_copy_end text
        "copy_in": db.insert("COPY t FROM STDIN", remote=dsn),
        # COPY to/from a program (and so a server file) runs on the remote server
        "program": db.insert("COPY t FROM PROGRAM 'echo 7'; COPY (SELECT 1) TO PROGRAM 'cat > /dev/null'",
                             remote=dsn),
        # explicit BEGIN/COMMIT/ROLLBACK; a transaction left open is committed
        "tx": db.insert("BEGIN; INSERT INTO t VALUES (1); COMMIT; BEGIN; INSERT INTO t VALUES (2); "
                        "ROLLBACK; BEGIN; INSERT INTO t VALUES (3)", remote=dsn),
        # DDL
        "ddl": db.insert("CREATE TABLE d (x int); ALTER TABLE d ADD y text; DROP TABLE d", remote=dsn),
    }
    rows = {k: db.wait_state(i) for k, i in ids.items()}
    assert (rows["multi"]["state"], rows["multi"]["output"], rows["multi"]["error"]) == (
        "DONE", "1\na\tb\n2\t3\nCREATE TABLE\nINSERT 0 2\nUPDATE 2\n9", None)
    # the COPY data keeps its own newlines; the next piece still gets its "\n" separator (spec 7)
    assert (rows["copy_out"]["output"], rows["copy_out"]["error"]) == ("1\n2\n\n3", None)
    copy_in = rows["copy_in"]
    assert copy_in["state"] == "FAIL" and copy_in["output"] == ""
    assert copy_in["error"] == ("ERROR:  COPY from stdin failed: COPY FROM STDIN is not supported\n"
                                "CONTEXT:  COPY t, line 1\nSTATEMENT:  COPY t FROM STDIN")
    assert (rows["program"]["state"], rows["program"]["output"]) == ("DONE", "COPY 1\nCOPY 1")
    assert (rows["tx"]["state"], rows["tx"]["output"]) == (
        "DONE", "BEGIN\nINSERT 0 1\nCOMMIT\nBEGIN\nINSERT 0 1\nROLLBACK\nBEGIN\nINSERT 0 1")
    assert (rows["ddl"]["state"], rows["ddl"]["output"]) == ("DONE", "CREATE TABLE\nALTER TABLE\nDROP TABLE")
    assert [r[0] for r in fconn.execute("SELECT x FROM t ORDER BY x")] == [1, 3, 7]
    # nothing ran locally
    assert db.value("SELECT to_regclass('public.m')") is None


def test_copy_both_refused(db, service, scram):
    """COPY BOTH (a logical replication stream) is refused: pg_task ends it at once with
    put_copy_end("COPY BOTH is not supported"); a walsender answers that CopyFail by closing the
    connection with its own FATAL, which is what the task records."""
    with psycopg.connect(scram.conninfo(), autocommit=True) as conn:
        if conn.execute("SHOW wal_level").fetchone()[0] != "logical":
            conn.execute("ALTER SYSTEM SET wal_level = logical")
            scram.restart()
    with psycopg.connect(scram.conninfo(), autocommit=True) as conn:
        try:
            conn.execute("SELECT pg_create_logical_replication_slot('both', 'test_decoding')")
        except psycopg.errors.UndefinedFile:
            pytest.skip("test_decoding is not installed with this server")
    try:
        dsn = f"host={scram.socket_dir} port={scram.port} dbname=postgres user=postgres replication=database"
        row = db.wait_state(db.insert("START_REPLICATION SLOT both LOGICAL 0/0", remote=dsn))
        assert (row["state"], row["output"]) == ("FAIL", ""), row  # the stream's keepalives are no output
        assert row["error"].startswith('ERROR:  PQconsumeInput failed\n'
                                       'DETAIL:  FATAL:  invalid standby message type "f"'), row["error"]
        assert row["error"].endswith("STATEMENT:  START_REPLICATION SLOT both LOGICAL 0/0")
    finally:
        with psycopg.connect(scram.conninfo(), autocommit=True) as conn:
            wait_for(lambda: conn.execute("SELECT NOT active FROM pg_replication_slots "
                                          "WHERE slot_name = 'both'").fetchone()[0], message="slot released")
            conn.execute("SELECT pg_drop_replication_slot('both')")


def test_copy_to_stdout_100000_rows(db, service, far):
    dsn, _ = far
    row = db.wait_state(db.insert("COPY (SELECT i, 'row ' || i FROM generate_series(1, 100000) i) TO STDOUT",
                                  remote=dsn), timeout=60)
    assert row["state"] == "DONE" and row["error"] is None
    expected = "".join(f"{i}\trow {i}\n" for i in range(1, 100001))
    assert len(row["output"]) == len(expected)
    assert row["output"] == expected


def test_binary_copy_to_stdout_is_written_with_its_nul_bytes_replaced(db, service, far):
    """Binary COPY data holds NUL bytes, which no text column can: each becomes U+FFFD (as bytes
    the encoding cannot read do) and the task is DONE -- the database refused the result before,
    and the task stayed WORK, its finish retried for ever."""
    dsn, _ = far
    row = db.wait_state(db.insert("COPY (SELECT 7) TO STDOUT (FORMAT binary)", remote=dsn))
    assert (row["state"], row["error"]) == ("DONE", None), row
    assert row["output"].startswith("PGCOPY\n\ufffd\r\n\ufffd") and "\x00" not in row["output"], row


# -- the session the remote side sees -------------------------------------------------------------

@pytest.mark.quick
def test_session_settings(db, service, far):
    dsn, _ = far
    group = "it's a \\group"
    probe = ("SELECT current_setting('pg_task.id'), current_setting('pg_task.group'), "
             "current_setting('application_name'), current_setting('client_encoding'), "
             "current_setting('statement_timeout'), current_setting('pg_task.schema'), "
             "current_setting('pg_task.table'), current_setting('pg_task.oid') = %s, pg_backend_pid()")
    oid = str(db.value("SELECT 'public.task'::regclass::oid"))
    i = db.insert(probe.replace("%s", f"'{oid}'"), group=group, timeout="3 s",
                  remote=f"{dsn} application_name=mine options='-c work_mem=7MB'")
    row = db.wait_state(i)
    assert row["state"] == "DONE", row["error"]
    values = row["output"].split("\n")[1].split("\t")
    assert values[:8] == [str(i), group, f"pg_task public task {group}", "UTF8", "3s", "public", "task", "t"]
    assert row["pid"] == int(values[8])  # the remote backend's pid
    # the user's options are kept
    j = db.insert("SHOW work_mem", remote=f"{dsn} options='-c work_mem=7MB'")
    assert db.wait_state(j)["output"] == "7MB"


def test_timeout_and_failures(db, service, far):
    dsn, _ = far
    slow = db.insert("SELECT pg_sleep(5)", timeout="1 s", remote=dsn)
    fail = db.insert("SELECT 1 AS a; SELECT 1/0", remote=dsn)
    row = db.wait_state(slow)
    assert (row["state"], row["output"], row["error"]) == (
        "FAIL", "", "ERROR:  canceling statement due to statement timeout\nSTATEMENT:  SELECT pg_sleep(5)")
    row = db.wait_state(fail)
    assert (row["state"], row["output"], row["error"]) == (
        "FAIL", "1", "ERROR:  division by zero\nSTATEMENT:  SELECT 1 AS a; SELECT 1/0")
    # a syntax error on the remote side: its position
    row = db.wait_state(db.insert("SELEC 1", remote=dsn))
    assert row["error"] == 'ERROR:  syntax error at or near "SELEC" at character 1\nSTATEMENT:  SELEC 1'
    # the connection lost while the input runs: what had arrived is kept, as for any error
    lost = "SELECT 1 AS a; SELECT 2 AS b; SELECT pg_sleep(30)"
    task_id = db.insert(lost, remote=dsn)
    backend = wait_for(lambda: db.value("SELECT pid FROM pg_stat_activity WHERE query = %s AND state = 'active'",
                                        (lost,)), message="the remote task's last statement to run")
    db.execute("SELECT pg_terminate_backend(%s)", (backend,))
    row = db.wait_state(task_id)
    assert (row["state"], row["output"]) == ("FAIL", "1\n2"), row
    assert row["error"].startswith("ERROR:  PQconsumeInput failed\nDETAIL:  FATAL:  terminating connection"), row
    assert row["error"].endswith(f"STATEMENT:  {lost}"), row


# -- connection strings and connecting --------------------------------------------------------------

def test_conninfo_parse_error(db, service):
    i = db.insert("SELECT 1", remote="application_name")
    row = db.wait_state(i)
    assert row["state"] == "FAIL"
    assert row["error"] == ('ERROR:  PQconninfoParse failed\n'
                            'DETAIL:  missing "=" after "application_name" in connection info string')
    assert row["start"] is None and row["pid"] is None
    row = db.wait_state(db.insert("SELECT 1", remote="host=x nosuchkey=1"))
    assert row["error"] == 'ERROR:  PQconninfoParse failed\nDETAIL:  invalid connection option "nosuchkey"'


@pytest.fixture
def black_hole():
    """A TCP port on 127.0.0.1 that completes the handshake and then never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    yield s.getsockname()[1]
    s.close()


def test_unreachable_host_fails_within_connect_timeout(db, service_factory, black_hole):
    service = service_factory(db.name, ONE_CONNECTION)
    refused_port = free_port()
    t0 = time.monotonic()
    hole = db.insert("SELECT 1",
                     remote=f"host=127.0.0.1 port={black_hole} user=x password=y connect_timeout=2")
    default = db.insert("SELECT 1", remote=f"host=127.0.0.1 port={black_hole} user=x password=y")
    refused = db.insert("SELECT 1", remote=f"host=127.0.0.1 port={refused_port} user=x password=y")

    row = db.wait_state(refused)
    assert row["state"] == "FAIL" and row["start"] is None
    assert row["error"].startswith(
        "ERROR:  PQconnectPoll failed\nDETAIL:  connection to server at "
        f'"127.0.0.1", port {refused_port} failed: Connection refused'), row["error"]

    row = db.wait_state(hole, timeout=10)
    took = time.monotonic() - t0
    assert row["state"] == "FAIL" and row["start"] is None
    assert row["error"] == "ERROR:  PQconnectPoll failed\nDETAIL:  connection timeout expired"
    assert 1.5 < took < 6, took

    # no connect_timeout given: bounded by the default (10 s)
    row = db.wait_state(default, timeout=20)
    took = time.monotonic() - t0
    assert row["error"] == "ERROR:  PQconnectPoll failed\nDETAIL:  connection timeout expired"
    assert 8 < took < 16, took
    assert "password" not in service.output().replace("password is required", "")

    # a connection string libpq refuses before connecting (a port that is no number): the task
    # fails as pg_task's does, "PQstatus == CONNECTION_BAD" with libpq's text
    row = db.wait_state(db.insert("SELECT 1", remote="host=127.0.0.1 port=abc user=x password=y"))
    assert row["error"] == 'ERROR:  PQstatus == CONNECTION_BAD\nDETAIL:  invalid integer value "abc" for connection option "port"', row


@pytest.mark.quick
def test_stop_cancels_running_remote_task(db, service, far):
    dsn, fconn = far
    i = db.insert("SELECT pg_sleep(60)", remote=dsn)
    row = db.wait_state(i, states=("WORK",))
    pid = row["pid"]
    wait_for(lambda: (remote_activity(fconn, pid) or ("", ""))[0] == "active", message="remote query running")
    assert remote_activity(fconn, pid)[1] == "SELECT pg_sleep(60)"
    t0 = time.monotonic()
    db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (i,))
    row = wait_for(lambda: (r := db.task(i))["stop"] is not None and r, message="the run to end")
    assert time.monotonic() - t0 < 5
    assert row["state"] == "STOP"
    assert row["error"] == ("ERROR:  canceling statement due to user request\n"
                            "STATEMENT:  SELECT pg_sleep(60)")
    # the remote query is gone (cancelled, and the connection closed)
    wait_for(lambda: remote_activity(fconn, pid) is None or remote_activity(fconn, pid)[0] != "active",
             message="remote query cancelled")


# -- the password rule ----------------------------------------------------------------------------

@pytest.fixture
def alice(db):
    """A local non-superuser who may insert tasks (roles are cluster-wide: a name per test)."""
    role = f"alice_{db.name}"
    db.execute(f"CREATE ROLE {role} LOGIN")
    db.execute(f"GRANT INSERT, SELECT ON task TO {role}")
    db.execute(f"GRANT USAGE ON SEQUENCE task_id_seq TO {role}")
    conn = db.connect(role)
    yield conn
    conn.close()


def insert_as(conn, input_text: str, remote: str) -> int:
    return conn.execute("INSERT INTO task (input, remote) VALUES (%s, %s) RETURNING id",
                        (input_text, remote)).fetchone()[0]


def test_password_rule(db, service_factory, far, scram, alice):
    service = service_factory(db.name, ONE_CONNECTION)
    dsn, _ = far
    no_keyword = insert_as(alice, "SELECT 1", dsn)
    not_used = insert_as(alice, "SELECT 1", f"{dsn} password=whatever")
    with_password = insert_as(alice, "SELECT current_user", scram_conninfo(scram))
    wrong_password = insert_as(alice, "SELECT current_user", scram_conninfo(scram, "not it"))
    superuser = db.insert("SELECT current_user", remote=dsn)

    row = db.wait_state(no_keyword)
    assert (row["state"], row["user"], row["start"]) == ("FAIL", alice.info.user, None)
    assert row["error"] == ("ERROR:  password is required\n"
                            "DETAIL:  Non-superusers must provide a password in the connection string.")
    row = db.wait_state(not_used)
    assert (row["state"], row["start"]) == ("FAIL", None)
    assert row["error"] == (
        "ERROR:  password is required\n"
        "DETAIL:  Non-superuser cannot connect if the server does not request a password.\n"
        "HINT:  Target server's authentication method must be changed.")
    row = db.wait_state(with_password)
    assert (row["state"], row["output"], row["error"]) == ("DONE", "bob", None)
    row = db.wait_state(wrong_password)
    assert row["state"] == "FAIL"
    assert row["error"].startswith("ERROR:  PQconnectPoll failed\n"
                                   "DETAIL:  connection to server at "), row["error"]
    assert 'password authentication failed for user "bob"' in row["error"]
    row = db.wait_state(superuser)
    assert (row["state"], row["user"], row["output"]) == ("DONE", "postgres", "postgres")
    # connection strings (and so passwords) never reach the log
    log = service.output()
    assert "bob secret" not in log and "not it" not in log and "whatever" not in log


# -- reuse within count/live ------------------------------------------------------------------------

def test_reuse_with_count_discard_and_save(db, service, far):
    dsn, _ = far
    probe = "SELECT to_regclass('pg_temp.tmp') IS NOT NULL, current_setting('my.x', true), pg_backend_pid()"
    setup = "CREATE TEMP TABLE tmp (x int); SET my.x = 'kept'"
    sleepy = "SELECT pg_backend_pid() FROM pg_sleep(1.2)"
    # Inserted in one transaction: one connection takes the first and then the others (count = 3).
    with db.connect() as conn, conn.transaction():
        ids = [conn.execute("INSERT INTO task (input, remote, \"group\", count, save, timeout) "
                            "VALUES (%s, %s, %s, 3, %s, %s) RETURNING id", params).fetchone()[0]
               for params in ((setup, dsn, "discard", False, "1 s"), (probe, dsn, "discard", False, "1 s"),
                              (sleepy, dsn, "discard", False, "0"), (probe, dsn, "discard", False, "0"),
                              (setup, dsn, "save", True, "0"), (probe, dsn, "save", False, "0"))]
    rows = [db.wait_state(i) for i in ids]
    assert all(r["state"] == "DONE" for r in rows), [r["error"] for r in rows]
    # DISCARD ALL between tasks (save = false): temp table and settings gone (a placeholder
    # setting once SET reads '' after RESET ALL)
    assert rows[1]["output"].split("\n")[1].split("\t") == ["f", "", str(rows[1]["pid"])]
    # the same remote backend ran the first three tasks of the group (count = 3), and the 1 s
    # statement_timeout of the tasks before did not leak into the third (RESET "statement_timeout")
    assert rows[0]["pid"] == rows[1]["pid"] == rows[2]["pid"] == int(rows[2]["output"])
    # the fourth got a new connection
    assert rows[3]["pid"] != rows[0]["pid"]
    assert rows[3]["output"].split("\n")[1].split("\t") == ["f", "\\N", str(rows[3]["pid"])]
    # save = true: the next task on the connection sees the temp table and the setting
    assert rows[4]["pid"] == rows[5]["pid"]
    assert rows[5]["output"].split("\n")[1].split("\t") == ["t", "kept", str(rows[5]["pid"])]


def test_no_reuse_without_count(db, service, far):
    dsn, _ = far
    with db.connect() as conn, conn.transaction():
        ids = [conn.execute("INSERT INTO task (input, remote) VALUES ('SELECT pg_backend_pid()', %s) "
                            "RETURNING id", (dsn,)).fetchone()[0] for _ in range(3)]
    rows = [db.wait_state(i) for i in ids]
    assert len({r["pid"] for r in rows}) == 3


# -- many at once -----------------------------------------------------------------------------------

def test_200_concurrent_remote_tasks(db, service, far):
    dsn, fconn = far
    n = 220
    with db.connect() as conn, conn.transaction():
        conn.execute("INSERT INTO task (input, remote, \"group\") SELECT 'SELECT pg_sleep(1)', %s, 'g' || i "
                     "FROM generate_series(1, %s) i", (dsn, n))
    t0 = time.monotonic()
    seen_active = 0
    threads = 0

    def all_done():
        nonlocal seen_active, threads
        active = fconn.execute("SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(1)' "
                               "AND state = 'active'").fetchone()[0]
        seen_active = max(seen_active, active)
        threads = max(threads, len(os.listdir(f"/proc/{service.proc.pid}/task")))
        return db.value("SELECT count(*) FROM task WHERE state = 'DONE'") == n

    wait_for(all_done, timeout=30, interval=0.1, message="all remote tasks done")
    took = time.monotonic() - t0
    span = db.value("SELECT extract(epoch FROM max(stop) - min(start)) FROM task")
    assert seen_active >= 150, seen_active  # they really overlapped on the remote server
    assert span < 6, span
    assert took < 10, took
    assert threads < 20, threads  # no thread per task
    assert db.value("SELECT count(DISTINCT pid) FROM task") == n


def test_sigterm_cancels_remote_tasks_after_grace(db, service, far):
    """SIGTERM: running remote tasks get the grace period (5 s in tests), then are cancelled on the
    remote server and given back (PLAN, to run again); the service exits."""
    dsn, fconn = far
    i = db.insert("SELECT pg_sleep(60)", remote=dsn)
    pid = db.wait_state(i, states=("WORK",))["pid"]
    t0 = time.monotonic()
    assert service.stop(timeout=30) == 0
    assert time.monotonic() - t0 < 15
    row = db.task(i)
    assert (row["state"], row["start"], row["pid"], row["error"]) == ("PLAN", None, None, None)
    wait_for(lambda: remote_activity(fconn, pid) is None, message="remote connection closed")
