"""The failure model, fault by fault. Every task's input records its id in `runs`, so each test
counts, per task, how often it ran: nothing may be lost, and a task may run twice only if its
executor may have died mid-run (it was in flight when the fault hit)."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
from support import Service, spi_on, wait_for, wait_for_async

from pgtask.cluster import Cluster, free_port
from pgtask.output import Output
from pgtask.runner import LOST_ATTEMPTS
from pgtask.scheduler import Scheduler

BODY = "INSERT INTO runs VALUES (current_setting('pg_task.id')::bigint); SELECT pg_sleep({sleep})"


def load(db, n, groups, max_=2, sleep=0.01):
    db.execute("CREATE TABLE IF NOT EXISTS runs (id bigint)")
    db.execute(f"""INSERT INTO task (input, "group", max)
                   SELECT %s, 'g' || (i %% {groups}), {max_} FROM generate_series(1, {n}) i""",
               (BODY.format(sleep=sleep),))
    return [r[0] for r in db.execute("SELECT id FROM task ORDER BY id")]


def in_flight(db):
    return {r[0] for r in db.execute("SELECT id FROM task WHERE state IN ('TAKE', 'WORK')")}


def check_counts(db, ids, allowed_twice):
    counts = dict(db.execute("SELECT id, count(*) FROM runs GROUP BY id"))
    lost = [i for i in ids if i not in counts]
    repeated = {i for i, c in counts.items() if c > 1}
    assert not lost, f"{len(lost)} tasks never ran"
    assert repeated <= allowed_twice, f"ran twice without a fault in flight: {sorted(repeated - allowed_twice)}"
    assert max(counts.values()) <= 2
    assert db.value("SELECT count(*) FROM task WHERE state <> 'DONE'") == 0
    return repeated


def test_sigkill_mid_load_then_restart(db, service_factory):
    ids = load(db, 3000, groups=30)
    svc = service_factory(db.name)
    wait_for(lambda: db.value("SELECT count(*) FROM runs") > 600 and in_flight(db), 60,
             message="the load to get going, with tasks in flight")
    svc.kill()
    flying = in_flight(db)  # rows the dead service had claimed: the only ones allowed to run twice
    assert flying, "the kill should hit tasks in flight"
    service_factory(db.name)
    wait_for(lambda: db.value("SELECT count(*) FROM task WHERE state = 'DONE'") == len(ids), 120,
             message="every task to be DONE after the restart")
    repeated = check_counts(db, ids, flying)
    print(f"in flight at the kill: {len(flying)}, ran twice: {len(repeated)}")


def test_postgres_immediate_restart_mid_load(db, cluster, service_factory):
    # durability as a real installation has it (the test cluster defaults to synchronous_commit off)
    db.execute(f'ALTER DATABASE "{db.name}" SET synchronous_commit = on')
    ids = load(db, 1500, groups=15)
    svc = service_factory(db.name)
    wait_for(lambda: db.value("SELECT count(*) FROM runs") > 300, 60, message="the load to get going")
    flying_before = in_flight(db)
    db.close()
    cluster.restart("immediate")
    db.conn = psycopg.connect(db.dsn, autocommit=True)
    # whatever was in flight around the crash may run again; everything else exactly once
    wait_for(lambda: db.value("SELECT count(*) FROM task WHERE state = 'DONE'") == len(ids), 120,
             message="the load to complete after the restart")
    counts = dict(db.execute("SELECT id, count(*) FROM runs GROUP BY id"))
    assert all(i in counts for i in ids), "a task was lost"
    assert max(counts.values()) <= 2
    assert svc.proc.poll() is None, "the service must survive a server restart"
    assert "reconnect" in svc.output() or "retrying" in svc.output()
    print(f"in flight before the crash: {len(flying_before)}, "
          f"ran twice: {sum(1 for c in counts.values() if c > 1)}")


def test_lost_notifications_do_not_lose_tasks(db, service_factory):
    service_factory(db.name, "[pg_task]\nsleep = 300\n")
    db.execute("ALTER TABLE task DISABLE TRIGGER task_wake_up")  # no NOTIFY at all
    task_id = db.insert("SELECT 1")
    assert db.wait_state(task_id, timeout=10)["state"] == "DONE"


def test_listener_killed(db, service_factory):
    svc = service_factory(db.name)
    wait_for(lambda: db.value("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgtask listen%%' "
                              "AND datname = current_database()"), message="the listener")
    db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'pgtask listen%%' "
               "AND datname = current_database()")
    assert db.wait_state(db.insert("SELECT 1"), timeout=10)["state"] == "DONE"
    wait_for(lambda: "listener lost" in svc.output(), message="the listener loss to be logged")
    wait_for(lambda: db.value("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgtask listen%%' "
                              "AND datname = current_database()"), message="the listener to reconnect")


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
def test_cut_off_service_has_its_query_cancelled_and_rerun(db, service_factory, remote):
    """The server running the task's query (a remote one too) checks for the vanished client while
    it runs, and ends the query; the task runs again once a service is back."""
    db.execute("CREATE TABLE runs (id bigint)")
    svc = service_factory(db.name)
    task_id = db.insert(BODY.format(sleep=60), remote=db.dsn if remote else None)

    def sleeping() -> int:
        return db.value("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%%pg_sleep(60)%%' "
                        "AND state = 'active' AND pid <> pg_backend_pid()")

    db.wait_state(task_id, states=("WORK",))
    wait_for(lambda: sleeping() == 1, message="the task's query")
    svc.kill()
    # the server notices the vanished client (client_connection_check_interval) and stops the query
    wait_for(lambda: sleeping() == 0, 15, message="the orphaned query to be cancelled")
    assert db.value("SELECT count(*) FROM runs") == 0  # its transaction never committed
    service_factory(db.name)
    wait_for(lambda: (r := db.task(task_id))["attempt"] == 2 and r["state"] == "WORK", 15,
             message="the task to run again")


def test_executor_backend_terminated_reruns(db, service):
    db.execute("CREATE TABLE runs (id bigint)")
    task_id = db.insert(BODY.format(sleep=2))
    row = db.wait_state(task_id, states=("WORK",))
    db.execute("SELECT pg_terminate_backend(%s)", (row["pid"],))
    row = wait_for(lambda: (r := db.task(task_id)) and r["attempt"] == 2 and r["state"] == "DONE" and r, 20,
                   message="the task to run again and finish")
    assert db.value("SELECT count(*) FROM runs") == 1  # the first run's transaction was rolled back


@pytest.mark.parametrize("mode", ["local", "spi"])
def test_an_input_that_ends_its_own_session_fails_after_ten_attempts(db, service_factory, mode):
    """A lost session makes its task run again -- but not for ever: at its LOST_ATTEMPTS-th attempt
    (an input that ends or crashes its own backend) it fails with the reason, libpq's or the
    server's whole text."""
    if mode == "spi":
        spi_on(db)
    service_factory(db.name)
    task_id = db.insert("SELECT pg_terminate_backend(pg_backend_pid())")
    row = db.wait_state(task_id, timeout=60)
    assert (row["state"], row["attempt"]) == ("FAIL", LOST_ATTEMPTS), row
    assert row["error"].startswith(f"ERROR:  the task's session ended while it ran, {LOST_ATTEMPTS} "
                                   "times in a row\nDETAIL:  "), row["error"]
    detail = row["error"].split("\nDETAIL:  ", 1)[1].split("\nSTATEMENT:  ")[0]
    assert detail.startswith(("FATAL:  terminating connection", "server closed the connection")), row["error"]
    assert row["error"].endswith("STATEMENT:  SELECT pg_terminate_backend(pg_backend_pid())"), row["error"]


