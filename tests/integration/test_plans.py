"""The claim query's plan: it must stay on the partial indexes however many rows the table holds."""

import asyncio

import psycopg
import pytest
from support import hold_claims

from pgtask.scheduler import FINISH_PARAMS, PLANNER_SETTINGS, render_query


async def explain_prepared(conn, execute: str) -> str:
    """EXPLAIN of an EXECUTE of a statement the scheduler prepared on ``conn`` (its control
    connection or a writer): the plan that statement runs with now."""
    cur = conn.cursor(row_factory=psycopg.rows.tuple_row)
    await cur.execute(f"EXPLAIN {execute}")
    return "\n".join(r[0] for r in await cur.fetchall())


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
    plan = explain(db, "claim", {"oid": oid, "limit": 1000, "offer_pid": [1], "offer_id": [1]})
    assert "task_queue_idx" in plan, plan
    assert "task_running_idx" in plan, plan
    assert "Seq Scan on task" not in plan, plan
    plan = explain(db, "expire", {})
    assert "task_plan_idx" in plan, plan
    assert "Seq Scan on task" not in plan, plan
    plan = explain(db, "reset", {"oid": oid})
    assert "Seq Scan on task" not in plan, plan
    plan = explain(db, "next", {})
    assert "Seq Scan on task" not in plan, plan


@pytest.mark.parametrize("analyzed", [True, False], ids=["analyzed-finished", "never-analyzed"])
def test_statistics_older_than_the_queue_are_refreshed_when_claiming_starts(db, analyzed):
    """Analyzed while the table held only finished rows -- or never analyzed, its partial indexes
    built empty -- then a burst of 6,000 due rows in 16 groups: the planner estimates no PLAN row,
    and sorted each group's whole backlog for a claim (44 ms instead of 1) until autovacuum analyzed
    the table, up to a minute later. The first claim after an empty pass that leaves due rows
    waiting finds the statistics counting fewer PLAN rows than it took: the service analyzes the
    table, and the pass is planned again on the queue as it is."""
    db.execute("ALTER TABLE task DISABLE TRIGGER USER")
    db.execute("INSERT INTO task (input, state, \"group\") SELECT 'SELECT 1', 'DONE', 'g' || i % 16 "
               "FROM generate_series(1, 320) i")
    db.execute("ALTER TABLE task ENABLE TRIGGER USER")
    if analyzed:
        db.execute("ANALYZE task")
    assert db.value("SELECT reltuples >= 0 FROM pg_class WHERE oid = 'task'::regclass") == analyzed

    async def go() -> tuple[str, str, int]:
        sched = db.scheduler(run=16)
        await sched.start()
        claim = f"EXECUTE pgtask_claim({sched.oid}, 1000, '{{}}', '{{}}')"
        hold_claims(sched)
        try:
            await sched.claim_pass()  # empty
            db.execute("INSERT INTO task (input, \"group\") SELECT 'SELECT 1', 'g' || i % 16 "
                       "FROM generate_series(1, 6000) i")
            before = db.value("SELECT analyze_count FROM pg_stat_user_tables WHERE relid = 'task'::regclass")
            assert (await sched.claim_pass())[0] == 16
            stale = await explain_prepared(sched.control, claim)
            assert sched.analyzing is not None
            await sched.analyzing
            await sched.claim_pass()  # planned again
            fresh = await explain_prepared(sched.control, claim)
            count = db.value("SELECT analyze_count FROM pg_stat_user_tables WHERE relid = 'task'::regclass")
            return stale, fresh, count - before
        finally:
            await sched.close()

    stale, fresh, analyzes = asyncio.run(go())
    assert analyzes == 1
    heads = [line for line in fresh.splitlines() if "on task t_" in line]  # the skip scan, the heads
    assert len(heads) == 3 and all("Index Scan using task_queue_idx" in line for line in heads), (stale, fresh)
    if analyzed:  # the plan it had before (never analyzed, the planner's guess from the table's
        # size picks either: here the queue index, after the benchmark's warm-up the sorting plan)
        assert "Sort Key: (GREATEST(t_3.max, 0)) DESC, t_3.id" in stale, stale


def test_the_pass_is_planned_again_when_claiming_starts(db):
    """The claim pass's statements are prepared once per control session; planned on an empty
    queue, "next" read every due row through the queue index (1 ms a pass in a burst, PostgreSQL
    15). When claiming starts after an empty pass they are prepared again, for the queue as it is."""
    async def go() -> tuple[str, str]:
        sched = db.scheduler()
        await sched.start()
        hold_claims(sched)
        try:
            await sched.claim_pass()  # empty: prepared and planned on an empty table
            plans = [await explain_prepared(sched.control, "EXECUTE pgtask_next")]
            db.execute("INSERT INTO task (input, \"group\") SELECT 'SELECT 1', 'g' || i % 4 "
                       "FROM generate_series(1, 3000) i")
            assert (await sched.claim_pass())[0] == 4
            await sched.claim_pass()  # prepared again
            plans.append(await explain_prepared(sched.control, "EXECUTE pgtask_next"))
            return plans
        finally:
            await sched.close()

    before, after = asyncio.run(go())
    # PostgreSQL 15 plans the empty queue through task_queue_idx (this fails there without the new
    # PREPARE); 18 happens to pick task_plan_idx for the empty table too.
    assert "task_plan_idx" in after and "task_queue_idx" not in after, (before, after)


FLUSH = "EXECUTE pgtask_flush_finish('{}', '{}', '{}', '{}', '{}')"


def test_the_flushes_are_planned_again_with_the_pass(db):
    """A flush of finishes (UPDATE ... FROM unnest of its arrays, a generic plan) prepared while the
    table was small kept that plan -- a hash join over a sequential scan of the whole table -- for
    the burst that followed: 1.5-2 ms a flush at 6,000 rows instead of 0.3, and a warmed-up service
    a quarter slower than a fresh one (docs/performance.md, tenth session). The writers' flush
    statements are prepared again whenever the claim pass's are."""
    empty = {name: [] for name in FINISH_PARAMS}

    async def go() -> tuple[str, str]:
        sched = db.scheduler()
        await sched.start()
        hold_claims(sched)
        try:
            await sched.claim_pass()  # empty
            async with sched.writers.connection() as writer:
                await sched._run_flush(writer, "flush_finish", FINISH_PARAMS, empty)  # planned on 0 rows
                plans = [await explain_prepared(writer, FLUSH)]
                db.execute("INSERT INTO task (input, \"group\") SELECT 'SELECT 1', 'g' || i % 4 "
                           "FROM generate_series(1, 20000) i")
                assert (await sched.claim_pass())[0] == 4
                await sched.claim_pass()  # the pass is prepared again: so are the flushes, when next used
                await sched._run_flush(writer, "flush_finish", FINISH_PARAMS, empty)
                plans.append(await explain_prepared(writer, FLUSH))
            return plans
        finally:
            await sched.close()

    before, after = asyncio.run(go())
    assert "task_pkey" in after and "Seq Scan on task" not in after, (before, after)
