"""Every notebook executed with papermill against a throwaway database with `pgtask run` serving
it, then assertions on the database. Each runs twice in a row: the second run succeeds, its install
step reports nothing to change, and the catalog (columns, constraints, indexes, triggers, functions,
relations, pattern tasks) is identical afterwards."""

import itertools
import re
from datetime import UTC, datetime, timedelta

import pytest
from support import wait_for

from .catalog import snapshot


def outputs(nb) -> str:
    """All text a notebook printed or displayed."""
    out = []
    for c in nb.cells:
        for o in c.get("outputs", []) if c.cell_type == "code" else []:
            out.append(o.get("text", "") or o.get("data", {}).get("text/plain", ""))
    return "\n".join(out)


def twice(db, run_notebook, name, **params):
    """Run a notebook twice; the second run must change nothing but its own demo rows."""
    first = run_notebook(name, **params)
    assert "OK:" in outputs(first)
    catalog = snapshot(db.conn, "public", "task")
    second = run_notebook(name, **params)
    text = outputs(second)
    assert "OK:" in text
    if name != "retry_until_success":
        assert "nothing to change: already in place" in text, text
    assert snapshot(db.conn, "public", "task") == catalog
    return second


def demo_rows(db, mark, columns="id, parent, state::text"):
    return db.execute(f"SELECT {columns} FROM task WHERE data = %s ORDER BY id", (mark,))


def test_retry_until_success(db, service, run_notebook):
    twice(db, run_notebook, "retry_until_success", repeat="0.3 seconds", failures=2)
    rows = demo_rows(db, "notebook demo: retry_until_success", "id, parent, state::text, repeat")
    assert [r[2] for r in rows] == ["FAIL", "FAIL", "DONE"]
    assert rows[-1][3] == timedelta(0) and rows[0][3] == timedelta(seconds=0.3)
    assert [r[1] for r in rows[1:]] == [r[0] for r in rows[:-1]]


def test_retry_backoff(db, service, run_notebook):
    twice(db, run_notebook, "retry_backoff", retry_max=3, retry_interval="0.2 seconds")
    rows = db.execute("""SELECT id, parent, retry, state::text, plan - lag(stop) OVER (ORDER BY id)
        FROM task WHERE data = 'notebook demo: retry_backoff' ORDER BY id""")
    assert [r[2] for r in rows] == [0, 1, 2, 3]
    assert all(r[3] == "FAIL" for r in rows)
    # the plans double: 1, 2, 4 times the interval after each failure
    assert [r[4] for r in rows[1:]] == [timedelta(seconds=0.2), timedelta(seconds=0.4), timedelta(seconds=0.8)]
    assert [r[1] for r in rows[1:]] == [r[0] for r in rows[:-1]]


def test_depend_on_parent(db, service, run_notebook):
    # waiting children have plan = 'infinity': the scheduler's next-deadline query must skip them
    twice(db, run_notebook, "depend_on_parent", parent_seconds=0.3)
    rows = db.execute("""SELECT p.state::text, c.depend, c.state::text, c.start IS NOT NULL
        FROM task c JOIN task p ON p.id = c.parent
        WHERE c.data = 'notebook demo: depend' ORDER BY c.id""")
    assert len(rows) == 8
    for parent_state, depend, state, ran in rows:
        runs = depend == "always" or (depend == "success") == (parent_state == "DONE")
        assert (state, ran) == (("DONE", True) if runs else ("STOP", False)), (parent_state, depend, state)
    # the graph of tasks (after): a diamond and a fan-in, the third shard failing
    dag = db.execute("""SELECT split_part(input, '''', 2), state::text, error FROM task
                        WHERE data = 'notebook demo: dag' ORDER BY id""")
    states = {label: state for label, state, _ in dag}
    assert len(dag) == 10 and states.pop("shard_3") == "FAIL" and states.pop("report") == "GONE", dag
    assert set(states.values()) == {"DONE"}, dag


