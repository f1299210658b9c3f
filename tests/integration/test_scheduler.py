"""The scheduler through the real `pgtask run`: timing columns, repeat, groups, reuse, STOP, recovery."""

import asyncio
import functools
import itertools
import json
import os
import signal
import subprocess
import sys
from datetime import timedelta

import psycopg
import pytest
from support import holding_scheduler, killed_mid_task, wait_for, wait_for_async

from pgtask.queries import TASK_COLUMNS
from pgtask.scheduler import Scheduler
from pgtask.task import Task


def test_repeat_on_the_plan_grid(db, service):
    task_id = db.value("INSERT INTO task (plan, repeat, input) VALUES (now() - '10.5 sec'::interval, '3 sec', "
                       "'SELECT 1') RETURNING id")
    first = db.wait_state(task_id)
    nxt = wait_for(lambda: db.execute("SELECT plan, state, parent FROM task WHERE parent = %s", (task_id,)),
                   message="the next occurrence")[0]
    # the first plan + k * 3 s after now: plan - 10.5 s + 12 s = plan + 1.5 s
    assert nxt[0] - first["plan"] == timedelta(seconds=12)
    assert nxt[1] in ("PLAN", "TAKE", "WORK", "DONE") and nxt[2] == task_id


def test_repeat_with_drift_counts_from_stop(db, service):
    task_id = db.insert("SELECT 1", repeat="1 hour", drift=True)
    first = db.wait_state(task_id)
    plan = wait_for(lambda: db.value("SELECT plan FROM task WHERE parent = %s", (task_id,)), message="repeat")
    assert plan - first["stop"] == timedelta(hours=1)


def test_failed_task_repeats_and_copies_user_columns(db, service_factory):
    # the periodic look at the table's columns never comes (reset_check): the finish itself must see
    # a column added after the service started
    service_factory(db.name, "[pgtask]\nreset_check = 3600\n")
    assert db.wait_state(db.insert("SELECT 1"))["state"] == "DONE"  # the scheduler has read the table
    db.execute("ALTER TABLE task ADD COLUMN meta text")
    task_id = db.insert("SELECT 1/0", repeat="1 hour", meta="kept", data="d")
    assert db.wait_state(task_id)["state"] == "FAIL"
    row = wait_for(lambda: db.execute("SELECT meta, data, input, \"group\" FROM task WHERE parent = %s",
                                      (task_id,)), message="repeat")[0]
    assert row == ("kept", "d", "SELECT 1/0", "group")


def test_retry_until_success_pattern(db, service):
    """The manual's pattern: the last statement sets the row's own repeat to 0."""
    db.execute("CREATE TABLE some_table (a int)")
    task_id = db.insert("INSERT INTO some_table VALUES (1); "
                        "UPDATE task SET repeat = '0 sec' WHERE id = current_setting('pg_task.id')::bigint",
                        repeat="1 min", delete=False)
    row = db.wait_state(task_id)
    assert row["state"] == "DONE" and str(row["repeat"]) == "0:00:00"
    assert db.value("SELECT count(*) FROM task WHERE parent = %s", (task_id,)) == 0


@pytest.mark.parametrize("mode", ["login", "set_role"])
def test_retry_until_success_pattern_of_a_role_that_is_not_superuser(db, service_factory, mode):
    """The running task may edit its own row (its session, pg_task.id naming it, as its role) --
    also when its author is an ordinary role, in both execution modes."""
    db.role("retrier")
    db.execute("CREATE TABLE retried (a int); GRANT INSERT ON retried TO retrier")
    service_factory(db.name, f'[pgtask]\nexecute_as = "{mode}"\n')
    with db.connect("retrier") as retrier:
        task_id = retrier.execute(
            "INSERT INTO task (input, repeat, delete) VALUES ('INSERT INTO retried VALUES (1); "
            "UPDATE task SET repeat = ''0 sec'' WHERE id = current_setting(''pg_task.id'')::bigint', "
            "'1 min', false) RETURNING id").fetchone()[0]
    row = db.wait_state(task_id)
    assert (row["state"], row["error"], str(row["repeat"])) == ("DONE", None, "0:00:00")
    assert db.value("SELECT count(*) FROM task WHERE parent = %s", (task_id,)) == 0


def test_auto_runs_a_role_that_cannot_log_in_through_set_role_only_when_that_gives_it_nothing(db, service):
    """execute_as = auto (the default): a role that cannot log in would run through SET ROLE from
    the service's session, where its input can RESET ROLE to the service role (a superuser here).
    So its task fails saying why and what to do -- unless the role may act as the service role
    anyway (a member of it), where SET ROLE gives its input nothing more."""
    db.role("walled_in")
    db.role("trusted_in")
    db.execute('ALTER ROLE walled_in NOLOGIN; ALTER ROLE trusted_in NOLOGIN; GRANT postgres TO trusted_in')
    ids = {}
    for who in ("walled_in", "trusted_in"):
        with db.connect() as conn:
            conn.execute(f'SET ROLE "{who}"')
            ids[who] = conn.execute("INSERT INTO task (input) VALUES ('SELECT current_user') RETURNING id").fetchone()[0]
    walled, trusted = db.wait_state(ids["walled_in"]), db.wait_state(ids["trusted_in"])
    assert (trusted["state"], trusted["output"]) == ("DONE", "trusted_in"), trusted
    assert walled["state"] == "FAIL" and walled["error"].startswith(
        "ERROR:  could not connect as role walled_in\nDETAIL:  role walled_in cannot log in ("), walled
    assert 'set execute_as = "set_role"' in walled["error"] and "RESET ROLE" in walled["error"], walled


