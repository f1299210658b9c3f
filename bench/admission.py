"""Admission control overhead: inserts per second into an unlimited group, with and without the
capacity trigger and its index, alone and while a capacity-limited group is hammered next door.

    .venv/bin/python bench/admission.py [--pg 15|18] [--seconds 3] [--clients 4]

The two "while 2 clients fill ..." lines are the pair to compare: on a 2-core machine the extra
clients take CPU either way; a lock shared with the limited group would show as a gap between them.
Prints numbers; asserts nothing (this is a measurement, not a test). A throwaway cluster with
fsync and synchronous_commit off, so the numbers show CPU and lock cost, not the disk.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from pgtask import provision
from pgtask.cluster import Cluster, debian_bindir, find_bindir, free_port


def hammer(dsn: str, group: str, seconds: float, clients: int) -> tuple[float, int]:
    """``clients`` threads inserting one row per autocommit transaction into ``group``:
    (inserts per second, PT001 refusals)."""
    counts, refused = [0] * clients, [0] * clients
    start = threading.Barrier(clients + 1)

    def worker(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            start.wait()
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                try:
                    conn.execute("""INSERT INTO task (input, "group", plan) VALUES ('SELECT 1', %s, 'infinity')""",
                                 (group,))
                    counts[i] += 1
                except psycopg.Error as exc:
                    if exc.sqlstate != "PT001":
                        raise
                    refused[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    for t in threads:
        t.join()
    return sum(counts) / seconds, sum(refused)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", default="auto")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--clients", type=int, default=4)
    args = ap.parse_args()
    version = args.pg
    if version == "auto":
        version = "15" if debian_bindir(15) else "embedded"
    c = Cluster(base=Path(tempfile.mkdtemp(prefix="pgtask-bench-")),
                bindir=find_bindir("embedded" if version == "18" else version), port=free_port())
    c.init({"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", "max_connections": "100"})
    c.start()
    try:
        dsn = c.conninfo()

        async def prov():
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                await provision.provision_table(conn, "public", "task", provision.Report())
                await conn.commit()
        asyncio.run(prov())
        db = psycopg.connect(dsn, autocommit=True)
        db.execute("ALTER TABLE task DISABLE TRIGGER task_wake_up")  # NOTIFY per insert: not what we measure
        runs = []

        def measure(label: str, setup: str = "", limited_load: bool = False, noise_group: str = "limited") -> None:
            db.execute("TRUNCATE task; DELETE FROM task_group")
            if setup:
                db.execute(setup)
            noise: list = []
            t = None
            if limited_load:
                db.execute("INSERT INTO task_group VALUES ('limited', 1000000000)")
                t = threading.Thread(target=lambda: noise.append(hammer(dsn, "limited", args.seconds, 2)))
                t.start()
            rate, _ = hammer(dsn, "free", args.seconds, args.clients)
            if t:
                t.join()
            extra = f"   ({noise_group} group next door: {noise[0][0]:,.0f}/s)" if noise else ""
            runs.append((label, rate))
            print(f"{label:<58} {rate:>9,.0f} inserts/s{extra}", flush=True)

        print(f"PostgreSQL {version}, {args.clients} clients, {args.seconds:.0f} s each, "
              f"one autocommit INSERT per transaction\n")
        measure("unlimited group, capacity trigger + index disabled",
                "ALTER TABLE task DISABLE TRIGGER task_capacity; "
                "ALTER INDEX task_live_group_idx RENAME TO x; DROP INDEX x")
        db.execute("""CREATE INDEX task_live_group_idx ON task ("group") WHERE state IN ('PLAN', 'TAKE', 'WORK')""")
        measure("unlimited group, trigger disabled, index present",
                "ALTER TABLE task DISABLE TRIGGER task_capacity")
        measure("unlimited group, trigger enabled (as provisioned)", "ALTER TABLE task ENABLE TRIGGER task_capacity")
        measure("unlimited group, while 2 clients fill another unlimited", "", limited_load=True,
                noise_group="other")
        measure("unlimited group, while 2 clients fill a limited group", "", limited_load=True)
        db.execute("TRUNCATE task; DELETE FROM task_group; INSERT INTO task_group VALUES ('free', 1000000000)")
        rate, _ = hammer(dsn, "free", args.seconds, args.clients)
        print(f"{'the same group with a capacity (serialized on its row)':<58} {rate:>9,.0f} inserts/s")
        base = runs[0][1]
        print("\nrelative to no trigger, no index: " + ", ".join(f"{r / base:.0%}" for _, r in runs[1:]))
        db.close()
    finally:
        c.destroy()


if __name__ == "__main__":
    main()
