"""Admission control: task_group.capacity bounds a group's PLAN + TAKE + WORK rows (and STOP rows
whose task still runs); a full group
refuses an insert with SQLSTATE PT001 naming the group and its limit."""

from __future__ import annotations

import threading

import psycopg
import pytest
from support import wait_for


def test_ten_concurrent_inserters_capacity_five(db):
    db.execute("INSERT INTO task_group VALUES ('mail', 5)")
    barrier = threading.Barrier(10)
    admitted, refused, other = [], [], []
    conns = [db.connect() for _ in range(10)]

    def worker(conn):
        try:
            with conn.transaction():
                barrier.wait()
                # all ten inserts are in flight at once; they queue on the group's row lock
                tid = conn.execute("""INSERT INTO task (input, "group") VALUES ('SELECT 1', 'mail') RETURNING id""").fetchone()[0]
            admitted.append(tid)
        except psycopg.Error as exc:
            (refused if exc.sqlstate == "PT001" else other).append(exc)

    threads = [threading.Thread(target=worker, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for c in conns:
        c.close()
    assert not other, other
    assert len(admitted) == 5 and len(refused) == 5
    assert db.value("""SELECT count(*) FROM task WHERE "group" = 'mail'""") == 5
    msg = refused[0]
    assert str(msg).startswith('group "mail" is full: capacity 5')
    assert "5 task(s) of group 'mail' are queued, waiting or running" in msg.diag.message_detail


def test_capacity_counts_queued_and_running_rows_only(db):
    db.execute("INSERT INTO task_group VALUES ('g', 2)")
    a = db.insert("SELECT 1", group="g")
    db.insert("SELECT 1", group="g")
    with pytest.raises(psycopg.Error) as err:
        db.insert("SELECT 1", group="g")
    assert err.value.sqlstate == "PT001"
    db.execute("UPDATE task SET state = 'TAKE' WHERE id = %s", (a,))
    with pytest.raises(psycopg.Error):
        db.insert("SELECT 1", group="g")
    # STOP while it runs: its task has not ended (a pid, no stop), it still counts
    db.execute("UPDATE task SET state = 'WORK', pid = pg_backend_pid() WHERE id = %s", (a,))
    db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (a,))
    with pytest.raises(psycopg.Error, match="capacity 2"):
        db.insert("SELECT 1", group="g")
    db.execute("UPDATE task SET stop = now() WHERE id = %s", (a,))
    c = db.insert("SELECT 1", group="g")        # a stopped row whose task ended frees a slot
    db.execute("UPDATE task SET state = 'TAKE' WHERE id = %s", (c,))
    db.execute("UPDATE task SET state = 'DONE' WHERE id = %s", (c,))
    d = db.insert("SELECT 1", group="g")        # so does a finished one
    db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (d,))
    db.insert("SELECT 1", group="g")            # and one stopped before it ran
    db.insert("SELECT 1", group="other")        # other groups: unlimited
    db.execute("UPDATE task_group SET capacity = 0 WHERE \"group\" = 'g'")
    with pytest.raises(psycopg.Error, match='capacity 0'):
        db.insert("SELECT 1", group="g")
    db.execute("DELETE FROM task_group")
    db.insert("SELECT 1", group="g")            # no row: no limit


def test_multi_row_insert_counts_its_own_rows(db):
    db.execute("INSERT INTO task_group VALUES ('g', 3)")
    with pytest.raises(psycopg.Error) as err:
        db.execute("""INSERT INTO task (input, "group") SELECT 'SELECT 1', 'g' FROM generate_series(1, 4)""")
    assert err.value.sqlstate == "PT001"
    assert db.value("SELECT count(*) FROM task") == 0
    db.execute("""INSERT INTO task (input, "group") SELECT 'SELECT 1', 'g' FROM generate_series(1, 3)""")


def test_enqueue_into_full_group_keeps_no_reservation(db):
    db.execute("INSERT INTO task_group VALUES ('g', 1)")
    db.execute("""SELECT * FROM task_enqueue('SELECT 1', 'a', '{"group": "g"}')""")
    with pytest.raises(psycopg.Error) as err:
        db.execute("""SELECT * FROM task_enqueue('SELECT 1', 'b', '{"group": "g"}')""")
    assert err.value.sqlstate == "PT001"
    assert [r[0] for r in db.execute("SELECT key FROM task_key")] == ["a"]
    # the same key again while the group is full: the original id, no error
    assert db.execute("""SELECT created FROM task_enqueue('SELECT 1', 'a', '{"group": "g"}')""") == [(False,)]