def test_parent_is_the_running_task(db, service):
    task_id = db.insert("INSERT INTO task (input, plan) VALUES ('SELECT 2', now() + '1 day') RETURNING parent")
    row = db.wait_state(task_id)
    assert row["output"] == f"{task_id}\nINSERT 0 1"
    assert db.value("SELECT parent FROM task WHERE id <> %s", (task_id,)) == task_id


def test_session_settings(db, service):
    task_id = db.insert("SELECT current_setting('pg_task.id'), current_setting('pg_task.group'), "
                        "current_setting('application_name'), current_user, "
                        "current_setting('statement_timeout')", group="g x", timeout="2 sec", header=False)
    out = db.wait_state(task_id)["output"].split("\t")
    assert out == [str(task_id), "g x", "pg_task public task g x", "postgres", "2s"]


def test_timeout_rounds_to_whole_seconds(db, service):
    task_id = db.insert("SELECT current_setting('statement_timeout')", timeout="1.6 sec")
    assert db.wait_state(task_id)["output"] == "2s"
    task_id = db.insert("SELECT current_setting('statement_timeout')", timeout="400 ms")
    assert db.wait_state(task_id)["output"] == "0"


def test_search_path_of_role_and_database(db, service):
    db.execute("CREATE SCHEMA app; CREATE TABLE app.thing (a int); INSERT INTO app.thing VALUES (5)")
    db.execute(f'ALTER DATABASE "{db.name}" SET search_path = app, public')
    task_id = db.insert("SELECT a FROM thing")
    assert db.wait_state(task_id)["output"] == "5"


def test_gone_after_active(db, service):
    task_id = db.value("INSERT INTO task (plan, active, input) VALUES (now() - '2 hours'::interval, '1 hour', "
                       "'SELECT 1') RETURNING id")
    row = db.wait_state(task_id)
    assert row["state"] == "GONE" and row["error"] == "ERROR:  task not active" and row["output"] is None
    # repeating tasks and pause groups never expire
    rep = db.value("INSERT INTO task (plan, active, repeat, input) VALUES (now() - '2 hours'::interval, "
                   "'1 hour', '1 hour', 'SELECT 1') RETURNING id")
    assert db.wait_state(rep)["state"] == "DONE"


def test_stop_before_start_never_runs(db, service):
    task_id = db.value("INSERT INTO task (plan, input) VALUES (now() + '1 hour', 'SELECT 1') RETURNING id")
    db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (task_id,))
    db.execute("UPDATE task SET plan = now() WHERE id = %s AND false", (task_id,))
    assert db.task(task_id)["state"] == "STOP"


def test_stop_cancels_running_task(db, service):
    task_id = db.insert("SELECT pg_sleep(30)", repeat="1 min")
    db.wait_state(task_id, states=("WORK",))
    db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (task_id,))
    row = wait_for(lambda: (r := db.task(task_id)) and r["stop"] is not None and r,
                   message="the cancelled task to be finished")
    assert row["state"] == "STOP"
    assert row["error"].startswith("ERROR:  canceling statement due to user request")
    assert db.value("SELECT count(*) FROM task WHERE parent = %s", (task_id,)) == 0  # no repeat
    assert db.value("SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)' "
                    "AND state = 'active'") == 0


def slow_to_stop(seconds: float) -> str:
    """An input that takes every cancel (the STOP trigger's and the service's alike) and runs on for
    ``seconds`` after the first, then records when it ended in table ran."""
    return ("DO $$DECLARE first timestamptz; BEGIN LOOP BEGIN PERFORM pg_sleep(0.05); "
            f"EXIT WHEN first IS NOT NULL AND clock_timestamp() > first + interval '{seconds} s'; "
            "EXIT WHEN clock_timestamp() > statement_timestamp() + interval '60 s'; "
            "EXCEPTION WHEN query_canceled THEN first := coalesce(first, clock_timestamp()); END; END LOOP; END$$; "
            "INSERT INTO ran VALUES (current_setting('pg_task.id')::bigint, clock_timestamp())")


def test_a_stopped_task_holds_its_groups_slot_until_it_has_ended(db, service):
    """STOP on a running task: its row leaves WORK at once, but its query runs on until the cancel
    takes (here 2 s: it ignores cancels that long). Until then it still counts against its group:
    a group of max 0 starts its next task only after the stopped one has ended."""
    db.execute("CREATE TABLE ran (id bigint, at timestamptz)")
    a = db.insert(slow_to_stop(2), group="one", max=0, delete=False)
    db.wait_state(a, states=("WORK",))
    b = db.insert("INSERT INTO ran VALUES (current_setting('pg_task.id')::bigint, clock_timestamp())",
                  group="one", max=0, delete=False)
    db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (a,))

    def a_ended():  # one snapshot: the claim that starts B may commit with A's finish
        a_stop, b_state = db.execute("SELECT a.stop, b.state FROM task a, task b WHERE a.id = %s AND b.id = %s",
                                     (a, b))[0]
        assert a_stop is not None or b_state == "PLAN", f"task {b} started while the stopped task {a} still ran"
        return a_stop is not None
    wait_for(a_ended, message="the stopped task to end")
    db.wait_state(b)
    assert db.value("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'DO $$DECLARE first%%'") == 0
    rows = {r["id"]: r for r in map(db.task, (a, b))}
    assert (rows[a]["state"], rows[a]["output"], rows[a]["error"]) == ("STOP", "DO\nINSERT 0 1", None)
    assert rows[b]["state"] == "DONE" and rows[b]["start"] >= rows[a]["stop"]
    ended = dict(db.execute("SELECT id, at FROM ran"))
    assert ended[b] > ended[a], ended


