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