def test_cron_schedule(db, service, run_notebook):
    twice(db, run_notebook, "cron_schedule", cron_expr="* * * * *")
    rows = demo_rows(db, "notebook demo: cron", "id, parent, state::text, plan, stop, "
                                                "task_cron_next(cron, stop)")
    # the first run, then the occurrence the demo stopped -- with, when a minute began while the
    # notebook ran, the occurrences that ran in between, each planned by the one before
    assert [r[2] for r in rows] == ["DONE"] * (len(rows) - 1) + ["STOP"] and len(rows) >= 2, rows
    for done, nxt in itertools.pairwise(rows):
        assert nxt[1] == done[0] and nxt[3] == done[5]
        assert nxt[3].second == 0 and timedelta(0) < nxt[3] - done[4] <= timedelta(minutes=1)


def test_notify_on_completion(db, service, run_notebook):
    nb = twice(db, run_notebook, "notify_on_completion")
    assert "task_done: {" in outputs(nb)
    assert db.value("SELECT count(*) FROM pg_trigger WHERE tgname = 'task_notify'") == 1


def test_archive_history(db, service, run_notebook):
    twice(db, run_notebook, "archive_history")
    assert demo_rows(db, "notebook demo: archive") == []
    archived = db.execute("""SELECT state::text, input, tableoid::regclass::text FROM task_archive
        WHERE data = 'notebook demo: archive' ORDER BY id""")
    assert [(a[0], a[1]) for a in archived] == [
        ("DONE", "SELECT 1 WHERE false"), ("DONE", "SELECT 'kept until cleanup'"), ("FAIL", "SELECT 1/0")]
    assert {a[2] for a in archived} == {"task_archive_default"}


def test_archive_partitions(db, service, run_notebook):
    # a row archived before any dated partition exists sits in the default partition; creating
    # its month's partition moves it there instead of failing
    from pgtask import patterns
    with db.connect() as conn:
        patterns.install(conn, "archive")
    db.execute("INSERT INTO task (input, state, stop, data) VALUES ('SELECT 1', 'DONE', now(), 'early')")
    db.execute("DELETE FROM task WHERE data = 'early'")
    assert db.value("SELECT tableoid::regclass::text FROM task_archive WHERE data = 'early'") == "task_archive_default"
    twice(db, run_notebook, "archive_partitions", lead="1 month", repeat="1 day")
    month = db.value("SELECT 'task_archive_' || to_char(now() AT TIME ZONE 'UTC', 'YYYY_MM')")
    following = db.value("SELECT 'task_archive_' || to_char(now() AT TIME ZONE 'UTC' + '1 month', 'YYYY_MM')")
    parts = [r[0] for r in db.execute("""SELECT inhrelid::regclass::text FROM pg_inherits
        WHERE inhparent = 'task_archive'::regclass ORDER BY 1""")]
    assert month in parts and following in parts and "task_archive_default" in parts
    assert db.value("SELECT tableoid::regclass::text FROM task_archive WHERE data = 'early'") == month
    live = db.execute("""SELECT repeat FROM task WHERE data LIKE 'pgtask.patterns partition %'
        AND state IN ('PLAN', 'TAKE', 'WORK')""")
    assert live == [(timedelta(days=1),)]


def test_structured_tags(db, service, run_notebook):
    twice(db, run_notebook, "structured_tags", tenant="acme")
    assert db.value("""SELECT count(*) FROM task WHERE meta @> '{"tenant": "acme"}'
        AND data = 'notebook demo: tags' AND state = 'DONE'""") == 2
    assert db.value("SELECT indexdef FROM pg_indexes WHERE indexname = 'task_meta_gin'").endswith(
        "USING gin (meta jsonb_path_ops)")


def test_idempotency_key(db, service, run_notebook):
    twice(db, run_notebook, "idempotency_key", key="k1")
    assert demo_rows(db, "notebook demo: idempotency", "idem_key, state::text") == [("k1", "DONE"), ("k1", "DONE")]


def test_trace_propagation(db, service, run_notebook):
    twice(db, run_notebook, "trace_propagation", children=2)
    rows = demo_rows(db, "notebook demo: trace", "id, parent, trace_id, span_id")
    assert len(rows) == 3 and len({r[2] for r in rows}) == 1 and len({r[3] for r in rows}) == 3
    assert rows[1][1] == rows[0][0] and rows[2][1] == rows[0][0]


