"""The claim query's plan: it must stay on the partial indexes however many rows the table holds."""

import asyncio
import contextlib
import re

import psycopg
import pytest
from support import holding_scheduler

from pgtask.queries import FINISH_PARAMS, PLANNER_SETTINGS, numbered, render_query


async def explain_prepared(conn, execute: str) -> str:
    """EXPLAIN of an EXECUTE of a statement the scheduler prepared on ``conn`` (its control
    connection or a writer): the plan that statement runs with now."""
    cur = conn.cursor(row_factory=psycopg.rows.tuple_row)
    await cur.execute(f"EXPLAIN {execute}")
    return "\n".join(r[0] for r in await cur.fetchall())


def scans_task(plan: str) -> bool:
    """Whether the plan reads the task table sequentially (the small instance table may be)."""
    return re.search(r"Seq Scan on task\b", plan) is not None


def explain(db, name, params):
    text = render_query(name, "public", "task")
    with db.conn.cursor() as cur:
        cur.execute(PLANNER_SETTINGS)  # as on the scheduler's control connection and its writers
        cur.execute(psycopg.sql.SQL("EXPLAIN ") + psycopg.sql.SQL(text), params)
        return "\n".join(r[0] for r in cur.fetchall())


def test_claim_uses_partial_indexes_with_many_rows(db):
    # 300k finished rows and 300k future rows: none of them may be scanned by a claim
    db.execute("ALTER TABLE task DISABLE TRIGGER USER")
    db.execute("INSERT INTO task (input, state, plan) SELECT 'SELECT 1', 'DONE', now() - '1 day'::interval "
               "FROM generate_series(1, 300000)")
    db.execute("INSERT INTO task (input, plan) SELECT 'SELECT 1', now() + '1 day'::interval "
               "FROM generate_series(1, 300000)")
    db.execute("INSERT INTO task (input) SELECT 'SELECT 1' FROM generate_series(1, 10)")
    db.execute("ALTER TABLE task ENABLE TRIGGER USER")
    db.execute("ANALYZE task")
    oid = db.value("SELECT 'task'::regclass::oid")
    plan = explain(db, "claim", {"token": "00000000-0000-40", "oid": oid, "limit": 1000,
                                 "offer_pid": [1], "offer_id": [1]})
    assert "task_queue_idx" in plan, plan
    assert "task_slot_idx" in plan, plan
    assert not scans_task(plan), plan
    plan = explain(db, "expire", {})
    assert "task_plan_idx" in plan, plan
    assert not scans_task(plan), plan
    plan = explain(db, "reset", {"oid": oid})
    assert not scans_task(plan), plan
    plan = explain(db, "next", {})
    assert not scans_task(plan), plan


ANALYZE_COUNT = "SELECT analyze_count FROM pg_stat_user_tables WHERE relid = 'task'::regclass"


@contextlib.asynccontextmanager
async def idle_scheduler(db, run: int = 4, analyze_wait: float = 60):
    """An in-process scheduler holding what it claims (hold_claims), after a first pass that found
    the queue empty: its next claim may start a burst. ``analyze_wait``: how long that claim waits
    for the statistics' ANALYZE (long by default: the order is what these tests look at)."""
    async with holding_scheduler(db, run=run) as (sched, claimed):
        sched.claimer.planning.ANALYZE_WAIT = analyze_wait
        assert (await sched.claimer.claim_pass())[0] == 0  # empty
        yield sched, claimed


def insert_burst(db, tasks: int, groups: int) -> None:
    """``tasks`` rows of `SELECT 1` due now, spread over ``groups`` groups, in one statement."""
    db.execute("INSERT INTO task (input, \"group\") SELECT 'SELECT 1', 'g' || i %% %s "
               "FROM generate_series(1, %s) i", (groups, tasks))