def test_repeatable_read_does_not_over_admit(db):
    """Under REPEATABLE READ the second of two racing admissions fails with 40001 instead."""
    db.execute("INSERT INTO task_group VALUES ('g', 1)")
    a, b = db.connect(), db.connect()
    a.isolation_level = b.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    a.autocommit = b.autocommit = False
    b.execute("SELECT 1")   # b's snapshot is taken before a commits
    a.execute("""INSERT INTO task (input, "group") VALUES ('SELECT 1', 'g')""")
    a.commit()
    with pytest.raises(psycopg.Error) as err:
        b.execute("""INSERT INTO task (input, "group") VALUES ('SELECT 1', 'g')""")
    assert err.value.sqlstate in ("40001", "PT001")
    b.rollback()
    a.close(), b.close()
    assert db.value("SELECT count(*) FROM task") == 1


def test_unlimited_groups_take_no_row_lock(db):
    """An insert into a group without a capacity row locks nothing in task_group, while a
    limited group's insert holds its row until commit."""
    db.execute("INSERT INTO task_group VALUES ('limited', 10)")
    with db.connect() as conn:
        with conn.transaction():
            conn.execute("""INSERT INTO task (input, "group") VALUES ('SELECT 1', 'free')""")
            modes = db.execute("""SELECT DISTINCT mode FROM pg_locks WHERE pid = %s
                AND relation IN ('task_group'::regclass, 'task_group_pkey'::regclass)""", (conn.info.backend_pid,))
            assert modes == [("AccessShareLock",)]   # a plain read: no RowShareLock, no row lock
            assert db.value("SELECT count(*) FROM (SELECT FROM task_group FOR UPDATE SKIP LOCKED) x") == 1
        with conn.transaction():
            conn.execute("""INSERT INTO task (input, "group") VALUES ('SELECT 1', 'limited')""")
            assert db.value("SELECT count(*) FROM (SELECT FROM task_group FOR UPDATE SKIP LOCKED) x") == 0
        assert db.value("SELECT count(*) FROM (SELECT FROM task_group FOR UPDATE SKIP LOCKED) x") == 1


def test_repeat_of_a_finished_task_is_admitted(db, service):
    """finish_repeat inserts the next occurrence while the finished row leaves the count: a full
    group (capacity lowered meanwhile) does not make the service's finish fail."""
    db.execute("INSERT INTO task_group VALUES ('g', 1)")
    tid = db.insert("SELECT 1", group="g", repeat="1 hour")
    db.wait_state(tid)
    db.execute("UPDATE task_group SET capacity = 0")
    wait_for(lambda: db.value("SELECT count(*) FROM task WHERE parent = %s", (tid,)) == 1)


def test_naming_a_finished_repeating_parent_admits_no_user_insert(db):
    """The repeat's exemption is the service's alone: a role that names a finished repeating task
    as its row's parent is counted like any other insert -- also under SET ROLE in a superuser's
    session (the executor's set_role mode)."""
    db.role("crowd")
    db.execute("INSERT INTO task_group VALUES ('g', 2)")
    parent = db.insert("SELECT 1", group="g", repeat="1 day")
    db.claim(parent)
    db.execute("UPDATE task SET state = 'DONE' WHERE id = %s", (parent,))
    insert = "INSERT INTO task (input, \"group\", parent, repeat) VALUES ('SELECT 1', 'g', %s, %s)"
    with db.connect("crowd") as crowd:
        crowd.execute(insert, (None, "0 sec"))
        crowd.execute(insert, (None, "0 sec"))
        for row in ((None, "0 sec"), (parent, "1 day")):
            with pytest.raises(psycopg.Error, match='group "g" is full') as refused:
                crowd.execute(insert, row)
            assert refused.value.sqlstate == "PT001"
    with db.connect() as service, service.transaction():
        service.execute('SET ROLE "crowd"')
        with pytest.raises(psycopg.Error, match='group "g" is full'):
            service.execute(insert, (parent, "1 day"))
    assert db.value("SELECT count(*) FROM task WHERE \"group\" = 'g' AND state = 'PLAN'") == 2