def test_dry_run_validation(db, service, run_notebook):
    twice(db, run_notebook, "dry_run_validation")
    rows = demo_rows(db, "notebook demo: dry_run", "dry_run, state::text, error IS NULL, start IS NULL")
    assert rows == [(True, "STOP", True, True), (True, "STOP", False, True), (True, "STOP", False, True),
                    (False, "DONE", True, False)]
    assert db.value("SELECT to_regclass('notebook_dry_run_demo')") is None


@pytest.mark.parametrize("name", ["retry_backoff", "depend_on_parent", "cron_schedule", "notify_on_completion",
                                  "archive_history", "structured_tags", "idempotency_key", "trace_propagation",
                                  "dry_run_validation"])
def test_install_only_without_a_service(db, run_notebook, name):
    """demo = False: installs and checks, no service needed."""
    nb = run_notebook(name, demo=False)
    assert "OK: installed" in outputs(nb)


def stderr(nb) -> str:
    """What a notebook's cells wrote to stderr (warnings among it)."""
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                     if o.get("output_type") == "stream" and o.get("name") == "stderr")


def test_queue_inspection(db, service, run_notebook, tmp_path):
    """Read only: a seeded queue (done, failed, running long, planned) shows up in every table, the
    summary says the service is looking after it, and the figure is drawn into the executed notebook
    and saved as a PNG without a warning printed."""
    ids = [db.insert("SELECT pg_sleep(0.05)", group="reports") for _ in range(5)]
    ids += [db.insert("SELECT 1/0", group="imports"), db.insert("SELECT * FROM missing_table", group="imports")]
    slow = db.insert("SELECT pg_sleep(30)", group="slow")
    db.execute("INSERT INTO task (plan, input) VALUES (now() + '1 hour', 'SELECT 1')")
    db.execute("""INSERT INTO task_group ("group", paused) VALUES ('held', true)""")
    for i in ids:
        db.wait_state(i)
    db.wait_state(slow, ("WORK",))
    before = snapshot(db.conn, "public", "task")
    png = tmp_path / "queue.png"
    nb = run_notebook("queue_inspection", since="1 hour", bucket="1 minute", stuck_after="0.1 seconds",
                      figure_path=str(png))
    text = outputs(nb)
    assert "OK: a service is connected and claiming; 0 due; 1 running" in text, text
    assert "9 rows in the table; 8 tasks ran in the last 1 hour" in text, text
    assert "2 did not succeed; 1 stuck, 0 of them orphaned" in text, text
    assert "division by zero" in text and "relation \"missing_table\" does not exist" in text
    assert "SELECT 1/0" in text  # a sample input beside its error
    assert "1 paused, 0 rate-limited of 1 groups under flow control" in text and "PAUSED" in text, text
    assert png.stat().st_size > 10_000
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) == 1
    assert stderr(nb) == ""  # no library warning printed
    assert snapshot(db.conn, "public", "task") == before  # read only
    db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (slow,))


def test_queue_inspection_with_the_service_killed(db, service, run_notebook):
    """The service SIGKILLed with tasks due: the notebook leads with NOT OK and says why (no service,
    the late backlog, an orphaned row); a GONE row -- its start is when it expired -- counts neither
    as a task that ran nor in the pickup latency; tasks that did not succeed include it and a STOP."""
    ran = [db.insert("SELECT 1", group="reports") for _ in range(3)]
    for i in ran:
        db.wait_state(i)
    gone = db.insert("SELECT 1", group="expired", plan=datetime.now(UTC) - timedelta(hours=2), active="1 hour")
    db.wait_state(gone, ("GONE",))
    service.kill()
    wait_for(lambda: not db.value("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pg_work %'"),
             30, message="the killed service's sessions to end")
    late = datetime.now(UTC) - timedelta(seconds=73)
    for _ in range(4):
        db.insert("SELECT 1", group="reports", plan=late)
    db.insert("SELECT 1", group="orphans", state="TAKE")  # claimed by the service that died
    db.insert("SELECT 1", group="cancelled", state="STOP")
    nb = run_notebook("queue_inspection", since="1 hour", behind_after=60)
    text = outputs(nb)
    assert re.search(r"NOT OK: no `pgtask run` is connected for public.task; 1 orphaned row \(their service "
                     r"died\); 4 due tasks not picked up, the oldest for 7\d s \(over 60 s\); 4 due, the oldest 7\d s",
                     text), text
    assert text.index("NOT OK") < text.index("(all groups)")  # it leads
    assert "3 tasks ran (started) in the last 1 hour" in text and "3 tasks ran in the last 1 hour" in text, text
    assert "2.0 h" not in text  # the GONE row's start - plan is no pickup latency
    assert "task not active" in text and "stopped" in text


