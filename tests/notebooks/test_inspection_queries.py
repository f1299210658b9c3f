"""The queue inspection's queries (pgtask/patterns/inspect.sql) on a real table, without Jupyter:
the backlog over time counts a row only while it waited, failures group by their message with the
numbers masked, and a row's age is never negative."""

from __future__ import annotations

from pgtask.patterns import notebook as nb


def test_a_gone_row_is_backlog_only_until_it_expired(db):
    """GONE rows' start and stop are when the service noticed them: one inserted with a plan long
    past expired at plan + active, and is no backlog after that."""
    db.execute("""INSERT INTO task (input, state, plan, active, start, stop) VALUES
        ('SELECT 1', 'GONE', now() - interval '3 hours', interval '1 hour', now(), now()),
        ('SELECT 1', 'GONE', now() - interval '20 minutes', interval '5 minutes', now(), now())""")
    db.execute("INSERT INTO task (input, plan) VALUES ('SELECT 1', now() - interval '10 minutes')")
    curve = nb.inspect(db.dsn, "public", "task", "backlog_over_time", since="1 hour", bucket="1 minute")
    at = [db.value("SELECT date_bin('1 minute', now() - %s::interval, timestamptz '2000-01-01')", (ago,))
          for ago in ("20 minutes", "15 minutes", "10 minutes")]
    assert [(b.to_pydatetime(), int(n)) for b, n in zip(curve["bucket"], curve["backlog"])] == \
        list(zip(at, [1, 0, 1])), curve


def test_failures_group_by_their_message_with_the_numbers_masked(db):
    rows = [("a", "task 123 failed at 2026-01-02 03:04:05.678+00"), ("b", "task 7 failed at 2026-02-03T10:11:12Z"),
            ("a", "task 45 failed at 2026-03-04 05:06"), ("a", "relation \"t1\" does not exist"),
            ("c", "relation \"t22\" does not exist\nLINE 1: SELECT * FROM t22")]
    ids = [db.value("""INSERT INTO task (input, "group", state, start, stop, error)
                       VALUES ('SELECT ' || %s, %s, 'FAIL', now(), now() + %s * interval '1 ms', %s)
                       RETURNING id""", (i, g, i, e)) for i, (g, e) in enumerate(rows)]
    failures = nb.inspect(db.dsn, "public", "task", "failures", since="1 hour")
    got = [(r.state, r.error, r.tasks, r.groups, r.example_id, r.sample_input) for r in failures.itertuples()]
    assert got == [("FAIL", "task N failed at ...", 3, "a, b", ids[2], "SELECT 2"),
                   ("FAIL", "relation \"tN\" does not exist", 2, "a, c", ids[4], "SELECT 4")], failures
    latest = db.value("SELECT stop FROM task WHERE id = %s", (ids[2],))
    assert failures["latest"][0].to_pydatetime() == latest


def test_a_row_started_after_the_query_began_is_0_s_old(db):
    """Its service started it while the query ran (here: a start a minute ahead stands for that)."""
    task = db.value("""INSERT INTO task (input, state, pid, start)
                       VALUES ('SELECT 1', 'WORK', 1, now() + interval '1 minute') RETURNING id""")
    stuck = nb.inspect(db.dsn, "public", "task", "stuck", stuck_after="0 seconds")
    assert list(zip(stuck["id"], stuck["seconds"], stuck["orphaned"])) == [(task, 0, True)], stuck
