"""When a pooled executor session ends: once the worker running on it -- from the task that spawned
the worker on -- has run `count` tasks or lived `live` (the manual's worker exits then), and once
the ALTER DATABASE / ALTER ROLE settings it started with have changed (a backend reads them only
when it starts) -- while the service keeps running."""

import collections

import pytest
from support import sessions_reset_and_idle, wait_for


def finished(db, ids: list[int]) -> list[dict]:
    """The rows of ``ids`` once all are DONE or FAIL, in id order."""
    return [db.wait_state(i) for i in ids]


def warm(db, tasks: int, groups: int = 1, **columns) -> set[int]:
    """``tasks`` tasks of the same role in each of ``groups`` groups (others than the test's unless
    ``columns`` say), inserted at once: a session for each group runs its tasks one after another
    (the claim pass that finishes one starts the next on it). Once those sessions are back in the
    pool, having run tasks before the test's batch: their pids."""
    ids = insert(db, tasks * groups, "SELECT 1", groups=groups, **{"group": "warm", **columns})
    pids = {row["pid"] for row in finished(db, ids)}
    assert len(pids) == groups, pids
    wait_for(lambda: sessions_reset_and_idle(db, "pid = ANY(%s)", (list(pids),)) == len(pids),
             message="the warm sessions back in the pool")
    return pids


def insert(db, n: int, input_text: str, first_id: int | None = None, groups: int = 1, **columns) -> list[int]:
    """``n`` tasks in one statement (the claim sees them all at once), with ids from ``first_id`` on
    if given, their group spread over ``groups`` groups (its name and a number); their ids in order."""
    names = "".join(f', "{c}"' for c in columns)
    marks = "".join(", %s || (i %% %s)" if c == "group" and groups > 1 else ", %s" for c in columns)
    values = [x for c, v in columns.items() for x in ((v, groups) if c == "group" and groups > 1 else (v,))]
    id_column, id_value = ('"id", ', "i, ") if first_id is not None else ("", "")
    start = first_id if first_id is not None else 1
    return [r[0] for r in db.execute(
        f'INSERT INTO task ({id_column}"input", "delete"{names}) SELECT {id_value}%s, false{marks} '
        "FROM generate_series(%s::bigint, %s::bigint) i ORDER BY i RETURNING id",
        (input_text, *values, start, start + n - 1))]


# A task of run_in_lockstep: it runs once the test lets go of the lock of its id.
LOCKSTEP = "SELECT pg_advisory_xact_lock_shared(current_setting('pg_task.id')::bigint)"


def run_in_lockstep(db, n: int, **columns) -> list[dict]:
    """``n`` tasks of group g inserted in one statement, each waiting for the lock of its id that
    the test holds, let go one at a time: the lowest running one, once as many have started as
    the group has room for (the worker that ran the one before took its next task, or ended and a
    claim started a new worker). Which worker takes which task is then the service's choice alone,
    never a race between two workers that the machine's load decides. Their rows, in id order."""
    ids = list(range(1001, 1001 + n))
    room = columns.get("max", 0) + 1
    with db.connect() as holder:
        for i in ids:
            holder.execute("SELECT pg_advisory_lock(%s)", (i,))
        insert(db, n, LOCKSTEP, first_id=ids[0], group="g", **columns)
        for _ in ids:
            running = wait_for(lambda: db.value(
                """SELECT CASE WHEN count(*) FILTER (WHERE "state" = 'WORK')
                                    = least(%s, count(*) FILTER (WHERE "state" NOT IN ('DONE', 'FAIL')))
                          THEN min("id") FILTER (WHERE "state" = 'WORK') END
                   FROM task WHERE "id" = ANY(%s)""", (room, ids)), message="the group's workers to run")
            holder.execute("SELECT pg_advisory_unlock(%s)", (running,))
            db.wait_state(running)
    return finished(db, ids)


def per_backend(rows: list[dict]) -> list[int]:
    """How many of ``rows`` each backend ran, backends in the order of their first task."""
    return list(collections.Counter(r["pid"] for r in sorted(rows, key=lambda r: r["id"])).values())


@pytest.mark.parametrize("warmed", [{"tasks": 1, "group": "g", "count": 5}, {"tasks": 3}],
                         ids=["a worker of the group before", "3 tasks of another group before"])
def test_each_worker_runs_count_tasks(db, service, warmed):
    """10 tasks of one group, two at a time (max 1), count 5: each of the two workers runs 5 --
    on sessions of the pool that ran other tasks of the role before too (count is the worker's,
    from the task that spawned it: the manual's worker starts from zero)."""
    warm(db, **warmed)
    rows = run_in_lockstep(db, 10, max=1, count=5)
    assert {r["state"] for r in rows} == {"DONE"}
    assert per_backend(rows) == [5, 5], per_backend(rows)


def test_a_worker_that_ran_count_tasks_ends_its_backend(db, service):
    """20 such tasks: once a worker has run 5 its backend ends, and two new workers run 5 each."""
    warm(db, 3, groups=2)
    rows = run_in_lockstep(db, 20, max=1, count=5)
    assert {r["state"] for r in rows} == {"DONE"}
    assert per_backend(rows) == [5, 5, 5, 5], per_backend(rows)


