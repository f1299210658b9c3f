"""Retention of finished task rows and expiry of idempotency reservations: independent, bounded,
children before parents, and deleting history never releases a live key."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from support import wait_for

from pgtask.maintenance import KeyExpiry, Maintenance, MaintenanceOptions, Retention

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def run(db, service, now=NOW, user=None):
    async def go():
        async with await psycopg.AsyncConnection.connect(db.dsn, autocommit=True,
                                                         **({"user": user} if user else {})) as conn:
            return await service.run_once(conn, now)
    return asyncio.run(go())


def finished(db, state="DONE", age_days=10, parent=None, n=1):
    stop = NOW - timedelta(days=age_days)
    ids = []
    for _ in range(n):
        tid = db.insert("SELECT 1", parent=parent) if parent else db.insert("SELECT 1")
        if state in ("DONE", "FAIL"):
            db.execute("UPDATE task SET state = 'TAKE' WHERE id = %s", (tid,))
        if state != "PLAN":
            db.execute("UPDATE task SET state = %s WHERE id = %s", (state, tid))
        finish(db, tid, stop if state != "PLAN" else None)
        ids.append(tid)
    return ids if n > 1 else ids[0]


def finish(db, task_id: int, stop: datetime | None) -> None:
    """Set a task's stop time, as its run would have (the progress guard set aside)."""
    db.execute("ALTER TABLE task DISABLE TRIGGER task_update")
    db.execute("UPDATE task SET stop = %s WHERE id = %s", (stop, task_id))
    db.execute("ALTER TABLE task ENABLE TRIGGER task_update")


@pytest.mark.quick
def test_deletes_old_finished_rows_in_batches(db):
    old = finished(db, "DONE", 10, n=25)
    fail = finished(db, "FAIL", 10)
    stop = finished(db, "STOP", 10)
    young = finished(db, "DONE", 1)
    live = finished(db, "PLAN", 10)
    r = Retention("public", "task", "7 days", batch=10, batches=2)
    assert run(db, r) == 20                       # bounded: 2 batches of 10
    assert run(db, r) == 7                        # the rest
    assert run(db, r) == 0
    left = {row[0] for row in db.execute("SELECT id FROM task")}
    assert left == {young, live}
    assert not set(old) & left and fail not in left and stop not in left
    assert run(db, Retention("public", "task", "")) == 0


def test_children_before_parents(db):
    parent = finished(db, "DONE", 10)
    kids = [finished(db, "DONE", 10, parent=parent) for _ in range(3)]
    grandkid = finished(db, "DONE", 10, parent=kids[0])
    # a batch of 2 holds the newest rows (the grandchild and a child): the parent waits
    r = Retention("public", "task", "7 days", batch=2, batches=1)
    seen = []
    while True:
        before = {row[0] for row in db.execute("SELECT id FROM task")}
        if run(db, r) == 0:
            break
        after = {row[0] for row in db.execute("SELECT id FROM task")}
        seen.append(before - after)
        # invariant: no remaining row points to a deleted parent
        assert db.value("SELECT count(*) FROM task c WHERE c.parent IS NOT NULL AND NOT EXISTS "
                        "(SELECT FROM task p WHERE p.id = c.parent)") == 0
    assert db.value("SELECT count(*) FROM task") == 0
    order = [i for batch in seen for i in batch]
    assert order.index(grandkid) < order.index(kids[0]) or any({grandkid, kids[0]} <= b for b in seen)
    assert order.index(parent) == len(order) - 1


def test_live_child_keeps_its_parent(db):
    parent = finished(db, "DONE", 10)
    child = finished(db, "PLAN", 10, parent=parent)
    young = finished(db, "DONE", 10)
    youngkid = finished(db, "DONE", 1, parent=young)
    assert run(db, Retention("public", "task", "7 days")) == 0
    assert {r[0] for r in db.execute("SELECT id FROM task")} == {parent, child, young, youngkid}


