"""Dependencies between tasks: a task inserted with "after" (ids) waits (WAIT) until every task it
names has ended DONE, counted down in the transaction that ends each one; a FAIL, GONE or STOP
among them -- or one deleted before it ended -- ends it GONE naming that task, and the tasks waiting
on it in turn. An insert naming a task that does not exist, or one of a role the new task's role is
not a member of, is refused."""

from __future__ import annotations

import json
import threading

import psycopg
import pytest
from support import killed_mid_task, race, wait_for
from test_authors import author, enqueue


def end(db, task_id: int, state: str = "DONE", error: str | None = None) -> None:
    """The task ended as the service ends it: claimed first, unless it expires (GONE)."""
    if state != "GONE":
        db.claim(task_id)
    db.execute("UPDATE task SET state = %s, stop = now(), error = %s WHERE id = %s", (state, error, task_id))


@pytest.mark.quick
def test_waits_until_every_dependency_ended_done(db):
    a, b = db.insert("SELECT 1"), db.insert("SELECT 2")
    c = db.insert("SELECT 3", after=[b, a, b], plan="2000-01-01")
    row = db.task(c)
    assert (row["state"], row["wait"], row["after"]) == ("WAIT", 2, sorted([a, b]))
    end(db, a)
    assert (db.task(c)["state"], db.task(c)["wait"]) == ("WAIT", 1)
    end(db, b)
    row = db.task(c)
    # released to run now: the plan it had passed while it waited, and its "active" counts from now
    assert row["state"] == "PLAN" and row["wait"] == 0
    assert db.value("SELECT plan > now() - interval '1 min' FROM task WHERE id = %s", (c,))
    assert db.value("SELECT count(*) FROM task WHERE state = 'WAIT'") == 0


def test_a_later_plan_is_kept(db):
    a = db.insert("SELECT 1")
    c = db.insert("SELECT 2", after=[a], plan="2999-01-01")
    end(db, a)
    row = db.task(c)
    assert row["state"] == "PLAN" and row["plan"].year == 2999


def test_a_dependency_done_already_is_met(db):
    a = db.insert("SELECT 1", delete=False)
    end(db, a)
    c = db.insert("SELECT 2", after=[a])
    assert (db.task(c)["state"], db.task(c)["wait"]) == ("PLAN", None)


@pytest.mark.parametrize("state", ["FAIL", "GONE", "STOP"])
def test_a_failure_cascades(db, state):
    a = db.insert("SELECT 1")
    b = db.insert("SELECT 2", after=[a])
    c = db.insert("SELECT 3", after=[b])
    other = db.insert("SELECT 4")
    d = db.insert("SELECT 5", after=[other, c])
    if state == "STOP":
        db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (a,))
    else:
        end(db, a, state, "boom")
    for waiter, cause, ended in ((b, a, state), (c, b, "GONE"), (d, c, "GONE")):
        row = db.task(waiter)
        assert (row["state"], row["error"]) == ("GONE", f"dependency {cause} ended {ended}"), row
        assert row["stop"] is not None
    assert db.task(other)["state"] == "PLAN"
    # naming an ended one: GONE at once
    e = db.insert("SELECT 6", after=[other, a])
    assert (db.task(e)["state"], db.task(e)["error"]) == ("GONE", f"dependency {a} ended {state}")


def test_a_dependency_deleted_before_it_ended(db):
    a = db.insert("SELECT 1")
    b = db.insert("SELECT 2", after=[a])
    c = db.insert("SELECT 3", after=[b])
    db.execute("DELETE FROM task WHERE id = %s", (a,))
    assert db.task(b)["error"] == f"dependency {a} was deleted before it ended"
    assert (db.task(c)["state"], db.task(c)["error"]) == ("GONE", f"dependency {b} ended GONE")


def test_missing_ids_and_bad_values_are_refused(db):
    a = db.insert("SELECT 1", delete=False)
    end(db, a)
    db.execute("DELETE FROM task WHERE id = %s", (a,))
    for ids in ([a], [10 ** 12], [-1]):
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match=f"task {ids[0]} named in after does not exist"):
            db.insert("SELECT 2", after=ids)
    for bad in ("ARRAY[NULL]::bigint[]", "ARRAY[[1, 2], [3, 4]]::bigint[]", "array_fill(1::bigint, ARRAY[10001])"):
        with pytest.raises(psycopg.errors.CheckViolation, match="invalid after of task"):
            db.execute(f"INSERT INTO task (input, after) VALUES ('SELECT 1', {bad})")
    assert db.value("SELECT count(*) FROM task") == 0
    empty = db.insert("SELECT 3", after=[])
    assert db.task(empty)["state"] == "PLAN"


def test_after_and_wait_are_not_the_users(db):
    a = db.insert("SELECT 1")
    b = db.insert("SELECT 2", after=[a])
    user = author(db, "after_mallory")
    db.execute("GRANT SELECT, UPDATE ON task TO after_mallory")
    with db.connect(user=user) as conn:
        mine = enqueue(conn, None)[0]
        with pytest.raises(psycopg.Error, match="immutable"):
            conn.execute("UPDATE task SET after = ARRAY[%s] WHERE id = %s", (mine, mine))
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="wait"):
            enqueue(conn, None, columns=json.dumps({"wait": 0}))
    with pytest.raises(psycopg.Error, match="immutable"):
        db.execute("UPDATE task SET after = NULL WHERE id = %s", (b,))
    assert db.task(b)["state"] == "WAIT"


