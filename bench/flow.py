"""Flow control, measured (docs/flow.md): what waiting tasks cost the claim, how soon dependents
are released, a rate limit shared by two service instances, and a resume.

    .venv/bin/python -m bench.flow [--waiting 100000] [--rate 20] [--seconds 10]

1. The claim statement (16 groups with due tasks, 16 claimed, rolled back) on two databases alike
   but for --waiting tasks in WAIT in the second; rounds alternate between them (this machine's
   speed drifts within minutes). Median of each, and the ratio.
2. Fan-in 1,000 -> 1 and fan-out 1 -> 1,000 under a running service: from the last dependency's
   stop (the transaction that releases the dependents) to the first dependent's start.
3. A group limited to --rate/s (burst 1) with 1,000 due tasks and two services: starts in each
   second of --seconds.
4. A paused group with due tasks and a service: starts during --seconds, then the time from the
   resuming UPDATE to the first start (5 times).
5. What the release trigger costs a finish nobody waits for: 16 claimed rows set DONE in one
   statement (rolled back), with the trigger and with it disabled, in alternating rounds (its
   WHEN clause reads the row's "waited" mark: no call).
6. What flow control costs a claim while no group is paused or rate-limited: the claim statement
   under flow control ("claim") against the one a pass uses then ("claim_plain"), on an empty
   queue (an idle pass) and on 16 groups x 2,000 due (16 claimed, rolled back), alternating rounds.
7. What a group's retry policy costs the finishes of groups without one: as 5, for the retry policy's
   trigger, 16 rows set DONE (its WHEN clause: no call) and 16 set FAIL (a call, and a read of the
   group table that finds no policy).

Prints numbers; asserts nothing. PostgreSQL 15 (Debian's), bench.run's cluster settings.
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg

from bench.run import Bench
from pgtask.queries import CLAIM_PARAMS, PLANNER_SETTINGS, numbered, render_query


def due_groups(conn: psycopg.Connection, groups: int = 16, per_group: int = 2000) -> None:
    conn.execute("""INSERT INTO task (input, "group", plan, delete)
                    SELECT 'SELECT 1', 'g' || (i %% %s), now() - interval '1 min', false
                    FROM generate_series(1, %s) i""", (groups, groups * per_group))


def claim_ms(conn: psycopg.Connection, reps: int, name: str = "flow_claim") -> list[float]:
    """The time of the claim statement prepared as ``name``, ``reps`` times, each claim rolled back."""
    times = []
    for _ in range(reps):
        conn.execute("BEGIN")
        t0 = time.perf_counter()
        conn.execute(f"EXECUTE {name}('00000000-0000-4000', 'task'::regclass, 16, '{{}}', '{{}}')")
        times.append((time.perf_counter() - t0) * 1000)
        conn.execute("ROLLBACK")
    return times


def claim_cost(bench: Bench, waiting: int, rounds: int = 6, reps: int = 100) -> None:
    conns = []
    for with_waiting in (False, True):
        conn = bench.connect(bench.database())
        due_groups(conn)
        if with_waiting:
            held = conn.execute("INSERT INTO task (input, plan) VALUES ('SELECT 1', 'infinity') RETURNING id").fetchone()[0]
            conn.execute("""INSERT INTO task (input, "group", after) SELECT 'SELECT 1', 'g' || (i %% 16), ARRAY[%s::bigint]
                            FROM generate_series(1, %s) i""", (held, waiting))
        conn.execute("VACUUM ANALYZE task")
        conn.execute(PLANNER_SETTINGS)
        conn.execute("PREPARE flow_claim AS " + numbered(render_query("claim", "public", "task"), CLAIM_PARAMS))
        claim_ms(conn, 20)  # warm
        conns.append(conn)
    states = conns[1].execute("SELECT state::text, count(*) FROM task GROUP BY 1 ORDER BY 1").fetchall()
    print(f"1. claim statement, 16 groups x 2,000 due; with waiting: {dict(states)}")
    plain, slow = [], []
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for i in order:
            (plain if i == 0 else slow).extend(claim_ms(conns[i], reps))
    a, b = statistics.median(plain), statistics.median(slow)
    print(f"   median {a:.3f} ms without, {b:.3f} ms with {waiting:,} waiting: {b / a:.2f} x "
          f"(p90 {statistics.quantiles(plain, n=10)[-1]:.3f} / {statistics.quantiles(slow, n=10)[-1]:.3f} ms)")
    for c in conns:
        c.close()


def fan(bench: Bench, n: int = 1000) -> None:
    dbname = bench.database()
    conn = bench.connect(dbname)
    proc = bench.service(dbname)
    try:
        for shape in ("fan-in", "fan-out"):
            conn.execute("TRUNCATE task")
            with conn.transaction():
                if shape == "fan-in":
                    deps = [r[0] for r in conn.execute(
                        """INSERT INTO task (input, delete) SELECT 'SELECT 1', false FROM generate_series(1, %s)
                           RETURNING id""", (n,)).fetchall()]
                    waiters = [conn.execute("INSERT INTO task (input, after, delete) VALUES ('SELECT 1', %s, false) "
                                            "RETURNING id", (deps,)).fetchone()[0]]
                else:
                    deps = [conn.execute("INSERT INTO task (input, delete) VALUES ('SELECT pg_sleep(0.2)', false) "
                                         "RETURNING id").fetchone()[0]]
                    waiters = [r[0] for r in conn.execute(
                        """INSERT INTO task (input, "group", after, delete)
                           SELECT 'SELECT 1', 'g' || (i %% 16), %s, false FROM generate_series(1, %s) i
                           RETURNING id""", (deps, n)).fetchall()]
            bench.wait_done(conn, n + 1, 120)
            last_stop, first, last = conn.execute(
                """SELECT (SELECT max(stop) FROM task WHERE id = ANY(%s)),
                          (SELECT min(start) FROM task WHERE id = ANY(%s)),
                          (SELECT max(start) FROM task WHERE id = ANY(%s))""", (deps, waiters, waiters)).fetchone()
            gap = (first - last_stop).total_seconds() * 1000
            spread = (last - first).total_seconds() * 1000
            print(f"2. {shape} {len(deps):,} -> {len(waiters):,}: first dependent started {gap:.1f} ms after the last "
                  f"dependency's stop" + (f", the last {spread:.0f} ms after the first (16 groups, one at a time)"
                                          if len(waiters) > 1 else ""))
    finally:
        bench.stop(proc)
        conn.close()


def rate(bench: Bench, per_second: float, seconds: float) -> None:
    dbname = bench.database()
    conn = bench.connect(dbname)
    procs = [bench.service(dbname), bench.service(dbname)]
    try:
        conn.execute("""INSERT INTO task_group ("group", rate, burst, tokens) VALUES ('api', %s, 1, 0)""", (per_second,))
        conn.execute("""INSERT INTO task (input, "group", delete) SELECT 'SELECT 1', 'api', false
                        FROM generate_series(1, 1000)""")
        time.sleep(seconds + 1.5)
        rows = conn.execute("""WITH s AS (SELECT start - min(start) OVER () AS at FROM task WHERE start IS NOT NULL)
                               SELECT floor(extract(epoch FROM at))::int AS sec, count(*) FROM s
                               GROUP BY 1 ORDER BY 1""").fetchall()
        per_sec = [c for s, c in rows if s < seconds]
        print(f"3. rate {per_second:g}/s, burst 1, two services, 1,000 due: starts per second over {seconds:g} s: "
              f"{per_sec} (mean {statistics.mean(per_sec):.1f}, min {min(per_sec)}, max {max(per_sec)})")
    finally:
        for p in procs:
            bench.stop(p)
        conn.close()


def pause(bench: Bench, seconds: float, times: int = 5) -> None:
    dbname = bench.database()
    conn = bench.connect(dbname)
    proc = bench.service(dbname)
    try:
        conn.execute("""INSERT INTO task_group ("group", paused) VALUES ('held', true)""")
        conn.execute("""INSERT INTO task (input, "group", delete) SELECT 'SELECT 1', 'held', false
                        FROM generate_series(1, 100)""")
        time.sleep(seconds)
        started = conn.execute("SELECT count(*) FROM task WHERE start IS NOT NULL").fetchone()[0]
        delays = []
        for _ in range(times):
            conn.execute("UPDATE task_group SET paused = true")
            conn.execute("TRUNCATE task")
            conn.execute("""INSERT INTO task (input, "group", delete) VALUES ('SELECT 1', 'held', false)""")
            time.sleep(1.0)  # a claim pass or two see it paused
            resumed = conn.execute("UPDATE task_group SET paused = false RETURNING statement_timestamp()").fetchone()[0]
            bench.wait_done(conn, 1, 30)
            start = conn.execute("SELECT start FROM task").fetchone()[0]
            delays.append((start - resumed).total_seconds() * 1000)
        print(f"4. paused group, 100 due: {started} started in {seconds:g} s; resume -> first start: "
              f"{', '.join(f'{d:.1f}' for d in delays)} ms (median {statistics.median(delays):.1f} ms)")
    finally:
        bench.stop(proc)
        conn.close()


def finish_cost(bench: Bench, trigger: str = "task_release", state: str = "DONE", label: str = "5.",
                rounds: int = 6, reps: int = 200) -> None:
    conn = bench.connect(bench.database())
    due_groups(conn)
    ids = [r[0] for r in conn.execute("""UPDATE task SET state = 'TAKE', attempt = 1, lease = gen_random_uuid()
                                         WHERE id IN (SELECT id FROM task ORDER BY id LIMIT 16) RETURNING id""")]
    conn.execute("VACUUM ANALYZE task")
    error = "'ERROR:  division by zero'" if state == "FAIL" else "NULL"
    finish = f"""UPDATE task SET state = '{state}', stop = statement_timestamp(), error = {error}
                 WHERE id = ANY('{{{','.join(map(str, ids))}}}'::bigint[])"""
    timed: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for enabled in ((True, False) if r % 2 == 0 else (False, True)):
            conn.execute(f"ALTER TABLE task {'ENABLE' if enabled else 'DISABLE'} TRIGGER {trigger}")
            for _ in range(reps):
                conn.execute("BEGIN")
                t0 = time.perf_counter()
                conn.execute(finish)
                timed[enabled].append((time.perf_counter() - t0) * 1000)
                conn.execute("ROLLBACK")
    on, off = statistics.median(timed[True]), statistics.median(timed[False])
    print(f"{label} 16 finishes ({state}) in one statement: {off:.3f} ms without {trigger}, {on:.3f} ms with it "
          f"(+{(on - off) / 16 * 1000:.0f} us a finish)")
    conn.close()


def plain_cost(bench: Bench, rounds: int = 10, reps: int = 200) -> None:
    for due in (False, True):
        conn = bench.connect(bench.database())
        if due:
            due_groups(conn)
        conn.execute("VACUUM ANALYZE task")
        conn.execute(PLANNER_SETTINGS)
        for name in ("claim", "claim_plain"):
            conn.execute(f"PREPARE {name} AS " + numbered(render_query(name, "public", "task"), CLAIM_PARAMS))
            claim_ms(conn, 20, name)  # warm
        timed: dict[str, list[float]] = {"claim": [], "claim_plain": []}
        ratios = []
        for r in range(rounds):
            if due:  # the rolled-back claims' dead rows, gone before each round
                conn.execute("VACUUM task")
            for name in (("claim", "claim_plain") if r % 2 == 0 else ("claim_plain", "claim")):
                timed[name].append(statistics.median(claim_ms(conn, reps, name)))
            ratios.append(timed["claim_plain"][-1] / timed["claim"][-1])
        print(f"6. claim statement, {'16 groups x 2,000 due' if due else 'empty queue'}: "
              f"{statistics.median(timed['claim']):.3f} ms under flow control, "
              f"{statistics.median(timed['claim_plain']):.3f} ms plain (rounds' medians; plain/flow paired "
              f"{statistics.median(ratios):.2f}, spread {min(ratios):.2f}-{max(ratios):.2f})")
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--waiting", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--only", default="1234567", help="which measurements (digits)")
    args = ap.parse_args()
    bench = Bench(1.0, 1)
    bench.start()
    try:
        if "1" in args.only:
            claim_cost(bench, args.waiting)
        if "2" in args.only:
            fan(bench)
        if "3" in args.only:
            rate(bench, args.rate, args.seconds)
        if "4" in args.only:
            pause(bench, args.seconds)
        if "5" in args.only:
            finish_cost(bench)
        if "6" in args.only:
            plain_cost(bench)
        if "7" in args.only:
            for state in ("DONE", "FAIL"):
                finish_cost(bench, "task_retry_policy", state, "7.")
    finally:
        bench.close()


if __name__ == "__main__":
    main()
