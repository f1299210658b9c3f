"""Two or more versions of the service, measured in interleaved rounds on one cluster.

    git worktree add /tmp/before <commit>
    .venv/bin/python -m bench.ab --rounds 4 before=/tmp/before after=.
    .venv/bin/python -m bench.ab --rounds 4 --warm 320 before=/tmp/before after=.
    .venv/bin/python -m bench.ab --rounds 6 --remote before=/tmp/before after=.
    .venv/bin/python -m bench.ab --rounds 8 --metrics on off=. on=.

Each round runs every version once (the order reversed every other round), each run a fresh
database and a fresh `pgtask run` whose code is the version's checkout (its directory goes first
on the service's PYTHONPATH; the benchmark's own code is this checkout's). A run is the same as
bench.run's "16 groups" figure: --tasks `SELECT 1` (or --body) over --groups groups inserted in one
statement, after --warm tasks the service ran first. Printed per run and as medians: tasks/s and
the CPU per task of the server, of its control backends (the claim passes) and of the service.
With --remote, a run is bench.run's remote figure instead: 1,000 `SELECT pg_sleep(1)` (unless
--tasks/--body say otherwise), each in its own group and with `remote` pointing at the cluster;
its wall time is printed first. --metrics NAME (repeatable) runs that version's service with its
metrics endpoint on (``metrics_listen`` on a loopback port), scraped every second: the same
checkout twice, once with it, measures what metrics cost.

This machine's speed drifts by 10-40 % within minutes: compare versions within rounds, and run
enough rounds that the medians' difference is larger than the rounds' spread. A control: the same
checkout twice (x=. y=.) gave medians 2,060 against 1,879 tasks/s, x ahead in all of 4 rounds -- a 10 % difference in 4 rounds is not a finding.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
from pathlib import Path

from bench.run import REMOTE_BODY, TRIVIAL, Bench


def version(path: Path) -> str:
    """The checkout's commit (and "+" when it has uncommitted changes), or "?"."""
    try:
        head = subprocess.run(["git", "-C", str(path), "describe", "--always", "--dirty=+"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head


def figure(per_task) -> str:
    """Run.per_task()'s four figures and the wall time, as printed."""
    rate, service, server, control, wall = per_task
    return (f"{wall:.2f} s, {rate:,.0f} tasks/s; server {server:.0f}, control {control:.0f}, "
            f"service {service:.0f} us/task")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("versions", nargs="+", metavar="NAME=CHECKOUT")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tasks", type=int)
    parser.add_argument("--groups", type=int)
    parser.add_argument("--max", type=int, default=0, help="each task's max (0: one at a time per group)")
    parser.add_argument("--warm", type=int, default=0, help="tasks the service runs before the measured burst")
    parser.add_argument("--body")
    parser.add_argument("--remote", action="store_true",
                        help="remote tasks (bench.run's remote figure): 1,000 pg_sleep(1), a group each")
    parser.add_argument("--metrics", action="append", default=[], metavar="NAME",
                        help="run this version with its metrics endpoint on, scraped every second")
    args = parser.parse_args()
    tasks = args.tasks or (1000 if args.remote else 6000)
    groups = args.groups or (tasks if args.remote else 16)
    body = args.body or (REMOTE_BODY if args.remote else TRIVIAL)
    versions = []
    for spec in args.versions:
        name, sep, checkout = spec.partition("=")
        path = Path(checkout).resolve()
        if not sep or not (path / "pgtask" / "__init__.py").is_file():
            parser.error(f"{spec!r}: expected NAME=CHECKOUT, a directory holding pgtask/")
        versions.append((name, path))
    unknown = set(args.metrics) - {name for name, _ in versions}
    if unknown:
        parser.error(f"--metrics {', '.join(sorted(unknown))}: no such version")
    for name, path in versions:
        print(f"{name}: {path} ({version(path)})" + (", metrics on" if name in args.metrics else ""))

    bench = Bench(1.0, 1)
    bench.start()
    remote = bench.remote_conninfo() if args.remote else None
    runs: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name, _ in versions}
    try:
        for r in range(args.rounds):
            for name, path in versions if r % 2 == 0 else versions[::-1]:
                saved = os.environ.get("PYTHONPATH")
                os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), saved]))
                try:
                    run = bench.run_tasks(tasks, groups, args.max, body, remote=remote, warm=args.warm,
                                          metrics=name in args.metrics)
                finally:
                    if saved is None:
                        del os.environ["PYTHONPATH"]
                    else:
                        os.environ["PYTHONPATH"] = saved
                runs[name].append((*run.per_task(), run.wall))
                print(f"round {r + 1} {name}: {figure(runs[name][-1])}", flush=True)
    finally:
        bench.close()
    print("medians:")
    for name, figures in runs.items():
        print(f"  {name}: {figure([statistics.median(f[i] for f in figures) for i in range(5)])} "
              f"({len(figures)} runs)")


if __name__ == "__main__":
    main()