def test_an_insert_setting_the_wait_columns_without_after_waits_for_nothing(db):
    """"wait" and "waited" are the service's: an INSERT that sets them (naming no task) gets neither,
    so the row neither waits nor makes its end release anything."""
    user = author(db, "after_trudy")
    with db.connect(user=user) as conn:
        conn.execute("INSERT INTO task (input, wait, waited) VALUES ('SELECT 1', 3, true)")
    row = db.task(db.value("SELECT id FROM task"))
    assert (row["state"], row["wait"], row["waited"]) == ("PLAN", None, None)


def test_another_roles_task_cannot_be_named(db):
    """The same error as for a task that does not exist: no role learns another's ids."""
    theirs = db.insert("SELECT 1")
    alice = author(db, "after_alice")
    with db.connect(user=alice) as conn:
        with pytest.raises(psycopg.errors.ForeignKeyViolation,
                           match=f"task {theirs} named in after does not exist, or is not a task of role after_alice"):
            enqueue(conn, None, columns=json.dumps({"after": [theirs]}))
        mine = enqueue(conn, None)[0]
        waiter = enqueue(conn, None, columns=json.dumps({"after": [mine]}))[0]
    assert db.task(waiter)["state"] == "WAIT" and db.task(waiter)["user"] == "after_alice"


def test_capacity_counts_waiting_tasks(db):
    db.execute("INSERT INTO task_group VALUES ('g', 2)")
    a = db.insert("SELECT 1")
    db.insert("SELECT 2", group="g", after=[a])
    db.insert("SELECT 3", group="g", after=[a])
    with pytest.raises(psycopg.Error, match="capacity 2"):
        db.insert("SELECT 4", group="g")


def test_a_repeat_waits_for_nothing(db):
    a = db.insert("SELECT 1", delete=False)
    end(db, a)
    b = db.insert("SELECT 2", after=[a], repeat="1 hour")
    db.run_scheduler(finished=2)
    nxt = db.execute("SELECT after, wait, state FROM task WHERE parent = %s", (b,))
    assert nxt == [(None, None, "PLAN")]


def test_a_diamond_runs_in_order(db):
    """a -> (b, c) -> d, run by the scheduler; a deleted at its finish still releases b and c."""
    db.execute("CREATE TABLE ran (id bigint, at timestamptz DEFAULT clock_timestamp())")
    log = "INSERT INTO ran (id) VALUES (current_setting('pg_task.id')::bigint)"
    a = db.insert(f"WITH i AS ({log} RETURNING id) SELECT id FROM i WHERE false")
    b = db.insert(log + "; SELECT pg_sleep(0.2)", after=[a], delete=False)
    c = db.insert(log, after=[a], delete=False)
    d = db.insert(log, after=[b, c], delete=False)
    db.run_scheduler(finished=3)
    order = [r[0] for r in db.execute("SELECT id FROM ran ORDER BY at")]
    assert len(order) == 4 and order[0] == a and order[-1] == d and set(order[1:3]) == {b, c}
    assert db.task(a) is None  # deleted at its finish: no output, no error


@pytest.mark.quick
def test_dependents_released_once_after_a_crash(db, service_factory):
    """The service SIGKILLed while the dependency runs: after the restart it runs again, and its
    dependents are released once and run once."""
    a = killed_mid_task(db, service_factory)
    waiters = [db.insert("INSERT INTO ran VALUES (-current_setting('pg_task.id')::bigint)", after=[a])
               for _ in range(3)]
    assert {db.task(w)["state"] for w in waiters} == {"WAIT"}
    service_factory(db.name)
    for w in waiters:
        db.wait_state(w, timeout=30)
    assert sorted(db.value("SELECT array_agg(id) FROM ran")) == sorted([a, *(-w for w in waiters)])
    assert [db.task(w)["attempt"] for w in waiters] == [1, 1, 1]


@pytest.mark.parametrize("first", ["insert", "finish"])
def test_an_insert_racing_the_finish_of_its_dependency(db, first):
    """Whichever transaction takes the dependency's row first, the other waits for it: the waiting
    task is released by the finish, or sees the dependency DONE at its insert."""
    a = db.insert("SELECT 1", delete=False)
    db.claim(a)
    finish = ("UPDATE task SET state = 'DONE', stop = now() WHERE id = %s", (a,))
    insert = ("INSERT INTO task (input, after) VALUES ('SELECT 2', ARRAY[%s]::bigint[])", (a,))
    held, later = (insert, finish) if first == "insert" else (finish, insert)
    with db.connect() as holder, db.connect() as other:
        holder.execute("BEGIN")
        holder.execute(*held)
        pid = other.info.backend_pid
        second = threading.Thread(target=lambda: other.execute(*later))
        second.start()
        wait_for(lambda: db.value("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)),
                 message="the second transaction to wait for the first's lock")
        holder.execute("COMMIT")
        second.join(30)
    assert db.task(a)["state"] == "DONE"
    assert db.execute("SELECT state::text FROM task WHERE id <> %s", (a,)) == [("PLAN",)]


def test_inserts_naming_the_same_dependency_take_turns(db):
    a = db.insert("SELECT 1")
    def insert(go):
        with db.connect() as conn:
            go()
            return conn.execute("INSERT INTO task (input, after) VALUES ('SELECT 2', ARRAY[%s]::bigint[]) RETURNING id",
                                (a,)).fetchone()[0]

    results, errors = race(8, insert)
    assert not errors and len(results) == 8, errors
    assert db.value("SELECT count(*) FROM task WHERE state = 'WAIT' AND wait = 1") == 8
    end(db, a)
    assert db.value("SELECT count(*) FROM task WHERE state = 'PLAN'") == 8
