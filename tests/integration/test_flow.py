"""Pause and rate per group (task_group): a paused group's tasks are not claimed -- nor taken by a
session its running task frees -- while running ones finish, and a resume wakes the service; a
rate-limited group starts at most burst + rate * t tasks in t seconds, however many service
instances claim; values that would break the arithmetic are refused, naming the column."""

from __future__ import annotations

import psycopg
import pytest
from support import provision_again, wait_for

from pgtask.names import channel


def starts(db) -> list[float]:
    """The database times the tasks recorded (table started), as epoch seconds, in order."""
    return [r[0] for r in db.execute("SELECT extract(epoch FROM at)::float8 FROM started ORDER BY at")]


RECORD = "INSERT INTO started VALUES (clock_timestamp())"


def test_a_paused_group_starts_nothing_until_resumed(db, service):
    """From the very next claim: while no group is paused or rate-limited the service claims
    without the group table's flow columns but for a check in the claim's own snapshot, so a pause
    committed after its last pass holds that group's tasks in the claim the tasks' notification wakes."""
    probe = db.insert("SELECT 1", group="probe", delete=False)
    db.wait_state(probe)  # its pass found no group limited
    with db.connect() as conn, conn.transaction():
        conn.execute("INSERT INTO task_group (\"group\", paused) VALUES ('held', true)")
        held = [conn.execute("INSERT INTO task (input, \"group\", delete) VALUES ('SELECT 1', 'held', false) "
                             "RETURNING id").fetchone()[0] for _ in range(3)]
        free = conn.execute("INSERT INTO task (input, \"group\", delete) VALUES ('SELECT 1', 'free', false) "
                            "RETURNING id").fetchone()[0]
    db.wait_state(free)
    assert {db.task(t)["state"] for t in held} == {"PLAN"}
    db.execute("UPDATE task_group SET paused = false WHERE \"group\" = 'held'")
    for t in held:
        assert db.wait_state(t)["state"] == "DONE"


def test_running_tasks_finish_and_their_session_takes_no_next(db, service):
    """A task of a paused group that runs finishes; the session it frees does not take the group's
    next task (count > 0: executor reuse)."""
    db.execute("INSERT INTO task_group (\"group\", capacity) VALUES ('g', NULL)")
    first = db.insert("SELECT pg_sleep(0.5)", group="g", count=10, delete=False)
    db.wait_state(first, states=("WORK",))
    nxt = db.insert("SELECT 1", group="g", count=10, delete=False)
    db.execute("UPDATE task_group SET paused = true WHERE \"group\" = 'g'")
    assert db.wait_state(first)["state"] == "DONE"
    probe = db.insert("SELECT 1", group="probe", delete=False)
    db.wait_state(probe)  # a claim pass after the finish
    assert db.task(nxt)["state"] == "PLAN"
    db.execute("UPDATE task_group SET paused = false WHERE \"group\" = 'g'")
    assert db.wait_state(nxt)["state"] == "DONE"


def test_two_instances_share_a_rate(db, service_factory):
    """rate 10/s, burst 2, two services: no more than burst + rate * t starts in any t seconds."""
    db.execute("CREATE TABLE started (at timestamptz)")
    db.execute("INSERT INTO task_group (\"group\", rate, burst) VALUES ('r', 10, 2)")
    service_factory(db.name)
    service_factory(db.name)
    db.execute("""INSERT INTO task (input, "group") SELECT %s, 'r' FROM generate_series(1, 20)""", (RECORD,))
    wait_for(lambda: db.value("SELECT count(*) FROM started") == 20, timeout=30)
    at = starts(db)
    # claims are spaced by the bucket; a start follows its claim by the session's round trip, so
    # allow one more task in each window than the bucket does
    for i in range(len(at)):
        for j in range(i + 1, len(at)):
            assert j - i + 1 <= 2 + 1 + 10 * (at[j] - at[i]), (i, j, at)
    assert at[-1] - at[0] >= (20 - 2 - 1) / 10 * 0.9, at


