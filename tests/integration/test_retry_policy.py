"""A group's retry policy (task_group.retry_*): a task that ends FAIL (or GONE, when the policy says
so) runs again as a new row, parent = the failed attempt, planned on the database clock after the
policy's delay, as its author -- with the real service running tasks that fail."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from psycopg import sql
from support import provision_again, wait_for

from pgtask import names

FAILING = "SELECT 1/0"


def policy(db, group: str = "r", **columns) -> None:
    """The group's row, with these retry columns (their names without retry_)."""
    cols = [sql.Identifier(f"retry_{k}") for k in columns]
    db.execute(sql.SQL('INSERT INTO task_group ("group", {}) VALUES (%s, {})').format(
        sql.SQL(", ").join(cols), sql.SQL(", ").join(sql.Placeholder() * len(cols))), [group, *columns.values()])


def row(db, task_id: int, table: str = "task") -> dict:
    cur = db.conn.cursor(row_factory=psycopg.rows.dict_row)
    return cur.execute(sql.SQL("SELECT * FROM {} WHERE id = %s").format(sql.Identifier(table)), (task_id,)).fetchone()


def chain(db, first: int, table: str = "task") -> list[dict]:
    """The attempts of a task, from the first: each row the one child of the one before."""
    rows = [row(db, first, table)]
    while True:
        children = db.execute(sql.SQL("SELECT id FROM {} WHERE parent = %s ORDER BY id").format(sql.Identifier(table)),
                              (rows[-1]["id"],))
        assert len(children) <= 1, children
        if not children:
            return rows
        rows.append(row(db, children[0][0], table))


def ended_chain(db, first: int, length: int, timeout: float = 30, table: str = "task") -> list[dict]:
    """The chain once it holds ``length`` ended rows (its last ended: an attempt's retry is inserted
    in the transaction that ends it, so an ended last row has no retry to come)."""
    def done():
        rows = chain(db, first, table)
        return rows if len(rows) >= length and rows[-1]["state"] in ("DONE", "FAIL", "GONE", "STOP") else None
    return wait_for(done, timeout, message=f"{length} attempts of task {first} to end")


def spacing(parent: dict, child: dict) -> timedelta:
    return child["plan"] - parent["stop"]


@pytest.mark.quick
def test_attempts_exhausted_leave_one_row_per_attempt(db, service):
    policy(db, attempts=3, backoff="fixed", delay="1 second")
    first = db.insert(FAILING, group="r")
    rows = ended_chain(db, first, 3)
    assert len(rows) == 3
    assert [r["state"] for r in rows] == ["FAIL"] * 3
    assert [r["retried"] for r in rows] == [None, 1, 2]
    assert [r["parent"] for r in rows[1:]] == [r["id"] for r in rows[:2]]
    for r in rows:
        assert r["error"].startswith("ERROR:  division by zero"), r
        assert (r["input"], r["group"], r["user"], r["attempt"]) == (FAILING, "r", rows[0]["user"], 1)
    assert db.value("SELECT count(*) FROM task") == 3


def test_exponential_backoff_on_the_database_clock(db, service):
    """Delays 1, 2, then 3 s (4 capped): each child's plan is its parent's stop plus exactly that."""
    policy(db, attempts=4, backoff="exponential", delay="1 second", delay_max="3 seconds")
    first = db.insert(FAILING, group="r")
    rows = ended_chain(db, first, 4, timeout=45)
    assert len(rows) == 4 and [r["state"] for r in rows] == ["FAIL"] * 4
    assert [spacing(p, c) for p, c in zip(rows, rows[1:])] == [timedelta(seconds=s) for s in (1, 2, 3)]
    assert [r["start"] >= r["plan"] for r in rows[1:]] == [True] * 3


def test_jitter_shortens_the_delay_within_its_fraction(db, service):
    policy(db, attempts=4, backoff="fixed", delay="2 seconds", jitter=0.5)
    first = db.insert(FAILING, group="r")
    rows = ended_chain(db, first, 4, timeout=45)
    assert len(rows) == 4
    for p, c in zip(rows, rows[1:]):
        assert timedelta(seconds=1) <= spacing(p, c) <= timedelta(seconds=2), (p, c)


