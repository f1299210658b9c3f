"""Group commit of finishes (completer.Completer.flush): which statement writes a batch, and that each one
keeps the fence (attempt + lease) and the manual's finish: DONE/FAIL, output, error, the repeat."""

import asyncio
import contextlib
import itertools
import threading

import pytest
from support import holding_scheduler, wait_for, wait_for_async


def prepared_names(sched) -> set[str]:
    return set().union(*(names.keys() for names in sched.queries.prepared.values()))


@pytest.mark.quick
def test_plain_finishes_take_the_lean_statement_and_a_repeat_the_full_one(db):
    plain = [db.insert("SELECT 1", group=f"g{i}") for i in range(3)]
    lost = db.insert("SELECT 1", group="lost")
    repeating = db.insert("SELECT 1", group="r", repeat="1 hour")

    async def go() -> tuple[set[str], set[str]]:
        async with holding_scheduler(db, run=10) as (sched, claimed):
            assert (await sched.claimer.claim_pass())[0] == 5
            db.claim(lost)  # another claim took it meanwhile: its finish must not land
            await asyncio.gather(
                sched.completer.finish(claimed[plain[0]], "1", None),
                sched.completer.finish(claimed[plain[1]], "", "ERROR:  boom"),
                sched.completer.finish(claimed[plain[2]], "a\tb", None),
                sched.completer.finish(claimed[lost], "1", None))
            lean = prepared_names(sched)
            await sched.completer.finish(claimed[repeating], "1", None)
            return lean, prepared_names(sched)

    lean, full = asyncio.run(go())
    assert "flush_finish" in lean and "flush" not in lean, lean
    assert "flush" in full, full
    rows = [db.task(i) for i in plain]
    assert [(r["state"], r["output"], r["error"]) for r in rows] == [
        ("DONE", "1", None), ("FAIL", "", "ERROR:  boom"), ("DONE", "a\tb", None)]
    assert all(r["stop"] is not None for r in rows)
    assert db.task(lost)["state"] == "TAKE" and db.task(lost)["output"] is None
    assert db.task(repeating)["state"] == "DONE"
    assert db.value("SELECT count(*) FROM task WHERE parent = %s AND state = 'PLAN'", (repeating,)) == 1