def test_a_recurring_tasks_history_goes_but_its_latest_runs(db):
    """Each run of a recurring task is the parent of the next: only a child that is queued,
    running or recent holds its parent, so the chain keeps its pending run, the runs younger than
    the retention and the one old run they name, and the older history goes. Rows that wait never
    fill a batch: a standalone old row goes with a batch of 2 (a rule over all descendants kept the
    whole chain, and its newest rows filled every batch, which then deleted nothing)."""
    alone = finished(db, "DONE", 30)
    chain = [finished(db, "DONE", 20)]
    for age in (19, 18, 17, 16, 1):
        chain.append(finished(db, "DONE", age, parent=chain[-1]))
    chain.append(finished(db, "PLAN", 0, parent=chain[-1]))
    assert run(db, Retention("public", "task", "7 days", batch=2, batches=10)) == 5
    assert {r[0] for r in db.execute("SELECT id FROM task")} == set(chain[-3:])
    assert alone not in {r[0] for r in db.execute("SELECT id FROM task")}


def test_a_stopped_task_still_running_is_not_deleted(db):
    """A task set to STOP while it runs has no stop until its query has ended (it holds its
    group's slot meanwhile): however old its plan, retention leaves it; once it has ended it goes."""
    tid = finished(db, "PLAN", 0)
    db.execute("ALTER TABLE task DISABLE TRIGGER task_update")
    db.execute("UPDATE task SET state = 'STOP', pid = pg_backend_pid(), start = %s, plan = %s WHERE id = %s",
               (NOW - timedelta(days=9), NOW - timedelta(days=10), tid))
    db.execute("ALTER TABLE task ENABLE TRIGGER task_update")
    assert run(db, Retention("public", "task", "7 days")) == 0
    db.execute("ALTER TABLE task DISABLE TRIGGER task_update")
    db.execute("UPDATE task SET stop = %s WHERE id = %s", (NOW - timedelta(days=8), tid))
    db.execute("ALTER TABLE task ENABLE TRIGGER task_update")
    assert run(db, Retention("public", "task", "7 days")) == 1


def test_key_expiry_is_independent_of_history(db):
    """Deleting task history does not release an unexpired key; an expired key of a finished (or
    deleted) task goes; an expired key of a queued task stays."""
    live_key = db.execute("SELECT id FROM task_enqueue('SELECT 1', 'live', '{}', '1 day')")[0][0]
    done_key = db.execute("SELECT id FROM task_enqueue('SELECT 1', 'done', '{}', '1 day')")[0][0]
    fresh = db.execute("SELECT id FROM task_enqueue('SELECT 1', 'fresh', '{}', '100 years')")[0][0]
    for tid in (done_key, fresh):
        db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (tid,))
    db.execute("ALTER TABLE task DISABLE TRIGGER task_update")
    db.execute("UPDATE task SET stop = %s WHERE state = 'STOP'", (NOW - timedelta(days=30),))
    db.execute("ALTER TABLE task ENABLE TRIGGER task_update")
    # history deleted first: the keys of deleted tasks are still reserved
    assert run(db, Retention("public", "task", "7 days")) == 2
    assert db.execute("SELECT created FROM task_enqueue('SELECT 1', 'fresh')") == [(False,)]
    assert db.execute("SELECT created FROM task_enqueue('SELECT 1', 'done')") == [(False,)]  # not expired yet (now())
    # key expiry at NOW (2030): 'done' expired and its task gone; 'live' expired but its task is queued
    out = run(db, KeyExpiry("public", "task", batch=1))
    assert out["keys"] == 1
    assert {r[0] for r in db.execute("SELECT key FROM task_key")} == {"live", "fresh"}
    assert db.execute("SELECT created FROM task_enqueue('SELECT 1', 'fresh')") == [(False,)]
    assert db.task(live_key)["state"] == "PLAN"  # its task untouched by either