def test_a_stopped_task_its_killed_service_left_running_is_ended_by_the_reset(db, service_factory):
    """The service SIGKILLed while a stopped task's query still runs: the row stays STOP with no stop
    and holds its group's slot -- until its backend is gone (the server ends the orphaned query) and
    the next service's orphan check ends it: STOP for good (not back to PLAN), its stop written, and
    the group's next task runs."""
    db.execute("CREATE TABLE ran (id bigint, at timestamptz)")
    svc = service_factory(db.name)
    a = db.insert(slow_to_stop(30), group="one", max=0)
    db.wait_state(a, states=("WORK",))
    b = db.insert("SELECT 1", group="one", max=0, delete=False)
    backend = db.task(a)["pid"]
    db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (a,))
    svc.kill()
    row = db.task(a)
    assert (row["state"], row["stop"], db.task(b)["state"]) == ("STOP", None, "PLAN")
    service_factory(db.name)
    done = db.wait_state(b, timeout=20)
    row = db.task(a)
    assert (row["state"], row["attempt"], row["pid"]) == ("STOP", 1, backend)
    assert row["stop"] is not None and done["state"] == "DONE" and done["start"] >= row["stop"]
    assert db.value("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (backend,)) == 0
    assert db.value("SELECT count(*) FROM ran") == 0  # its transaction died with its backend


@pytest.mark.parametrize("end", ["not_started", "requeue"])
def test_a_stopped_task_that_ends_without_a_finish_gives_its_slot_back(db, end):
    """A row set to STOP whose task ends without a finish -- the STOP came before its input began
    (its start refused), its session was lost, SIGTERM's grace period cancelled it -- holds its
    group's slot until then, and gets its stop then: it stays STOP and frees the slot."""
    async def go() -> list[int]:
        async with holding_scheduler(db) as (sched, _):
            a = db.insert("SELECT 1", group="one", max=0)
            task = Task.from_row(db.claim(a, TASK_COLUMNS))
            db.execute("UPDATE task SET state = 'WORK', pid = pg_backend_pid(), start = now() WHERE id = %s", (a,))
            db.insert("SELECT 1", group="one", max=0)
            claimed = [(await sched.claimer.claim_pass())[0]]
            db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (a,))
            claimed.append((await sched.claimer.claim_pass())[0])
            await getattr(sched.completer, end)(task)
            row = db.task(a)
            assert (row["state"], row["attempt"], row["stop"] is not None) == ("STOP", 1, True), row
            claimed.append((await sched.claimer.claim_pass())[0])
            return claimed

    assert asyncio.run(go()) == [0, 0, 1]


def test_negative_max_pauses_the_group(db, service):
    db.execute("CREATE TABLE ran (at timestamptz)")
    # one plan for all three: each finish pushes the others' plans along that grid (|max| = 0.7 s)
    rows = db.execute("INSERT INTO task (input, \"group\", max, plan) SELECT 'INSERT INTO ran VALUES "
                      "(clock_timestamp())', 'paced', -700, statement_timestamp() FROM generate_series(1, 3) "
                      "RETURNING id, plan")
    for i, _ in rows:
        db.wait_state(i, timeout=20)
    grid = rows[0][1]
    offsets = [(r[0] - grid).total_seconds() for r in db.execute("SELECT at FROM ran ORDER BY at")]
    # the k-th run waits for at least k grid points -- however late the first one was picked up,
    # which moves the next grid point closer -- and the pause is applied once, not twice per finish
    assert len(offsets) == 3 and all(o >= 0.7 * k for k, o in enumerate(offsets)), offsets
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert all(g <= 2.5 for g in gaps), gaps


def test_serial_group_runs_back_to_back(db, service):
    """max 0: one at a time, each next task started right after the previous finished (no poll wait)."""
    db.execute("CREATE TABLE ran (id bigint, at timestamptz, until timestamptz)")
    ids = [db.insert("INSERT INTO ran SELECT current_setting('pg_task.id')::bigint, clock_timestamp(), "
                     "clock_timestamp() + '0.05 s'; SELECT pg_sleep(0.05)", group="serial") for _ in range(10)]
    for i in ids:
        db.wait_state(i)
    assert db.value("SELECT max((SELECT count(*) FROM ran b WHERE b.at <= a.at AND b.until > a.at)) FROM ran a") == 1
    # the whole chain takes far less than 10 polls of pg_task.sleep (1 s)
    span = db.value("SELECT extract(epoch FROM max(at) - min(at)) FROM ran")
    assert span < 5, span


def test_higher_max_is_a_priority(db, service_factory):
    """Rows are claimed by remaining capacity, then id: a higher max jumps ahead in its group."""
    db.execute("CREATE TABLE ran (id bigint, at timestamptz DEFAULT clock_timestamp())")
    low = [db.insert("INSERT INTO ran (id) VALUES (current_setting('pg_task.id')::bigint)", group="p", max=0)
           for _ in range(3)]
    high = db.insert("INSERT INTO ran (id) VALUES (current_setting('pg_task.id')::bigint)", group="p", max=5)
    service_factory(db.name)
    for i in low + [high]:
        db.wait_state(i)
    assert db.value("SELECT id FROM ran ORDER BY at LIMIT 1") == high