@pytest.mark.parametrize("mode", ["local", "spi"])
@pytest.mark.parametrize("code", ["57P01", "08006"])
def test_an_error_the_input_raises_with_a_session_ending_code_is_its_error(db, service_factory, mode, code):
    """Only a session that really ended (FATAL, the connection gone) makes a task run again: an
    ERROR the input raises itself with admin_shutdown's or connection_failure's SQLSTATE is the
    task's error, with what ran before it kept -- it runs once."""
    if mode == "spi":
        spi_on(db)
    service_factory(db.name)
    db.execute("CREATE TABLE runs (id bigint)")
    body = f"DO $$BEGIN RAISE EXCEPTION 'not the end' USING ERRCODE = '{code}'; END$$"
    task_id = db.insert(("INSERT INTO runs VALUES (1); COMMIT; " if mode == "local" else "SELECT 1 AS a; ") + body)
    row = db.wait_state(task_id)
    assert (row["state"], row["attempt"]) == ("FAIL", 1), row
    assert row["error"].startswith("ERROR:  not the end\nCONTEXT:  PL/pgSQL function inline_code_block"), row
    if mode == "local":
        assert (row["output"], db.value("SELECT count(*) FROM runs")) == ("INSERT 0 1\nCOMMIT", 1)
    else:
        assert row["output"] == "1"