def test_a_registered_service_role_expires_every_roles_keys(db):
    """Keys are each role's own (row-level security): a service running as a role provisioning
    registered expires the expired keys of every role; any other role reaches only its own."""
    for name in ("keys_svc", "keys_dan"):
        db.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{db.role(name)}"')
    db.execute("INSERT INTO task_service VALUES ('keys_svc')")  # as provisioning registers an entry's user
    with db.connect(user="keys_dan") as dan:
        dan.execute("SELECT * FROM task_enqueue('SELECT 1', 'dan', '{}', '1 day')")
    db.execute("SELECT * FROM task_enqueue('SELECT 1', 'admin', '{}', '1 day')")
    db.execute("UPDATE task SET state = 'STOP'")
    assert run(db, KeyExpiry("public", "task"), user="keys_dan")["keys"] == 1
    assert [r[0] for r in db.execute("SELECT key FROM task_key")] == ["admin"]
    assert run(db, KeyExpiry("public", "task"), user="keys_svc")["keys"] == 1
    assert db.value("SELECT count(*) FROM task_key") == 0


def test_retention_and_enqueue_interleaved(db):
    """History deletion, key expiry and idempotent inserts running at the same time: every key
    maps to exactly one task it created, never two live tasks for one key."""
    keys = [f"k{i}" for i in range(40)]
    stop = threading.Event()
    errors = []

    def producer():
        try:
            with db.connect() as conn:
                while not stop.is_set():
                    for k in keys:
                        tid, _ = conn.execute("SELECT * FROM task_enqueue('SELECT 1', %s, '{}', '0 sec')",
                                              (k,)).fetchone()
                        # finish it (so its key may expire and its row be deleted)
                        conn.execute("UPDATE task SET state = 'STOP' WHERE id = %s AND state = 'PLAN'", (tid,))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    def cleaner():
        try:
            r, k = Retention("public", "task", "0 sec", batch=7, batches=3), KeyExpiry("public", "task", batch=5)
            for _ in range(30):
                run(db, r, None)
                run(db, k, None)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=producer) for _ in range(2)] + [threading.Thread(target=cleaner)]
    for t in threads[2:]:
        t.start()
    for t in threads[:2]:
        t.start()
    threads[2].join(120)
    stop.set()
    for t in threads[:2]:
        t.join(60)
    assert not errors, errors
    # never two live tasks under one key at any time: at the end, each key's task exists or was deleted
    assert db.value("SELECT count(*) FROM task WHERE state IN ('PLAN', 'TAKE', 'WORK')") <= len(keys)
    assert db.value("SELECT count(*) FROM task_key") <= len(keys)


def test_failed_pass_never_blocks_claiming(db, service_factory):
    """A retention pass that fails (a user's trigger refuses the DELETE) fails every pass; tasks
    are claimed and run all the same. (A retention value that is no interval is refused at start,
    see test_cli_provision_json_and_config_errors.)"""
    db.execute("""CREATE FUNCTION keep_all() RETURNS trigger LANGUAGE plpgsql AS $$
                  BEGIN RAISE EXCEPTION 'kept'; END $$""")
    db.execute("CREATE TRIGGER keep_all BEFORE DELETE ON task FOR EACH ROW EXECUTE FUNCTION keep_all()")
    svc = service_factory(db.name, "[pgtask]\nreset_check = 0.5\nretention = '0 sec'\n"
                                   "retention_interval = 0.1\n")
    tid = db.insert("SELECT 42")
    assert db.wait_state(tid)["state"] == "DONE"
    wait_for(lambda: "retention pass failed" in svc.output(), message="a failed retention pass logged")


def test_service_deletes_history(db, service_factory):
    tid = db.insert("SELECT 1")
    svc = service_factory(db.name, "[pgtask]\nreset_check = 0.5\nretention = '0 sec'\nretention_interval = 0.1\n")
    wait_for(lambda: db.task(tid) is None, message=f"task {tid} deleted by retention:\n{svc.output()}")


def test_maintenance_options_from_config():
    o = MaintenanceOptions.from_service({"retention": "30 days", "schedule_batch": 5, "grace": 3.0})
    assert o.retention == "30 days" and o.schedule_batch == 5 and o.retention_batch == 1000
    Maintenance("dbname=x", "public", "task", o)