def test_maintenance(db, run_notebook):
    """No service (so orphans stay orphaned): a dry run changes nothing; a real run resets the
    orphans, purges old finished rows in batches into the archive, creates the partitions; a second
    real run finds nothing to do."""
    from pgtask import patterns
    with db.connect() as conn:
        patterns.install(conn, "partition")  # and the archive; its repeating task stays PLAN here
    db.execute("INSERT INTO task (input, state) SELECT 'SELECT 1', 'TAKE' FROM generate_series(1, 2)")
    stopped = db.insert("SELECT 1")  # set to STOP while it ran; its service died: it holds its slot
    db.execute("UPDATE task SET state = 'WORK', pid = 1, start = now() WHERE id = %s", (stopped,))
    db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (stopped,))
    db.execute("""INSERT INTO task (input, state, start, stop, output)
        SELECT 'SELECT 1', s::state, now() - '8 days'::interval, now() - '8 days'::interval, '1'
        FROM unnest(ARRAY['DONE', 'DONE', 'FAIL', 'GONE', 'STOP']) s""")
    db.execute("INSERT INTO task (input, state, start, stop, output) VALUES ('SELECT 1', 'DONE', now(), now(), '1')")

    def state():
        return (db.execute("SELECT state::text, count(*) FROM task GROUP BY 1 ORDER BY 1"),
                db.value("SELECT count(*) FROM task_archive"),
                db.value("SELECT count(*) FROM pg_inherits WHERE inhparent = 'task_archive'::regclass"))

    before = state()
    nb = run_notebook("maintenance")  # dry_run = True by default
    assert "OK: dry run, nothing changed" in outputs(nb)
    assert "would reset 3 orphaned rows" in outputs(nb) and "would delete 5 rows" in outputs(nb)
    assert state() == before

    nb = run_notebook("maintenance", dry_run=False, batch_size=2)
    text = outputs(nb)
    assert "deleted 5 finished rows in 3 batches" in text and "OK: maintenance done" in text, text
    rows, archived, partitions = state()
    assert f"ended 1 stopped rows: [{stopped}]" in text, text
    assert dict(rows) == {"PLAN": 3, "DONE": 1, "STOP": 1}  # 2 reset orphans + the partition task; the recent DONE
    assert db.task(stopped)["stop"] is not None
    assert archived == 5 and partitions >= 3  # default + this month + next month

    after = state()
    catalog = snapshot(db.conn, "public", "task")
    nb = run_notebook("maintenance", dry_run=False, batch_size=2)
    text = outputs(nb)
    assert "no orphaned rows" in text and "nothing to purge" in text and "nothing to change" in text, text
    assert state() == after and snapshot(db.conn, "public", "task") == catalog