def stale_statistics(db, analyzed: bool) -> None:
    """320 finished rows; analyzed then (the statistics count no PLAN row), or never analyzed (the
    table's partial indexes, built empty, count none either)."""
    db.execute("ALTER TABLE task DISABLE TRIGGER USER")
    db.execute("INSERT INTO task (input, state, \"group\") SELECT 'SELECT 1', 'DONE', 'g' || i % 16 "
               "FROM generate_series(1, 320) i")
    db.execute("ALTER TABLE task ENABLE TRIGGER USER")
    if analyzed:
        db.execute("ANALYZE task")
    assert db.value("SELECT reltuples >= 0 FROM pg_class WHERE oid = 'task'::regclass") == analyzed


@pytest.mark.parametrize("groups", [16, 1000], ids=["16-groups", "1000-groups"])
@pytest.mark.parametrize("analyzed", [True, False], ids=["analyzed-finished", "never-analyzed"])
def test_statistics_older_than_the_queue_are_refreshed_before_claiming_starts(db, analyzed, groups):
    """Statistics that count no PLAN row, then a burst of due rows: 6,000 in 16 groups, or one task
    in each of 1,000 groups. On them the planner sorted each group's whole backlog for a claim (44 ms
    instead of 1), or read each group's head through the plan index -- every due row once per group:
    0.2-0.45 s for the first claim of 1,000 groups, 3.7 s for 3,000 -- until autovacuum analyzed the
    table. The first claim after an empty pass finds more rows due than the statistics count: the
    service analyzes the table before that claim, and the claim is planned on the queue as it is."""
    stale_statistics(db, analyzed)

    async def go() -> tuple[str, int, int]:
        async with idle_scheduler(db, run=1000) as (sched, _):
            insert_burst(db, 6000 if groups == 16 else groups, groups)
            before = db.value(ANALYZE_COUNT)
            claimed = (await sched.claimer.claim_pass())[0]
            analyzes = db.value(ANALYZE_COUNT) - before
            plan = await explain_prepared(sched.control.conn, f"EXECUTE pgtask_claim('{sched.control.token}', {sched.queries.oid}, 1000, '{{}}', '{{}}')")
            return plan, claimed, analyzes

    plan, claimed, analyzes = asyncio.run(go())
    assert (claimed, analyzes) == (groups, 1)
    heads = [line for line in plan.splitlines() if "on task t_" in line]  # the skip scan, the heads
    assert len(heads) == 3 and all("Index Scan using task_queue_idx" in line for line in heads), plan


def test_statistics_are_looked_at_when_a_burst_follows_the_last_finish(db):
    """A burst inserted right after the last running task finished -- its finish written by a claim
    pass, before the next poll found the queue empty: claiming starts again there too, and the
    statistics are looked at before it (they were only after a pass that found nothing running,
    so a trickle of tasks kept the check from ever running before a burst)."""
    stale_statistics(db, analyzed=True)

    async def go() -> int:
        async with idle_scheduler(db, run=1000) as (sched, claimed):
            db.execute("INSERT INTO task (input) VALUES ('SELECT 1')")
            assert (await sched.claimer.claim_pass())[0] == 1
            (task,) = claimed.values()
            finishing = asyncio.create_task(sched.completer.finish(task, "1", None))
            await asyncio.sleep(0)  # the finish is submitted: the next pass writes it
            assert (await sched.claimer.claim_pass())[0] == 0
            await finishing
            assert db.value("SELECT state::text FROM task WHERE id = %s", (task.id,)) == "DONE"
            insert_burst(db, 1000, 1000)
            before = db.value(ANALYZE_COUNT)
            assert (await sched.claimer.claim_pass())[0] == 1000
            return db.value(ANALYZE_COUNT) - before

    assert asyncio.run(go()) == 1


