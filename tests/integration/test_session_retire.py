"""When a pooled executor session ends: after `count` tasks or `live` time (the manual's worker
exits then)."""

import collections


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


def test_save_keeps_the_session_within_count(db, service):
    """Within count/live with save, the group's next task inherits its session, its temporary
    table still there."""
    first = db.insert("CREATE TEMP TABLE kept (x int); SELECT pg_sleep(0.3)", group="g", count=10, save=True)
    second = db.insert("SELECT to_regclass('kept') IS NOT NULL", group="g", count=10, save=True)
    one, two = finished(db, [first, second])
    assert (two["state"], two["output"], two["pid"]) == ("DONE", "t", one["pid"])