def test_a_policy_changed_mid_flight_applies_to_the_next_attempt(db, service):
    """Raised from 2 to 4 attempts and its delay from 2 s to 3 s while the second attempt waits: the
    second's plan stays, the third comes 3 s after the second; lowered to 3 while the third waits:
    the chain ends with it."""
    policy(db, attempts=2, backoff="fixed", delay="2 seconds")
    first = db.insert(FAILING, group="r")

    def change_while_pending(rows_before: int, change: str) -> None:
        rows = wait_for(lambda: (r := chain(db, first)) and len(r) == rows_before and r, 30,
                        message=f"attempt {rows_before} planned")
        pending = rows[-1]["id"]
        updated = db.execute(f"UPDATE task_group SET {change} WHERE \"group\" = 'r' AND EXISTS "
                             "(SELECT FROM task WHERE id = %s AND state::text IN ('PLAN', 'TAKE', 'WORK')) "
                             "RETURNING 1", (pending,))
        assert updated == [(1,)], "the attempt ended before the policy changed: the machine is too slow"

    change_while_pending(2, "retry_attempts = 4, retry_delay = '3 seconds'")
    change_while_pending(3, "retry_attempts = 3")
    rows = ended_chain(db, first, 3, timeout=45)
    assert [r["state"] for r in rows] == ["FAIL"] * 3 and len(chain(db, first)) == 3
    assert [spacing(p, c) for p, c in zip(rows, rows[1:])] == [timedelta(seconds=2), timedelta(seconds=3)]


def test_a_service_killed_between_attempts(db, service_factory):
    """SIGKILLed while the next attempt is planned ahead, started again: the chain completes, each
    attempt ran once."""
    policy(db, attempts=3, backoff="fixed", delay="3 seconds")
    svc = service_factory(db.name)
    first = db.insert(FAILING, group="r")
    rows = wait_for(lambda: (r := chain(db, first)) and len(r) == 2 and r, 30, message="the second attempt planned")
    assert rows[1]["state"] == "PLAN"
    svc.kill()
    service_factory(db.name)
    rows = ended_chain(db, first, 3, timeout=45)
    assert len(rows) == 3 and [r["state"] for r in rows] == ["FAIL"] * 3
    assert [r["attempt"] for r in rows] == [1, 1, 1]
    assert [spacing(p, c) for p, c in zip(rows, rows[1:])] == [timedelta(seconds=3)] * 2
    assert db.value("SELECT count(*) FROM task") == 3


def test_gone_is_retried_only_when_the_policy_names_it(db, service):
    """An expired task (GONE) gets a retry in a group whose policy names GONE, none where it names
    FAIL only; a task GONE because what it waited for failed is not retried either."""
    policy(db, group="gone", attempts=2, backoff="fixed", delay="1 second", on=["FAIL", "GONE"])
    policy(db, group="fail", attempts=2, backoff="fixed", delay="1 second")
    expired = {g: db.value("INSERT INTO task (input, \"group\", plan, active) VALUES "
                           "('SELECT 1', %s, now() - interval '1 hour', '10 minutes') RETURNING id", (g,))
               for g in ("gone", "fail")}
    dependency = db.insert(FAILING, group="plain", plan=db.value("SELECT now() + interval '2 seconds'"))
    waiter = db.insert("SELECT 1", group="gone", after=[dependency])
    assert db.task(waiter)["state"] == "WAIT"
    rows = ended_chain(db, expired["gone"], 2)
    assert [(r["state"], r["retried"]) for r in rows] == [("GONE", None), ("DONE", 1)]
    assert spacing(*rows) == timedelta(seconds=1)
    assert db.wait_state(expired["fail"])["state"] == "GONE"
    assert (db.wait_state(waiter)["state"], db.task(waiter)["error"]) == ("GONE", f"dependency {dependency} ended FAIL")
    assert db.wait_state(dependency)["state"] == "FAIL"
    assert db.value("SELECT count(*) FROM task WHERE parent = ANY(%s)",
                    ([expired["fail"], waiter, dependency],)) == 0


def author(db, name: str, table: str) -> str:
    db.execute(f"""DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') THEN
                   CREATE ROLE "{name}" LOGIN; END IF; END$$""")
    db.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(names.author_role(table)), sql.Identifier(name)))
    return name