def test_count_reuses_the_session(db, service):
    """count = N: one executor session runs up to N tasks of its group; save keeps its state."""
    ids = [db.insert("SELECT pg_backend_pid()", group="reuse", count=3, header=False, delete=False)
           for _ in range(3)]
    pids = {db.wait_state(i)["output"] for i in ids}
    assert len(pids) == 1


def test_save_keeps_session_state(db, service):
    db.value("INSERT INTO task (input, \"group\", count, save) VALUES "
             "('CREATE TEMP TABLE t AS SELECT 41 AS a', 's', 2, true), "
             "('SELECT a + 1 FROM t', 's', 2, true) RETURNING id")
    rows = wait_for(lambda: (r := db.execute("SELECT output, error FROM task WHERE \"group\" = 's' AND "
                                             "state IN ('DONE', 'FAIL') ORDER BY id")) and len(r) == 2 and r,
                    message="both tasks")
    assert rows == [("SELECT 1", None), ("42", None)]


def test_without_save_the_session_is_reset(db, service):
    db.execute("INSERT INTO task (input, \"group\", count) VALUES "
               "('CREATE TEMP TABLE t AS SELECT 41 AS a', 'r', 2), ('SELECT a + 1 FROM t', 'r', 2)")
    rows = wait_for(lambda: (r := db.execute("SELECT state, error FROM task WHERE \"group\" = 'r' AND "
                                             "state IN ('DONE', 'FAIL') ORDER BY id")) and len(r) == 2 and r,
                    message="both tasks")
    assert rows[0][0] == "DONE" and rows[1][0] == "FAIL" and 'relation "t" does not exist' in rows[1][1]


def test_a_tasks_leftovers_do_not_outlive_it(db, service):
    """A pooled session is reset after its task: an advisory lock the task kept is released soon
    after it finished (the idle session's reset), and the next task of the role on that session
    sees neither the temp table nor the setting."""
    first = db.insert("SELECT pg_advisory_lock(4242); CREATE TEMP TABLE left_over (a int); "
                      "SET work_mem = '7MB'; SELECT pg_backend_pid()", header=False)
    pid = int(db.wait_state(first)["output"].split("\n")[-1])
    wait_for(lambda: db.value("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242") == 0,
             5, message="the advisory lock to be released")
    second = db.insert("SELECT pg_backend_pid(), current_setting('work_mem'), to_regclass('pg_temp.left_over')",
                       header=False)
    assert db.wait_state(second)["output"] == f"{pid}\t4MB\t\\N"  # the same session, clean


def test_run_caps_tasks_in_flight(db, service_factory):
    db.execute("CREATE TABLE ran (id bigint, at timestamptz, until timestamptz)")
    service_factory(db.name, "[pg_task]\nrun = 2\n")
    ids = [db.insert("INSERT INTO ran SELECT current_setting('pg_task.id')::bigint, clock_timestamp(), "
                     "clock_timestamp() + '0.3 s'; SELECT pg_sleep(0.3)", group=f"g{i}") for i in range(6)]
    for i in ids:
        db.wait_state(i)
    assert db.value("SELECT max((SELECT count(*) FROM ran b WHERE b.at <= a.at AND b.until > a.at)) FROM ran a") == 2


def test_a_claim_its_row_limit_cut_claims_the_rest_at_once(db, service_factory):
    """pg_task.limit rows per claim: the next claim follows at once, not after pg_task.sleep (one
    insert, one wake-up; the tasks run long, so no finish wakes the service meanwhile)."""
    service_factory(db.name, "[pg_task]\nlimit = 2\nsleep = 60000\n")
    ids = [r[0] for r in db.execute(
        """INSERT INTO task (input, "group") SELECT 'SELECT pg_sleep(60)', 'g' || i FROM generate_series(1, 6) i
           RETURNING id""")]
    for task_id in ids:
        db.wait_state(task_id, states=("WORK",), timeout=10)


def test_run_one_goes_on_from_the_finishes_a_claim_pass_writes(db, service_factory):
    """pg_task.run = 1: the claim pass that writes a task's finish counts its place as free and
    starts the next task in the same transaction; nothing waits for pg_task.sleep."""
    service_factory(db.name, "[pg_task]\nrun = 1\nsleep = 60000\n")
    ids = [r[0] for r in db.execute(
        """INSERT INTO task (input, "group") SELECT 'SELECT 1', 'g' || i FROM generate_series(1, 5) i
           RETURNING id""")]
    for task_id in ids:
        assert db.wait_state(task_id, timeout=10)["state"] == "DONE"
    # one at a time all along
    assert db.value("SELECT count(*) FROM task a JOIN task b ON a.id < b.id "
                    "WHERE a.start < b.stop AND b.start < a.stop") == 0


def test_limit_zero_claims_nothing(db, service_factory):
    service_factory(db.name, "[pg_task]\nlimit = 0\n")
    task_id = db.insert("SELECT 1")
    with pytest.raises(AssertionError):
        db.wait_state(task_id, timeout=2)
    assert db.task(task_id)["state"] == "PLAN"


def test_orphans_of_a_killed_service_run_again(db, service_factory):
    task_id = killed_mid_task(db, service_factory)
    service_factory(db.name)
    row = wait_for(lambda: (r := db.task(task_id))["state"] == "DONE" and r, 20, message="the re-run")
    assert row["attempt"] == 2
    assert db.value("SELECT count(*) FROM ran") == 1


