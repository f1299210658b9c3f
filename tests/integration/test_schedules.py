"""Schedules: materialisation (cursor + occurrence key in one transaction), misfire and overlap
policies, DST, pause/resume, races between two materialisers, a crash before the advance, and the
real service running a schedule's tasks to DONE."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from support import race, wait_for

from pgtask.maintenance import Materialiser

T0 = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)


def materialise(db, now, materialiser=None):
    m = materialiser or Materialiser("public", "task")

    async def go():
        async with await psycopg.AsyncConnection.connect(db.dsn, autocommit=True) as conn:
            return await m.run_once(conn, now)
    return asyncio.run(go())


def add(db, name="s", cron="0 * * * *", tz="UTC", input_text="SELECT 1", **cols):
    names = ", ".join(["name", "cron", "timezone", "input", *[f'"{c}"' for c in cols]])
    marks = ", ".join(["%s"] * (4 + len(cols)))
    return db.value(f"INSERT INTO task_schedule ({names}) VALUES ({marks}) RETURNING id",
                    [name, cron, tz, input_text, *cols.values()])


def sched(db, name="s"):
    cur = db.conn.cursor(row_factory=psycopg.rows.dict_row)
    cur.execute("SELECT * FROM task_schedule WHERE name = %s", (name,))
    return cur.fetchone()


def plans(db):
    return [r[0] for r in db.execute("SELECT plan FROM task ORDER BY plan")]


def test_new_schedule_gets_cursor_and_preview(db):
    add(db, cron="0 9 * * MON-FRI", tz="Europe/Berlin")
    r = materialise(db, T0)  # a Monday
    assert r.initialised == 1 and not r.created
    s = sched(db)
    assert s["cursor"] == T0 and s["next_run"] == datetime(2026, 6, 2, 7, tzinfo=UTC)
    rows = db.execute("SELECT run_at, local_time::text FROM task_schedule_next('s', 3)")
    assert [r[1] for r in rows] == ["2026-06-02 09:00:00", "2026-06-03 09:00:00", "2026-06-04 09:00:00"]
    assert len(db.execute("SELECT * FROM task_schedule_next('s', 50)")) == 20
    assert plans(db) == []  # nothing for the past or present


@pytest.mark.quick
def test_due_occurrence_becomes_one_task(db):
    db.execute("CREATE ROLE sched_bob LOGIN")
    add(db, cron="0 * * * *", columns=psycopg.types.json.Jsonb({"group": "reports", "timeout": "1 min"}),
        user="sched_bob")
    materialise(db, T0)
    r = materialise(db, T0 + timedelta(hours=1))   # 13:00:30: 13:00 is due
    assert len(r.created) == 1
    task = db.task(r.created[0][0])
    assert task["plan"] == datetime(2026, 6, 1, 13, tzinfo=UTC) and task["group"] == "reports"
    assert task["user"] == "sched_bob" and str(task["timeout"]) == "0:01:00" and task["input"] == "SELECT 1"
    s = sched(db)
    assert s["cursor"] == task["plan"] and s["next_run"] == datetime(2026, 6, 1, 14, tzinfo=UTC)
    assert s["last_task"] == task["id"]
    assert db.value("SELECT task FROM task_occurrence") == task["id"]
    # nothing more until 14:00
    assert materialise(db, T0 + timedelta(minutes=110)).created == []


@pytest.mark.parametrize("policy,expected", [
    ("latest", ["2026-06-01 22:00:00+00"]),
    ("skip", []),
    ("catchup", ["2026-06-01 20:00:00+00", "2026-06-01 21:00:00+00", "2026-06-01 22:00:00+00"]),
])
def test_misfire_policies(db, policy, expected):
    """Down from 12:00:30 to 22:30: ten hourly runs missed."""
    add(db, misfire=policy, catchup=3, overlap="allow")
    materialise(db, T0)
    r = materialise(db, datetime(2026, 6, 1, 22, 30, tzinfo=UTC))
    assert [str(p)[:22] for p in plans(db)] == [e[:22] for e in expected]
    assert len(r.created) == len(expected)
    assert sched(db)["cursor"] == datetime(2026, 6, 1, 22, tzinfo=UTC)  # past the missed ones
    assert sched(db)["next_run"] == datetime(2026, 6, 1, 23, tzinfo=UTC)


def test_skip_runs_an_occurrence_within_grace(db):
    add(db, misfire="skip", grace="5 min")
    materialise(db, T0)
    assert len(materialise(db, datetime(2026, 6, 1, 13, 4, tzinfo=UTC)).created) == 1


def test_catchup_is_bounded(db):
    """A year of downtime of an every-second schedule: catchup stays at its bound."""
    add(db, cron="* * * * * *", misfire="catchup", catchup=1000)
    materialise(db, T0)
    r = materialise(db, T0 + timedelta(days=365))
    assert len(r.created) == 1000
    assert max(plans(db)) == (T0 + timedelta(days=365)).replace(microsecond=0)


def test_overlap_skip(db):
    add(db, overlap="skip")
    materialise(db, T0)
    first = materialise(db, T0 + timedelta(hours=1)).created
    assert len(first) == 1
    r = materialise(db, T0 + timedelta(hours=2))      # the first still PLAN: skipped
    assert r.created == [] and r.skipped_overlap == 1
    db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (first[0][0],))
    assert len(materialise(db, T0 + timedelta(hours=3)).created) == 1
    # catch-up with overlap skip: only the first of several
    db.execute("UPDATE task SET state = 'STOP' WHERE state = 'PLAN'")
    db.execute("UPDATE task_schedule SET misfire = 'catchup', catchup = 5")
    r = materialise(db, T0 + timedelta(hours=8))
    assert len(r.created) == 1 and r.skipped_overlap == 4


def test_pause_and_resume(db):
    add(db)
    materialise(db, T0)
    db.execute("UPDATE task_schedule SET paused = true")
    assert materialise(db, T0 + timedelta(hours=5)).created == []
    db.execute("UPDATE task_schedule SET paused = false")
    r = materialise(db, T0 + timedelta(hours=6))     # resume: from now on, no runs for the pause
    assert r.initialised == 1 and r.created == []
    assert sched(db)["next_run"] == datetime(2026, 6, 1, 19, tzinfo=UTC)
    assert len(materialise(db, T0 + timedelta(hours=7)).created) == 1


def test_paused_schedule_still_gets_a_preview(db):
    """How to check an expression from SQL before relying on it: insert it paused."""
    add(db, cron="0 0 9 * * MON#1", paused=True)
    materialise(db, T0)
    assert [r[0] for r in db.execute("SELECT local_time::date::text FROM task_schedule_next('s', 2)")] == [
        "2026-07-06", "2026-08-03"]
    assert materialise(db, datetime(2026, 7, 7, tzinfo=UTC)).created == []


def test_invalid_expression_and_time_zone(db):
    add(db, cron="61 * * * *")
    add(db, name="never", cron="0 0 30 2 *")
    r = materialise(db, T0)
    assert r.invalid == 2
    assert "61" in sched(db)["error"] and "never runs" in sched(db, "never")["error"]
    assert db.execute("SELECT * FROM task_schedule_next('s')") == []
    assert materialise(db, T0 + timedelta(days=1)).invalid == 0   # parked until changed
    db.execute("UPDATE task_schedule SET cron = '*/15 * * * *' WHERE name = 's'")
    assert sched(db)["error"] is None
    assert materialise(db, T0).initialised == 1 and sched(db)["next_run"] == T0.replace(minute=15, second=0)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="time zone"):
        add(db, name="tz", tz="Mars/Olympus")


def test_dst_spring_forward_berlin(db):
    """2026-03-29 02:00 CET -> 03:00 CEST: 02:30 does not exist; a 02:30 schedule runs at 03:00."""
    add(db, cron="30 2 * * *", tz="Europe/Berlin")
    materialise(db, datetime(2026, 3, 27, 12, tzinfo=UTC))
    rows = db.execute("SELECT run_at, local_time::text FROM task_schedule_next('s', 3)")
    assert rows[0][0] == datetime(2026, 3, 28, 1, 30, tzinfo=UTC)   # 02:30 CET
    assert rows[1] == (datetime(2026, 3, 29, 1, 0, tzinfo=UTC), "2026-03-29 03:00:00")
    assert rows[2][0] == datetime(2026, 3, 30, 0, 30, tzinfo=UTC)   # 02:30 CEST
    db.execute("UPDATE task_schedule SET misfire = 'catchup'")
    materialise(db, datetime(2026, 3, 27, 12, tzinfo=UTC))
    r = materialise(db, datetime(2026, 3, 29, 12, tzinfo=UTC))
    assert [at for _, at in r.created] == [datetime(2026, 3, 28, 1, 30, tzinfo=UTC),
                                         datetime(2026, 3, 29, 1, 0, tzinfo=UTC)]


@pytest.mark.quick
def test_dst_fall_back_berlin(db):
    """2026-10-25 03:00 CEST -> 02:00 CET: 02:30 happens twice. A fixed-hour schedule runs once
    (the first); an every-30-minutes one runs at both."""
    add(db, cron="30 2 * * *", tz="Europe/Berlin", misfire="catchup")
    add(db, name="often", cron="*/30 * * * *", tz="Europe/Berlin", misfire="catchup", catchup=100)
    materialise(db, datetime(2026, 10, 24, 12, tzinfo=UTC))
    r = materialise(db, datetime(2026, 10, 25, 3, 0, tzinfo=UTC))   # 04:00 CET
    by_schedule = db.execute("""SELECT s.name, array_agg(to_char(o.scheduled_for AT TIME ZONE 'Europe/Berlin',
        'HH24:MI') || ' ' || to_char(o.scheduled_for AT TIME ZONE 'UTC', 'HH24:MI') ORDER BY o.scheduled_for)
        FROM task_occurrence o JOIN task_schedule s ON s.id = o.schedule GROUP BY s.name ORDER BY s.name""")
    assert by_schedule[1] == ("s", ["02:30 00:30"])
    often = by_schedule[0][1]
    assert "02:00 00:00" in often and "02:30 00:30" in often and "02:00 01:00" in often and "02:30 01:30" in often
    assert len(r.created) == 1 + len(often)
    assert sched(db)["next_run"] == datetime(2026, 10, 26, 1, 30, tzinfo=UTC)   # 02:30 CET next day


def test_two_materialisers_racing_never_duplicate(db):
    n = 40
    for i in range(n):
        add(db, name=f"s{i}", cron="* * * * *", misfire="catchup", catchup=5)
    materialise(db, T0)

    def work(start):
        m = Materialiser("public", "task", batch=1000)
        start()
        # the same moment, again and again
        return [materialise(db, T0 + timedelta(minutes=10), m) for _ in range(3)]

    runs, errors = race(2, work)
    results = [r for run in runs for r in run]
    assert not errors
    created = sum(len(r.created) for r in results)
    assert created == n * 5
    assert db.value("SELECT count(*) FROM task") == n * 5
    assert db.value("SELECT count(*) FROM (SELECT DISTINCT o.schedule, t.plan FROM task t "
                    "JOIN task_occurrence o ON o.task = t.id) x") == n * 5


def test_occurrence_key_blocks_a_duplicate(db):
    """Even a materialiser that missed the cursor advance cannot create an occurrence twice."""
    sid = add(db)
    materialise(db, T0)
    db.execute("INSERT INTO task_occurrence (schedule, scheduled_for) VALUES (%s, '2026-06-01 13:00+00')", (sid,))
    r = materialise(db, T0 + timedelta(hours=1))
    assert r.created == [] and r.duplicates == 1 and db.value("SELECT count(*) FROM task") == 0
    assert sched(db)["cursor"] == datetime(2026, 6, 1, 13, tzinfo=UTC)


def test_crash_before_advance_creates_nothing(db):
    add(db, misfire="catchup", catchup=3)
    materialise(db, T0)
    m = Materialiser("public", "task")

    async def boom(conn, s):
        assert (await (await conn.execute("SELECT count(*) FROM task")).fetchone())[0] == 3
        raise RuntimeError("crash between materialise and advance")

    m.before_advance = boom
    with pytest.raises(RuntimeError):
        materialise(db, T0 + timedelta(hours=5), m)
    assert db.value("SELECT count(*) FROM task") == 0 and db.value("SELECT count(*) FROM task_occurrence") == 0
    assert sched(db)["cursor"] == T0
    r = materialise(db, T0 + timedelta(hours=5))
    assert len(r.created) == 3 and db.value("SELECT count(*) FROM task") == 3


def test_connection_killed_before_advance_creates_nothing(db):
    add(db)
    materialise(db, T0)
    m = Materialiser("public", "task")

    async def kill(conn, s):
        pid = conn.info.backend_pid
        with db.connect() as other:
            other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        await conn.execute("SELECT 1")

    m.before_advance = kill
    with pytest.raises(psycopg.OperationalError):
        materialise(db, T0 + timedelta(hours=1), m)
    assert db.value("SELECT count(*) FROM task") == 0
    assert len(materialise(db, T0 + timedelta(hours=1)).created) == 1
    assert db.value("SELECT count(*) FROM task") == 1


def test_full_group_keeps_the_occurrence_at_the_cursor(db):
    db.execute("INSERT INTO task_group VALUES ('g', 1)")
    blocker = db.value("""INSERT INTO task (input, "group") VALUES ('SELECT 1', 'g') RETURNING id""")
    add(db, columns=psycopg.types.json.Jsonb({"group": "g"}), misfire="catchup")
    materialise(db, T0)
    r = materialise(db, T0 + timedelta(hours=1))
    assert r.waiting == 1 and r.created == []
    s = sched(db)
    assert s["cursor"] == T0 and s["next_run"] == datetime(2026, 6, 1, 13, tzinfo=UTC)
    assert 'group "g" is full' in s["error"]
    db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (blocker,))
    r = materialise(db, T0 + timedelta(hours=1, minutes=5))
    assert [at for _, at in r.created] == [datetime(2026, 6, 1, 13, tzinfo=UTC)]
    assert sched(db)["error"] is None


def test_schedule_of_a_role_the_service_cannot_act_as(db):
    db.execute("CREATE ROLE sched_svc LOGIN; CREATE ROLE sched_carol LOGIN")
    db.execute("GRANT ALL ON ALL TABLES IN SCHEMA public TO sched_svc; GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO sched_svc")
    db.execute("INSERT INTO task_service VALUES ('sched_svc')")  # as provisioning registers an entry's user
    add(db, user="sched_carol")
    assert sched(db)["user"] == "sched_carol"   # inserted by a superuser
    m = Materialiser("public", "task")

    async def go(now):
        async with await psycopg.AsyncConnection.connect(db.dsn, user="sched_svc", autocommit=True) as conn:
            return await m.run_once(conn, now)
    asyncio.run(go(T0))
    r = asyncio.run(go(T0 + timedelta(hours=1)))
    assert r.failed == 1 and db.value("SELECT count(*) FROM task") == 0
    assert "cannot insert tasks as role 'sched_carol'" in sched(db)["error"]


def test_service_runs_a_schedule_to_done(db, service_factory):
    svc = service_factory(db.name, "[pgtask]\nreset_check = 0.5\nschedule_interval = 0.2\n")
    add(db, name="every-second", cron="* * * * * *", input_text="SELECT 'tick'")
    wait_for(lambda: db.value("SELECT count(*) FROM task t JOIN task_occurrence o ON o.task = t.id "
                              "WHERE t.state = 'DONE' AND t.output = 'tick'") >= 2, 20,
             message=f"two scheduled tasks DONE:\n{svc.output()}")
    db.execute("UPDATE task_schedule SET paused = true")
    assert db.value("SELECT count(DISTINCT plan) FROM task") == db.value("SELECT count(*) FROM task")
    assert "schedule occurrence" in svc.output()


def test_only_members_of_its_role_change_a_schedule(db):
    """Another role does not see a schedule (row-level security); the service's roles see every
    schedule but change only its progress (and may delete it); the progress is the service's alone."""
    db.execute("CREATE ROLE sched_dave LOGIN IN ROLE task_user; CREATE ROLE sched_erin LOGIN IN ROLE task_user; "
               "CREATE ROLE sched_svc2 LOGIN")
    db.execute("GRANT ALL ON task_schedule TO sched_svc2; INSERT INTO task_service VALUES ('sched_svc2')")
    with db.connect(user="sched_dave") as conn:
        conn.execute("""INSERT INTO task_schedule (name, cron, input, "user") VALUES ('d', '@daily', 'SELECT 1', 'postgres')""")
    assert sched(db, "d")["user"] == "sched_dave"      # not a member of postgres: its own role
    with db.connect(user="sched_erin") as conn:
        assert conn.execute("SELECT count(*) FROM task_schedule").fetchone() == (0,)
        assert conn.execute("UPDATE task_schedule SET input = 'SELECT 2' WHERE name = 'd'").rowcount == 0
        assert conn.execute("DELETE FROM task_schedule WHERE name = 'd'").rowcount == 0
    with db.connect(user="sched_svc2") as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="change schedule"):
            conn.execute("UPDATE task_schedule SET input = 'SELECT 2' WHERE name = 'd'")
        assert conn.execute("UPDATE task_schedule SET error = NULL WHERE name = 'd'").rowcount == 1  # its progress
    with db.connect(user="sched_dave") as conn:
        conn.execute("UPDATE task_schedule SET paused = true WHERE name = 'd'")
    materialise(db, T0)    # the service (another role) updates its own columns freely
    assert sched(db, "d")["preview"] and sched(db, "d")["input"] == "SELECT 1"
    # the service's columns are the service's: a cursor set back would replay past runs as dave
    for change in ("cursor = now() - interval '30 days'", "next_run = 'infinity'", "error = 'x'"):
        with db.connect(user="sched_dave") as conn, pytest.raises(psycopg.errors.InsufficientPrivilege,
                                                                  match="progress of schedule"):
            conn.execute(f"UPDATE task_schedule SET {change} WHERE name = 'd'")
    with db.connect(user="sched_dave") as conn:
        assert conn.execute("DELETE FROM task_schedule WHERE name = 'd' RETURNING name").fetchone() == ("d",)


def test_bad_task_columns_fail_the_schedules_insert(db):
    """A schedule's columns are checked when they are set, as task_enqueue checks them: not
    accepted, to fail every materialisation after."""
    for columns, message in (('{"state": "DONE"}', "cannot set task column\\(s\\) state"),
                             ('{"grop": "mail"}', "cannot set task column\\(s\\) grop"),
                             ('{"plan": "2030-01-01"}', "cannot set task column\\(s\\) plan\n"),
                             ('{"plan": "2030-01-01", "pid": 1}', "cannot set task column\\(s\\) pid, plan\n"),
                             ('{"timeout": "soon"}', "invalid columns: invalid input syntax for type interval")):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
            add(db, name="bad", columns=columns)
    sid = add(db, name="good", columns='{"group": "mail", "timeout": "5 min"}')
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="cannot set task column"):
        db.execute("""UPDATE task_schedule SET columns = '{"pid": 1}' WHERE id = %s""", (sid,))
