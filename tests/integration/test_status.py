"""`pgtask status` and `pgtask config` as an operator reads them: whether a service looks after the
table comes first, the columns line up whatever the group names, and `config` names the server and
what an empty value means."""

import os
import subprocess
import sys

import pytest
from support import wait_for

LONG = "nightly-ledger-reconciliation-eu-west-1"  # 39 characters


def cli(cluster, db, *args):
    env = {**os.environ, **cluster.env(), "PGDATABASE": db.name}
    result = subprocess.run([sys.executable, "-m", "pgtask.cli", *args], env=env, capture_output=True, text=True,
                            check=False, timeout=60)
    return result


@pytest.mark.quick
def test_status_leads_with_liveness_and_aligns_its_columns(db, cluster, service):
    assert len(LONG) == 39
    ids = [db.insert("SELECT 1", group=LONG) for _ in range(3)] + [db.insert("SELECT 1/0", group="a")]
    for i in ids:
        db.wait_state(i)
    result = cli(cluster, db, "status", "--check")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("OK: a service is connected and claiming; 0 due; 0 running"), result.stdout
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("group "))
    table = lines[header:header + 4]
    assert [line.split()[0] for line in table] == ["group", LONG, "a", "(all"], result.stdout
    # every cell ends (numbers) or starts (the group) in the same column on every line
    for name in ("due", "done", "fail %", "stop (all)"):
        end = table[0].index(name) + len(name)
        cells = [line[:end].rstrip() for line in table]
        assert all(len(c) == end for c in cells), (name, result.stdout)
    assert table[1].startswith(f"  {LONG}  ") and table[2].startswith("  a" + " " * (len(LONG) + 1))
    assert "done (all)" in table[0] and "pickup p50" in table[0]

    service.kill()
    wait_for(lambda: not db.value("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pg_work %'"),
             30, message="the killed service's sessions to end")
    db.execute("INSERT INTO task (input, plan) VALUES ('SELECT 1', now() - interval '73 seconds')")
    db.execute("INSERT INTO task (input, \"group\", state) VALUES ('SELECT pg_sleep(1)', 'x', 'WORK')")
    result = cli(cluster, db, "status", "--check")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[1].startswith("NOT OK: no `pgtask run` is connected for public.task; 1 orphaned row"), result.stdout
    assert "1 due task not picked up, the oldest for 7" in lines[1]
    assert "longest running: task" in result.stdout and "SELECT pg_sleep(1)" in result.stdout


@pytest.mark.quick
def test_config_names_the_server_and_what_empty_means(db, cluster):
    result = cli(cluster, db, "config")
    assert result.returncode == 0, result.stderr
    server = next(line for line in result.stdout.splitlines() if line.startswith("# server:"))
    assert f"host={cluster.socket_dir}" in server and f"dbname={db.name}" in server and "environment" in server
    assert 'pgtask.retention = ""    # default; finished tasks are kept for ever' in result.stdout


@pytest.mark.quick
def test_status_shows_paused_and_rate_limited_groups(db, cluster, service):
    """A paused group's overdue tasks wait by design: the verdict stays OK, and the flow table says why."""
    db.execute("""INSERT INTO task_group ("group", paused) VALUES ('held', true)""")
    db.execute("""INSERT INTO task_group ("group", rate, burst, capacity, tokens) VALUES ('slow', 2.5, 3, 100, 3)""")
    db.execute("""INSERT INTO task (input, "group", plan) VALUES ('SELECT 1', 'held', now() - interval '5 min')""")
    result = cli(cluster, db, "status", "--check")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("flow control"))
    assert lines[at].endswith("1 paused group, 1 rate-limited group"), result.stdout
    assert lines[at + 1].split() == ["group", "paused", "rate", "burst", "tokens", "capacity", "due", "waiting"]
    assert lines[at + 2].split() == ["held", "PAUSED", "1", "0"], result.stdout
    assert lines[at + 3].split() == ["slow", "2.50/s", "3", "3.0", "100", "0", "0"], result.stdout


def group_table(stdout: str) -> dict[str, dict[str, str]]:
    """The groups table of `pgtask status`, cell by column name (the cells line up with the headers)."""
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("group "))
    header, rows = lines[at], []
    for line in lines[at + 1:]:
        if not line.startswith("  ") or line.startswith("  …"):
            break
        rows.append(line)
    names = [h for h in ("due", "running", "orphaned", "done") if h in header]
    ends = {n: header.index(f" {n} ") + len(n) + 1 if f" {n} " in header else len(header) for n in names}
    return {r.split()[0]: {n: r[:ends[n]].split()[-1] for n in names} for r in rows}


@pytest.mark.quick
def test_orphaned_rows_are_counted_apart_from_running_ones(db, cluster, service_factory):
    """A task running under a live service is running; a TAKE row no live service claimed is
    orphaned -- in the group rows as in the verdict, never as running."""
    service_factory(db.name, "[pgtask]\nreset_check = 3600\n")  # the orphan stays until the test ends
    live = db.insert("SELECT pg_sleep(60)", group="live")
    db.wait_state(live, ("WORK",))
    db.insert("SELECT 1", group="dead", state="TAKE")
    db.insert("SELECT 1", group="dead", state="TAKE")
    result = cli(cluster, db, "status")
    assert "backlog: 0 due, 0 of them with a free group slot; 1 running, 2 orphaned" in result.stdout, result.stdout
    cells = group_table(result.stdout)
    assert {g: (c["running"], c["orphaned"]) for g, c in cells.items()} == {
        "live": ("1", "0"), "dead": ("0", "2"), "(all": ("1", "2")}, result.stdout
    db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (live,))