def test_stale_executor_writes_nothing(db, service_factory):
    """A row reset and re-claimed under a running executor: the old run's result is dropped."""
    service = service_factory(db.name, "[pgtask]\nreset_check = 600\n")
    task_id = db.insert("SELECT pg_sleep(1.5); SELECT 'first'")
    db.wait_state(task_id, states=("WORK",))
    # simulate another instance taking over: reset the row, claim it with a new attempt and lease
    # (in one transaction, so the service's own claim pass never sees the row in PLAN)
    with db.conn.transaction():
        db.execute("UPDATE task SET state = 'PLAN' WHERE id = %s", (task_id,))
        db.claim(task_id)
    wait_for(lambda: "lease lost" in service.output(), 15, message="the stale result to be dropped")
    row = db.task(task_id)
    assert row["state"] == "TAKE" and row["output"] is None and row["attempt"] == 2


def test_unknown_role_fails_clearly(db, service):
    db.execute("CREATE ROLE ghost LOGIN")
    task_id = db.insert("SELECT 1", user="ghost", plan="2100-01-01")
    db.execute("DROP ROLE ghost")
    db.execute("UPDATE task SET plan = now() WHERE id = %s", (task_id,))
    row = db.wait_state(task_id)
    assert row["state"] == "FAIL" and 'role "ghost" does not exist' in row["error"]
    assert db.wait_state(db.insert("SELECT 2"))["state"] == "DONE"  # the service keeps going


def test_huge_output_is_capped_in_bounded_memory(db, service_factory):
    svc = service_factory(db.name, "[pgtask]\noutput_limit = 1000000\nreset_check = 0.5\n")
    task_id = db.insert("SELECT repeat('x', 1000) FROM generate_series(1, 100000)")  # 100 MB of output
    row = db.wait_state(task_id, timeout=120)
    assert row["state"] == "DONE"
    assert len(row["output"]) < 1_100_000 and row["output"].endswith("[output truncated at 1000000 characters by pgtask]")
    peak_kb = int(next(line.split()[1] for line in Path(f"/proc/{svc.proc.pid}/status").read_text().splitlines()
                       if line.startswith("VmHWM")))
    assert peak_kb < 150_000, f"peak RSS {peak_kb} kB"


HOSTILE = {"data": "db ';x ü", "user": "rôle \"q\" ;", "schema": "s; x", "table": "t 'q' ü"}


