"""The supervisor (pg_conf): entries of pg_task.json, SIGHUP, restarts; several service instances."""

import asyncio
import functools
import logging
import os
import signal
import sys
from pathlib import Path

import psycopg
import pytest
from support import wait_for, wait_for_async

from pgtask.config import ConfigError, from_dict
from pgtask.supervisor import Workers


def qualified(schema, table):
    return psycopg.sql.Identifier(schema, table).as_string(None)


def run_in(cluster, dbname, user, schema, table, input_text="SELECT current_user, current_database()"):
    with psycopg.connect(cluster.conninfo(dbname, user), autocommit=True) as conn:
        return conn.execute(f"INSERT INTO {qualified(schema, table)} (input) VALUES (%s) RETURNING id",
                            (input_text,)).fetchone()[0]


def state_in(cluster, dbname, schema, table, task_id):
    with psycopg.connect(cluster.conninfo(dbname), autocommit=True) as conn:
        return conn.execute(f"SELECT state, output FROM {qualified(schema, table)} WHERE id = %s",
                            (task_id,)).fetchone()


def done_in(cluster, dbname, schema, table, task_id):
    """The task's (state, output) once it is DONE, else None."""
    row = state_in(cluster, dbname, schema, table, task_id)
    return row if row is not None and row[0] == "DONE" else None


def test_four_entries_from_nothing_and_sighup(db, cluster, service_factory):
    suffix = db.name
    entries = [
        {"data": f"{suffix}_db1"},                                            # other database, user = data
        {"data": db.name, "user": f"{suffix}_u2"},                            # other user
        {"data": db.name, "user": "postgres", "schema": "s3"},                # other schema
        {"data": db.name, "user": "postgres", "table": "t4", "sleep": 100},  # other table and sleep
    ]

    def toml(items):
        inner = ", ".join("{" + ", ".join(f'{k} = {v!r}'.replace("'", '"') for k, v in e.items()) + "}"
                          for e in items)
        return f"[pg_task]\njson = [{inner}]\n"

    svc = service_factory(db.name, toml(entries))
    targets = [(f"{suffix}_db1", f"{suffix}_db1", "public", "task"), (db.name, f"{suffix}_u2", "public", "task"),
               (db.name, "postgres", "s3", "task"), (db.name, "postgres", "public", "t4")]
    for dbname, user, schema, table in targets:
        if user != "postgres" and dbname == db.name:
            # the table already existed (the template's); let the new role use it
            db.execute(f'GRANT INSERT, SELECT ON task TO "{user}"; GRANT USAGE ON SEQUENCE task_id_seq TO "{user}"')
        task_id = run_in(cluster, dbname, user, schema, table)
        row = wait_for(functools.partial(done_in, cluster, dbname, schema, table, task_id),
                       message=f"a task in {dbname} {schema}.{table}")
        assert row[1].split("\n")[-1] == f"{user}\t{dbname}"
    # the new database is owned by its role, and so is its table
    with psycopg.connect(cluster.conninfo(f"{suffix}_db1"), autocommit=True) as conn:
        assert conn.execute("SELECT tableowner FROM pg_tables WHERE tablename = 'task'").fetchone()[0] == f"{suffix}_db1"

    # SIGHUP: remove the third entry, add a fifth
    entries = [entries[0], entries[1], entries[3], {"data": db.name, "user": "postgres", "table": "t5"}]
    svc.write_config(toml(entries))
    svc.signal(signal.SIGHUP)
    wait_for(lambda: "claiming: postgres@" + db.name + " public.t5" in svc.output(), 20,
             message="the added entry to start")
    task_id = run_in(cluster, db.name, "postgres", "public", "t5")
    wait_for(lambda: state_in(cluster, db.name, "public", "t5", task_id)[0] == "DONE", message="t5 task")
    wait_for(lambda: "entry removed" in svc.output(), message="the removed entry to stop")
    task_id = run_in(cluster, db.name, "postgres", "s3", "task")
    with pytest.raises(AssertionError):
        wait_for(lambda: state_in(cluster, db.name, "s3", "task", task_id)[0] != "PLAN", 2)


def test_bad_config_on_sighup_keeps_the_old_one(db, service_factory):
    svc = service_factory(db.name)
    svc.write_config("[pg_task]\nsleep = 'soon'\n")
    svc.signal(signal.SIGHUP)
    wait_for(lambda: "configuration not reloaded" in svc.output() and "pg_task.sleep" in svc.output(),
             message="the error to be logged")
    assert db.wait_state(db.insert("SELECT 1"))["state"] == "DONE"