@pytest.mark.quick
def test_ages_are_never_negative_and_ids_paste_into_sql(db, cluster):
    """A task stamped after the status statement began (its service started it meanwhile: here a
    start a minute ahead stands for those milliseconds) is 0 s old, not negative; its id prints as
    a plain integer."""
    db.execute("INSERT INTO task (id, input, \"group\", state, pid, start) "
               "VALUES (1234567, 'SELECT 1', 'x', 'WORK', 1, now() + interval '1 minute')")
    result = cli(cluster, db, "status")
    assert "last task started: 0 s ago" in result.stdout, result.stdout
    assert "longest running: task 1234567 (group x, WORK) for 0 s: SELECT 1" in result.stdout, result.stdout
    assert " -" not in result.stdout.replace(" - ", ""), result.stdout


def cell(header: str, row: str, name: str) -> str:
    """A right-aligned cell of the groups table under the header ``name`` ('' when blank)."""
    end, row = header.index(f" {name}") + len(name) + 1, row.ljust(len(header))  # trailing blanks are cut
    return "" if row[end - 1] == " " else row[:end].split()[-1]


def test_past_the_threshold_finished_counts_are_marked_estimates_and_the_live_ones_stay_exact(db, cluster):
    """Past 100,000 finished rows the "(all)" figures are the planner's estimates, marked "~" and
    named in the header; the groups with nothing live or in the window (the history) are not read;
    the backlog, the slots and the window's figures stay exact."""
    db.execute("""INSERT INTO task ("group", plan, start, stop, state, input)
                  SELECT 'old', now() - interval '2 days' + i * interval '1 ms', now() - interval '2 days',
                         now() - interval '2 days', CASE WHEN i % 100 = 0 THEN 'FAIL' ELSE 'DONE' END::state, 'SELECT 1'
                  FROM generate_series(1, 120000) i""")
    for state in ("DONE", "DONE", "DONE", "FAIL"):  # finished in the window
        db.execute("""INSERT INTO task ("group", plan, start, stop, state, input) VALUES
                      ('new', now() - interval '10 minutes', now() - interval '9 minutes', now() - interval '8 minutes',
                       %s, 'SELECT 1')""", (state,))
    db.execute("""INSERT INTO task ("group", plan, input) VALUES ('new', now() - interval '1 minute', 'SELECT 1'),
                  ('new', now() - interval '2 minutes', 'SELECT 1'), ('new', now() + interval '1 hour', 'SELECT 1')""")
    db.execute("""INSERT INTO task ("group", state, pid, plan, start, input)
                  VALUES ('w', 'WORK', 1, now() - interval '6 minutes', now() - interval '5 minutes', 'SELECT 1')""")
    db.execute("ANALYZE task")
    result = cli(cluster, db, "status")
    out = result.stdout
    assert "backlog: 2 due, 2 of them with a free group slot; 0 running, 1 orphaned" in out, out
    assert "last task started: 5 min ago (of the running tasks and the newest 1,000 started)" in out, out
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("group "))
    assert "(all): ~ the planner's estimates, past 100,000 finished rows, for all groups only" in lines[at - 1], out
    header, rows = lines[at], {line.split()[0]: line for line in lines[at + 1:at + 4]}
    assert sorted(rows) == ["(all", "new", "w"], out  # the history's group is not read
    new = {n: cell(header, rows["new"], n) for n in ("due", "planned", "orphaned", "done", "fail", "done (all)")}
    assert new == {"due": "2", "planned": "1", "orphaned": "0", "done": "3", "fail": "1", "done (all)": ""}, out
    assert cell(header, rows["w"], "orphaned") == "1", out
    total = rows["(all"]
    assert (cell(header, total, "due"), cell(header, total, "done"), cell(header, total, "fail")) == ("2", "3", "1"), out
    done, fail = (cell(header, total, f"{s} (all)") for s in ("done", "fail"))
    assert done.startswith("~") and fail.startswith("~"), out
    # estimates of 118,803 DONE and 1,201 FAIL rows (ANALYZE samples 30,000 of them)
    assert abs(int(done[1:].replace(",", "")) - 118_803) < 6000, out
    assert abs(int(fail[1:].replace(",", "")) - 1_201) < 400, out


def test_past_the_threshold_a_busy_window_is_read_from_the_newest_rows_and_says_so(db, cluster):
    """When the newest 10,000 rows all fall within the window, the window's figures are theirs, over
    the part of the window they cover, and the groups line says so."""
    db.execute("""INSERT INTO task ("group", plan, start, stop, state, input)
                  SELECT 'old', now() - interval '2 days', now() - interval '2 days', now() - interval '2 days',
                         'DONE', 'SELECT 1' FROM generate_series(1, 110000)""")
    db.execute("""INSERT INTO task ("group", plan, start, stop, state, input)
                  SELECT 'busy', now() - interval '10 minutes' + i * interval '10 ms',
                         now() - interval '10 minutes' + i * interval '10 ms',
                         now() - interval '10 minutes' + i * interval '10 ms' + interval '1 second', 'DONE', 'SELECT 1'
                  FROM generate_series(1, 10050) i""")
    db.execute("ANALYZE task")
    out = cli(cluster, db, "status").stdout
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("group "))
    assert "in the last 1 hour, read from the last 10 min of it: the newest 10,000 rows" in lines[at - 1], out
    header, rows = lines[at], {line.split()[0]: line for line in lines[at + 1:at + 3]}
    assert sorted(rows) == ["(all", "busy"], out
    assert cell(header, rows["busy"], "done") == "10,000" and cell(header, rows["busy"], "done (all)") == "", out
    assert cell(header, rows["(all"], "done (all)").startswith("~"), out