def test_hostile_names_everywhere(cluster, service_factory, db):
    data, user, schema, table = ('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in HOSTILE.values())
    toml = f"[pg_task]\njson = [{{data = {data}, user = {user}, schema = {schema}, table = {table}}}]\n"
    service_factory(db.name, toml)
    table = psycopg.sql.Identifier(HOSTILE["schema"], HOSTILE["table"])
    with psycopg.connect(cluster.conninfo(HOSTILE["data"], HOSTILE["user"]), autocommit=True) as conn:
        task_id = conn.execute(psycopg.sql.SQL('INSERT INTO {} (input, "group") VALUES (%s, %s) RETURNING id')
                               .format(table), ("SELECT current_user, current_setting('pg_task.group')",
                                                "g'; DROP TABLE x; -- ü")).fetchone()[0]
        row = wait_for(lambda: conn.execute(psycopg.sql.SQL("SELECT state, output FROM {} WHERE id = %s")
                                            .format(table), (task_id,)).fetchone()[0] == "DONE" and
                       conn.execute(psycopg.sql.SQL("SELECT output FROM {} WHERE id = %s").format(table),
                                    (task_id,)).fetchone(), message="the task in hostile names")
    assert row[0].split("\n")[-1] == f"{HOSTILE['user']}\tg'; DROP TABLE x; -- ü"


@contextlib.contextmanager
def primary_and_standby(cluster):
    """A primary (synchronous_commit on, the standby its synchronous one) and a streaming standby,
    each a cluster of its own on a free port; both destroyed afterwards."""
    primary = Cluster(Path(tempfile.mkdtemp(prefix="pgtask-primary-")), cluster.bindir, port=free_port())
    primary.init({"wal_level": "replica", "max_wal_senders": "4", "synchronous_standby_names": "'*'",
                  "synchronous_commit": "on"})
    primary.start()
    standby = Cluster(Path(tempfile.mkdtemp(prefix="pgtask-standby-")), cluster.bindir, port=free_port())
    standby.base.mkdir(exist_ok=True)
    standby.socket_dir.mkdir(exist_ok=True)
    from pgtask.cluster import grant_path
    grant_path(standby.base)
    grant_path(standby.socket_dir)
    try:
        standby.run_tool("pg_basebackup", "-D", str(standby.data), "-R", "-X", "stream", "-h", str(primary.socket_dir),
                     "-p", str(primary.port), "-U", "postgres")
        with open(standby.data / "postgresql.auto.conf", "a") as f:
            # once promoted it has no synchronous standby of its own to wait for
            f.write(f"port = {standby.port}\nunix_socket_directories = '{standby.socket_dir}'\n"
                    "synchronous_standby_names = ''\n")
        standby.start()
        with psycopg.connect(primary.conninfo(), autocommit=True) as conn:
            wait_for(lambda: conn.execute("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")
                     .fetchone()[0], message="streaming replication")
            conn.execute("CREATE TABLE runs (id bigint)")
        yield primary, standby
    finally:
        primary.destroy()
        standby.destroy()


def test_failover_to_promoted_standby(tmp_path, cluster):
    """A multi-host connection string with target_session_attrs=read-write follows a promotion."""
    services: list[Service] = []
    with primary_and_standby(cluster) as (primary, standby):
        try:
            dsn = (f"host={primary.socket_dir},{standby.socket_dir} port={primary.port},{standby.port} "
                   f"user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=2")
            svc = Service(cluster, "postgres", f'dsn = "{dsn}"\n', tmp=tmp_path)
            services.append(svc)
            svc.start()
            with psycopg.connect(primary.conninfo(), autocommit=True) as conn:
                conn.execute("INSERT INTO task (input) SELECT %s FROM generate_series(1, 300)",
                             (BODY.format(sleep=0.01),))
                wait_for(lambda: conn.execute("SELECT count(*) FROM runs").fetchone()[0] > 50, message="progress")
            primary.stop("immediate")
            standby.run_tool("pg_ctl", "-D", str(standby.data), "promote", "-w")
            with psycopg.connect(standby.conninfo(), autocommit=True) as conn:
                conn.execute("INSERT INTO task (input) SELECT %s FROM generate_series(1, 50)",
                             (BODY.format(sleep=0.01),))
                wait_for(lambda: conn.execute("SELECT count(*) FROM task WHERE state <> 'DONE'").fetchone()[0] == 0,
                         90, message="every task done on the new primary")
                counts = dict(conn.execute("SELECT id, count(*) FROM runs GROUP BY id").fetchall())
                ids = [r[0] for r in conn.execute("SELECT id FROM task").fetchall()]
            assert len(ids) == 350 and all(i in counts for i in ids), "a committed task was lost"
            assert svc.proc.poll() is None
            svc.stop()
        finally:
            for svc in services:
                if svc.proc is not None and svc.proc.poll() is None:
                    svc.kill()


def test_a_failover_under_load_logs_a_bounded_number_of_warnings(tmp_path, cluster):
    """The leader gone for 10 s under load (40 tasks running): the tasks whose sessions were lost
    each wait to write their requeue, retrying on their own, and maintenance's passes fail every
    second: the log has one warning for each, not one per task, pass and attempt, and the tasks end
    on the promoted standby."""
    with primary_and_standby(cluster) as (primary, standby):
        dsn = (f"host={primary.socket_dir},{standby.socket_dir} port={primary.port},{standby.port} "
               f"user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=2")
        svc = Service(cluster, "postgres", f'dsn = "{dsn}"\n[pgtask]\nreset_check = 2\ngrace = 5\n'
                      'log_level = "info"\n', tmp=tmp_path)
        try:
            svc.start()
            with psycopg.connect(primary.conninfo(), autocommit=True) as conn:
                conn.execute("""INSERT INTO task (input, "group", max)
                                SELECT %s, 'g' || (i %% 20), 2 FROM generate_series(1, 1000) i""",
                             (BODY.format(sleep=0.2),))
                wait_for(lambda: conn.execute("SELECT count(*) FROM runs").fetchone()[0] > 100, 60,
                         message="the load to get going")
            before = len(svc.output().splitlines())
            primary.stop("immediate")
            time.sleep(10)
            standby.run_tool("pg_ctl", "-D", str(standby.data), "promote", "-w")
            with psycopg.connect(standby.conninfo(), autocommit=True) as conn:
                wait_for(lambda: conn.execute("SELECT count(*) FROM task WHERE state = 'DONE'").fetchone()[0] > 990,
                         60, message="the tasks going on on the promoted standby")
                time.sleep(3)
                lines = svc.output().splitlines()[before:]
                warnings = [line for line in lines if " WARNING " in line]
                write_failed = [line for line in warnings if "write failed" in line]
                print(f"{len(lines)} log lines, {len(warnings)} warnings ({len(write_failed)} write failed)")
                assert "Traceback" not in "\n".join(lines)
                assert 1 <= len(write_failed) <= 3, "\n".join(write_failed)
                assert any("writes go through again" in line for line in lines)
                assert sum("pass failed" in line for line in warnings) <= 4, "\n".join(warnings)
                # rows whose claim or start answer was lost with the old primary are this live
                # instance's to reset (claim.Claimer.reset_own): none is left TAKE/WORK
                wait_for(lambda: conn.execute("SELECT count(*) FROM task WHERE state <> 'DONE'").fetchone()[0] == 0,
                         30, message="every task done on the promoted standby")
        finally:
            if svc.proc is not None and svc.proc.poll() is None:
                svc.kill()


def test_a_service_on_a_standby_waits_quietly_then_follows_its_promotion(tmp_path, cluster):
    """A connection string that names a standby alone (a replica behind a proxy, a host list without
    target_session_attrs): the service claims nothing there and waits with a few warnings -- no
    traceback, no error -- backing off; once that server is promoted, it runs the tasks, its listener
    LISTENing there, well before pg_work.restart (60 s) is over."""
    with primary_and_standby(cluster) as (primary, standby):
        first = Service(primary, "postgres", tmp=tmp_path).start()  # provisions the table
        first.stop()
        with psycopg.connect(primary.conninfo(), autocommit=True) as conn:
            conn.execute("INSERT INTO task (input) SELECT %s FROM generate_series(1, 50)", (BODY.format(sleep=0.01),))
            lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        with psycopg.connect(standby.conninfo(), autocommit=True) as conn:
            wait_for(lambda: conn.execute("SELECT pg_last_wal_replay_lsn() >= %s", (lsn,)).fetchone()[0],
                     message="the tasks on the standby")
        svc = Service(standby, "postgres", tmp=tmp_path)
        try:
            svc.start(wait=False)
            waited = time.monotonic() + 12
            while time.monotonic() < waited:
                assert svc.proc.poll() is None, svc.output()
                time.sleep(0.2)
            lines = [line for line in svc.output().splitlines() if " WARNING " in line or " ERROR " in line]
            print(f"{len(lines)} warnings in 12 s on the standby")
            assert "Traceback" not in svc.output() and not any(" ERROR " in line for line in lines), svc.output()
            assert len(lines) <= 40, svc.output()
            primary.stop("immediate")
            promoted = time.monotonic()
            standby.run_tool("pg_ctl", "-D", str(standby.data), "promote", "-w")
            with psycopg.connect(standby.conninfo(), autocommit=True) as conn:
                wait_for(lambda: conn.execute("SELECT count(*) FROM task WHERE state <> 'DONE'").fetchone()[0] == 0,
                         40, message=f"every task done once promoted:\n{svc.output()[-3000:]}")
                print(f"all done {time.monotonic() - promoted:.1f} s after the promotion")
                wait_for(lambda: conn.execute("SELECT count(*) FROM pg_stat_activity "
                                              "WHERE application_name LIKE 'pgtask listen%'").fetchone()[0] == 1,
                         10, message="the listener on the promoted server")
                assert conn.execute("SELECT count(DISTINCT id) FROM runs").fetchone()[0] == 50
            svc.stop()
        finally:
            if svc.proc is not None and svc.proc.poll() is None:
                svc.kill()


def test_a_failure_of_the_service_itself_fails_the_task_and_the_service_goes_on(db, monkeypatch):
    """A bug in the service while it runs one task (injected here: formatting a row raises) must
    not leave that task WORK for as long as the service runs: it fails with the reason, its session
    is dropped, and the service runs the next tasks -- local and remote."""

    real = Output.row

    def row(self, res, row=0):
        if res.get_value(row, 0) == b"explode":
            raise RuntimeError("injected")
        return real(self, res, row)

    monkeypatch.setattr(Output, "row", row)
    bad = [db.insert("SELECT 'explode' AS a"), db.insert("SELECT 'explode' AS a", remote=db.dsn)]
    good = [db.insert("SELECT 'fine' AS a"), db.insert("SELECT 'fine' AS a", remote=db.dsn)]
    db.run_scheduler(len(bad) + len(good))
    for task_id in bad:
        row = db.task(task_id)
        assert row["state"] == "FAIL", row
        assert row["error"] == ("ERROR:  pgtask failed running the task: RuntimeError: injected\n"
                                "STATEMENT:  SELECT 'explode' AS a"), row["error"]
    assert [db.task(i)["output"] for i in good] == ["fine", "fine"]


def test_a_cancel_that_arrives_late_does_not_reach_the_next_task(db, monkeypatch):
    """A STOP's cancel (the listener's, or the shutdown's) is on its way to the server while the
    task's query ends by itself, and the session's next task -- here the group's next one, started
    on the same session in the pass that finishes the first -- must not be the one it cancels.
    The delivery is held up here until the next task is WORK."""
    delivered = asyncio.Event()
    deliver = asyncio.Event()
    real = psycopg.AsyncConnection.cancel_safe

    async def late_cancel(self, *args, **kwargs):
        await deliver.wait()
        await real(self, *args, **kwargs)
        delivered.set()

    monkeypatch.setattr(psycopg.AsyncConnection, "cancel_safe", late_cancel)
    first = db.insert("SELECT pg_sleep(0.3)", group="g")
    following = db.insert("SELECT pg_sleep(1)", group="g")

    async def during(sched: Scheduler) -> None:
        await wait_for_async(lambda: (entry := sched.inflight.get(first)) is not None and entry[1] is not None,
                             message="the first task to run on its session")
        cancel = asyncio.create_task(sched.runner.cancel(first))
        await wait_for_async(lambda: db.task(following)["state"] == "WORK", message="the next task to be WORK")
        assert db.task(first)["state"] == "DONE"
        deliver.set()
        await cancel
        assert delivered.is_set()

    db.run_scheduler(2, during=during)
    rows = [db.task(first), db.task(following)]
    assert [r["state"] for r in rows] == ["DONE", "DONE"], rows[1]["error"]
    assert rows[0]["pid"] == rows[1]["pid"]  # the cancelled session ran the next task


def test_a_lost_control_connection_is_no_orphan_for_another_instance(db):
    """The liveness locks of a service's running tasks are on its control connection. When that
    connection is lost, its tasks still run on their sessions: another instance's orphan check
    must not reset them (they would run a second time beside the first, max 0 or not) while
    their sessions are connected. They finish once, and their results land."""
    db.execute("CREATE TABLE runs (id bigint)")
    with db.connect() as locker:
        locker.execute("SELECT pg_advisory_lock(4246)")  # the tasks run until this is released
        ids = [db.insert("INSERT INTO runs VALUES (current_setting('pg_task.id')::bigint); "
                         "SELECT pg_advisory_xact_lock_shared(4246)", group=f"g{i}") for i in range(3)]

        async def during(sched: Scheduler) -> None:
            await wait_for_async(lambda: db.value("SELECT count(*) FROM task WHERE state = 'WORK'") == 3,
                                 message="the three tasks to run")
            control = sched.control.conn.info.backend_pid
            db.execute("SELECT pg_terminate_backend(%s, 5000)", (control,))
            other = db.scheduler()  # another instance: it looks for orphans when it starts
            await other.start()
            try:
                await other.claimer.reset_orphans()
            finally:
                await other.close()
            assert [db.task(i)["state"] for i in ids] == ["WORK"] * 3  # not orphans: still running
            locker.execute("SELECT pg_advisory_unlock(4246)")

        db.run_scheduler(len(ids), during=during, timeout=30)
    assert [(r := db.task(i))["state"] for i in ids] == ["DONE"] * 3, r
    assert dict(db.execute("SELECT id, count(*) FROM runs GROUP BY id")) == dict.fromkeys(ids, 1)
    assert {db.task(i)["attempt"] for i in ids} == {1}