def test_maintenance_children_before_parents(db, run_notebook):
    """The purge keeps an old finished row while one of its children is queued, running or recent
    (as the service's retention does), but not for a grandchild (a repeat's history would stay
    whole); an old tree whose rows are all old goes whole, into the archive; the preview counts
    exactly that."""

    from pgtask import patterns
    with db.connect() as conn:
        patterns.install(conn, "archive")
    old, now = datetime.now(UTC) - timedelta(days=8), datetime.now(UTC)

    def add(state, stop=None, parent=None, start=None):
        return db.insert("SELECT 1", data="purge", state=state, stop=stop, start=start, parent=parent)

    kept = {}
    kept["plan_parent"] = add("DONE", old)
    kept["plan"] = add("PLAN", parent=kept["plan_parent"])
    kept["work_parent"] = add("DONE", old)
    kept["work"] = add("WORK", start=now, parent=kept["work_parent"])
    kept["recent_parent"] = add("FAIL", old)
    kept["recent"] = add("DONE", now, parent=kept["recent_parent"])
    gone = {}
    gone["grandparent"] = add("DONE", old)  # its grandchild is queued, its child old: it goes
    kept["parent"] = add("STOP", old, parent=gone["grandparent"])
    kept["grandchild"] = add("PLAN", parent=kept["parent"])
    gone["root"] = add("DONE", old)
    gone["child"] = add("DONE", old, parent=gone["root"])
    gone["sibling"] = add("STOP", old, parent=gone["root"])
    gone["grandchild"] = add("FAIL", old, parent=gone["child"])
    gone["alone"] = add("GONE", old)

    nb = run_notebook("maintenance")
    assert f"would delete {len(gone)} rows" in outputs(nb), outputs(nb)

    nb = run_notebook("maintenance", dry_run=False, reset_orphans=False, batch_size=2)
    text = outputs(nb)
    assert f"deleted {len(gone)} finished rows" in text and "OK: maintenance done" in text, text
    left = {r[0] for r in demo_rows(db, "purge", "id")}
    assert left == set(kept.values()), {k: v for k, v in {**kept, **gone}.items() if (v in left) != (k in kept)}
    assert {r[0] for r in db.execute("SELECT id FROM task_archive")} == set(gone.values())
    assert db.value("SELECT count(*) FROM task") == len(kept)


def test_maintenance_vacuum_reports_what_it_left(db, run_notebook):
    """After the purge, VACUUM's figures are shown as they are afterwards: with a transaction that
    began before the purge still open, the deleted rows stay as dead rows, the notebook names that
    session as the oldest xmin holder and the summary is NOT OK; once it ends, a second run leaves
    no dead row and says OK."""
    db.execute("""INSERT INTO task (input, state, stop) SELECT 'SELECT 1', 'DONE', now() - interval '8 days'
                  FROM generate_series(1, 2000)""")
    holder = db.connect()
    holder.autocommit = False
    holder.execute("SET application_name = 'long report'")
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM task")  # its snapshot sees the rows the purge deletes
    pid = holder.info.backend_pid
    try:
        text = outputs(run_notebook("maintenance", dry_run=False, reset_orphans=False))
        assert "deleted 2,000 rows in 2 batches" in text, text
        assert re.search(rf"NOT OK: VACUUM left 2,000 dead rows beside 0 live ones; the oldest xmin holder: "
                         rf"session {pid} long report \(user postgres, database {db.name}, idle in transaction", text), text
        assert "before:" in text and "after:" in text
    finally:
        holder.rollback()
        holder.close()
    text = outputs(run_notebook("maintenance", dry_run=False, reset_orphans=False))
    assert "VACUUM left" not in text and "OK: maintenance done" in text, text


@pytest.mark.parametrize("params, message", [({"purge_states": ["DONE", "WORK"]}, "purge_states"),
                                             ({"batch_size": 0}, "batch_size")])
def test_maintenance_refuses_bad_parameters(db, run_notebook, params, message):
    """A purge state that is not a finished one, or an empty batch, stops the notebook before it
    changes anything, naming the parameter."""
    import papermill

    tid = db.insert("SELECT 1", state="DONE", stop=datetime.now(UTC) - timedelta(days=30))
    with pytest.raises(papermill.PapermillExecutionError, match=message):
        run_notebook("maintenance", dry_run=False, **params)
    assert db.task(tid)["state"] == "DONE"


def test_console(db, run_notebook):
    """The console's notebook runs headless (papermill) with its parameters and displays one
    widget, the console; tests/notebooks/test_console.py drives it in a browser."""
    nb = run_notebook("console", refresh=1)
    views = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(views) == 1
    assert "error" not in {o.get("output_type") for c in nb.cells if c.cell_type == "code" for o in c.outputs}
