"""A task row's extreme values: each one runs, or the INSERT refuses it naming the column."""

import psycopg
import pytest
from support import provision_again, wait_for


# The next occurrence's input: it takes its own repeat away, so a grid case repeats once.
def _ended(db, task_id: int, states=("DONE", "FAIL", "GONE", "STOP")) -> dict:
    """The row's state, error, output and stop once in ``states`` (psycopg reads no year BC and no
    interval of more than 999,999,999 days: db.wait_state's whole row would not do)."""
    def check():
        cur = db.conn.cursor(row_factory=psycopg.rows.dict_row)
        row = cur.execute("SELECT id, state, error, output, stop::text FROM task WHERE id = %s", (task_id,)).fetchone()
        return row if row is not None and row["state"] in states else None
    return wait_for(check, message=f"task {task_id} to reach {states}")


ONCE = "UPDATE task SET repeat = '0 sec' WHERE id = current_setting('pg_task.id')::bigint AND parent IS NOT NULL"


@pytest.mark.parametrize(("plan", "repeat"), [
    ("1970-01-01", "1 millisecond"), ("4713-01-01 BC", "1 microsecond"), ("2000-01-31", "1 month"),
    ("1999-03-28 02:30", "1 day 1 microsecond"), ("1970-01-01", "1 year 2 mons 3 days 04:05:06.789")])
def test_a_repeat_far_in_the_past_is_computed_at_once(db, service, plan, repeat):
    """The next occurrence is the first plan + k * repeat after the finish, however many steps
    lie between (10^11 for a millisecond since 1970, 2 * 10^17 for a microsecond since 4713 BC)."""
    first = db.insert(ONCE, plan=plan, repeat=repeat)
    row = _ended(db, first)
    assert (row["state"], row["error"]) == ("DONE", None)
    nxt = wait_for(lambda: db.value("SELECT plan::text FROM task WHERE parent = %s", (first,)), message="the repeat")
    # on the grid, after the finish (stop is the finish's statement_timestamp), and the first such.
    # A step of time only: in whole steps of microseconds from the plan. A calendar step: k steps
    # from the plan and k - 1 not after the stop (k found near the grid point itself).
    on_grid, first_after = db.execute(
        """SELECT CASE WHEN date_trunc('day', g.r) = '0' THEN
                      mod((extract(epoch FROM n) - extract(epoch FROM g.p)) * 1000000, extract(epoch FROM g.r) * 1000000) = 0
                      ELSE g.p + g.r * c.k = n END,
                  CASE WHEN date_trunc('day', g.r) = '0' THEN n > s AND n - g.r <= s
                      ELSE g.p + g.r * c.k > s AND g.p + g.r * (c.k - 1) <= s END
           FROM (SELECT %(plan)s::timestamptz AS p, %(repeat)s::interval AS r,
                        %(nxt)s::timestamptz AS n, %(stop)s::timestamptz AS s) g,
           LATERAL (SELECT round((extract(epoch FROM g.n) - extract(epoch FROM g.p)) / extract(epoch FROM g.r)) AS k0) e,
           LATERAL (SELECT k FROM generate_series(e.k0 - 40, e.k0 + 40) k
                    ORDER BY abs(extract(epoch FROM g.p + g.r * k - g.n)) LIMIT 1) c""",
        {"nxt": nxt, "stop": row["stop"], "plan": plan, "repeat": repeat})[0]
    assert on_grid and first_after, (nxt, row["stop"])


@pytest.mark.quick
def test_the_least_max_pauses_its_group(db, service):
    """max = -2147483648: a pause of 24.8 days. The finish writes the output and pushes the
    group's other due row ahead."""
    first = db.insert("SELECT 1", group="pause", max=-2147483648, delete=False)
    second = db.insert("SELECT 2", group="pause", max=-2147483648, delete=False)
    done = wait_for(lambda: [r for r in (db.task(first), db.task(second)) if r["state"] in ("DONE", "FAIL")],
                    message="one of the two ended")
    assert len(done) == 1 and done[0]["output"] in ("1", "2") and done[0]["error"] is None, done
    other = second if done[0]["id"] == first else first
    assert wait_for(lambda: db.value("SELECT plan > now() + interval '24 days' FROM task WHERE id = %s",
                                     (other,)), message="the pause applied")
    assert "out of range" not in service.output()


def _extremes(db) -> list[dict]:
    """Rows of extreme values that must run (DONE), each in a group of its own."""
    rows = [
        {"id": 9223372036854775807}, {"id": -9223372036854775808},
        {"parent": 9223372036854775807}, {"parent": -9223372036854775808},
        {"plan": "4713-01-01 BC", "active": "178000000 years"},
        {"max": 2147483647}, {"count": 2147483647}, {"live": "178000000 years"},
        {"timeout": "178000000 years"}, {"active": "178000000 years"},
        {"delimiter": "", "quote": "", "escape": ""}, {"null": ""}, {"data": "x" * 1_000_000},
        {"input": "/*" + "x" * 1_000_000 + "*/ SELECT 1"},
        {"repeat": "99999 years", "plan": "1900-01-01"},
    ]
    if db.value("SELECT current_setting('server_version_num')::int") >= 170000:  # infinite intervals
        rows += [{"timeout": "infinity"}, {"active": "infinity"}, {"live": "infinity"}]
    return rows