def test_a_retry_runs_as_its_author_whoever_writes_the_failure(db, service_factory):
    """A table the service's role (no superuser) owns -- so do the retry policy's trigger and the
    service's writes -- and an author holding only the table's authors' role, of which the service
    is no member: the retry still runs as the author. A role that sets pgtask.retry itself and
    names another role's failed attempt gets a task of its own."""
    service_factory(db.name, f'[pg_task]\njson = [{{data = "{db.name}", user = "retry_svc", table = "rt"}}]\n')
    alice, mallory = author(db, "retry_alice", "rt"), author(db, "retry_mallory", "rt")
    assert db.execute("""SELECT c.relowner::regrole::text, p.proowner::regrole::text, r.rolsuper,
                                pg_has_role('retry_svc', 'retry_alice', 'MEMBER')
                         FROM pg_class c, pg_proc p, pg_roles r WHERE c.oid = 'rt'::regclass
                         AND p.proname = 'rt_retry_policy' AND r.rolname = 'retry_svc'""") \
        == [("retry_svc", "retry_svc", False, False)]
    db.execute("""INSERT INTO rt_group ("group", retry_attempts, retry_backoff, retry_delay)
                  VALUES ('r', 2, 'fixed', '1 second')""")
    with db.connect(user=alice) as conn:
        first = conn.execute("SELECT nextval('rt_id_seq')").fetchone()[0]
        conn.execute("""INSERT INTO rt (id, input, "group") VALUES (%s, format('SELECT current_user AS who,
                        1 / (current_setting(''pg_task.id'')::bigint - %%s) AS ok', %s::bigint), 'r')""",
                     (first, first))
    rows = ended_chain(db, first, 2, table="rt")
    assert [(r["state"], r["user"]) for r in rows] == [("FAIL", alice), ("DONE", alice)]
    assert rows[1]["output"].split("\n")[1].split("\t")[0] == alice, rows[1]
    with db.connect(user=mallory) as conn:
        conn.execute("SET pgtask.retry = %s" % rows[0]["id"])
        stolen = conn.execute("SELECT nextval('rt_id_seq')").fetchone()[0]
        conn.execute("""INSERT INTO rt (id, input, "group", parent, "user") VALUES
                        (%s, 'SELECT current_user', 'x', %s, %s)""", (stolen, rows[0]["id"], alice))
    mine = wait_for(lambda: (r := row(db, stolen, "rt"))["state"] == "DONE" and r, message="mallory's task")
    assert (mine["user"], mine["output"].split("\n")[-1]) == (mallory, mallory), mine


def test_only_the_operator_sets_a_retry_policy(db):
    """A policy runs other roles' failed tasks again: an author (task_user) who may set a group's
    capacity may not set its policy; task_admin may."""
    alice = author(db, "policy_alice", "task")
    db.execute('DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = \'policy_dave\') THEN '
               'CREATE ROLE policy_dave LOGIN; END IF; END$$')
    db.execute("GRANT task_admin TO policy_dave")
    refused = "permission denied to set the retry policy of group"
    with db.connect(user=alice) as conn:
        conn.execute("""INSERT INTO task_group ("group", capacity) VALUES ('shared', 5)""")
        conn.execute("""UPDATE task_group SET capacity = 6, paused = true WHERE "group" = 'shared'""")
        for statement in ("""INSERT INTO task_group ("group", retry_attempts) VALUES ('mine', 3)""",
                          """UPDATE task_group SET retry_attempts = 3 WHERE "group" = 'shared'""",
                          """UPDATE task_group SET retry_delay = '1 second' WHERE "group" = 'shared'"""):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match=refused):
                conn.execute(statement)
    assert db.execute("""SELECT "group", capacity, paused, retry_attempts, retry_delay FROM task_group""") \
        == [("shared", 6, True, None, timedelta(minutes=1))]
    with db.connect(user="policy_dave") as conn:
        conn.execute("""UPDATE task_group SET retry_attempts = 3, retry_delay = '1 second' WHERE "group" = 'shared'""")
        conn.execute("""INSERT INTO task_group ("group", retry_attempts) VALUES ('theirs', 2)""")
    assert db.execute("""SELECT "group", retry_attempts FROM task_group ORDER BY 1""") \
        == [("shared", 3), ("theirs", 2)]


def test_groups_without_a_policy_retry_nothing(db, service):
    """No group row, a row with a capacity only, a policy of one attempt: a failed task has no child."""
    db.execute("""INSERT INTO task_group ("group", capacity) VALUES ('capped', 10)""")
    policy(db, group="once", attempts=1, delay="0 sec")
    failed = [db.insert(FAILING, group=g) for g in ("none", "capped", "once")]
    for task_id in failed:
        assert db.wait_state(task_id)["state"] == "FAIL"
    assert db.value("SELECT count(*) FROM task") == 3


def test_a_repeating_task_is_not_retried(db, service):
    """Its next occurrence is its retry: one row more per failure, not two."""
    policy(db, attempts=5, backoff="fixed", delay="0 sec")
    first = db.insert(FAILING, group="r", repeat="1 hour")
    assert db.wait_state(first)["state"] == "FAIL"
    children = db.execute("SELECT retried, plan - %s::timestamptz FROM task WHERE parent = %s",
                          (db.task(first)["plan"], first))
    assert children == [(None, timedelta(hours=1))]


