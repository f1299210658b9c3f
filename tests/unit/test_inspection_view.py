"""What the queue inspection shows, without a cluster: its tables print ids and pids as plain
integers, the group rows count orphaned rows apart from running ones, and the figure carries the
liveness verdict."""

from __future__ import annotations

import pytest

from pgtask import status
from pgtask.patterns import figure
from pgtask.patterns import notebook as nb

pytestmark = [pytest.mark.any_pg, pytest.mark.quick]  # no server: the first pass of ./test runs it

pd = pytest.importorskip("pandas")


def test_a_table_prints_ids_and_pids_without_separators_and_counts_with():
    df = pd.DataFrame({"id": [1234567, 7], "pid": [48213.0, None], "example id": [2345678, 8],
                       "tasks": [1759, 3]})  # a pid column with a NULL loads as float
    lines = repr(nb.Table(df)).splitlines()
    assert [line.split() for line in lines] == [["id", "pid", "example", "id", "tasks"],
                                                ["1234567", "48213", "2345678", "1,759"],
                                                ["7", "8", "3"]]


def group(name, running, orphaned):
    return {"group": name, "due": 0, "oldest_due_seconds": None, "planned": 0, "running": running,
            "orphaned": orphaned, "done_window": 0, "fail_window": 0, "gone_window": 0, "stop_window": 0,
            "done": 0, "fail": 0, "gone": 0, "stop": 0, "finished_window": 0, "failed_window": 0, "rate": None,
            "pickup_p50_seconds": None, "pickup_p99_seconds": None}


def test_group_rows_count_orphaned_rows_apart_from_running_ones():
    found = [group("a", 2, 0), group("b", 0, 3)]
    at = status.GROUP_COLUMNS.index("running"), status.GROUP_COLUMNS.index("orphaned")
    rows = [status.group_cells(g) for g in found] + [status.total_cells(found)]
    assert all(len(r) == len(status.GROUP_COLUMNS) for r in rows)
    assert [(r[at[0]], r[at[1]]) for r in rows] == [("2", "0"), ("0", "3"), ("2", "3")]


def verdict(ok: bool) -> status.Verdict:
    headline = ("OK: a service is connected and claiming; 0 due; 1 running" if ok else
                "NOT OK: no `pgtask run` is connected for public.task; 1 orphaned row (their service died); "
                "4 due tasks not picked up, the oldest for 73 s (over 60 s); 4 due, the oldest 73 s")
    return status.Verdict(ok, headline, [])


def test_the_figure_title_carries_the_liveness_verdict_wrapped():
    bad = verdict(False)
    lines = figure.figure_title("public.task", "1 hour", bad).splitlines()
    assert lines[0] == "public.task: the last 1 hour (rows by state: the whole table)"
    assert " ".join(lines[1:]) == bad.headline and all(len(line) <= 110 for line in lines) and len(lines) == 3


@pytest.mark.parametrize("ok", [True, False])
def test_the_figure_shows_the_verdict_in_its_colour(ok):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    v = verdict(ok)
    now = pd.Timestamp.now(tz="UTC")
    empty = pd.DataFrame({"group": [], "state": [], "tasks": []})
    timings = pd.DataFrame({"pickup_seconds": [0.1, 0.2], "run_seconds": [0.3, 0.4]})
    fig = figure.queue_figure("public.task", "1 hour", 60.0, empty, [], pd.DataFrame(),
                              pd.DataFrame({"bucket": [], "backlog": []}), timings, now - pd.Timedelta(hours=1),
                              now, verdict=v)
    try:
        title = next(t for t in fig.texts if t.get_text() == fig.get_suptitle())
        assert title.get_text().splitlines()[1].startswith("OK: a service" if ok else "NOT OK: no `pgtask run`")
        assert title.get_color() == figure.VERDICT_COLORS[ok]
    finally:
        plt.close(fig)