@pytest.mark.parametrize("columns", [{}, {"count": 5}], ids=["plain", "count"])
def test_a_finish_blocked_by_a_row_lock_does_not_hold_up_the_others(db, service, columns):
    """Finishes are written one batch at a time; one that waits (here on a row lock someone else
    holds) gets a second writer beside it, so other tasks still finish meanwhile. Within count/live
    the finish holds the control lock every claim pass needs: it lets go of it after SLOW_FLUSH."""
    with db.connect() as locker:
        locker.execute("SELECT pg_advisory_lock(4244)")  # the slow task runs until this is released
        slow = db.insert("SELECT pg_advisory_xact_lock(4244)", group="a", **columns)
        db.wait_state(slow, states=("WORK",))
        locker.execute("BEGIN")
        locker.execute("SELECT FROM task WHERE id = %s FOR UPDATE", (slow,))  # held until COMMIT
        locker.execute("SELECT pg_advisory_unlock(4244)")  # the slow task ends; its finish waits
        wait_for(lambda: db.value(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%%pgtask_flush%%'"),
            message="the slow task's finish to wait for the row lock")
        quick = db.insert("SELECT 1", group="b")
        assert db.wait_state(quick, timeout=10)["state"] == "DONE"
        assert db.task(slow)["state"] == "WORK"  # its finish still waits
        locker.execute("COMMIT")
    assert db.wait_state(slow)["state"] == "DONE"


@pytest.mark.quick
def test_a_groups_next_task_is_claimed_in_the_commit_that_finishes_the_previous_one(db):
    """The claim pass writes the finishes waiting to be written first in its own transaction: a
    serial group's next task is claimed in the transaction that finishes the one before (a user's
    trigger records each state change's transaction) -- and started there, on the session the one
    before ran on: PLAN -> WORK with that session's pid, no TAKE (see "offered" in the claim)."""
    db.execute("CREATE TABLE state_log (id bigint, state text, xid xid8)")
    db.execute("""CREATE FUNCTION log_state() RETURNS trigger LANGUAGE plpgsql AS $$
                  BEGIN INSERT INTO public.state_log VALUES (NEW.id, NEW.state, pg_current_xact_id()); RETURN NULL; END $$""")
    db.execute("CREATE TRIGGER log_state AFTER UPDATE OF state ON task FOR EACH ROW EXECUTE FUNCTION log_state()")
    ids = [db.insert("SELECT 1", group="serial") for _ in range(4)]
    # no flusher takes over however slow this machine is: claim passes only
    db.run_scheduler(len(ids), configure=lambda sched: setattr(sched.completer, "SLOW_FLUSH", 30.0))
    assert [db.task(i)["state"] for i in ids] == ["DONE"] * len(ids)
    xid = {(i, s): x for i, s, x in db.execute("SELECT id, state, xid FROM state_log")}
    for previous, following in itertools.pairwise(ids):
        assert xid[previous, "DONE"] == xid[following, "WORK"], (previous, following, xid)
        assert (following, "TAKE") not in xid, xid
    # the first one: claimed (TAKE), then started by its session (WORK), then finished
    assert len({xid[ids[0], "TAKE"], xid[ids[0], "WORK"], xid[ids[0], "DONE"]}) == 3
    assert len({db.task(i)["pid"] for i in ids}) == 1  # one session ran them all


def test_the_pass_writing_finishes_is_woken_when_the_cohort_has_finished(db):
    """The tasks one claim pass started finish within about a millisecond of each other, and a pass
    costs nearly as much for two finishes as for sixteen: the pass that writes them is woken when the
    last of that cohort has finished (or COHORT_WAIT after the first), and writes them all at once."""
    ids = [db.insert("SELECT 1", group=f"g{i}") for i in range(4)]

    async def go() -> tuple[bool, bool]:
        async with holding_scheduler(db, run=10) as (sched, claimed):
            sched.completer.COHORT_WAIT = sched.completer.SLOW_FLUSH = 60.0  # only the cohort's end wakes it, no flusher
            assert (await sched.claimer.claim_pass())[0] == 4
            sched.wake.clear()
            finishes = [asyncio.create_task(sched.completer.finish(claimed[i], "1", None)) for i in ids[:3]]
            await asyncio.sleep(0)  # submitted
            early = sched.wake.is_set()
            finishes.append(asyncio.create_task(sched.completer.finish(claimed[ids[3]], "1", None)))
            await asyncio.sleep(0)
            woken = sched.wake.is_set()
            await sched.claimer.claim_pass()
            await asyncio.wait_for(asyncio.gather(*finishes), 10)
            return early, woken

    assert asyncio.run(go()) == (False, True)
    assert [db.task(i)["state"] for i in ids] == ["DONE"] * 4
    assert db.value("SELECT count(DISTINCT xmin::text) FROM task WHERE id = ANY(%s)", (ids,)) == 1  # one pass


def test_a_task_of_the_cohort_that_runs_on_is_waited_for_once(db):
    """COHORT_WAIT after the first finish of a cohort the pass is woken without the rest of it, and
    the rest is not waited for again: a long task does not hold up every pass of the short ones."""
    ids = [db.insert("SELECT 1", group=f"g{i}") for i in range(3)]  # ids[2]: the long one

    async def go() -> tuple[bool, set, bool]:
        async with holding_scheduler(db, run=10) as (sched, claimed):
            sched.completer.COHORT_WAIT, sched.completer.SLOW_FLUSH = 0.1, 60.0
            assert (await sched.claimer.claim_pass())[0] == 3
            sched.wake.clear()
            first = asyncio.create_task(sched.completer.finish(claimed[ids[0]], "1", None))
            await asyncio.sleep(0)  # submitted
            held = not sched.wake.is_set()
            await asyncio.wait_for(sched.wake.wait(), 10)  # COHORT_WAIT later
            given_up = set(sched.completer.cohort)  # ids[1] and ids[2] still run: only the timer empties it
            await sched.claimer.claim_pass()
            await asyncio.wait_for(first, 10)
            sched.wake.clear()
            second = asyncio.create_task(sched.completer.finish(claimed[ids[1]], "1", None))
            await asyncio.sleep(0)
            at_once = sched.wake.is_set()
            await sched.claimer.claim_pass()
            await asyncio.wait_for(second, 10)
            return held, given_up, at_once

    assert asyncio.run(go()) == (True, set(), True)
    assert [db.task(i)["state"] for i in ids] == ["DONE", "DONE", "TAKE"]


@pytest.mark.quick
def test_finishes_are_written_while_claim_passes_wait_for_the_claim_lock(db, service):
    """Another instance holding the table's claim lock stalls the claim passes, not the finishes:
    a pass carrying finishes gives up waiting after SLOW_FLUSH and hands them to a writer."""
    with db.connect() as locker, db.connect() as claimer:
        locker.execute("SELECT pg_advisory_lock(4246)")  # the task runs until this is released
        task = db.insert("SELECT pg_advisory_xact_lock(4246)", group="a")
        db.wait_state(task, states=("WORK",))
        claimer.execute("BEGIN")
        claimer.execute("LOCK TABLE task_claim IN SHARE UPDATE EXCLUSIVE MODE")  # as a claim pass takes it
        locker.execute("SELECT pg_advisory_unlock(4246)")  # the task ends; its finish must get through
        assert db.wait_state(task, timeout=10)["state"] == "DONE"
        waiting = db.insert("SELECT 1", group="b")
        claimer.execute("COMMIT")
    assert db.wait_state(waiting)["state"] == "DONE"  # claiming goes on once the lock is free


def test_a_rolled_back_finish_leaves_the_flush_statements_in_place(db, caplog):
    """psycopg deallocates ALL of a connection's prepared statements when a transaction on it rolls
    back, once it has prepared a statement of its own there (after five runs of one query): the
    service's own statements on that writer went with them, and every later batch written there
    failed ("prepared statement ... does not exist") and was written row by row instead."""
    db.execute("""CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
                  BEGIN RAISE EXCEPTION 'refused by a trigger'; END $$""")
    db.execute("""CREATE TRIGGER refuse BEFORE UPDATE ON task FOR EACH ROW
                  WHEN (NEW.state = 'DONE' AND NEW.input = 'SELECT ''refuse''') EXECUTE FUNCTION refuse()""")
    repeating = [db.insert("SELECT 1", group=f"r{i}", repeat="1 hour") for i in range(2)]
    pausing = [db.insert("SELECT 1", group=f"p{i}", max=-1) for i in range(8)]  # finished one by one
    refused = db.insert("SELECT 'refuse'", group="refused", max=-1)

    async def go() -> None:
        async with holding_scheduler(db, run=20) as (sched, claimed):
            assert (await sched.claimer.claim_pass())[0] == 11
            await sched.completer.finish(claimed[repeating[0]], "1", None)  # the writer prepares pgtask_flush
            for task_id in pausing:
                await sched.completer.finish(claimed[task_id], "1", None)   # the same writer, through psycopg
            await sched.completer.finish(claimed[refused], "refuse", None)  # a rollback there
            await sched.completer.finish(claimed[repeating[1]], "1", None)  # pgtask_flush again

    with caplog.at_level("INFO", logger="pgtask"):
        asyncio.run(go())
    assert db.task(refused)["state"] == "FAIL" and "refused by a trigger" in db.task(refused)["error"]
    assert db.value("SELECT count(*) FROM task WHERE parent = ANY(%s)", (repeating,)) == 2
    assert "batched write failed" not in caplog.text, caplog.text


def test_a_slow_user_trigger_on_a_finish_holds_up_no_claims(db, caplog):
    """A user's trigger on the finish that runs long (the manual's webhook pattern) fails the claim
    pass that writes it after SLOW_FLUSH (statement_timeout): the finish goes to a writer, which
    runs the trigger for as long as it takes, and other groups' tasks are claimed and finished
    meanwhile. After that, claim passes leave finishes to the writers for PASS_WRITES_PAUSE."""
    db.execute("CREATE TABLE hook_released (g text)")  # the groups whose trigger may end
    db.execute("""CREATE FUNCTION slow_hook() RETURNS trigger LANGUAGE plpgsql AS $$
                  BEGIN
                      WHILE NEW."group" LIKE 'hook%' AND NOT EXISTS (
                          SELECT FROM public.hook_released WHERE g = NEW."group") LOOP
                          PERFORM pg_sleep(0.01);
                      END LOOP;
                      RETURN NULL;
                  END $$""")
    db.execute("CREATE TRIGGER slow_hook AFTER UPDATE OF state ON task FOR EACH ROW "
               "WHEN (NEW.state IN ('DONE', 'FAIL')) EXECUTE FUNCTION slow_hook()")

    def in_hook() -> bool:
        return db.value("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                        "AND query LIKE '%%pgtask_flush%%'") == 1

    async def during(sched) -> None:
        first = db.insert("SELECT 1", group="hook1")
        await wait_for_async(in_hook, message="the first hooked finish to run its trigger")
        quick = [db.insert("SELECT 1", group=f"g{i}") for i in range(3)]
        await wait_for_async(lambda: all(db.task(i)["state"] == "DONE" for i in quick),
                             message="the other groups' tasks to finish")
        assert db.task(first)["state"] == "WORK"  # its finish still runs
        db.execute("INSERT INTO hook_released VALUES ('hook1')")
        await wait_for_async(lambda: db.task(first)["state"] == "DONE", message="the first hooked finish")
        second = db.insert("SELECT 1", group="hook2")  # no writer busy now
        await wait_for_async(in_hook, message="the second hooked finish to run its trigger")
        db.execute("INSERT INTO hook_released VALUES ('hook2')")
        await wait_for_async(lambda: db.task(second)["state"] == "DONE", message="the second hooked finish")

    caplog.set_level("INFO", logger="pgtask")
    db.run_scheduler(5, configure=lambda sched: setattr(sched.completer, "PASS_WRITES_PAUSE", 3600.0), during=during)
    assert db.value("SELECT count(*) FROM task WHERE state = 'DONE'") == 5
    handed = [r.getMessage() for r in caplog.records if "handed its finishes to a writer" in r.getMessage()]
    assert len(handed) == 1, handed  # the second went to a writer at once
    assert "statement timeout" in handed[0]



@contextlib.contextmanager
def commits_wait_for_a_standby(db):
    """synchronous_standby_names names a standby that never comes: a commit that waits for the WAL
    flush then waits for it as well, after committing locally -- and a backend ended while it waits
    has committed, its client never hearing so (the server warns "The transaction has already
    committed locally"). Yields once a probe's commit was seen waiting (the reload has reached the
    server); the test's own connection commits without waiting (the service's finishes ask for
    synchronous_commit = on whatever the cluster's default)."""
    db.execute("SET synchronous_commit = local")
    db.execute("CREATE TABLE sync_probe (x int)")
    db.execute("ALTER SYSTEM SET synchronous_standby_names = 'pgtask_test_nobody'")
    db.execute("SELECT pg_reload_conf()")
    try:
        with db.connect() as probe:
            pid = probe.info.backend_pid
            probe.execute("SET synchronous_commit = on")  # the test cluster's default is off
            writes = threading.Thread(target=probe.execute, args=("INSERT INTO sync_probe VALUES (1)",))
            writes.start()
            wait_for(lambda: db.value("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)) == "SyncRep",
                     message="a commit waiting for the standby")
            db.execute("SELECT pg_cancel_backend(%s)", (pid,))
            writes.join()
        yield
    finally:
        db.execute("ALTER SYSTEM RESET synchronous_standby_names")
        db.execute("SELECT pg_reload_conf()")


def test_a_finish_committed_before_its_connection_was_lost_is_not_reported_lost(db, caplog):
    """A finish that committed on a connection lost before its answer came is written again on
    another one, which matches nothing (the rows are ended, or deleted): the results are in the
    table, and the service says so instead of "lease lost: result dropped". Batched finishes (one of
    them deleting its row) and a finish of its own (negative max) alike."""
    plain = db.insert("SELECT 1", group="a")
    deleted = db.insert("SELECT 1", group="b", delete=True)  # finished without output: deleted
    alone = db.insert("SELECT 1", group="c", max=-1)
    # PostgreSQL's default, which the test cluster turns off: a finish of its own waits for the flush
    db.execute(f'ALTER DATABASE "{db.name}" SET synchronous_commit = on')

    async def go() -> None:
        async with holding_scheduler(db, run=10) as (sched, claimed):
            assert (await sched.claimer.claim_pass())[0] == 3
            with commits_wait_for_a_standby(db):
                finishing = asyncio.gather(sched.completer.finish(claimed[plain], "1", None),
                                           sched.completer.finish(claimed[deleted], None, None),
                                           sched.completer.finish(claimed[alone], "3", None))
                waiting = "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
                await wait_for_async(lambda: len(db.execute(waiting)) == 2, message="both commits waiting")
                db.execute(f"SELECT pg_terminate_backend(pid) FROM ({waiting}) w")
                await finishing

    with caplog.at_level("INFO", logger="pgtask"):
        asyncio.run(go())
    assert "flush failed" in caplog.text and "finish failed" in caplog.text, caplog.text  # both were retried
    assert "lease lost" not in caplog.text, caplog.text
    assert (db.task(plain)["state"], db.task(plain)["output"]) == ("DONE", "1")
    assert (db.task(alone)["state"], db.task(alone)["output"]) == ("DONE", "3")
    assert db.value("SELECT count(*) FROM task WHERE id = %s", (deleted,)) == 0