@pytest.mark.parametrize("column,value", [
    ("retry_attempts", "0"), ("retry_attempts", "-1"), ("retry_attempts", "1000001"),
    ("retry_backoff", "'linear'"), ("retry_backoff", "NULL"), ("retry_delay", "'-1 sec'"),
    ("retry_delay", "'101 years'"), ("retry_delay", "NULL"), ("retry_delay_max", "'-1 sec'"),
    ("retry_delay_max", "'1000 years'"), ("retry_jitter", "'NaN'"), ("retry_jitter", "'Infinity'"),
    ("retry_jitter", "-0.1"), ("retry_jitter", "1.5"), ("retry_on", "'{DONE}'"), ("retry_on", "'{FAIL,NULL}'"),
    ("retry_on", "'{{FAIL}}'"), ("retry_on", "NULL"),
])
def test_bad_policies_are_refused_naming_the_column(db, column, value):
    db.execute("INSERT INTO task_group (\"group\") VALUES ('g')")
    with pytest.raises((psycopg.errors.CheckViolation, psycopg.errors.NotNullViolation), match=column):
        db.execute(f'UPDATE task_group SET "{column}" = {value}')


def test_an_infinite_delay_is_refused(db):
    """PostgreSQL 17 has infinite intervals; earlier ones refuse the literal itself."""
    db.execute("INSERT INTO task_group (\"group\") VALUES ('g')")
    for column in ("retry_delay", "retry_delay_max"):
        with pytest.raises((psycopg.errors.CheckViolation, psycopg.errors.InvalidDatetimeFormat)) as err:
            db.execute(f"UPDATE task_group SET \"{column}\" = 'infinity'")
        assert isinstance(err.value, psycopg.errors.InvalidDatetimeFormat) or column in str(err.value)


def test_the_retry_count_is_checked_and_immutable(db):
    with pytest.raises(psycopg.errors.CheckViolation, match="retried"):
        db.insert("SELECT 1", retried=0)
    task_id = db.insert("SELECT 1", plan="infinity")
    with pytest.raises(psycopg.errors.CheckViolation, match="retried"):
        db.execute("UPDATE task SET retried = 3 WHERE id = %s", (task_id,))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="retried"):
        db.execute("""SELECT task_enqueue('SELECT 1', NULL, '{"retried": 2}')""")


def test_a_group_table_of_an_earlier_version_gets_the_policy_columns(db):
    db.execute("DROP TRIGGER task_group_guard ON task_group")  # an earlier version had neither
    db.execute("""ALTER TABLE task_group DROP COLUMN retry_attempts, DROP COLUMN retry_backoff,
                  DROP COLUMN retry_delay, DROP COLUMN retry_delay_max, DROP COLUMN retry_jitter,
                  DROP COLUMN retry_on""")
    db.execute("INSERT INTO task_group (\"group\", capacity) VALUES ('g', 3)")
    actions = provision_again(db).actions
    assert "added the retry policy's columns to public.task_group" in actions
    assert "created trigger task_group_guard" in actions, actions
    assert db.execute("""SELECT capacity, retry_attempts, retry_backoff, retry_delay, retry_delay_max, retry_jitter,
                         retry_on FROM task_group""") == [(3, None, "exponential", timedelta(minutes=1), None, 0.0,
                                                            ["FAIL"])]
    assert provision_again(db).actions == []


def test_a_task_table_of_an_earlier_version_gets_the_retry_count(db):
    db.execute("ALTER TABLE task DROP COLUMN retried")
    actions = provision_again(db).actions
    assert {"added column retried to public.task", "added check task_retried_check"} <= set(actions), actions
    assert provision_again(db).actions == []
    policy(db, attempts=2, delay="0 sec")
    failed = db.insert(FAILING, group="r")
    db.run_scheduler(finished=2)
    assert [(r["state"], r["retried"]) for r in chain(db, failed)] == [("FAIL", None), ("FAIL", 1)]


def test_a_retry_that_cannot_be_inserted_leaves_the_failure_written(db, service):
    """A constraint of the user's own column refuses the copy: the attempt still ends FAIL with its
    error, without a child, and the group runs on."""
    db.execute("ALTER TABLE task ADD COLUMN ticket integer UNIQUE")
    policy(db, attempts=3, backoff="fixed", delay="0 sec")
    failed = db.insert(FAILING, group="r", ticket=7)
    row = db.wait_state(failed)
    assert (row["state"], row["error"].startswith("ERROR:  division by zero")) == ("FAIL", True), row
    after = db.insert("SELECT 2", group="r", delete=False)
    assert db.wait_state(after)["state"] == "DONE"
    assert db.value("SELECT count(*) FROM task WHERE parent = %s", (failed,)) == 0