def test_a_claim_waits_for_a_slow_analyze_only_so_long_and_is_planned_again_after_it(db):
    """The ANALYZE before a burst's first claim may take longer than ANALYZE_WAIT (a large table's
    sample; here it is held up writing its statistics, whose pg_statistic rows another transaction
    has locked): the claim then goes on with the plans it has, and once the ANALYZE is done the next
    pass is planned again -- on the statistics it wrote."""
    stale_statistics(db, analyzed=True)  # its pg_statistic rows exist: an ANALYZE updates them
    blocker = db.connect()
    blocker.autocommit = False
    assert blocker.execute("SELECT count(*) FROM (SELECT FROM pg_statistic "
                           "WHERE starelid = 'task'::regclass FOR UPDATE) s").fetchone()[0] > 0

    async def go() -> tuple[int, int, int, int, int]:
        async with idle_scheduler(db, run=1000, analyze_wait=0.2) as (sched, _):
            insert_burst(db, 6000, 16)
            before = db.value(ANALYZE_COUNT)
            # without the bound the claim would wait for the blocker, past this test's timeout
            claimed = (await asyncio.wait_for(sched.claimer.claim_pass(), 30))[0]
            analyzing = sched.claimer.planning.analyzing is not None and not sched.claimer.planning.analyzing.done()
            await sched.claimer.claim_pass()  # the replan of a burst's second pass (Planning.replan_due), as always
            plans = sched.queries.plans
            await sched.claimer.claim_pass()
            unchanged = sched.queries.plans - plans  # nothing new: no replan
            blocker.rollback()
            await asyncio.wait_for(asyncio.shield(sched.claimer.planning.analyzing), 30)
            await sched.claimer.claim_pass()
            return claimed, int(analyzing), unchanged, sched.queries.plans - plans, db.value(ANALYZE_COUNT) - before

    try:
        claimed, analyzing, unchanged, replanned, analyzes = asyncio.run(go())
    finally:
        blocker.close()
    assert (claimed, analyzing) == (16, 1)  # claimed while the ANALYZE was still held up
    assert (unchanged, replanned, analyzes) == (0, 1, 1)


def test_a_trickle_of_tasks_is_claimed_without_analyzing(db):
    """Below STATISTICS_DUE due rows even a plan made on statistics that count none costs little,
    once: a few tasks inserted into a table whose statistics are old do not make the service
    analyze it before claiming them (an ANALYZE of a large table would delay their pickup)."""
    stale_statistics(db, analyzed=True)

    async def go() -> tuple[int, int]:
        async with idle_scheduler(db, run=100) as (sched, _):
            insert_burst(db, sched.claimer.planning.STATISTICS_DUE - 1, sched.claimer.planning.STATISTICS_DUE - 1)
            before = db.value(ANALYZE_COUNT)
            claimed = (await sched.claimer.claim_pass())[0]
            return claimed, db.value(ANALYZE_COUNT) - before

    claimed, analyzes = asyncio.run(go())
    assert claimed == 100
    assert analyzes == 0


def test_the_pass_is_planned_again_when_claiming_starts(db):
    """The claim pass's statements are prepared once per control session; planned on an empty
    queue, "next" read every due row through the queue index (1 ms a pass in a burst, PostgreSQL
    15). When claiming starts after an empty pass they are prepared again, for the queue as it is."""
    async def go() -> tuple[str, str]:
        async with idle_scheduler(db) as (sched, _):  # prepared and planned on an empty table
            plans = [await explain_prepared(sched.control.conn, "EXECUTE pgtask_next")]
            insert_burst(db, 3000, 4)
            assert (await sched.claimer.claim_pass())[0] == 4
            await sched.claimer.claim_pass()  # prepared again
            plans.append(await explain_prepared(sched.control.conn, "EXECUTE pgtask_next"))
            return plans

    before, after = asyncio.run(go())
    # PostgreSQL 15 plans the empty queue through task_queue_idx (this fails there without the new
    # PREPARE); 18 happens to pick task_plan_idx for the empty table too.
    assert "task_plan_idx" in after and "task_queue_idx" not in after, (before, after)


FLUSH = "EXECUTE pgtask_flush_finish('{}', '{}', '{}', '{}', '{}')"


