"""An ordinary role with only the documented grant (GRANT task_user TO alice) schedules work as
docs/schedules.md shows -- keyed enqueue, schedules, group capacity -- and still cannot see or
touch another role's tasks, reservations or schedules."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from psycopg import sql
from support import provision_again, race
from test_retention import NOW, finish, run
from test_schedules import T0, materialise, sched

from pgtask import names, provision_beside
from pgtask.maintenance import Retention

ROLE = names.author_role("task")


def author(db, name: str, role: str = ROLE) -> str:
    """A LOGIN role whose one privilege is membership in a table's authors' role."""
    db.execute(f"""DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') THEN
                   CREATE ROLE "{name}" LOGIN; END IF; END$$""")
    db.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(role), sql.Identifier(name)))
    return name


def enqueue(conn, key, input_text="SELECT 1", columns="{}"):
    return conn.execute("SELECT id, created FROM task_enqueue(%s, %s, %s)", (input_text, key, columns)).fetchone()


def test_provisioning_creates_the_authors_role(db):
    """A table provisioned before gets the role's privileges, the view and the schedules' policy."""
    assert db.execute("SELECT rolcanlogin, rolsuper FROM pg_roles WHERE rolname = %s", (ROLE,)) == [(False, False)]
    db.execute(f"REVOKE ALL ON task_key, task_schedule, task_group FROM {ROLE}; REVOKE INSERT ON task FROM {ROLE}; "
               "DROP VIEW task_open; DROP POLICY task_schedule_role ON task_schedule; "
               "ALTER TABLE task_schedule DISABLE ROW LEVEL SECURITY")
    actions = provision_again(db).actions
    for action in ("created view public.task_open", "created policy task_schedule_role on public.task_schedule",
                   "granted INSERT on table task to task_user", "granted SELECT on table task_open to task_user",
                   "granted SELECT, INSERT, UPDATE, DELETE on table task_schedule to task_user"):
        assert action in actions, actions
    assert provision_again(db).actions == []


@pytest.mark.parametrize("schema,table", [("it's a schema", "my table;"), ("ünï", "ü" * 25 + "\"x"),
                                          ("public", "l" * 53),  # cut names that would merge: hashed
                                          ("public", "l" * 63)])  # the longest: names beside it hashed
def test_hostile_names(db, schema, table):
    """The role is named after the table, whatever its characters; an author uses it there."""
    provision_again(db, schema, table)
    routines = {names.function_name(table, kind) for kind in provision_beside.EXTRA_FUNCTIONS}
    assert db.value("SELECT count(*) FROM pg_proc WHERE pronamespace = %s::regnamespace AND proname = ANY(%s)",
                    (sql.Identifier(schema).as_string(None), list(routines))) == len(provision_beside.EXTRA_FUNCTIONS)
    role = names.author_role(table)
    assert len(role.encode()) <= 63 and db.value("SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)) == 1
    name = author(db, "authors_carol", role)
    ident = lambda suffix: sql.Identifier(schema, names.function_name(table, suffix))
    with db.connect(user=name) as conn:
        assert conn.execute(sql.SQL("SELECT created FROM {}('SELECT 1', 'k')").format(ident("enqueue"))).fetchone() \
            == (True,)
        conn.execute(sql.SQL("INSERT INTO {} (name, cron, input) VALUES ('s', '0 0 * * 5L', 'SELECT 1')").format(
            ident("schedule")))
    assert provision_again(db, schema, table).actions == []


def test_a_reserved_role_name_gets_no_role(db):
    """A table named pg_...: PostgreSQL reserves the role name; the table is provisioned without it."""
    assert provision_again(db, "public", "pg_q").changed
    assert db.value("SELECT count(*) FROM pg_roles WHERE rolname = 'pg_q_user'") == 0
    assert db.execute("SELECT * FROM pg_q_enqueue('SELECT 1', 'k')")[0][1] is True


def test_keyed_enqueue_as_an_author(db):
    alice = author(db, "authors_alice")
    with db.connect(user=alice) as conn:
        first = enqueue(conn, "k1")
        assert first[1] is True and enqueue(conn, "k1") == (first[0], False)
        plain = conn.execute("INSERT INTO task (input) VALUES ('SELECT 2')").rowcount
        assert plain == 1
        # the key reserved by hand, as docs/schedules.md shows
        with conn.transaction():
            reserved = conn.execute("""INSERT INTO task_key (key, task, expires)
                VALUES ('k', nextval('task_id_seq'), now() + '7 days') ON CONFLICT DO NOTHING RETURNING task""").fetchone()
            conn.execute("INSERT INTO task (id, input) VALUES (%s, 'SELECT 3')", reserved)
        assert conn.execute("SELECT id FROM task_open ORDER BY id").fetchall()[0] == (first[0],)
        # the refusals of a task insert: a state but PLAN or STOP, a pid, a progress column
        for columns in ("(input, state) VALUES ('SELECT 1', 'DONE')", "(input, pid) VALUES ('SELECT 1', 1)"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied to insert task"):
                conn.execute(f"INSERT INTO task {columns}")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="cannot set task column"):
            enqueue(conn, "k2", columns='{"state": "DONE"}')
    assert db.task(first[0])["user"] == alice and db.value("SELECT count(*) FROM task") == 3
    assert db.task(reserved[0])["user"] == alice


def test_concurrent_keyed_enqueue_as_an_author(db):
    alice = author(db, "authors_alice")

    def work(start):
        with db.connect(user=alice) as conn:
            start()
            return enqueue(conn, "same")

    results, errors = race(8, work)
    assert not errors, errors
    assert sum(1 for _, created in results if created) == 1 and len({i for i, _ in results}) == 1
    assert db.value("SELECT count(*) FROM task") == 1


def test_keyed_enqueue_as_an_author_after_retention(db):
    alice = author(db, "authors_alice")
    with db.connect(user=alice) as conn:
        held = enqueue(conn, "k1", columns='{"delete": false}')[0]
    for state in ("TAKE", "DONE"):
        db.execute("UPDATE task SET state = %s WHERE id = %s", (state, held))
    finish(db, held, NOW - timedelta(days=10))
    assert run(db, Retention("public", "task", "7 days")) == 1
    with db.connect(user=alice) as conn:
        assert enqueue(conn, "k1") == (held, False)    # the reservation outlives the history
    db.execute("UPDATE task_key SET expires = now() - interval '1 sec'")
    with db.connect(user=alice) as conn:
        again = enqueue(conn, "k1")
    assert again[1] is True and again[0] != held and db.task(again[0])["user"] == alice


def test_an_author_cannot_see_or_touch_other_roles_rows(db):
    alice, bob = author(db, "authors_alice"), author(db, "authors_bob")
    with db.connect(user=bob) as conn:
        bobs = enqueue(conn, "k1", "SELECT 'secret'")[0]
        conn.execute("INSERT INTO task_schedule (name, cron, input) VALUES ('bob-s', '@daily', 'SELECT 1')")
    with db.connect(user=alice) as conn:
        for read in ("SELECT input, output FROM task", "SELECT id FROM task", "SELECT * FROM task_occurrence"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
                conn.execute(read)
        for change in ("UPDATE task SET state = 'STOP'", "DELETE FROM task"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table task"):
                conn.execute(change)
        assert conn.execute("SELECT count(*) FROM task_key").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM task_schedule").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM task_open").fetchone() == (0,)
        assert conn.execute("SELECT * FROM task_schedule_next('bob-s')").fetchall() == []
        assert conn.execute("UPDATE task_schedule SET input = 'SELECT 2', paused = true").rowcount == 0
        assert conn.execute("DELETE FROM task_schedule").rowcount == 0
        assert conn.execute("UPDATE task_key SET expires = now()").rowcount == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            conn.execute("INSERT INTO task_key (\"user\", key, task, expires) VALUES (%s, 'k2', %s, now())",
                         (bob, bobs))
        # a leaky function of her own in a WHERE on the view sees her rows only (security_barrier)
        conn.execute("""CREATE FUNCTION pg_temp.peek(bigint) RETURNS boolean LANGUAGE plpgsql COST 0.0001
                        AS $$BEGIN RAISE NOTICE 'saw %', $1; RETURN true; END$$""")
        seen = []
        conn.add_notice_handler(lambda diag: seen.append(diag.message_primary))
        conn.execute("SELECT * FROM task_open WHERE pg_temp.peek(id)")
        assert seen == []
        # her own reservation pointed at bob's queued task does not make his task hold her key
        conn.execute("INSERT INTO task_key (key, task, expires) VALUES ('k3', %s, now() - interval '1 sec')",
                     (bobs,))
        mine = enqueue(conn, "k3")
        assert mine[1] is True and mine[0] != bobs
        # a schedule naming bob as its role is hers
        conn.execute("""INSERT INTO task_schedule (name, cron, input, "user") VALUES ('a', '@daily', 'SELECT 1', %s)""",
                     (bob,))
    assert sched(db, "a")["user"] == alice
    assert db.task(bobs)["input"] == "SELECT 'secret'" and db.task(bobs)["state"] == "PLAN"
    assert sched(db, "bob-s")["input"] == "SELECT 1" and not sched(db, "bob-s")["paused"]
    assert db.execute('SELECT "user", key, task FROM task_key WHERE "user" = %s', (bob,)) == [(bob, "k1", bobs)]


def test_schedules_as_an_author(db):
    alice = author(db, "authors_alice")
    with db.connect(user=alice) as conn:
        conn.execute("""INSERT INTO task_schedule (name, cron, timezone, input, columns)
                        VALUES ('digest', '0 9 * * MON-FRI', 'America/New_York', 'SELECT 1',
                                '{"group": "mail", "timeout": "5 min"}')""")
    materialise(db, T0)
    with db.connect(user=alice) as conn:
        assert len(conn.execute("SELECT * FROM task_schedule_next('digest', 5)").fetchall()) == 5
        conn.execute("UPDATE task_schedule SET paused = true WHERE name = 'digest'")
        conn.execute("UPDATE task_schedule SET paused = false WHERE name = 'digest'")
        # the refusals docs/schedules.md shows
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="progress of schedule"):
            conn.execute("UPDATE task_schedule SET cursor = now() - interval '30 days' WHERE name = 'digest'")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="invalid time zone"):
            conn.execute("INSERT INTO task_schedule (name, cron, timezone, input) VALUES ('x', '@daily', 'Mars/Base', '1')")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="cannot set task column"):
            conn.execute("""INSERT INTO task_schedule (name, cron, input, columns) VALUES ('x', '@daily', '1', '{"pid": 1}')""")
    materialise(db, T0)
    r = materialise(db, T0 + timedelta(days=1))    # 2026-06-02 09:00 New York is due
    assert len(r.created) == 1
    task = db.task(r.created[0][0])
    assert task["user"] == alice and task["group"] == "mail"
    with db.connect(user=alice) as conn:
        assert conn.execute("DELETE FROM task_schedule WHERE name = 'digest' RETURNING name").fetchone() == ("digest",)


def test_group_capacity_as_an_author(db):
    alice = author(db, "authors_alice")
    with db.connect(user=alice) as conn:
        conn.execute("""INSERT INTO task_group ("group", capacity) VALUES ('mail', 1)""")
        assert enqueue(conn, "a", columns='{"group": "mail"}')[1] is True
        with pytest.raises(psycopg.Error) as err:
            enqueue(conn, "b", columns='{"group": "mail"}')
        assert err.value.sqlstate == "PT001"
        with pytest.raises(psycopg.Error) as err:
            conn.execute("INSERT INTO task (input, \"group\") VALUES ('SELECT 1', 'mail')")
        assert err.value.sqlstate == "PT001"
        assert conn.execute("SELECT key FROM task_key").fetchall() == [("a",)]
        conn.execute("""UPDATE task_group SET capacity = 2 WHERE "group" = 'mail'""")
        assert enqueue(conn, "b", columns='{"group": "mail"}')[1] is True
        conn.execute("""DELETE FROM task_group WHERE "group" = 'mail'""")
        assert enqueue(conn, "c", columns='{"group": "mail"}')[1] is True
    assert db.value("""SELECT count(*) FROM task WHERE "group" = 'mail' AND "user" = %s""", (alice,)) == 3
