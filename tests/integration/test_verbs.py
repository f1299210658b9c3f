"""The operator verbs beside a task table (docs/operations.md): retry, cancel, delete by id and by
filter with their previews, pause and resume; the authority of an author, of ``task_admin`` and of
a role with neither; hostile arguments; a bulk retry of 100,000 tasks while the service claims."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from support import provision_again, wait_for
from test_metrics import sample, scrape

from pgtask import names, provision
from pgtask.cluster import free_port

AUTHORS = ("verb_alice", "verb_bob")
NEITHER = "verb_carol"
ADMIN = "verb_dave"


@pytest.fixture
def roles(db):
    """alice and bob author tasks (task_user), carol has INSERT on task but neither role, dave is
    the operator (task_admin)."""
    for name in (*AUTHORS, NEITHER, ADMIN):
        db.role(name, grant=False)
    for name in AUTHORS:
        db.execute(f'GRANT task_user TO "{name}"')
    db.execute(f'GRANT INSERT ON task TO "{NEITHER}"; GRANT USAGE ON SEQUENCE task_id_seq TO "{NEITHER}"')
    db.execute(f'GRANT task_admin TO "{ADMIN}"')
    return db


def verb(conn: psycopg.Connection, name: str, **args) -> dict:
    """``SELECT * FROM task_<name>(arg => value, ...)``: its one result row."""
    named = sql.SQL(", ").join(sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder()) for k in args)
    query = sql.SQL("SELECT * FROM {}({})").format(sql.Identifier(f"task_{name}"), named)
    return conn.cursor(row_factory=dict_row).execute(query, list(args.values())).fetchone()


def rows(db, user: str, state: str, n: int = 1, group: str = "g", error: str | None = None) -> list[int]:
    """``n`` tasks of ``user`` in ``state`` (as the service would have left them), inserted as the
    superuser; their ids."""
    ended = state in ("DONE", "FAIL", "GONE", "STOP")
    return [r[0] for r in db.execute(
        """INSERT INTO task ("user", "state", "group", "input", "error", "start", "stop", "note")
           SELECT %s, %s::state, %s, 'SELECT ' || i, %s, CASE WHEN %s THEN now() END, CASE WHEN %s THEN now() END,
                  'note ' || i
           FROM generate_series(1, %s) i RETURNING id""",
        (user, state, group, error, ended, ended, n))]


def snapshot(db) -> list[tuple]:
    return db.execute("SELECT t::text FROM task t ORDER BY id") + db.execute("SELECT g::text FROM task_group g ORDER BY 1")


@pytest.fixture
def noted(roles):
    """A user-added column: a retry copies it."""
    roles.execute("ALTER TABLE task ADD COLUMN note text")
    return roles


def test_retry_by_id_runs_again_as_its_author(noted, service):
    db = noted
    [mine] = rows(db, AUTHORS[0], "FAIL", error="ERROR:  boom")
    [theirs] = rows(db, AUTHORS[1], "FAIL", error="ERROR:  boom")
    with db.connect(AUTHORS[0]) as alice:
        before = snapshot(db)
        assert verb(alice, "retry", ids=[mine], preview=True) == {
            "tasks": 1, "remaining": 1, "last_id": None, "sample": [mine], "new_sample": None}
        assert snapshot(db) == before
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as err:
            verb(alice, "retry", ids=[mine, theirs])
        assert f"task {theirs} does not exist or is not a task of a role {AUTHORS[0]} is a member of" in str(err.value)
        assert snapshot(db) == before
        done = verb(alice, "retry", ids=[mine])
    assert (done["tasks"], done["remaining"], done["last_id"], done["sample"]) == (1, 0, mine, [mine])
    [new] = done["new_sample"]
    old, row = db.task(mine), db.task(new)
    assert (old["state"], old["error"]) == ("FAIL", "ERROR:  boom")
    assert (row["parent"], row["user"], row["input"], row["group"], row["note"], row["repeat"].total_seconds()) == \
        (mine, AUTHORS[0], old["input"], "g", old["note"], 0)
    finished = db.wait_state(new)
    assert (finished["state"], finished["output"]) == ("DONE", "1")


def test_retry_as_author_runs_as_author_not_caller(noted, service):
    """The admin's retry of alice's task runs as alice: its input reports current_user."""
    db = noted
    [mine] = [db.value("""INSERT INTO task ("user", state, input, start, stop, error, note)
                          VALUES (%s, 'FAIL', 'SELECT current_user', now(), now(), 'x', 'n') RETURNING id""",
                       (AUTHORS[0],))]
    with db.connect(ADMIN) as dave:
        done = verb(dave, "retry", ids=[mine])
    [new] = done["new_sample"]
    assert db.wait_state(new)["output"] == AUTHORS[0]


def test_admin_acts_on_every_row_and_preview_equals_the_verb(noted):
    db = noted
    fail = rows(db, AUTHORS[0], "FAIL", 3, error="ERROR:  50% done") + rows(db, AUTHORS[1], "GONE", 2, error="x")
    plan = rows(db, AUTHORS[0], "PLAN", 2) + rows(db, AUTHORS[1], "PLAN", 2)
    done = rows(db, AUTHORS[0], "DONE", 2) + rows(db, AUTHORS[1], "DONE", 1)
    with db.connect(ADMIN) as dave:
        preview = verb(dave, "retry", group_name="g", preview=True)
        assert (preview["tasks"], preview["sample"]) == (5, fail)
        did = verb(dave, "retry", group_name="g")
        assert (did["tasks"], did["sample"], did["remaining"]) == (5, fail, 0)
        users = dict(db.execute("SELECT parent, \"user\" FROM task WHERE parent = ANY(%s)", (fail,)))
        assert users == {i: db.task(i)["user"] for i in fail}
        assert db.value("SELECT array_agg(id ORDER BY parent) FROM task WHERE parent = ANY(%s)", (fail,)) == \
            did["new_sample"]

        preview = verb(dave, "cancel", group_name="g", preview=True)
        new = did["new_sample"]
        assert (preview["tasks"], preview["sample"]) == (9, sorted(plan + new))
        did = verb(dave, "cancel", group_name="g")
        assert (did["tasks"], did["sample"], did["remaining"]) == (9, sorted(plan + new), 0)
        assert db.value("SELECT count(*) FROM task WHERE state = 'STOP'") == 9

        preview = verb(dave, "delete", states=["DONE"], preview=True)
        assert (preview["tasks"], preview["sample"]) == (3, done)
        did = verb(dave, "delete", states=["DONE"])
        assert (did["tasks"], did["sample"]) == (3, done)
        assert db.value("SELECT count(*) FROM task WHERE id = ANY(%s)", (done,)) == 0
        assert db.value("SELECT count(*) FROM task") == 5 + 4 + 5


def test_author_acts_on_own_rows_only(noted):
    db = noted
    a_plan, b_plan = rows(db, AUTHORS[0], "PLAN", 3), rows(db, AUTHORS[1], "PLAN", 3)
    a_fail, b_fail = rows(db, AUTHORS[0], "FAIL", 2, error="e"), rows(db, AUTHORS[1], "FAIL", 2, error="e")
    theirs = lambda: db.execute("SELECT t::text FROM task t WHERE \"user\" = %s ORDER BY id", (AUTHORS[1],))
    before = theirs()
    with db.connect(AUTHORS[0]) as alice:
        assert verb(alice, "retry", author=AUTHORS[1], preview=True)["tasks"] == 0
        assert verb(alice, "retry", author=AUTHORS[1])["tasks"] == 0
        assert verb(alice, "cancel", group_name="g", preview=True)["sample"] == a_plan
        assert verb(alice, "cancel", group_name="g")["sample"] == a_plan
        did = verb(alice, "retry", states=["FAIL"])
        assert did["sample"] == a_fail
        assert verb(alice, "delete", group_name="g", preview=True)["tasks"] == 5
        assert verb(alice, "delete", group_name="g")["tasks"] == 5
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            verb(alice, "cancel", ids=[b_plan[0]])
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            verb(alice, "delete", ids=[b_fail[0]])
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for function task_pause"):
            verb(alice, "pause", group_name="g")
    assert theirs() == before
    assert db.value("SELECT count(*) FROM task WHERE \"user\" = %s", (AUTHORS[0],)) == 2  # the retries


def test_a_stopped_task_still_running_is_neither_retried_nor_deleted(noted):
    """A STOP row with a pid and no stop holds its group's slot (its query has not ended): the
    verbs leave it until it has ended. A waiting task (WAIT) is cancelled like a queued one."""
    db = noted
    [running] = db.execute("""INSERT INTO task ("user", state, input, pid, start)
                              VALUES (%s, 'STOP', 'SELECT 1', 1, now()) RETURNING id""", (AUTHORS[0],))[0]
    [first] = rows(db, AUTHORS[0], "PLAN", 1)
    with db.connect(AUTHORS[0]) as alice:
        alice.execute("SELECT task_enqueue('SELECT 2', columns => %s)",
                      (psycopg.types.json.Jsonb({"after": [first], "group": "w"}),))
        [waiting] = db.execute("SELECT id FROM task WHERE \"group\" = 'w'")[0]
        assert db.task(waiting)["state"] == "WAIT"
        for name in ("retry", "delete"):
            assert verb(alice, name, ids=[running], preview=True)["tasks"] == 0
            assert verb(alice, name, ids=[running])["tasks"] == 0
        assert db.task(running)["state"] == "STOP"
        db.execute("UPDATE task SET stop = now() WHERE id = %s", (running,))
        assert verb(alice, "retry", ids=[running], preview=True)["tasks"] == 1
        assert verb(alice, "cancel", group_name="w") == {
            "tasks": 1, "remaining": 0, "last_id": waiting, "sample": [waiting], "new_sample": None}
        assert verb(alice, "delete", ids=[running, waiting])["tasks"] == 2
    assert db.execute("SELECT id, state::text FROM task ORDER BY id") == [(first, "PLAN")]


def test_a_role_with_neither_is_refused_and_nothing_changes(noted):
    db = noted
    plan, fail = rows(db, AUTHORS[0], "PLAN", 2), rows(db, AUTHORS[1], "FAIL", 2, error="e")
    before = snapshot(db)
    calls = [("retry", {"ids": fail}), ("retry", {"group_name": "g"}), ("cancel", {"ids": plan}),
             ("cancel", {"group_name": "g", "preview": True}), ("delete", {"states": ["FAIL"]}),
             ("pause", {"group_name": "g"}), ("resume", {"group_name": "g"})]
    with db.connect(NEITHER) as carol:
        for name, args in calls:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"permission denied for function task_{name}"):
                verb(carol, name, **args)
        for name in ("retry_all", "cancel_all", "delete_all"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"permission denied for procedure task_{name}"):
                carol.execute(sql.SQL("CALL {}(group_name => 'g')").format(sql.Identifier(f"task_{name}")))
    assert snapshot(db) == before


def test_cancel_stops_a_running_task_as_a_users_stop_would(noted, service):
    db = noted
    with db.connect(AUTHORS[0]) as alice:
        task_id = alice.execute("SELECT id FROM task_enqueue('SELECT pg_sleep(30)')").fetchone()[0]
        db.wait_state(task_id, states=("WORK",))
        assert verb(alice, "cancel", ids=[task_id], preview=True)["tasks"] == 1
        assert verb(alice, "cancel", ids=[task_id])["tasks"] == 1
    row = wait_for(lambda: (r := db.task(task_id)) and r["stop"] is not None and r,
                   message="the cancelled task to be finished")
    assert row["state"] == "STOP"
    assert row["error"].startswith("ERROR:  canceling statement due to user request")
    # ended now: deleted by the verb, which left it while it ran
    with db.connect(AUTHORS[0]) as alice:
        assert verb(alice, "delete", ids=[task_id])["tasks"] == 1
    assert db.task(task_id) is None


def test_pause_and_resume_are_the_operators(noted, service):
    db = noted
    with db.connect(ADMIN) as dave:
        assert verb(dave, "pause", group_name="held", preview=True) == {"tasks": 0, "sample": [], "changed": True}
        assert verb(dave, "pause", group_name="held") == {"tasks": 0, "sample": [], "changed": True}
        assert verb(dave, "pause", group_name="held")["changed"] is False
        with db.connect(AUTHORS[0]) as alice:
            held = alice.execute("""SELECT id FROM task_enqueue('SELECT 1', columns => '{"group": "held"}')""").fetchone()[0]
            other = alice.execute("SELECT id FROM task_enqueue('SELECT 2')").fetchone()[0]
        assert db.wait_state(other)["state"] == "DONE"
        assert db.task(held)["state"] == "PLAN"
        assert verb(dave, "resume", group_name="held", preview=True) == {"tasks": 1, "sample": [held], "changed": True}
        assert db.value("SELECT paused FROM task_group WHERE \"group\" = 'held'") is True
        assert verb(dave, "resume", group_name="held") == {"tasks": 1, "sample": [held], "changed": True}
        assert db.wait_state(held)["state"] == "DONE"
        assert verb(dave, "resume", group_name="held")["changed"] is False
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="group_name"):
            verb(dave, "pause", group_name=None)
    # EXECUTE alone is not the operator's authority: the function checks the caller itself
    db.execute(f'GRANT EXECUTE ON FUNCTION task_pause TO "{AUTHORS[0]}"')
    try:
        with db.connect(AUTHORS[0]) as alice:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="is not a member of task_admin"):
                verb(alice, "pause", group_name="held")
    finally:
        db.execute(f'REVOKE EXECUTE ON FUNCTION task_pause FROM "{AUTHORS[0]}"')
    assert db.value("SELECT paused FROM task_group WHERE \"group\" = 'held'") is False


def test_set_role_narrows_the_caller(noted):
    """A session acts as its SET ROLE: the admin's login, SET ROLE alice, acts on alice's rows only."""
    db = noted
    db.execute(f'GRANT "{AUTHORS[0]}" TO "{ADMIN}"')
    try:
        a, b = rows(db, AUTHORS[0], "PLAN", 1), rows(db, AUTHORS[1], "PLAN", 1)
        with db.connect(ADMIN) as dave:
            dave.execute(f'SET ROLE "{AUTHORS[0]}"')
            assert verb(dave, "cancel", group_name="g")["sample"] == a
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                verb(dave, "cancel", ids=b)
        assert db.task(b[0])["state"] == "PLAN"
    finally:
        db.execute(f'REVOKE "{AUTHORS[0]}" FROM "{ADMIN}"')


def test_hostile_arguments_are_refused_or_harmless(noted):
    db = noted
    pct = rows(db, AUTHORS[0], "FAIL", 2, error="ERROR:  100% full")
    other = rows(db, AUTHORS[0], "FAIL", 3, error="ERROR:  100 x full")
    before = snapshot(db)
    with db.connect(ADMIN) as dave:
        # '%' is a character in error_has, a wildcard in error_like
        assert verb(dave, "retry", error_has="100% full", preview=True)["sample"] == pct
        assert verb(dave, "retry", error_like="%100% full", preview=True)["sample"] == pct + other
        assert verb(dave, "retry", error_like="%100\\% full", preview=True)["sample"] == pct
        # infinite ranges, NULL ids among the ids, a huge array
        assert verb(dave, "retry", plan_from="-infinity", plan_to="infinity", preview=True)["tasks"] == 5
        assert verb(dave, "retry", stop_from="infinity", preview=True)["tasks"] == 0
        assert verb(dave, "retry", ids=[None, pct[0], None], preview=True)["sample"] == pct[:1]
        huge = dave.execute("SELECT array_agg(i) FROM generate_series(1, 1000000) i").fetchone()[0]
        assert verb(dave, "retry", ids=huge, preview=True)["tasks"] == 5
        for args, error, match in [
            ({}, psycopg.errors.InvalidParameterValue, "no tasks named"),
            ({"ids": huge + [0]}, psycopg.errors.ProgramLimitExceeded, "argument ids"),
            ({"states": ["DONE"]}, psycopg.errors.InvalidParameterValue, "argument states"),
            ({"states": [None]}, psycopg.errors.InvalidParameterValue, "argument states"),
            ({"states": ["FAIL"], "batch": 0}, psycopg.errors.InvalidParameterValue, "argument batch"),
            ({"states": ["FAIL"], "batch": None}, psycopg.errors.InvalidParameterValue, "argument batch"),
        ]:
            with pytest.raises(error, match=match) as err:
                verb(dave, "retry", **args)
            assert err.value.diag.message_hint
        # the caller's search_path reaches nothing inside
        dave.execute("CREATE TEMP TABLE pg_roles (rolname name, oid oid)")
        dave.execute("SET search_path = pg_temp, public")
        assert verb(dave, "retry", group_name="g", preview=True)["tasks"] == 5
    assert snapshot(db) == before
    with db.connect(AUTHORS[1]) as bob:  # an author's huge array of others' ids: refused, nothing read
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            verb(bob, "delete", ids=huge)
    assert snapshot(db) == before


@pytest.mark.parametrize("schema,table", [("it's a schema", "my table;"), ("ünï", "ü" * 25 + "\"x"),
                                          ("public", "l" * 63)])  # the longest: names beside it hashed
def test_hostile_table_names(db, schema, table):
    """The verbs and the operator role are named beside the table, whatever its characters."""
    provision_again(db, schema, table)
    admin, author = names.admin_role(table), names.author_role(table)
    assert len(admin.encode()) <= 63
    assert db.execute("SELECT rolcanlogin, rolsuper FROM pg_roles WHERE rolname = %s", (admin,)) == [(False, False)]
    for login, role in (("verbs_erin", author), ("verbs_frank", admin)):
        db.role(login, grant=False)
        db.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(role), sql.Identifier(login)))
    fn = lambda suffix: sql.Identifier(schema, names.function_name(table, suffix))
    with db.connect("verbs_erin") as erin:
        [task_id] = erin.execute(sql.SQL("SELECT id FROM {}('SELECT 1', columns => '{{\"plan\": \"infinity\"}}')")
                                 .format(fn("enqueue"))).fetchone()
        assert erin.execute(sql.SQL("SELECT tasks, sample FROM {}(ids => %s)").format(fn("cancel")),
                            ([task_id],)).fetchone() == (1, [task_id])
    with db.connect("verbs_frank") as frank:
        assert frank.execute(sql.SQL("SELECT tasks FROM {}(ids => %s)").format(fn("retry")),
                             ([task_id],)).fetchone() == (1,)
        frank.execute(sql.SQL("CALL {}(states => ARRAY['STOP'])").format(fn("delete_all")))
        assert frank.execute(sql.SQL("SELECT changed FROM {}('group')").format(fn("pause"))).fetchone() == (True,)
    assert provision_again(db, schema, table).actions == []


def test_a_retry_keeps_its_author_when_an_ordinary_role_owns_the_table(db):
    """Provisioned on behalf of a role that is no superuser (an entry's role): the verbs are its, and
    a retry's copy still runs as the author -- the insert trigger keeps the author for the owner
    under pgtask.retry only; an author setting pgtask.retry gains nothing."""
    owner = db.role("verbs_owner", grant=False)
    db.execute('ALTER ROLE verbs_owner NOSUPERUSER; GRANT CREATE ON DATABASE "%s" TO verbs_owner' % db.name)

    async def go():
        async with await psycopg.AsyncConnection.connect(db.dsn) as conn:
            await provision.provision_table(conn, "ops", "jobs", provision.Report(), owner=owner)
            await conn.commit()
    asyncio.run(go())
    assert db.value("SELECT proowner::regrole::text FROM pg_proc WHERE oid = 'ops.jobs_retry'::regproc") == owner
    for login, role in ((AUTHORS[0], names.author_role("jobs")), (AUTHORS[1], names.author_role("jobs")),
                        (ADMIN, names.admin_role("jobs"))):
        db.role(login, grant=False)
        db.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(role), sql.Identifier(login)))
    assert db.value("SELECT pg_has_role('verbs_owner', %s, 'MEMBER')", (AUTHORS[0],)) is False
    [old] = db.execute("""INSERT INTO ops.jobs ("user", state, input, error, start, stop)
                          VALUES (%s, 'FAIL', 'SELECT 1', 'e', now(), now()) RETURNING id""", (AUTHORS[0],))[0]
    with db.connect(ADMIN) as dave:
        [new] = dave.execute("SELECT new_sample FROM ops.jobs_retry(ids => %s)", ([old],)).fetchone()[0]
    assert db.execute('SELECT parent, "user" FROM ops.jobs WHERE id = %s', (new,)) == [(old, AUTHORS[0])]
    with db.connect(AUTHORS[0]) as alice:
        alice.execute("SET pgtask.retry = on")
        alice.execute('INSERT INTO ops.jobs ("user", input, plan) VALUES (%s, \'SELECT 1\', \'infinity\')',
                      (AUTHORS[1],))
    assert db.execute("""SELECT "user" FROM ops.jobs WHERE id > %s""", (new,)) == [(AUTHORS[0],)]


BULK = 100_000


def feed(db, stop: threading.Event, log: list) -> None:
    """Until ``stop``: one task at a time in the other groups, as alice, each waited for; ``log``
    gets (inserted, finished) monotonic times, finished None if it did not end DONE in 60 s."""
    with db.connect(AUTHORS[0]) as alice, db.connect() as watch:
        i = 0
        while not stop.is_set():
            inserted = time.monotonic()
            task_id = alice.execute("SELECT id FROM task_enqueue('SELECT 1', columns => %s)",
                                    (psycopg.types.json.Jsonb({"group": f"other{i % 4}"}),)).fetchone()[0]
            try:
                wait_for(lambda: watch.execute("SELECT state = 'DONE' FROM task WHERE id = %s",
                                               (task_id,)).fetchone()[0], 60, interval=0.01)
                log.append((inserted, time.monotonic()))
            except AssertionError:
                log.append((inserted, None))
                return
            i += 1


def test_bulk_retry_in_batches_while_the_service_claims(noted, service_factory):
    db = noted
    port = free_port()
    service_factory(db.name, f'[pgtask]\nmetrics_listen = "127.0.0.1:{port}"\nmetrics_refresh = 5\n')
    rows(db, AUTHORS[0], "FAIL", BULK, group="bulk", error="ERROR:  bad deploy")
    db.execute("ANALYZE task")
    entry = {"data": db.name, "schema": "public", "table": "task"}
    with db.connect(ADMIN) as dave:
        verb(dave, "pause", group_name="bulk")  # the retries stay queued: the machine runs the others
        assert verb(dave, "retry", group_name="bulk", preview=True)["tasks"] == BULK
        stop, log = threading.Event(), []
        feeder = threading.Thread(target=feed, args=(db, stop, log))
        feeder.start()
        wait_for(lambda: len(log) >= 3, 30, message="the other groups' tasks to run")
        before, started = scrape(port), time.monotonic()
        try:
            done = dave.execute("CALL task_retry_all(group_name => 'bulk', batch => 10000)").fetchone()
        finally:
            ended = time.monotonic()
            after = scrape(port)
            stop.set()
            feeder.join(90)
    assert done == (BULK, 0)
    assert db.execute("""SELECT count(*), count(DISTINCT n.parent), count(*) FILTER (WHERE o.state = 'FAIL'
                             AND o."group" = 'bulk' AND o."user" = n."user" AND o.input = n.input)
                         FROM task n JOIN task o ON o.id = n.parent WHERE n."group" = 'bulk' AND n.state = 'PLAN'""") \
        == [(BULK, BULK, BULK)]
    assert db.value("SELECT count(*) FROM task") == 2 * BULK + len(log)
    assert all(finished is not None for _, finished in log), log
    during = [finished - inserted for inserted, finished in log if inserted >= started and finished <= ended]
    assert during, f"no task of the other groups finished during the {ended - started:.1f} s retry"
    name = "pgtask_claim_pass_seconds"
    passes = sample(after, f"{name}_count", **entry) - sample(before, f"{name}_count", **entry)
    spent = sample(after, f"{name}_sum", **entry) - sample(before, f"{name}_sum", **entry)
    print(f"\nbulk retry of {BULK} tasks: {ended - started:.2f} s; meanwhile {len(during)} tasks of other "
          f"groups ran, insert to DONE median {statistics.median(during) * 1000:.1f} ms, max "
          f"{max(during) * 1000:.1f} ms; {passes:.0f} claim passes, mean {spent / max(passes, 1) * 1000:.2f} ms")