def test_the_flushes_are_planned_again_with_the_pass(db):
    """A flush of finishes (UPDATE ... FROM unnest of its arrays, a generic plan) prepared while the
    table was small kept that plan -- a hash join over a sequential scan of the whole table -- for
    the burst that followed: 1.5-2 ms a flush at 6,000 rows instead of 0.3, and a warmed-up service
    a quarter slower than a fresh one (docs/performance.md). The writers' flush
    statements are prepared again whenever the claim pass's are."""
    empty = {name: [] for name in FINISH_PARAMS}

    async def go() -> tuple[str, str]:
        async with idle_scheduler(db) as (sched, _), sched.writers.connection() as writer:
            await sched.queries.run_flush(writer, "flush_finish", empty)  # planned on 0 rows
            plans = [await explain_prepared(writer, FLUSH)]
            insert_burst(db, 20000, 4)
            assert (await sched.claimer.claim_pass())[0] == 4
            await sched.claimer.claim_pass()  # the pass is prepared again: so are the flushes, when next used
            await sched.queries.run_flush(writer, "flush_finish", empty)
            plans.append(await explain_prepared(writer, FLUSH))
            return plans

    before, after = asyncio.run(go())
    assert "task_pkey" in after and not scans_task(after), (before, after)


BY_ID = {  # the statements that write given tasks' rows, with parameters for a batch of two
    "work": {"id": 1, "attempt": 1, "lease": "00000000-0000-0000-0000-000000000000", "pid": 1},
    "finish": {"id": 1, "attempt": 1, "lease": "00000000-0000-0000-0000-000000000000", "output": None,
               "error": None},
    "requeue": {"id": 1, "attempt": 1, "lease": "00000000-0000-0000-0000-000000000000"},
    "stopped": {"id": 1, "attempt": 1, "lease": "00000000-0000-0000-0000-000000000000"},
    "flush_finish": {"f_id": [1, 2], "f_attempt": [1, 1], "f_lease": [None, None], "f_output": [None, None],
                     "f_error": [None, None]},
    "flush_delete": {"id": [1, 2], "attempt": [1, 1], "lease": [None, None]},
}


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_a_task_row_is_written_through_the_primary_key_whatever_the_statistics_say(db, generic):
    """Statistics taken while nothing ran (autovacuum on an idle queue, or the service analyzing as a
    burst starts) count no TAKE/WORK row; with a burst running, the statements that write a given
    task's row read it through the running or the state index -- every running row, for each
    start and finish (5.8 ms a start with 1,000 running) -- unless only the primary key can serve
    them."""
    db.execute("ALTER TABLE task DISABLE TRIGGER USER")
    insert_burst(db, 3000, 3000)
    db.execute("ANALYZE task")  # every row PLAN: no running row counted
    db.execute("UPDATE task SET state = 'WORK', attempt = 1")
    db.execute("ALTER TABLE task ENABLE TRIGGER USER")
    plans = {}
    with db.conn.cursor() as cur:
        cur.execute(PLANNER_SETTINGS)
        cur.execute(f"SET plan_cache_mode = {'force_generic_plan' if generic else 'force_custom_plan'}")
        for name, params in BY_ID.items():
            text = numbered(render_query(name, "public", "task"), tuple(params))
            cur.execute(psycopg.sql.SQL("PREPARE {} AS ").format(psycopg.sql.Identifier(f"t_{name}"))
                        + psycopg.sql.SQL(text))
            cur.execute(psycopg.sql.SQL("EXPLAIN EXECUTE {}({})").format(
                psycopg.sql.Identifier(f"t_{name}"), psycopg.sql.SQL(", ").join(map(psycopg.sql.Literal, params.values()))))
            plans[name] = "\n".join(r[0] for r in cur.fetchall())
    for name, plan in plans.items():
        assert "Index Scan using task_pkey on task" in plan, (name, plan)
        assert "task_slot_idx" not in plan and "task_state_idx" not in plan, (name, plan)