@pytest.mark.quick
def test_extreme_values_run(db, service):
    ids = []
    for i, columns in enumerate(_extremes(db)):
        ids.append(db.insert(columns.pop("input", "SELECT 1"), group=f"extreme {i}", delete=False, **columns))
    db.insert("SELECT 1", plan="infinity", group="held")
    for task_id, columns in zip(ids, _extremes(db)):
        row = _ended(db, task_id)
        assert (row["state"], row["error"]) == ("DONE", None), columns
    assert db.value("SELECT state FROM task WHERE \"group\" = 'held'") == "PLAN"
    assert "a claim pass failed" not in service.output()


@pytest.mark.parametrize(("columns", "refusal"), [
    ({"plan": "-infinity"}, "invalid plan"), ({"plan": "-infinity", "repeat": "1 hour"}, "invalid plan"),
    ({"repeat": "100001 years"}, "invalid repeat"), ({"repeat": "1 mon -29 days"}, "invalid repeat"),
    ({"repeat": "1 day -1 hour"}, "invalid repeat"), ({"repeat": "-1 mon 31 days"}, "invalid repeat"),
    ({"repeat": "-1 hour"}, "task_repeat_check"), ({"active": "0"}, "task_active_check"),
    ({"live": "-1 us"}, "task_live_check"), ({"timeout": "-1 us"}, "task_timeout_check"),
    ({"count": -1}, "task_count_check"), ({"drift": None}, 'column "drift"'), ({"max": None}, 'column "max"'),
    ({"plan": None}, 'column "plan"'), ({"group": None}, 'column "group"'),
])
def test_values_refused_at_insert_naming_the_column(db, columns, refusal):
    with pytest.raises(psycopg.errors.IntegrityError, match=refusal):
        db.insert("SELECT 1", **columns)
    task_id = db.insert("SELECT 1")
    edit = {k: v for k, v in columns.items() if k in ("plan", "repeat")}
    if edit and "invalid" in refusal:  # an edit of a PLAN row is refused the same way
        sets = ", ".join(f'"{k}" = %s' for k in edit)
        with pytest.raises(psycopg.errors.IntegrityError, match=refusal):
            db.execute(f"UPDATE task SET {sets} WHERE id = %s", (*edit.values(), task_id))


def test_a_table_dropped_and_provisioned_again_is_taken_up_as_new(db, service_factory):
    """A service that ran on the table before it was dropped and provisioned again, and one started
    after: both take up the new table (its oid: the keys of the liveness and claim locks, its
    columns, its channel) -- every task runs once, and a repeat copies the new table's columns."""
    old = service_factory(db.name)
    assert db.wait_state(db.insert("SELECT 1"))["state"] == "DONE"
    db.execute("DROP TABLE task CASCADE")
    provision_again(db)
    db.execute("CREATE TABLE runs (id bigint)")
    repeating = db.insert(ONCE, repeat="1 hour")
    ids = [db.insert("INSERT INTO runs VALUES (current_setting('pg_task.id')::bigint); SELECT pg_sleep(1)",
                     group=f"g{i}") for i in range(6)]
    for task_id in ids:  # running on the old service: the new one's reset at its start must not take them
        db.wait_state(task_id, states=("WORK", "DONE"))
    new = service_factory(db.name)
    for task_id in [*ids, repeating]:
        assert (db.wait_state(task_id)["state"], db.task(task_id)["error"]) == ("DONE", None)
    assert db.execute("SELECT id, count(*) FROM runs GROUP BY id HAVING count(*) > 1") == []
    assert db.value("SELECT count(*) FROM runs") == len(ids)
    wait_for(lambda: db.value("SELECT count(*) FROM task WHERE parent = %s", (repeating,)), message="the repeat")
    oids = [db.insert("SELECT current_setting('pg_task.oid')", delete=False) for _ in range(4)]
    assert {db.wait_state(i)["output"] for i in oids} == {str(db.value("SELECT 'task'::regclass::oid"))}
    assert "taking up the new one" in old.output()
    assert "taking up the new one" not in new.output()
    # both listen on the new table's channel
    listen = f'LISTEN "pg_task_{db.value("SELECT %s::regclass::oid", ("task",))}"'
    wait_for(lambda: db.value("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                              "AND application_name LIKE 'pgtask listen %%' AND query = %s", (listen,)) == 2,
             message="both listeners on the new channel")