@pytest.mark.parametrize("state", ["TAKE", "WORK", "STOP"])
def test_a_row_claimed_under_a_live_service_that_does_not_run_it_is_reset(db, service_factory, state):
    """A row holding its group's slot under the claim of a connected service that runs no task of it
    (the answer of its claim or of a write lost with a failover) is reset by that service's own
    orphan check -- a TAKE/WORK row runs, a STOP row gets its stop -- and a row it runs is left alone."""
    service_factory(db.name, "[pgtask]\nreset_check = 0.3\n")
    running = db.insert("SELECT pg_sleep(8)")
    db.wait_state(running, states=("WORK",))
    token = db.value("SELECT token FROM task_instance")
    task_id = db.insert("SELECT 'ran'", plan="infinity", group="other")
    db.execute("""UPDATE task SET state = %s, lease = (%s || substr(gen_random_uuid()::text, 19))::uuid,
                      attempt = 1, start = now(), pid = 0, plan = now() WHERE id = %s""", (state, token, task_id))
    if state == "STOP":
        row = wait_for(lambda: (r := db.task(task_id))["stop"] is not None and r, 10, message="its stop")
        assert row["state"] == "STOP"
    else:
        row = wait_for(lambda: (r := db.task(task_id))["state"] == "DONE" and r, 10, message="the reset row run")
        assert row["output"] == "ran"
    assert db.task(running)["state"] == "WORK"  # the task it runs is no orphan of its own
    row = db.wait_state(running, timeout=20)
    assert row["state"] == "DONE" and row["attempt"] == 1


def test_sigterm_drains(db, service_factory):
    svc = service_factory(db.name)
    task_id = db.insert("SELECT pg_sleep(1)")
    db.wait_state(task_id, states=("WORK",))
    assert svc.stop(signal.SIGTERM) == 0
    assert db.task(task_id)["state"] == "DONE"  # it finished within the grace period


def test_sigterm_grace_over_requeues(db, service_factory):
    svc = service_factory(db.name, "[pgtask]\ngrace = 0.5\nreset_check = 0.5\n")
    task_id = db.insert("SELECT pg_sleep(30)")
    db.wait_state(task_id, states=("WORK",))
    assert svc.stop(signal.SIGTERM) == 0
    row = db.task(task_id)
    assert row["state"] == "PLAN" and row["error"] is None  # cancelled by the drain: runs again later
    service_factory(db.name)
    db.wait_state(task_id, states=("WORK",))


def test_sigterm_grace_over_finishes_a_task_that_succeeded_all_the_same(db, service_factory):
    """A task the grace deadline cancels, whose input handles the cancel and succeeds: its work is
    committed, so it is finished (DONE, its output), not put back to run again."""
    db.execute("CREATE TABLE drained (x int)")
    svc = service_factory(db.name, "[pgtask]\ngrace = 0.5\nreset_check = 0.5\n")
    task_id = db.insert("DO $$BEGIN PERFORM pg_sleep(30); EXCEPTION WHEN query_canceled THEN NULL; END$$; "
                        "INSERT INTO drained VALUES (1)")
    db.wait_state(task_id, states=("WORK",))
    assert svc.stop(signal.SIGTERM) == 0
    row = db.task(task_id)
    assert (row["state"], row["output"], row["error"]) == ("DONE", "DO\nINSERT 0 1", None)
    assert db.value("SELECT count(*) FROM drained") == 1


def test_cli_provision_json_and_config_errors(db, cluster, tmp_path):
    env = {**os.environ, **cluster.env(), "PGDATABASE": db.name}
    cfg = tmp_path / "p.toml"
    cfg.write_text(f'[pg_task]\njson = [{{data = "{db.name}", user = "prov_user", schema = "jobs", table = "t"}}]\n')

    def run(*args):
        return subprocess.run([sys.executable, "-m", "pgtask.cli", *args], env=env, capture_output=True, text=True,
                              check=False)

    first = run("provision", "--json", "--config", str(cfg))
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert report["changed"] and "created role prov_user" in report["actions"]
    assert "created table jobs.t" in report["actions"]
    second = json.loads(run("provision", "--json", "--config", str(cfg)).stdout)
    assert second == {"changed": False, "actions": []}

    bad = tmp_path / "bad.toml"
    for text, key in [('[pg_task]\nsleep = "1s"\n', "pg_task.sleep"), ("[pg_task]\nslep = 1\n", "pg_task.slep"),
                      ('[pgtask]\ngrace = "x"\n', "pgtask.grace"), ("[pg_task]\ngroup = 'x'\n", "pg_task.group"),
                      ('[pg_task]\njson = [{data = "d", colour = 1}]\n', "pg_task.json[0].colour"),
                      ('[pgtask]\nretention = "-1 day"\n', "pgtask.retention: must not be a negative interval"),
                      ('[pgtask]\nretention = "30 dayz"\n', "pgtask.retention: invalid interval"),
                      ("[pgtask]\nschedule_batch = 0\n", "pgtask.schedule_batch: must be >= 1"),
                      ("[pgtask]\nreset_check = nan\n", "pgtask.reset_check: must be a finite number"),
                      ("[pgtask]\ngrace = -10.0\n", "pgtask.grace: must be >= 0"),
                      ('[pgtask]\nlog_level = "verbose"\n', "pgtask.log_level"),
                      ("[pgtask]\nembedded_port = 99999\n", "pgtask.embedded_port: must be <= 65535"),
                      ('[pg_task]\nreset = "banana"\n', "pg_task.reset: invalid interval"),
                      ('[pg_task]\njson = [{data = "d", reset = "banana"}]\n', "pg_task.json[0].reset: invalid")]:
        bad.write_text(text)
        result = run("run", "--config", str(bad))
        assert result.returncode == 2 and key in result.stderr, (text, result.stderr)

    status = run("status", "--config", str(cfg))
    assert status.returncode == 0 and "prov_user" in status.stdout
    config = run("config", "--config", str(cfg))
    assert config.returncode == 0 and "pg_task.json" in config.stdout


