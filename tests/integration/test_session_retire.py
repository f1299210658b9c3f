"""When a pooled executor session ends: after `count` tasks or `live` time (the manual's worker
exits then), and once the ALTER DATABASE / ALTER ROLE settings it started with have changed (a
backend reads them only when it starts) -- while the service keeps running."""

import collections

from support import sessions_reset_and_idle, wait_for


def finished(db, ids: list[int]) -> list[dict]:
    """The rows of ``ids`` once all are DONE or FAIL, in id order."""
    return [db.wait_state(i) for i in ids]


def test_a_session_that_ran_count_tasks_ends(db, service):
    """20 tasks of one group, two at a time (max 1), count 5: each backend runs at most 5."""
    ids = [db.insert("SELECT 1", group="g", max=1, count=5) for _ in range(20)]
    rows = finished(db, ids)
    assert {r["state"] for r in rows} == {"DONE"}
    per_pid = collections.Counter(r["pid"] for r in rows)
    assert max(per_pid.values()) <= 5, per_pid
    assert len(per_pid) >= 4, per_pid


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