def test_a_group_row_locked_by_a_user_holds_up_only_that_group(db, service):
    db.execute("INSERT INTO task_group (\"group\", rate) VALUES ('r', 1000)")
    with db.connect() as other:
        other.execute("BEGIN")
        other.execute("UPDATE task_group SET burst = 2 WHERE \"group\" = 'r'")
        held = db.insert("SELECT 1", group="r", delete=False)
        free = db.insert("SELECT 1", group="free", delete=False)
        db.wait_state(free)
        assert db.task(held)["state"] == "PLAN"
        other.execute("COMMIT")
    assert db.wait_state(held)["state"] == "DONE"


def test_extreme_bucket_values_fail_no_claim(db, service):
    """The far ends of what the checks let through -- the least rate, a refill at the end of time --
    overflow nothing in the claim pass: the other groups' tasks run."""
    db.execute("""INSERT INTO task_group ("group", rate, burst, tokens, refilled) VALUES
                  ('slow', 0.000001, 1000000, 0, '294276-12-31'), ('old', 1000000, 1000000, 0, '4713-01-01 BC')""")
    db.insert("SELECT 1", group="slow")
    old = db.insert("SELECT 1", group="old", delete=False)
    free = db.insert("SELECT 1", group="free", delete=False)
    assert db.wait_state(free)["state"] == "DONE" and db.wait_state(old)["state"] == "DONE"


@pytest.mark.parametrize("column,value", [
    ("rate", "'NaN'"), ("rate", "'Infinity'"), ("rate", "0"), ("rate", "-1"), ("rate", "1e7"), ("rate", "1e-9"),
    ("burst", "0"), ("burst", "-5"), ("burst", "NULL"), ("tokens", "'NaN'"), ("tokens", "-1"),
    ("refilled", "'infinity'"), ("refilled", "'-infinity'"), ("paused", "NULL"), ("capacity", "-1"),
])
def test_bad_values_are_refused(db, column, value):
    db.execute("INSERT INTO task_group (\"group\") VALUES ('g')")
    with pytest.raises((psycopg.errors.CheckViolation, psycopg.errors.NotNullViolation), match=column):
        db.execute(f'UPDATE task_group SET "{column}" = {value}')


def test_a_rate_without_a_capacity_admits_every_insert(db):
    db.execute("INSERT INTO task_group (\"group\", rate) VALUES ('g', 5)")
    db.execute("""INSERT INTO task (input, "group") SELECT 'SELECT 1', 'g' FROM generate_series(1, 50)""")
    assert db.value("SELECT count(*) FROM task") == 50


def test_a_group_table_of_an_earlier_version_gets_pause_and_rate(db):
    db.execute("DROP TRIGGER task_group_wake ON task_group")
    db.execute("""ALTER TABLE task_group DROP COLUMN paused, DROP COLUMN rate, DROP COLUMN burst,
                  DROP COLUMN tokens, DROP COLUMN refilled, ALTER COLUMN capacity SET NOT NULL""")
    db.execute("INSERT INTO task_group VALUES ('g', 3)")
    actions = provision_again(db).actions
    assert "added paused, rate and burst to public.task_group" in actions and "created trigger task_group_wake" in actions
    assert db.execute("SELECT capacity, paused, rate, burst FROM task_group") == [(3, False, None, 1)]
    assert provision_again(db).actions == []


def test_a_resume_notifies_the_table_channel(db):
    """The service's listener wakes a claim pass on it; a pause, or a change to a paused group, does not."""
    db.execute("INSERT INTO task_group (\"group\", paused) VALUES ('g', false)")
    with db.connect() as listener:
        listener.execute(f"LISTEN {channel(db.value('SELECT %s::regclass::oid', ('task',)))}")
        for change in ("paused = true", "rate = 5", "paused = false", "burst = 2", "capacity = 3"):
            db.execute(f"UPDATE task_group SET {change}")
        heard = [n.payload for n in listener.notifies(timeout=0.5, stop_after=10)]
    assert heard == ["wake", "wake"]  # the resume, then the burst of a running group