def test_a_setting_the_server_holds_is_checked_as_the_files_are(db, cluster, tmp_path):
    """pg_task.run = 0 in the file is refused; set with ALTER DATABASE it must be too (not a
    service that starts and never runs a task)."""
    env = {**os.environ, **cluster.env(), "PGDATABASE": db.name}
    cfg = tmp_path / "p.toml"
    cfg.write_text(f'[pg_task]\njson = [{{data = "{db.name}"}}]\n')
    db.execute(f'ALTER DATABASE "{db.name}" SET pg_task.run = \'0\'')
    result = subprocess.run([sys.executable, "-m", "pgtask.cli", "run", "--config", str(cfg)], env=env,
                            capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 2 and "pg_task.run: must be >= 1, got 0 (set in the server)" in result.stderr, \
        result.stderr


def test_many_groups_all_run(db, service):
    ids = [db.insert("SELECT 1", group=f"g{i % 16}") for i in range(200)]
    wait_for(lambda: db.value("SELECT count(*) FROM task WHERE state = 'DONE' AND output = '1'") == 200, 30,
             message="200 tasks in 16 groups to be DONE")
    assert {r[0] for r in db.execute("SELECT id FROM task WHERE state = 'DONE'")} == set(ids)
    assert db.value("SELECT max(attempt) FROM task") == 1


def test_executes_as_the_inserting_role(db, service):
    db.role("dave")
    with db.connect("dave") as dave:
        task_id = dave.execute("INSERT INTO task (input) VALUES ('SELECT current_user, session_user') "
                               "RETURNING id").fetchone()[0]
    assert db.wait_state(task_id)["output"] == "current_user\tsession_user\ndave\tdave"


@pytest.mark.parametrize("escape", [
    "RESET ROLE; SELECT current_user",
    "SET ROLE postgres; SELECT current_user",
    "SET SESSION AUTHORIZATION postgres; SELECT current_user",
    "SELECT set_config('role', 'postgres', false); SELECT current_user",
    "DO $$BEGIN EXECUTE 'SET ROLE postgres'; END$$; SELECT current_user",
    ("CREATE FUNCTION pg_temp.f() RETURNS text LANGUAGE plpgsql AS $$BEGIN RESET ROLE; RETURN current_user; END$$; "
     "SELECT pg_temp.f()"),
])
def test_input_cannot_leave_its_role(db, service, escape):
    db.role("erin")
    with db.connect("erin") as erin:
        task_id = erin.execute("INSERT INTO task (input) VALUES (%s) RETURNING id", (escape,)).fetchone()[0]
    row = db.wait_state(task_id)
    assert "postgres" not in (row["output"] or "").split("\n")[-1:]
    assert row["state"] == "FAIL" or row["output"].split("\n")[-1] == "erin", row


@pytest.mark.parametrize("group", ["alive", "it's a \\ \"group\"; DROP TABLE task; --"])
def test_live_reuses_the_session_for_a_while(db, service, group):
    """live > 0: one executor session takes the group's next tasks while it is younger than live
    (the next task is claimed by a statement taking the group's name as a literal: a hostile one
    is only a name)."""
    ids = [db.insert("SELECT pg_backend_pid()", group=group, live="1 hour", header=False) for _ in range(4)]
    rows = [db.wait_state(i) for i in ids]
    assert [r["state"] for r in rows] == ["DONE"] * 4 and len({r["output"] for r in rows}) == 1


def test_live_reuse_stays_with_the_sessions_role(db, service):
    """A reused session only takes the group's next task of its own role: tasks of two authors
    alternating in one live group each run as their author, none bounces."""
    for name in ("liv_a", "liv_b"):
        db.role(name)
    ids = []
    for i in range(6):
        with db.connect(("liv_a", "liv_b")[i % 2]) as author:
            ids.append(author.execute("INSERT INTO task (input, \"group\", live, header) VALUES "
                                      "('SELECT current_user', 'mixed', '1 hour', false) RETURNING id").fetchone()[0])
    rows = [db.wait_state(i) for i in ids]
    assert [(r["state"], r["output"], r["attempt"]) for r in rows] == \
        [("DONE", ("liv_a", "liv_b")[i % 2], 1) for i in range(6)]


def test_start_and_pid_are_the_executor_sessions(db, service):
    task_id = db.insert("SELECT pg_backend_pid(), statement_timestamp()", header=False)
    row = db.wait_state(task_id)
    pid, stamp = row["output"].split("\t")
    assert row["state"] == "DONE" and row["pid"] == int(pid)
    assert row["start"] <= db.value("SELECT %s::timestamptz", (stamp,)) <= row["stop"]


def test_a_finish_a_user_trigger_refuses_is_written_on_its_own(db, service):
    """Finishes are written in batches; when a user's trigger refuses one row, each row of the batch
    is written on its own: the others are DONE, the refused one FAILs saying why."""
    db.execute("""CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN
        IF NEW.state = 'DONE' AND NEW.input LIKE '%refuse%' THEN RAISE EXCEPTION 'no, not %', NEW.id; END IF;
        RETURN NEW; END$$""")
    db.execute("CREATE TRIGGER refuse BEFORE UPDATE ON task FOR EACH ROW EXECUTE FUNCTION refuse()")
    ids = [row[0] for row in db.execute(
        """INSERT INTO task (input, "group") SELECT CASE WHEN i = 5 THEN 'SELECT ''refuse''' ELSE 'SELECT 1' END,
           'g' || i FROM generate_series(1, 12) i RETURNING id""")]
    rows = [db.wait_state(i) for i in ids]
    refused = rows[4]
    assert refused["state"] == "FAIL", refused
    assert refused["output"] == "refuse"
    assert f"finishing the task failed: no, not {ids[4]}" in refused["error"], refused["error"]
    assert [r["state"] for r in rows[:4] + rows[5:]] == ["DONE"] * 11


def test_an_output_the_database_cannot_store_is_dropped_from_the_failure(db, service):
    """A finish refused for a value of its own (a data exception: here a user's check on output)
    is written as the failure without that output -- with it, the failure would be refused too,
    and the task would stay WORK for ever."""
    db.execute("""CREATE FUNCTION no_big() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN
        IF length(NEW.output) > 3 THEN RAISE EXCEPTION 'output too long' USING ERRCODE = '22001'; END IF;
        RETURN NEW; END$$""")
    db.execute("CREATE TRIGGER no_big BEFORE UPDATE ON task FOR EACH ROW EXECUTE FUNCTION no_big()")
    row = db.wait_state(db.insert("SELECT 'long output'"), timeout=20)
    assert (row["state"], row["output"]) == ("FAIL", ""), row
    assert row["error"].startswith("ERROR:  finishing the task failed: output too long\n"), row


def test_a_task_whose_every_finish_is_refused_stays_work_and_runs_once(db, service_factory):
    """When a user's trigger refuses the failure too, the task stays WORK, its liveness lock held
    (released, orphan checks would run it again and again), and the failure is written again
    later until the database takes it."""
    db.execute("CREATE TABLE runs (id bigint)")
    db.execute("""CREATE FUNCTION refuse_all() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN
        IF NEW.state IN ('DONE', 'FAIL') AND NEW."group" = 'stuck' THEN RAISE EXCEPTION 'never'; END IF;
        RETURN NEW; END$$""")
    db.execute("CREATE TRIGGER refuse_all BEFORE UPDATE ON task FOR EACH ROW EXECUTE FUNCTION refuse_all()")
    svc = service_factory(db.name, "[pgtask]\nreset_check = 0.2\n")
    task_id = db.insert("INSERT INTO runs VALUES (current_setting('pg_task.id')::bigint)", group="stuck")
    wait_for(lambda: svc.output().count(f"task {task_id}: its failure was refused too") >= 2, 20,
             message="the failure to be refused twice over")
    assert db.task(task_id)["state"] == "WORK"
    assert db.value("SELECT count(*) FROM runs") == 1  # not reset, not run again
    db.execute("DROP TRIGGER refuse_all ON task")
    row = db.wait_state(task_id, timeout=30)
    assert row["state"] == "FAIL" and "finishing the task failed: never" in row["error"], row["error"]
    assert db.value("SELECT count(*) FROM runs") == 1


def test_a_database_statement_timeout_does_not_cancel_the_services_own_statements(db, service_factory):
    """ALTER DATABASE/ROLE ... SET statement_timeout (or lock_timeout) is for the users' sessions:
    the service's own connections set theirs (claims and finishes cancelled by it read as lost
    connections, over and over). A task's input still gets the timeout its row gives it."""
    db.execute(f'ALTER DATABASE "{db.name}" SET statement_timeout = 1')
    db.execute(f'ALTER DATABASE "{db.name}" SET lock_timeout = 1')
    svc = service_factory(db.name)
    ids = [db.insert("SELECT pg_sleep(0.01)", group=f"g{i % 4}") for i in range(20)]
    timed = db.insert("SELECT pg_sleep(5)", timeout="1 second")
    assert [db.wait_state(i)["state"] for i in ids] == ["DONE"] * len(ids)
    assert "canceling statement due to statement timeout" in db.wait_state(timed)["error"]
    assert "connection lost" not in svc.output()


def test_a_refused_claim_leaves_no_lock_behind(db):
    """A claim the database refuses after it returned some rows: the failed pass rolls back -- no row
    claimed, and the claim lock is free for the next pass (of any instance)."""
    db.execute("""CREATE FUNCTION refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$
                  BEGIN RAISE EXCEPTION 'not this one'; END $$""")
    db.execute("CREATE TRIGGER refuse_claim BEFORE UPDATE OF state ON task FOR EACH ROW "
               "WHEN (NEW.\"group\" = 'poison' AND OLD.state = 'PLAN') EXECUTE FUNCTION refuse_claim()")
    for i in range(4):
        db.insert("SELECT 1", group=f"g{i}")
    db.insert("SELECT 1", group="poison")

    async def go() -> None:
        sched = db.scheduler(run=10)
        await sched.start()
        try:
            with pytest.raises(psycopg.errors.RaiseException, match="not this one"):
                await sched.claimer.claim_pass()
            assert db.execute("SELECT mode FROM pg_locks WHERE relation = 'task_claim'::regclass AND pid = %s",
                              (sched.control.conn.info.backend_pid,)) == []
        finally:
            await sched.close()

    asyncio.run(go())
    assert db.value("SELECT count(*) FROM task WHERE state <> 'PLAN'") == 0


def test_extreme_timeout_and_active_values_run(db, service):
    """A timeout of a month (more milliseconds than statement_timeout's int holds: it gets the
    most there is) and an active window of millions of years must not fail the claim."""
    for text, columns in (("SELECT 1", {"timeout": "1 mon"}), ("SELECT 2", {"active": "5000000 years"}),
                          ("SELECT 3", {})):
        db.insert(text, **columns)
    # (psycopg reads no interval of more than 999,999,999 days: the rows are read without "active")
    wait_for(lambda: db.value("SELECT count(*) FROM task WHERE state = 'DONE'") == 3, message="three tasks DONE")
    assert db.execute("SELECT output, error FROM task ORDER BY id") == [("1", None), ("2", None), ("3", None)]


def test_a_claim_the_database_refuses_stops_nothing_that_runs(db, service):
    """A row whose claim the database refuses (a user's trigger here) fails the claim pass: the
    service goes on -- the task already running finishes, the pass is tried again with the reason
    in the log -- and claims again once the row can be claimed."""
    with db.connect() as locker:
        locker.execute("SELECT pg_advisory_lock(4247)")
        running = db.insert("SELECT pg_advisory_xact_lock_shared(4247)", group="long")
        db.wait_state(running, states=("WORK",))
        db.execute("""CREATE FUNCTION refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$
                      BEGIN RAISE EXCEPTION 'not this one'; END $$""")
        db.execute("CREATE TRIGGER refuse_claim BEFORE UPDATE OF state ON task FOR EACH ROW "
                   "WHEN (NEW.\"group\" = 'poison' AND OLD.state = 'PLAN') EXECUTE FUNCTION refuse_claim()")
        poison = db.insert("SELECT 1", group="poison")
        wait_for(lambda: "a claim pass failed (not this one" in service.output(), message="the refusal logged")
        assert db.task(poison)["state"] == "PLAN"
        locker.execute("SELECT pg_advisory_unlock(4247)")
        assert db.wait_state(running)["state"] == "DONE"  # not cancelled by a scheduler restart
    db.execute("DROP TRIGGER refuse_claim ON task")
    assert db.wait_state(poison, timeout=30)["state"] == "DONE"
    assert "scheduler failed" not in service.output()


def test_an_expired_row_someone_holds_locked_holds_up_no_claims(db, service):
    """The expiry skips a row a user's open transaction holds locked (it expires in a later pass)
    instead of waiting for it with the claim pass."""
    expired = db.insert("SELECT 1", plan="2000-01-01", active="1 second")
    with db.connect() as locker:
        locker.execute("BEGIN")
        locker.execute("SELECT FROM task WHERE id = %s FOR UPDATE", (expired,))
        others = [db.insert("SELECT 1", group=f"g{i}") for i in range(3)]
        assert [db.wait_state(i)["state"] for i in others] == ["DONE"] * 3
        assert db.task(expired)["state"] == "PLAN"
        locker.execute("COMMIT")
    assert db.wait_state(expired)["state"] == "GONE"


def test_a_read_only_role_runs_its_tasks_read_only(db):
    """An author whose transactions are read-only by default (ALTER ROLE ... SET
    default_transaction_read_only) runs tasks: pgtask's own start write is not the author's (in
    two round trips, the session's first task, and in one, a task of another group on that
    session once it is idle again), and the input is read-only as the author set it."""
    db.role("reader")
    db.execute("ALTER ROLE reader SET default_transaction_read_only = on")
    rows: list[dict] = []
    try:
        with db.connect("reader") as reader:
            reader.execute("SET default_transaction_read_only = off")  # to insert; its tasks' sessions are not

            def ended_and_idle(sched: Scheduler, task_id: int) -> bool:
                # idle and reset: a session is out of the pool while its reset (RESET_DELAY after
                # the task) runs, and a task claimed meanwhile opens a new one
                return db.task(task_id)["state"] in ("DONE", "FAIL") and any(
                    not session.needs_reset for session in sched.sessions.idle.get("reader", ()))

            async def during(sched: Scheduler) -> None:
                for text, group in (("SELECT 42", "r1"), ("SELECT 43", "r2"), ("CREATE TABLE reader_made ()", "r3")):
                    task_id = reader.execute("INSERT INTO task (input, \"group\") VALUES (%s, %s) RETURNING id",
                                             (text, group)).fetchone()[0]
                    await wait_for_async(functools.partial(ended_and_idle, sched, task_id),
                                         message=f"task {task_id} to end and its session to be idle and reset")
                    rows.append(db.task(task_id))

            db.run_scheduler(3, during=during)
    finally:
        db.execute("ALTER ROLE reader RESET default_transaction_read_only")
    first, other, refused = rows
    assert [(r["state"], r["output"]) for r in (first, other)] == [("DONE", "42"), ("DONE", "43")]
    assert first["pid"] == other["pid"]  # the same session: the second took one round trip
    assert refused["state"] == "FAIL" and "read-only transaction" in refused["error"], refused["error"]
