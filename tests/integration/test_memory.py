"""Memory: task input held in the service at once is bounded ([pgtask] input_budget)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support import wait_for

from pgtask.inputs import Budget

MB = 1024 * 1024


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def insert_big(db, count: int, size: int) -> list[int]:
    """``count`` tasks in one statement, each in a group of its own, whose inputs are plain
    statements of ``size`` bytes with a small output: the length of a long literal."""
    return [r[0] for r in db.execute(
        """INSERT INTO task (input, "group")
           SELECT format('SELECT %%s AS tag, length(''%%s'')', i, repeat('x', %s - 26 - length(i::text))),
                  'big' || i
           FROM generate_series(1, %s) i RETURNING id""", (size, count))]


def run_inputs(db, svc, count: int, size: int) -> int:
    """Run ``count`` inputs of ``size`` bytes at once (each in a group of its own); the service's
    peak RSS growth over it."""
    db.wait_state(db.insert("SELECT 1"))  # the service has run a task: sessions, plans, buffers
    before = peak_rss(svc.proc.pid)
    ids = insert_big(db, count, size)
    wait_for(lambda: db.value("SELECT count(*) FROM task WHERE id = ANY(%s) AND state IN ('DONE', 'FAIL')",
                              (ids,)) == count, 120, message=f"{count} inputs of {size} bytes to end")
    rows = db.execute("SELECT state, output, error FROM task WHERE id = ANY(%s) ORDER BY id", (ids,))
    assert rows == [("DONE", f"tag\tlength\n{i}\t{size - 26 - len(str(i))}", None) for i in range(1, count + 1)], rows
    return peak_rss(svc.proc.pid) - before


def test_one_large_input(db, service):
    growth = run_inputs(db, service, 1, 50 * MB)
    print(f"\none 50 MB input: peak RSS +{growth / MB:.0f} MB")
    assert growth < 5 * 50 * MB


def test_eight_large_inputs_at_once_are_held_within_the_budget(db, service):
    """Eight 50 MB inputs at once: with the default budget (64 MB) they take turns, so the
    service's peak grows by what one takes, not eight (each input alone is held at least once)."""
    growth = run_inputs(db, service, 8, 50 * MB)
    print(f"\neight 50 MB inputs at once: peak RSS +{growth / MB:.0f} MB")
    assert growth < 8 * 50 * MB


def lock_holder(db):
    """A connection holding advisory lock 42: an input taking it waits until the test lets go."""
    conn = db.connect()
    conn.autocommit = True
    conn.execute("SELECT pg_advisory_lock(42)")
    return conn


def test_a_large_input_waits_for_the_budget_and_small_ones_do_not(db, service_factory):
    svc = service_factory(db.name, "[pgtask]\ninput_budget = 1048576\nreset_check = 0.5\n")
    pad = " -- " + "x" * (2 * MB)  # larger than the whole budget: each runs alone
    holder = lock_holder(db)
    first = db.insert("SELECT pg_advisory_lock(42), pg_advisory_unlock(42)" + pad, group="a")
    wait_for(lambda: db.value("SELECT state FROM task WHERE id = %s", (first,)) == "WORK", 30,
             message="the first large input to run")
    second = db.insert("SELECT 'second'" + pad, group="b")
    wait_for(lambda: db.value("SELECT state FROM task WHERE id = %s", (second,)) == "TAKE", 30,
             message="the second large input to be claimed")
    small = db.insert("SELECT 'small'", group="c")
    db.wait_state(small)
    assert db.value("SELECT output FROM task WHERE id = %s", (small,)) == "small"
    # the first still holds the budget: the second, claimed before the small one, has not started
    assert db.execute("SELECT state FROM task WHERE id = ANY(%s) ORDER BY id", ([first, second],)) == \
        [("WORK",), ("TAKE",)]
    holder.close()
    for task_id in (first, second):
        row = db.wait_state(task_id, timeout=30)
        assert (row["state"], row["error"]) == ("DONE", None), row
    assert svc.proc.poll() is None


def test_budget_takes_turns_first_come_and_lets_a_larger_one_run_alone():
    async def go() -> None:
        budget = Budget(100)
        await budget.acquire(60)
        order: list[int] = []

        async def take(size: int) -> None:
            await budget.acquire(size)
            order.append(size)

        big = asyncio.create_task(take(500))      # larger than the budget: waits until nothing is held
        mid = asyncio.create_task(take(30))       # would fit now, but comes after the big one
        gone = asyncio.create_task(take(10))
        await asyncio.sleep(0)
        assert order == [] and budget.held == 60
        gone.cancel()                             # a waiter cancelled leaves its place, holding nothing
        await asyncio.gather(gone, return_exceptions=True)
        budget.release(60)
        await big
        assert order == [500] and budget.held == 500 and not mid.done()
        budget.release(500)
        await mid
        assert order == [500, 30] and budget.held == 30
        budget.resize(10)                         # a smaller budget: the next waits for room
        late = asyncio.create_task(take(5))
        await asyncio.sleep(0)
        assert not late.done()
        budget.release(30)
        await late
        assert budget.held == 5 and not budget.waiting

    asyncio.run(go())
