"""How the cost grows (issue 50): with --finished finished rows kept in the table against an empty
table, and with --groups groups holding due tasks against 16.

    .venv/bin/python -m bench.scale                   # 10 M finished rows, 10,000 groups, 5 rounds
    .venv/bin/python -m bench.scale --quick           # 1 M rows, 1,000 groups, 2 rounds: a first look
    .venv/bin/python -m bench.scale --finished 3000000 --groups 2000 --rounds 3 --explain

On bench.run's PostgreSQL 15 cluster. One database ("history") holds --finished finished rows
(bench.metrics_cost's fill_finished: DONE, every 50th FAIL, over the day before) in the bursts' 16
groups, then VACUUM ANALYZE: the state autovacuum leaves. It is kept for every round and vacuumed
again (VACUUM ANALYZE, not timed) after each thing that leaves dead rows in it. Its "empty" side is
a fresh database for a burst (bench.run's scratch database) and an empty one kept beside it for the
rest. Every round measures each pair side by side, the order of the sides alternating from round
to round: this machine drifts 10-40 % within minutes, so a ratio is taken within each round, and
the table shows each side's median, the median of the rounds' ratios and their spread.
- burst: --tasks `SELECT 1` in 16 groups (max 0) inserted at once, a started `pgtask run`
  (bench.run's run_burst): tasks/s, and the CPU a task of the service's control backend (its claim
  passes, analyzing the table as the burst starts included);
- claim: the claim transaction (bench.metrics_cost's claims: claim_lock, a claim of 16, next;
  median of --claims) over a due backlog of --tasks tasks in 16 groups;
- groups: on empty tables, 2 x --groups tasks in --groups groups against as many in 16 groups: a
  burst timed over its first --group-tasks finishes (at most --groups: every group still holds a
  due task when the last of them ends), and the claim transaction over that backlog (median of
  --claims / 10); the service runs 16 tasks at once either way (pg_task.run = 16): only the number
  of groups differs, not the sessions;
- metrics: a reading of the service's table figures (bench.metrics_cost's readings of
  TableStats.refresh_once: its backend's CPU and wall time, median of 5);
- status: `pgtask status`'s report() (what the command prints) on a connection as the command
  opens it: wall time and its backend's CPU (parallel workers, if any, not included), once a
  round after once not timed.
A growth is how much more a side costs: the empty (or 16-group) side's tasks/s over the other's,
or the other's time over the empty side's; the issue's goal is 1.5 at most.

Prints numbers; asserts nothing (a measurement, not a test).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import psycopg

from bench.metrics_cost import claims, explain, fill_finished, readings, table_stats
from bench.run import TRIVIAL, Bench, running_seconds
from pgtask import status
from pgtask.queries import render_query

RUN16 = "[pg_task]\nrun = 16\n"  # the service's config for the groups pair: 16 tasks at once either way
GOAL = 1.5


class Figure(NamedTuple):
    """One measured quantity and how it is compared."""

    key: str
    what: str
    rate: bool  # higher is better (tasks/s): the growth is base / other, else other / base
    goal: bool  # one of the figures (the rest explain them)


FIGURES = (
    Figure("burst_rate", "16-group burst, tasks/s: empty table / history", True, True),
    Figure("burst_control", "  its claim passes' CPU (control backend), us a task", False, False),
    Figure("claim", "claim transaction (16 groups' backlog), ms: empty / history", False, True),
    Figure("groups_rate", "burst, tasks/s: 16 groups / GROUPS groups (16 at once)", True, True),
    Figure("groups_control", "  its claim passes' CPU (control backend), us a task", False, False),
    Figure("groups_claim", "claim transaction, ms: 16 groups / GROUPS groups", False, True),
    Figure("metrics_cpu", "a metrics reading, server CPU ms: empty / history", False, True),
    Figure("metrics_wall", "  the same, wall ms", False, False),
    Figure("status_wall", "pgtask status, wall ms: empty / history", False, True),
    Figure("status_cpu", "  the same, its backend's CPU ms", False, False),
)


def vacuum(bench: Bench, db: str) -> None:
    """VACUUM ANALYZE the task table: the state autovacuum leaves (not timed)."""
    with psycopg.connect(bench.cluster.conninfo(db), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE task")


def burst(bench: Bench, db: str | None, n: int, groups: int, config: str = "",
          backlog: int = 0) -> tuple[float, float]:
    """(tasks/s, control backend's CPU a task in us) of a burst of n `SELECT 1` in ``groups`` groups
    (and ``backlog`` more, not timed: see run_burst), in ``db`` (vacuumed after it), or in a fresh
    database when None."""
    if db is None:
        with bench.scratch_database() as scratch:
            run = bench.run_burst(scratch, n, groups, 0, TRIVIAL, config=config, backlog=backlog)
    else:
        run = bench.run_burst(db, n, groups, 0, TRIVIAL, config=config, backlog=backlog)
        vacuum(bench, db)
    rate, _, _, control = run.per_task()
    return rate, control


def claim_time(bench: Bench, db: str, n: int, groups: int, times: int) -> float:
    """The claim transaction's median in ms over a due backlog of n tasks in ``groups`` groups
    (analyzed as the service does before a burst); the backlog is deleted after it."""
    with bench.connect(db) as conn:
        first = conn.execute("SELECT coalesce(max(id), 0) FROM task").fetchone()[0]
        conn.execute("""INSERT INTO task ("group", input) SELECT 'g' || (i %% %s), 'SELECT 1'
                        FROM generate_series(1, %s) i""", (groups, n))
        conn.execute("ANALYZE task")
        took = claims(conn, times)
        conn.execute("DELETE FROM task WHERE id > %s", (first,))
    vacuum(bench, db)
    return took


def reading(bench: Bench, db: str) -> tuple[float, float]:
    """A metrics reading of ``db``'s table: medians of 5 (server CPU ms, wall ms)."""
    cpu, wall = readings(table_stats(bench, db), 5)
    return statistics.median(cpu), statistics.median(wall)


def status_time(bench: Bench, db: str, times: int = 1) -> tuple[float, float]:
    """`pgtask status`'s report() on ``db``: medians of ``times`` (wall ms, its backend's CPU ms),
    after one not timed (the plans, the catalog's caches)."""
    with psycopg.connect(bench.cluster.conninfo(db), autocommit=True) as conn:
        pid = conn.info.backend_pid
        status.report(conn, "public", "task")
        wall, cpu = [], []
        for _ in range(times):
            c, t = running_seconds(pid), time.perf_counter()
            status.report(conn, "public", "task")
            wall.append((time.perf_counter() - t) * 1000)
            cpu.append((running_seconds(pid) - c) * 1000)
    return statistics.median(wall), statistics.median(cpu)


class Scale:
    """The databases, the sizes and the rounds' figures: {key: [(base, other) a round]}."""

    def __init__(self, bench: Bench, args: argparse.Namespace):
        self.bench, self.args = bench, args
        # the groups pair: a backlog of two tasks a group (as many in 16 groups), of which a burst
        # times the first `timed` to finish: every group still holds a due task when the last does
        self.big_n, self.timed = 2 * args.groups, min(args.group_tasks, args.groups)
        self.empty = bench.database()
        self.history = bench.database()
        self.rounds: dict[str, list[tuple[float, float]]] = {f.key: [] for f in FIGURES}

    def fill(self) -> None:
        t = time.monotonic()
        with self.bench.connect(self.history) as conn:
            fill_finished(conn, self.args.finished, 16)
        vacuum(self.bench, self.history)
        print(f"history: {self.args.finished:,} finished rows in 16 groups, vacuumed and analyzed "
              f"({time.monotonic() - t:.0f} s)", flush=True)

    def pair(self, keys: tuple[str, ...], base: Callable, other: Callable, flip: bool) -> None:
        """Both sides, in the round's order; each returns its figures in ``keys``' order."""
        if flip:
            b_other, b_base = other(), base()
        else:
            b_base, b_other = base(), other()
        for key, x, y in zip(keys, b_base, b_other):
            self.rounds[key].append((x, y))

    def round(self, number: int) -> None:
        b, a, flip = self.bench, self.args, number % 2 == 1
        self.pair(("burst_rate", "burst_control"), lambda: burst(b, None, a.tasks, 16),
                  lambda: burst(b, self.history, a.tasks, 16), flip)
        self.pair(("claim",), lambda: (claim_time(b, self.empty, a.tasks, 16, a.claims),),
                  lambda: (claim_time(b, self.history, a.tasks, 16, a.claims),), flip)
        rest = self.big_n - self.timed
        self.pair(("groups_rate", "groups_control"), lambda: burst(b, None, self.timed, 16, RUN16, rest),
                  lambda: burst(b, None, self.timed, a.groups, RUN16, rest), flip)
        times = max(10, a.claims // 10)  # a claim over 10,000 groups takes a good part of a second
        self.pair(("groups_claim",), lambda: (claim_time(b, self.empty, self.big_n, 16, times),),
                  lambda: (claim_time(b, self.empty, self.big_n, a.groups, times),), flip)
        self.pair(("metrics_cpu", "metrics_wall"), lambda: reading(b, self.empty),
                  lambda: reading(b, self.history), flip)
        self.pair(("status_wall", "status_cpu"), lambda: status_time(b, self.empty),
                  lambda: status_time(b, self.history), flip)
        self.print_round(number)

    def print_round(self, number: int) -> None:
        last = ", ".join(f"{f.key} {self.rounds[f.key][-1][0]:,.1f}/{self.rounds[f.key][-1][1]:,.1f}"
                         for f in FIGURES)
        print(f"round {number + 1}: {last}", flush=True)

    def table(self) -> list[str]:
        """One line a figure: both sides' medians, the median growth of the rounds, its spread."""
        lines = [f"{'measurement':<58}{'base':>12}{'scaled':>12}{'growth':>11}  rounds' growths"]
        for f in FIGURES:
            pairs = self.rounds[f.key]
            growth = [x / y if f.rate else y / x for x, y in pairs]
            mid = statistics.median(growth)
            verdict = (" ok" if mid <= GOAL else f" over {GOAL}") if f.goal else ""
            lines.append(f"{f.what.replace('GROUPS', f'{self.args.groups:,}'):<58}"
                         f"{statistics.median(x for x, _ in pairs):>12,.2f}{statistics.median(y for _, y in pairs):>12,.2f}"
                         f"{mid:>10,.2f}x  {min(growth):,.2f}-{max(growth):,.2f}{verdict}")
        return lines


def explain_plans(scale: Scale) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of status's queries and the metrics reading's on the history
    table, and of the claim over the groups pair's backlog in --groups groups (rolled back); and
    how long an ANALYZE of the history table takes (the service's, as a burst starts)."""
    bench = scale.bench
    with bench.connect(scale.history) as conn:
        t = time.perf_counter()
        conn.execute("ANALYZE task")
        print(f"-- ANALYZE of the history table: {(time.perf_counter() - t) * 1000:,.0f} ms")
        conn.execute("RESET ALL")  # as `pgtask status` connects: the server's planner settings
        conn.execute(status.statement("settings", "public", "task"))
        oid = status.table_oid(conn, "public", "task")
        bounded = sum(status.finished_estimate(conn, "public", "task").values()) > status.EXACT_FINISHED
        window = status.window_rows(conn, "public", "task", "1 hour")
        for name, params in (("liveness", {"oid": oid, "bounded": bounded, "recent": status.RECENT_STARTED}),
                             ("window_rows", {"since": "1 hour", "recent": status.WINDOW_ROWS}),
                             ("groups", {"since": window.capped or "1 hour", "bounded": bounded, "after": window.after}),
                             ("longest", None)):
            plan = conn.execute(psycopg.sql.SQL("EXPLAIN (ANALYZE, BUFFERS) ") +
                                status.statement(name, "public", "task"), params).fetchall()
            print(f"-- status {name}:\n" + "\n".join("   " + row[0] for row in plan))
        explain(conn, table_stats(bench, scale.history))
    with bench.connect(scale.empty) as conn:
        conn.execute("""INSERT INTO task ("group", input) SELECT 'g' || (i %% %s), 'SELECT 1'
                        FROM generate_series(1, %s) i""", (scale.args.groups, scale.big_n))
        conn.execute("ANALYZE task")
        with conn.transaction(force_rollback=True):
            conn.execute(render_query("claim_lock", "public", "task"))
            plan = conn.execute(psycopg.sql.SQL("EXPLAIN (ANALYZE, BUFFERS) ") + psycopg.sql.SQL(
                render_query("claim", "public", "task")), {
                "token": "00000000-0000-0000", "oid": status.table_oid(conn, "public", "task"), "limit": 16,
                "offer_pid": [], "offer_id": []}).fetchall()
        print(f"-- claim, {scale.args.groups:,} groups:\n" + "\n".join("   " + row[0] for row in plan))
        conn.execute("DELETE FROM task")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--finished", type=int, default=10_000_000, help="finished rows of the history table")
    parser.add_argument("--groups", type=int, default=10_000, help="groups holding due tasks (against 16)")
    parser.add_argument("--tasks", type=int, default=6000, help="tasks of a 16-group burst, and the claim's backlog")
    parser.add_argument("--group-tasks", type=int, default=2000,
                        help="tasks the groups pair's bursts time (of two tasks a group inserted)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--claims", type=int, default=200, help="claim transactions a claim figure's median")
    parser.add_argument("--quick", action="store_true", help="1 M rows, 1,000 groups, 2 rounds, 50 claims")
    parser.add_argument("--explain", action="store_true", help="then the plans of what grows (EXPLAIN ANALYZE)")
    args = parser.parse_args()
    if args.quick:
        args.finished, args.groups, args.rounds, args.claims = 1_000_000, 1000, 2, 50
    bench = Bench(1.0, 1)
    t = time.monotonic()
    bench.start()
    try:
        scale = Scale(bench, args)
        scale.fill()
        for number in range(args.rounds):
            scale.round(number)
        if args.explain:
            explain_plans(scale)
        print()
        print(bench.machine())
        print(f"{args.rounds} rounds; history: {args.finished:,} finished rows; groups pair: {scale.big_n:,} "
              f"tasks in {args.groups:,} groups against 16, the first {scale.timed:,} timed")
        print("\n".join(scale.table()))
        print(f"\n(total {time.monotonic() - t:.0f} s)")
    finally:
        bench.close()


if __name__ == "__main__":
    main()