def test_a_reload_while_the_server_is_read_only_is_a_warning_and_applied_later(db, service_factory):
    """As during a failover: the re-read configuration cannot be applied for now (a new session is
    read-only), which is a warning naming when it is tried again; the next re-read applies it."""
    svc = service_factory(db.name, "[pg_conf]\nrestart = 1\n")
    db.execute(f'ALTER DATABASE "{db.name}" SET default_transaction_read_only = on')
    try:
        svc.signal(signal.SIGHUP)
        wait_for(lambda: "configuration not applied yet, the server is unavailable or read-only (tried again in 1s)"
                 in svc.output(), message=f"the warning:\n{svc.output()[-3000:]}")
        assert " ERROR " not in svc.output(), svc.output()[-3000:]
    finally:
        db.execute(f'ALTER DATABASE "{db.name}" RESET default_transaction_read_only')
    svc.write_config('[pg_conf]\nrestart = 1\n[pg_task]\njson = [{data = "%s"}, {data = "%s", table = "later"}]\n'
                     % (db.name, db.name))
    wait_for(lambda: db.value("SELECT to_regclass('later') IS NOT NULL"), 20, message=f"the entry applied:\n"
             f"{svc.output()[-3000:]}")
    assert db.wait_state(db.insert("SELECT 1"))["state"] == "DONE"


@pytest.mark.quick
def test_sighup_does_not_interrupt_running_tasks(db, service):
    task_id = db.insert("SELECT pg_sleep(1.5)")
    db.wait_state(task_id, states=("WORK",))
    service.signal(signal.SIGHUP)
    row = db.wait_state(task_id)
    assert row["state"] == "DONE" and row["attempt"] == 1


def test_two_instances_share_the_work(db, service_factory):
    db.execute("CREATE TABLE runs (id bigint, at timestamptz, until timestamptz)")
    body = ("INSERT INTO runs SELECT current_setting('pg_task.id')::bigint, clock_timestamp(), "
            "clock_timestamp() + '0.05 s'; SELECT pg_sleep(0.05)")
    ids = [db.insert(body, group=f"g{i % 4}", max=1) for i in range(120)]
    a = service_factory(db.name)
    b = service_factory(db.name)
    wait_for(lambda: db.value("SELECT count(*) FROM task WHERE state = 'DONE'") == len(ids), 60,
             message="all tasks done")
    assert db.value("SELECT count(*) FROM runs") == len(ids)            # none ran twice
    assert db.value("SELECT count(DISTINCT id) FROM runs") == len(ids)  # none was lost
    # max = 1 held across both instances: never more than 2 of a group at once
    overlap = db.value("""SELECT max((SELECT count(*) FROM runs b JOIN task tb ON tb.id = b.id
                          WHERE tb."group" = ta."group" AND b.at <= a.at AND b.until > a.at))
                          FROM runs a JOIN task ta ON ta.id = a.id""")
    assert overlap <= 2
    pids = db.value("SELECT count(DISTINCT pid) FROM task")
    assert pids >= 2
    assert a.proc.poll() is None and b.proc.poll() is None


def test_failing_entry_is_restarted_and_others_run(db, cluster, service_factory):
    db.execute("CREATE VIEW t6 AS SELECT 1 AS x")  # blocks creating table t6
    svc = service_factory(db.name, f'[pg_task]\njson = [{{data = "{db.name}", user = "postgres"}}, '
                                   f'{{data = "{db.name}", user = "postgres", table = "t6"}}]\n'
                                   "[pg_work]\nrestart = 1\n")
    assert db.wait_state(db.insert("SELECT 1"))["state"] == "DONE"  # the healthy entry runs
    wait_for(lambda: "scheduler failed" in svc.output(), message="the failing scheduler to be logged")
    db.execute("DROP VIEW t6")
    wait_for(lambda: db.value("SELECT to_regclass('t6') IS NOT NULL"), 20, message="the restarted scheduler")
    task_id = run_in(cluster, db.name, "postgres", "public", "t6")
    wait_for(lambda: state_in(cluster, db.name, "public", "t6", task_id)[0] == "DONE", message="t6 task")


# -- several processes (pgtask.processes) ---------------------------------------------------------

