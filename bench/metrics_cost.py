"""What one reading of the metrics' table figures costs the server (issue 38's goal: with 1 M
finished rows and 100 k queued rows, at most 100 ms of server time, and no claim held up).

    .venv/bin/python -m bench.metrics_cost                       # 1 M finished, 100 k queued
    .venv/bin/python -m bench.metrics_cost --finished 100000     # a quicker look

On bench.run's PostgreSQL 15 cluster (its settings; parallel query as the server's defaults, which
the reading's connection turns off as the service does): one table holding --finished finished rows
(DONE, 2 % FAIL) in --groups groups, --queued PLAN rows (60 % due, the rest a day ahead) and a few
running ones. A reading is ``TableStats.refresh_once`` on a connection set up as the service's
(``TableStats.connect``); each is timed by its backend's CPU (/proc/PID/schedstat: its server time)
and by the wall clock, --readings times, in two states of the table:
- loaded: right after the rows were written and analyzed, the visibility map not yet set (a table
  autovacuum has not reached since its last burst: the index-only scans visit the heap);
- vacuumed: after VACUUM (what autovacuum leaves).
Then the locks a reading takes (each query inside a transaction, pg_locks of its backend) and the
claim transaction (claim_lock, claim, next; median of 200) alone and with readings running back to
back on another connection: a reading that held up claims would show there.

Prints numbers; asserts nothing (a measurement, not a test).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

import psycopg

from bench.run import Bench, running_seconds
from pgtask.config import Entry
from pgtask.metrics import READ_SETTINGS, TableStats
from pgtask.queries import render_query


def fill(conn: psycopg.Connection, finished: int, queued: int, groups: int) -> None:
    """Finished rows as a long-running service leaves them, then the queue and a few running rows."""
    conn.execute("ALTER TABLE task SET (autovacuum_enabled = off)")  # the "loaded" state stays as loaded
    fill_finished(conn, finished, groups)
    conn.execute(
        """INSERT INTO task ("group", plan, input)
           SELECT 'g' || (i %% %(groups)s),
                  CASE WHEN i %% 10 < 6 THEN now() - i * interval '1 ms' ELSE now() + interval '1 day' END,
                  'SELECT 1'
           FROM generate_series(1, %(queued)s::int8) i""", {"groups": groups, "queued": queued})
    conn.execute("""INSERT INTO task ("group", plan, state, pid, start, input)
                    SELECT 'g' || i, now(), 'WORK', pg_backend_pid(), now(), 'SELECT pg_sleep(60)'
                    FROM generate_series(1, 16) i""")
    conn.execute("ANALYZE task")


def fill_finished(conn: psycopg.Connection, finished: int, groups: int) -> None:
    """``finished`` rows as a long-running service leaves them (DONE, every 50th FAIL) in ``groups``
    groups, written in steps of 200,000 (one statement for millions of rows holds all of them in
    one transaction's memory and WAL). A row every 10 ms from a day ago, closer together when more
    than a day's worth: none ends in the future."""
    step, spacing = 200_000, min(10.0, 86_000_000 / max(finished, 1))
    for first in range(0, finished, step):
        conn.execute(
            """INSERT INTO task ("group", plan, start, stop, state, input, output, error)
               SELECT 'g' || (i %% %(groups)s), now() - interval '1 day' + i * %(spacing)s * interval '1 ms',
                      now() - interval '1 day' + i * %(spacing)s * interval '1 ms' + interval '2 ms',
                      now() - interval '1 day' + i * %(spacing)s * interval '1 ms' + interval '5 ms',
                      CASE WHEN i %% 50 = 0 THEN 'FAIL' ELSE 'DONE' END::state, 'SELECT 1',
                      CASE WHEN i %% 50 = 0 THEN NULL ELSE '1' END,
                      CASE WHEN i %% 50 = 0 THEN 'division by zero' END
               FROM generate_series(%(first)s::int8, %(last)s::int8) i""",
            {"groups": groups, "first": first + 1, "last": min(first + step, finished), "spacing": spacing})


def table_stats(bench: Bench, db: str) -> TableStats:
    """The service's reading of the task table of ``db`` (its defaults: 50 groups by name)."""
    entry = Entry(data=db, user="postgres", schema="public", table="task", sleep=1000, reset="", run=1, spi=False)
    return TableStats(bench.cluster.conninfo(db), entry, groups=50, refresh=10)


def readings(stats: TableStats, count: int) -> tuple[list[float], list[float]]:
    """``count`` readings on one connection of the service's kind: (server CPU ms, wall ms) of each."""
    async def go() -> tuple[list[float], list[float]]:
        cpu, wall = [], []
        async with await stats.connect() as conn:
            pid = conn.info.backend_pid
            await stats.refresh_once(conn)  # the first one plans the statements and warms the cache
            for _ in range(count):
                c, t = running_seconds(pid), time.perf_counter()
                await stats.refresh_once(conn)
                wall.append((time.perf_counter() - t) * 1000)
                cpu.append((running_seconds(pid) - c) * 1000)
        return cpu, wall
    return asyncio.run(go())


def exact(conn: psycopg.Connection, stats: TableStats) -> tuple[dict[str, float], float]:
    """The finished rows counted (metrics.sql "ended"), and that count's server CPU in ms."""
    conn.execute(READ_SETTINGS)
    pid, before = conn.info.backend_pid, running_seconds(conn.info.backend_pid)
    counted = dict(conn.execute(stats.queries["ended"]).fetchall())
    took = (running_seconds(pid) - before) * 1000
    conn.execute("RESET ALL")
    return counted, took


async def estimated(stats: TableStats) -> dict[str, float]:
    async with await stats.connect() as conn:
        return await stats.finished_estimate(conn)


def fmt(counts: dict[str, float]) -> str:
    return ", ".join(f"{state} {counts.get(state, 0):,.0f}" for state in ("DONE", "FAIL", "GONE", "STOP"))


def explain(conn: psycopg.Connection, stats: TableStats) -> None:
    """Each query's plan and execution time, on the service's settings (a query of a table this
    database lacks is skipped, as the reading skips it)."""
    conn.execute(READ_SETTINGS)
    for name, query in stats.queries.items():
        params = {"prefix": stats.session_prefix} if name == "sessions" else None
        try:
            plan = [row[0] for row in conn.execute(
                psycopg.sql.SQL("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) ") + query, params)]
        except psycopg.errors.UndefinedTable:
            continue
        print(f"  -- {name}:\n" + "\n".join(f"     {line}" for line in plan))
    conn.execute("RESET ALL")


def locks(conn: psycopg.Connection, stats: TableStats) -> set[tuple[str, str]]:
    """The relations each query locks and the modes (kept to the transaction's end to be seen); a
    query of a table this database lacks is skipped, as the reading skips it."""
    conn.execute(READ_SETTINGS)
    seen = set()
    for name, query in stats.queries.items():
        params = {"prefix": stats.session_prefix} if name == "sessions" else None
        try:
            with conn.transaction():
                conn.execute(query, params).fetchall()
                seen |= set(conn.execute(
                    "SELECT coalesce(relation::regclass::text, locktype), mode FROM pg_locks "
                    "WHERE pid = pg_backend_pid() AND locktype IN ('relation', 'advisory', 'tuple', 'object') "
                    "AND coalesce(relation::regclass::text, '') NOT LIKE 'pg\\_%%'").fetchall())
        except psycopg.errors.UndefinedTable:
            continue
    conn.execute("RESET ALL")
    return seen


def claims(conn: psycopg.Connection, times: int = 200) -> float:
    """The claim transaction's median in ms (bench.run's "claim"), 16 rows of the due backlog each."""
    def q(name: str) -> str:
        return render_query(name, "public", "task")

    oid = conn.execute("SELECT 'task'::regclass::oid").fetchone()[0]
    took = []
    for _ in range(times):
        t = time.perf_counter()
        with conn.transaction():
            conn.execute(q("claim_lock"))
            conn.execute(q("claim"), {"token": "00000000-0000-0000", "oid": oid, "limit": 16, "offer_pid": [],
                                      "offer_id": []}).fetchall()
            conn.execute(q("next")).fetchone()
        took.append((time.perf_counter() - t) * 1000)
        conn.execute("UPDATE task SET state = 'DONE' WHERE state = 'TAKE'")
    return statistics.median(took)


def figure(values: list[float]) -> str:
    return f"median {statistics.median(values):.1f}, max {max(values):.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--readings", type=int, default=20)
    parser.add_argument("--plans", action="store_true", help="print each query's EXPLAIN ANALYZE")
    args = parser.parse_args()
    bench = Bench(1.0, 1)
    bench.start()
    try:
        db = bench.database()
        stats = table_stats(bench, db)
        with bench.connect(db) as conn:
            t = time.monotonic()
            fill(conn, args.finished, args.queued, args.groups)
            print(f"{args.finished:,} finished rows, {args.queued:,} queued, {args.groups} groups "
                  f"(filled in {time.monotonic() - t:.0f} s)", flush=True)
            for state in ("loaded", "vacuumed"):
                if state == "vacuumed":
                    conn.execute("VACUUM ANALYZE task")
                cpu, wall = readings(stats, args.readings)
                print(f"a reading, {state}: server CPU {figure(cpu)}; wall {figure(wall)}", flush=True)
                counted, took = exact(conn, stats)
                estimate = asyncio.run(estimated(stats))
                print(f"  finished rows: estimated {fmt(estimate)}; counted {fmt(counted)} "
                      f"(the count: {took:.0f} ms of server CPU)", flush=True)
                if args.plans:
                    explain(conn, stats)
            print("locks a reading takes: " + ", ".join(f"{rel} {mode}" for rel, mode in sorted(locks(conn, stats))))
            alone = claims(conn)
            stop = threading.Event()
            waits: list[bool] = []

            def read_on() -> None:
                while not stop.is_set():
                    readings(stats, 1)

            def watch(pid: int) -> None:
                """Whether the claiming backend waits on a lock, sampled every millisecond."""
                with bench.connect(db) as watcher:
                    while not stop.is_set():
                        waits.append(watcher.execute(
                            "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock')",
                            (pid,)).fetchone()[0])
                        time.sleep(0.001)
            helpers = [threading.Thread(target=read_on), threading.Thread(target=watch, args=(conn.info.backend_pid,))]
            for helper in helpers:
                helper.start()
            try:
                beside = claims(conn)
            finally:
                stop.set()
                for helper in helpers:
                    helper.join()
            print(f"claim transaction (median of 200): alone {alone:.2f} ms; with readings back to back "
                  f"beside it {beside:.2f} ms (CPU shared with them), waiting on a lock in {sum(waits)} of "
                  f"{len(waits)} samples")
        print(bench.machine())
    finally:
        bench.close()


if __name__ == "__main__":
    main()