def test_a_worker_takes_only_tasks_of_its_spawners_max(db, service):
    """The manual's mixed case: 10 tasks with max 1 and count 6, and one with max 2 and count 6,
    inserted at once. The max 2 task (its input waits for a lock the test holds) and the first max 1
    task start; the max 1 worker runs 6 (its group has no room for another meanwhile), then the
    next max 1 worker runs the other 4; the max 2 worker, let go, finds no task of max >= 2."""
    warm(db, 3, groups=2)
    with db.connect() as holder:
        holder.execute("SELECT pg_advisory_lock(4801)")
        ids = sorted(r[0] for r in db.execute(
            """INSERT INTO task ("input", "group", "max", "count", "delete")
               SELECT CASE WHEN i = 0 THEN 'SELECT pg_advisory_lock_shared(4801)' ELSE 'SELECT 1' END, 'g',
                      CASE WHEN i = 0 THEN 2 ELSE 1 END, 6, false
               FROM generate_series(0, 10) i ORDER BY i RETURNING id"""))
        ones = finished(db, ids[1:])
        assert db.task(ids[0])["state"] == "WORK"
    rows = [db.wait_state(ids[0]), *ones]
    assert {r["state"] for r in rows} == {"DONE"}, rows
    assert per_backend(rows) == [1, 6, 4], per_backend(rows)


def test_a_session_older_than_live_ends(db, service):
    """8 serial tasks of 0.3 s with live 2 s: a backend whose first task started 2 s ago runs no more."""
    ids = [db.insert("SELECT pg_sleep(0.3)", group="g", live="2 sec") for _ in range(8)]
    rows = finished(db, ids)
    assert {r["state"] for r in rows} == {"DONE"}
    pids = [r["pid"] for r in rows]
    assert len(set(pids)) >= 2, pids
    for pid in set(pids):
        ran = [i for i, p in enumerate(pids) if p == pid]
        assert ran == list(range(ran[0], ran[-1] + 1)), pids  # one after another: an ended backend is gone


def test_live_counts_from_the_workers_first_task(db, service):
    """A pooled session that opened longer than live ago still runs a whole worker's tasks: live
    is the worker's age, from the task that spawned it, not the session's."""
    live = "3 sec"
    (pid,) = warm(db, 1)
    wait_for(lambda: db.value("""SELECT max("stop") < statement_timestamp() - %s::interval FROM task
                                 WHERE "group" = 'warm'""", (live,)),
             timeout=10, message="the warm session's task to have ended longer than live ago")
    rows = finished(db, insert(db, 4, "SELECT 1", group="g", live=live))
    assert {r["state"] for r in rows} == {"DONE"}
    assert {r["pid"] for r in rows} == {pid}, rows


def search_path_after(db, change: str, user: str | None = None) -> tuple[dict, dict]:
    """A task showing search_path, then ``change`` while its session waits in the pool, then
    another: both rows (inserted as ``user``)."""
    def show() -> int:
        with db.connect(user) as conn:
            return conn.execute("INSERT INTO task (input) VALUES ('SHOW search_path') RETURNING id").fetchone()[0]

    before = db.wait_state(show())
    wait_for(lambda: sessions_reset_and_idle(db, "pid = %s", (before["pid"],)) == 1,
             message="the task's session back in the pool")
    db.execute(change)
    return before, db.wait_state(show())


def test_alter_database_set_reaches_the_next_task(db, service):
    before, after = search_path_after(db, f'ALTER DATABASE "{db.name}" SET search_path = pgtask_x, public')
    assert before["output"] == '"$user", public'
    assert (after["state"], after["output"]) == ("DONE", "pgtask_x, public")
    assert after["pid"] != before["pid"]
    assert service.proc.poll() is None


def test_alter_role_set_reaches_the_next_task(db, service):
    rita = db.role(f"rita_{db.name}")
    try:
        before, after = search_path_after(db, f'ALTER ROLE "{rita}" SET search_path = pgtask_r, public', rita)
    finally:
        db.execute(f'ALTER ROLE "{rita}" RESET search_path')
    assert before["output"] == '"$user", public'
    assert (after["state"], after["output"]) == ("DONE", "pgtask_r, public")
    assert service.proc.poll() is None


def test_a_settings_change_ends_the_session_that_save_keeps(db, service):
    """Within count/live with save, the group's next task inherits its session -- unless settings
    changed meanwhile: it then starts on a new session, which has them (and not the saved state)."""
    first = db.insert("CREATE TEMP TABLE kept (x int); SELECT pg_sleep(1)", group="g", count=10, save=True)
    second = db.insert("SELECT current_setting('search_path') || ' ' || (to_regclass('kept') IS NOT NULL)",
                       group="g", count=10, save=True)
    wait_for(lambda: db.task(first)["state"] == "WORK", message="the first task to run")
    db.execute(f'ALTER DATABASE "{db.name}" SET search_path = pgtask_s, public')
    one, two = finished(db, [first, second])
    assert (one["state"], two["state"]) == ("DONE", "DONE"), (one, two)
    assert two["output"] == "pgtask_s, public false"
    assert two["pid"] != one["pid"]


def test_save_keeps_the_session_within_count(db, service):
    """The same two tasks without a settings change: the second runs on the first one's session,
    its temporary table still there."""
    first = db.insert("CREATE TEMP TABLE kept (x int); SELECT pg_sleep(0.3)", group="g", count=10, save=True)
    second = db.insert("SELECT to_regclass('kept') IS NOT NULL", group="g", count=10, save=True)
    one, two = finished(db, [first, second])
    assert (two["state"], two["output"], two["pid"]) == ("DONE", "t", one["pid"])