def _pid_gone(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # ended, not yet reaped


def test_processes_share_the_work_and_pg_task_run(db, service_factory):
    """processes = 2 with pg_task.run = 3: both processes claim, and the service as a whole never
    has more than 3 tasks in flight (the first process's part is 2, the worker's 1)."""
    db.execute("CREATE TABLE seen (claimer int, in_flight bigint)")
    # the instance whose token begins the task's lease: the control connection of the process that claimed it
    body = ("INSERT INTO seen SELECT (SELECT i.pid FROM task t JOIN task_instance i ON i.token = left(t.lease::text, 18) "
            "WHERE t.id = current_setting('pg_task.id')::bigint), "
            "(SELECT count(*) FROM task WHERE state IN ('TAKE', 'WORK')); SELECT pg_sleep(0.3)")
    svc = service_factory(db.name, "[pg_task]\nrun = 3\n[pgtask]\nprocesses = 2\nreset_check = 0.5\ngrace = 5\n")
    wait_for(lambda: svc.running_workers(1), 30, message=f"the worker process:\n{svc.output()}")
    ids = [db.insert(body, group=f"g{i}") for i in range(12)]
    for task_id in ids:
        assert db.wait_state(task_id, timeout=30)["state"] == "DONE"
    assert db.value("SELECT count(DISTINCT claimer) FROM seen") == 2   # two control connections claimed
    assert db.value("SELECT max(in_flight) FROM seen") == 3            # 2 + 1, never more
    assert "[worker 1/2]" in svc.output()


def test_a_worker_process_is_started_again_and_stops_with_the_service(db, service_factory):
    svc = service_factory(db.name, "[pg_work]\nrestart = 1\n[pgtask]\nprocesses = 2\nreset_check = 0.5\n"
                                   "grace = 5\n")
    wait_for(lambda: svc.running_workers(1), 30, message=f"the worker process:\n{svc.output()}")
    [first] = svc.workers()
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: svc.workers() and svc.workers() != [first] and "pgtask running" in svc.output().split(
        "starting it again")[-1], 30, message=f"the worker started again:\n{svc.output()}")
    assert "failed: pid " in svc.output() and "exited with status -9; starting it again in 1.0s" in svc.output()
    assert db.wait_state(db.insert("SELECT 1"))["state"] == "DONE"
    [second] = svc.workers()
    assert svc.stop() == 0
    assert _pid_gone(second)


def test_a_worker_stops_when_the_first_process_is_gone(db, service_factory):
    svc = service_factory(db.name, "[pgtask]\nprocesses = 2\nreset_check = 0.5\ngrace = 5\n")
    wait_for(lambda: svc.running_workers(1), 30, message=f"the worker process:\n{svc.output()}")
    [worker] = svc.workers()
    svc.proc.kill()  # the first process only
    svc.proc.wait()
    wait_for(lambda: _pid_gone(worker), 20, message=f"the worker to stop:\n{svc.output()}")
    assert "the service's first process is gone: stopping" in svc.output()


def test_a_worker_left_no_part_of_run_stops_its_scheduler(db, service_factory):
    """pg_task.run 2 -> 1 on SIGHUP with two processes: the worker's part is 0 and it says so (the
    entry is still there), while the first process runs the tasks."""
    conf = "[pg_task]\nrun = {}\n[pgtask]\nprocesses = 2\nreset_check = 0.5\ngrace = 5\n"
    svc = service_factory(db.name, conf.format(2))
    wait_for(lambda: svc.running_workers(1), 30, message=f"the worker process:\n{svc.output()}")
    svc.write_config(conf.format(1))
    svc.signal(signal.SIGHUP)
    wait_for(lambda: any("[worker 1/2]" in line and "no part of pg_task.run left for this process "
                         "(run 1, 2 processes): stopping its scheduler" in line
                         for line in svc.output().splitlines()), 30, message=f"the worker's log:\n{svc.output()}")
    assert "entry removed" not in svc.output()
    assert db.wait_state(db.insert("SELECT 1"))["state"] == "DONE"


def test_a_worker_that_cannot_be_started_is_tried_again(monkeypatch, caplog):
    """Starting a worker fails (its interpreter is gone -- a venv replaced under a running service --
    or no fork is allowed): logged, tried again after pg_work.restart, ended by the service's stop."""
    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")

    async def go() -> None:
        workers = Workers(None, "")
        workers.restart_after = 0.01
        await workers.resize(2, grace=1)
        await wait_for_async(lambda: sum("could not be started" in r.getMessage() for r in caplog.records) >= 2)
        assert not workers.keepers[1].done()  # still trying
        await workers.stop(1)
        assert not workers.keepers and not workers.procs

    with caplog.at_level(logging.ERROR, logger="pgtask.supervisor"):
        asyncio.run(go())
    assert "worker process 1/2 failed: it could not be started ([Errno 2] No such file or directory" in caplog.text


@pytest.mark.parametrize("value, message", [(0, "must be >= 1, got 0"), ("2", "expected int, got '2'")])
def test_a_wrong_processes_is_refused_naming_the_key(value, message):
    with pytest.raises(ConfigError, match=f"^pgtask.processes: {message}$"):
        from_dict({"pgtask": {"processes": value}})
