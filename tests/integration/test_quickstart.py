"""The manual's Quick start statements, exactly as written, against the running service."""

import pytest

QUICK_START = [
    "INSERT INTO task (input) VALUES ('SELECT now()')",
    "INSERT INTO task (plan, input) VALUES (now() + '5 min':INTERVAL, 'SELECT now()')",
    "INSERT INTO task (plan, input) VALUES ('2029-07-01 12:51:00', 'SELECT now()')",
    "INSERT INTO task (repeat, input) VALUES ('5 min', 'SELECT now()')",
    "INSERT INTO task (input) VALUES ('SELECT 1/0')",
    "INSERT INTO task (group, max, input) VALUES ('group', 1, 'SELECT now()')",
    "INSERT INTO task (group, max, input) VALUES ('group', 2, 'SELECT now()')",
]


def test_quick_start_as_written(db):
    """Three Quick start lines are not valid PostgreSQL as printed: `'5 min':INTERVAL` (one colon)
    and the unquoted reserved word `group`. PostgreSQL's parser rejects them before pgtask sees
    anything; the README prints the corrected lines. Everything else inserts as written."""
    errors = {}
    for statement in QUICK_START:
        try:
            db.execute(statement)
        except Exception as exc:  # noqa: BLE001
            errors[statement] = str(exc).strip().splitlines()[0]
    assert sorted(errors) == sorted([QUICK_START[1], QUICK_START[5], QUICK_START[6]]), errors
    assert all("syntax error" in e for e in errors.values())
    assert db.value("SELECT count(*) FROM task") == len(QUICK_START) - 3
    # the corrected lines work
    db.execute("""INSERT INTO task (plan, input) VALUES (now() + '5 min'::INTERVAL, 'SELECT now()')""")
    db.execute("""INSERT INTO task ("group", max, input) VALUES ('group', 1, 'SELECT now()')""")
    assert db.value("SELECT count(*) FROM task") == len(QUICK_START) - 1


def test_quick_start_runs(db, service):
    now_id = db.insert("SELECT now()")
    later_id = db.value("INSERT INTO task (plan, input) VALUES (now() + '5 min'::INTERVAL, 'SELECT now()') RETURNING id")
    fixed_id = db.value("INSERT INTO task (plan, input) VALUES ('2029-07-01 12:51:00', 'SELECT now()') RETURNING id")
    repeat_id = db.value("INSERT INTO task (repeat, input) VALUES ('5 min', 'SELECT now()') RETURNING id")
    fail_id = db.value("INSERT INTO task (input) VALUES ('SELECT 1/0') RETURNING id")

    done = db.wait_state(now_id)
    assert done["state"] == "DONE" and done["output"] and done["error"] is None
    assert done["start"] is not None and done["stop"] >= done["start"] and done["pid"]

    failed = db.wait_state(fail_id)
    assert failed["state"] == "FAIL"
    assert failed["error"] == "ERROR:  division by zero\nSTATEMENT:  SELECT 1/0"
    assert failed["output"] == ""

    first = db.wait_state(repeat_id)
    assert first["state"] == "DONE"
    nxt = db.execute("SELECT plan - %s::timestamptz, state FROM task WHERE parent = %s", (first["plan"], repeat_id))
    assert len(nxt) == 1 and str(nxt[0][0]) == "0:05:00" and nxt[0][1] == "PLAN"

    assert db.task(later_id)["state"] == "PLAN"
    assert db.task(fixed_id)["state"] == "PLAN"


@pytest.mark.parametrize("max_", [1, 2])
def test_group_max_concurrency(db, service, max_):
    """max = N lets N + 1 tasks of a group run at once."""
    db.execute("CREATE TABLE seen (id bigint, at timestamptz, until timestamptz)")
    ids = [db.insert("INSERT INTO seen SELECT current_setting('pg_task.id')::bigint, clock_timestamp(), "
                     "clock_timestamp() + '0.4 s'; SELECT pg_sleep(0.4)", group="g", max=max_)
           for _ in range(6)]
    for i in ids:
        assert db.wait_state(i, timeout=30)["state"] == "DONE"
    # the largest number of runs overlapping at any start
    overlap = db.value("SELECT max((SELECT count(*) FROM seen b WHERE b.at <= a.at AND b.until > a.at)) FROM seen a")
    assert overlap == max_ + 1
