"""The queue inspection's figure as a person sees it (docs/queue_inspection.png), from a real run.

    .venv/bin/python -m bench.inspection_figure              # about a minute
    .venv/bin/python -m bench.inspection_figure --out /tmp/queue.png

On bench.run's PostgreSQL 15 cluster, a `pgtask run` drains about 1,800 tasks in 21 groups: quick
ones in 16 groups (the first the busiest), a serial group's backlog, failures whose messages differ only in their numbers,
tasks failing by division by zero, rows inserted with a plan two hours past (they expire at once:
GONE) and stopped rows. Then the service is SIGKILLed and two rows are left claimed by it (orphans),
and notebooks/queue_inspection.ipynb runs headless (papermill) with ``figure_path`` set: its figure
carries the verdict, NOT OK.
"""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

from bench.run import ROOT, Bench

SINCE, BUCKET = "20 seconds", "0.5 seconds"


def seed(conn) -> int:
    """The tasks, in one transaction (the service starts on them at once); how many."""
    with conn.transaction():
        conn.execute("""INSERT INTO task (input, "group")
            SELECT format('SELECT pg_sleep(%s)', round((random() * 0.004)::numeric, 4)),
                   format('g%s', lpad((1 + floor(16 * power(i / 1501.0, 3)))::text, 2, '0'))  -- g01 busiest
            FROM generate_series(1, 1500) i""")
        conn.execute("""INSERT INTO task (input, "group", "max")
            SELECT 'SELECT pg_sleep(0.05)', 'serial', 0 FROM generate_series(1, 60)""")
        conn.execute("""INSERT INTO task (input, "group")
            SELECT format('DO $$BEGIN RAISE EXCEPTION ''task %s failed at %%'', now(); END$$', i), 'imports'
            FROM generate_series(1, 40) i""")
        conn.execute("""INSERT INTO task (input, "group") SELECT 'SELECT 1/0', 'reports'
            FROM generate_series(1, 20)""")
        conn.execute("""INSERT INTO task (input, "group", plan, active)
            SELECT 'SELECT 1', 'expired', now() - interval '2 hours', interval '1 hour'
            FROM generate_series(1, 30)""")
        conn.execute("""INSERT INTO task (input, "group", state) SELECT 'SELECT 1', 'cancelled', 'STOP'
            FROM generate_series(1, 20)""")
        return conn.execute("SELECT count(*) FROM task").fetchone()[0]


def drained(conn) -> bool:
    return not conn.execute("""SELECT 1 FROM task WHERE state IN ('TAKE', 'WORK')
                               OR (state = 'PLAN' AND plan <= now()) LIMIT 1""").fetchone()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs/queue_inspection.png")
    args = parser.parse_args()
    import papermill

    bench = Bench(1.0, 1)
    bench.start()
    proc = None
    try:
        db = bench.database()
        proc = bench.service(db)
        with bench.connect(db) as conn:
            n = seed(conn)
            deadline = time.monotonic() + 120
            while not drained(conn):
                if time.monotonic() > deadline:
                    raise SystemExit("the service did not drain the queue in 120 s")
                time.sleep(0.2)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc = None
            conn.execute("""INSERT INTO task (input, "group", state)
                SELECT 'SELECT pg_sleep(60)', 'orphans', 'TAKE' FROM generate_series(1, 2)""")
        out = bench.base / "queue_inspection.ipynb"
        papermill.execute_notebook(str(ROOT / "notebooks/queue_inspection.ipynb"), str(out),
                                   parameters={"dsn": bench.cluster.conninfo(db), "since": SINCE, "bucket": BUCKET,
                                               "figure_path": str(args.out.absolute())},
                                   kernel_name="python3", cwd=str(ROOT / "notebooks"), progress_bar=False)
        print(f"{n + 2:,} rows; wrote {args.out}")
    finally:
        if proc is not None:
            bench.stop(proc)
        bench.close()


if __name__ == "__main__":
    main()
