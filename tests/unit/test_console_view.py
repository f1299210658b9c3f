"""The console's HTML: anyone's text (a task's group, author, error, input) is shown as text."""

from pgtask import status
from pgtask.console_data import Outcome, Snapshot
from pgtask.console_view import groups, result, tasks, verdict

HOSTILE = "<img src=x onerror=alert(1)>"


def test_anyones_text_is_escaped():
    snap = Snapshot(status.Verdict(True, "OK: " + HOSTILE, [HOSTILE]), matching=1, tasks=[
        {"id": 7, "state": "FAIL", "group": HOSTILE, "user": HOSTILE, "age_seconds": 3.0, "parent": None,
         "error": HOSTILE, "input": HOSTILE}])
    snap.groups = [{"group": HOSTILE, "due": 0, "oldest_due_seconds": None, "running": 0, "orphaned": 0,
                    "failed_window": 1, "finished_window": 1, "rate": None, "flow": None}]
    for html in (verdict(snap), tasks(snap), groups(snap, "1 hour")):
        assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html


def test_a_retry_shows_each_old_id_beside_its_new_one():
    shown = result(Outcome("retry", False, 2, [4, 9], [11, 12]))
    assert "retried <b class='pgtask-result-count'>2</b> tasks; the first: 4 → 11, 9 → 12." in shown
    assert "left" not in shown
    assert "3 left" in result(Outcome("delete", False, 5, [1], remaining=3))
