"""The side-by-side benchmark (issue 8): one throwaway PostgreSQL 15 cluster, one table of results.

    .venv/bin/python -m bench.run                 # everything, about 7 minutes on 2 cores
    .venv/bin/python -m bench.run --only pgtask   # a subset: names below, comma-separated
    .venv/bin/python -m bench.run --scale 0.3     # fewer tasks per run (a quick look)

Sections (--only): paired, pgbench, pgtask, peers, pickup, claim, remote.

How each figure is taken (all on the same cluster: synchronous_commit = on, fsync = on). Every
throughput figure (pgbench, pgtask, peers) is the median of --repeat runs (default 3): this kind of
machine drifts by 10-40 % within minutes.
- pgbench -N / -S: 4 clients, 2 threads, 10 s each, scale 10.
- paired: the two ratio goals, measured in --repeat rounds of pgbench -N, pgtask 16 groups and
  pgqueuer (one process), back to back (under a minute a round); a ratio per round, the goal rows
  take their medians. The sections below measure each figure --repeat times in a row, minutes
  apart from the others: on this machine their ratio also measures its drift between them (they
  are printed beside the paired figures; a goal falls back to them when there are no paired rounds,
  or when another peer than pgqueuer in one process was the better one).
- pgtask throughput (and, with no goal, 1,000 `SELECT 1` in 1,000 groups, a task each: a burst in
  many groups): `pgtask run` (its default: one process; 16 groups once more with `[pgtask]
  processes` = the machine's CPUs, no goal) is started as a subprocess on a fresh database and is
  ready and idle;
  then all tasks are inserted in ONE statement and we wait until every row is DONE/FAIL. 16 groups
  once more after a warm-up of WARM tasks run first by the same service (no goal: a service that
  has run before should be as fast as a fresh one: stale generic plans made one 27 % slower).
  Throughput = tasks / (max(stop) - insert time), both the database's clock. Each run (and each
  peer's) has a database of its own, dropped after it: left behind, its dead rows were vacuumed by
  autovacuum during later runs, CPU counted in theirs. Next to it the CPU per
  task of the service process and of the server (the postmaster and every child it reaped over the
  run, minus the benchmark's waiting connection) -- and of the server's, the service's control
  backends over the burst (the claim passes: the one serial step) --, and for 16 groups the bound
  the server's share sets: the rate if the service used no CPU (CPUs / server CPU per task).
- peers (pgqueuer 1.6 with its asyncpg driver; procrastinate 3 with psycopg): the worker runs in
  this process, started and idle, on the event loop the peer's own command line uses (pgqueuer's
  `pgq run`: uvloop when installed; procrastinate's: asyncio's); all jobs are enqueued in one
  batch call; wall = the last
  success's write (pgqueuer_log.created, procrastinate_events.at) - the time before the enqueue,
  both the database's clock, as pgtask's.
  Concurrency 16; the job body runs the same SQL on a 16-connection pool. pgqueuer
  also in as many processes as pgtask uses (spawned, each with its 16-connection pool; pgqueuer's
  concurrency_limit is fleet-wide, so 16 jobs at once in all): the better of all peer figures is
  what the goal compares with.
- pickup: an idle service; one INSERT every 20 ms; latency = start - plan (database times).
- claim: the scheduler's claim transaction (claim_lock + claim + next) with one due row, median
  of 200, with 1,000 and then 1,000,000 rows planned a year ahead.
- remote: 1,000 tasks `SELECT pg_sleep(1)`, each with `remote` pointing at this cluster, each its
  own group, one service process; wall = max(stop) - insert time; VmHWM of the service. Next to it
  the floor: 1,000 concurrent plain psycopg connections each running pg_sleep(1), without pgtask,
  and the same from a C client, pgbench with 1,000 clients (-C: its two threads connect their
  clients one after another, paced where psycopg opens all 1,000 at once).
  --repeat rounds of (floor, C floor, pgtask); each figure is the median of its rounds, and for
  each pgtask round the CPU it used (server + service) spread over the cores, against its wall
  time (the burst is CPU-bound: docs/performance.md, "What limits each figure"). Before them the
  cluster's own bound: pgbench -S -C (a new connection for every transaction), connections/s; no
  client makes 1,000 remote sleeps in much less than 1,000 / that rate (the server starting and
  ending 1,000 backends at full capacity, every sleep overlapping other backends' starts).
- idle RSS: the service's VmRSS after it is ready and 3 s idle (one scheduler).

The cluster runs with huge_pages = off, or with --huge-pages on (as root the benchmark reserves the
huge pages it needs in vm.nr_hugepages and gives them back at the end): a backend then starts with a
fraction of the page faults (1,000 connections: about 4 ms of server CPU each without, see remote).

Prints numbers; asserts nothing (a measurement, not a test).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import multiprocessing
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import NamedTuple

import psycopg
import uvloop

from pgtask import provision
from pgtask.cluster import Cluster, debian_bindir, free_port
from pgtask.queries import PLANNER_SETTINGS, render_query

ROOT = Path(__file__).resolve().parent.parent
# 16 groups of pgtask run once more with [pgtask] processes = the CPUs (no goal: the default is one),
# pgqueuer both ways too (one process, concurrency 16; PROCESSES processes sharing the 16)
PROCESSES = os.cpu_count() or 1
WARM = 320  # tasks a service runs before the timed burst of the "after a warm-up" row
G16_TASKS, PEER_JOBS = 6000, 4000  # a 16-group run's tasks, a peer run's jobs (paired rounds and sections)
TRIVIAL = "SELECT 1"
REMOTE_BODY = "SELECT pg_sleep(1)"
WRITING = "INSERT INTO sink (v) VALUES (1)"
NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")
# seconds between scrapes of a service with metrics on: a burst of 6,000 tasks lasts about 2 s, and
# a 1 s scrape interval puts scrapes inside it (Prometheus's default is 60 s)
METRICS_SCRAPE = 1.0


def proc_status(pid: int, key: str) -> float:
    """A /proc/PID/status figure in MB (VmRSS, VmHWM)."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.MULTILINE).group(1)) / 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its waited-for children, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> set[int]:
    """The live child processes of ``pid``."""
    return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def tree_cpu_seconds(pid: int) -> float:
    """cpu_seconds of a process and of its live children (the service's worker processes)."""
    return cpu_seconds(pid) + sum(cpu_seconds(c) for c in children(pid))


def running_seconds(pid: int) -> float:
    """CPU time a live process has run so far (the scheduler's own count, in ns; no children)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


class Scraper:
    """GET ``url`` every METRICS_SCRAPE seconds on a thread, as a Prometheus server does, until stop()."""

    def __init__(self, url: str):
        self.url, self.done = url, threading.Event()
        self.thread = threading.Thread(target=self.scrape, name="scraper", daemon=True)
        self.thread.start()

    def scrape(self) -> None:
        while not self.done.wait(METRICS_SCRAPE):
            with contextlib.suppress(OSError), urllib.request.urlopen(self.url, timeout=5) as resp:
                resp.read()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


class Run(NamedTuple):
    """One run_tasks(): wall time, the service's peak RSS and CPU, and the server's CPU."""

    wall: float    # s: max(stop) - insert time, both the database's clock
    hwm: float     # MB: the service's VmHWM
    cpu: float     # s: the service process
    server: float  # s: every PostgreSQL process (backends, autovacuum, WAL writer) but the bench's own
    control: float  # s: of it, the service's control backends (its claim passes) over the burst
    tasks: int      # the burst's tasks
    warm: int       # tasks the service ran before the burst (their server CPU is in ``server``)

    def per_task(self) -> tuple[float, float, float, float]:
        """Tasks/s, then CPU per task in us: the service's, the server's, its control backends'."""
        return (self.tasks / self.wall, self.cpu / self.tasks * 1e6,
                self.server / (self.tasks + self.warm) * 1e6, self.control / self.tasks * 1e6)


async def _pgqueuer_worker(url: str, body: str, stopped, concurrency: int = 16) -> None:
    """A pgqueuer worker running ``body`` on a pool of ``concurrency`` connections until ``stopped()``.
    Its concurrency_limit is the fleet's (pgqueuer counts it in the database): 16 in all however
    many processes run it."""
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager

    pool = await asyncpg.create_pool(url, min_size=concurrency, max_size=concurrency)
    worker_conn = await asyncpg.connect(url)
    qm = QueueManager(Queries(AsyncpgDriver(worker_conn)))

    @qm.entrypoint("job", concurrency_limit=concurrency)
    async def job(_job) -> None:
        await pool.execute(body)

    worker = asyncio.create_task(qm.run(batch_size=10))
    while not stopped():
        await asyncio.sleep(0.05)
    qm.shutdown.set()
    await asyncio.wait_for(worker, 30)
    await pool.close()


def _peer_wall(peer: str, n: int, done: int, t0, last) -> float:
    """Seconds from ``t0`` to the peer's ``last`` success, both the database's clock (as pgtask's
    max(stop)), once all ``n`` jobs are counted among its ``done`` successes."""
    if done != n:
        raise RuntimeError(f"{peer} recorded {done} successful jobs of {n}")
    return (last - t0).total_seconds()


def _pgqueuer_process(url: str, body: str, stop) -> None:
    uvloop.run(_pgqueuer_worker(url, body, stop.is_set))


class Bench:
    def __init__(self, scale: float, repeat: int = 3, huge_pages: bool = False):
        self.scale, self.repeat, self.huge_pages = scale, repeat, huge_pages
        self.hugepages_before: int | None = None  # vm.nr_hugepages to restore (see start)
        self.base = Path(tempfile.mkdtemp(prefix="pgtask-bench-"))
        self.cluster = Cluster(base=self.base, bindir=debian_bindir(15), port=free_port())
        self.rows: list[tuple[str, str, str]] = []  # (what, figure, ratio/notes)
        self.figures: dict[str, float] = {}
        self.counter = 0
        self.pgbench_ready = False
        self.scrapers: dict[int, Scraper] = {}  # service pid -> its scraper (service(metrics=True))

    def n(self, count: int) -> int:
        return max(int(count * self.scale), 50)

    # -- cluster and databases -----------------------------------------------------------------
    def start(self) -> None:
        self.cluster.init({"max_connections": "1300", "synchronous_commit": "on", "fsync": "on",
                           "shared_buffers": "256MB", "log_min_messages": "warning",
                           "max_wal_size": "4GB", "checkpoint_timeout": "30min",
                           "huge_pages": "on" if self.huge_pages else "off"})
        if self.huge_pages:
            self.reserve_huge_pages()
        self.cluster.start()

    def reserve_huge_pages(self) -> None:
        """--huge-pages: as many 2 MB pages reserved (vm.nr_hugepages) as the cluster's shared memory
        needs, if fewer are; the previous count is restored by close()."""
        need = int(self.cluster.run_tool("postgres", "-D", str(self.cluster.data), "-C",
                                     "shared_memory_size_in_huge_pages").stdout.strip())
        have = int(NR_HUGEPAGES.read_text())
        if have >= need:
            return
        try:
            NR_HUGEPAGES.write_text(str(need))
        except OSError as exc:
            raise SystemExit(f"--huge-pages: the cluster needs {need} huge pages, {have} are reserved and "
                             f"this user cannot reserve more ({exc}); as root: sysctl vm.nr_hugepages={need}")
        self.hugepages_before = have
        if int(NR_HUGEPAGES.read_text()) < need:
            raise SystemExit(f"--huge-pages: the kernel reserved {NR_HUGEPAGES.read_text().strip()} of the "
                             f"{need} huge pages the cluster needs (memory too fragmented?)")

    def close(self) -> None:
        try:
            self.cluster.destroy()
        finally:
            if self.hugepages_before is not None:
                NR_HUGEPAGES.write_text(str(self.hugepages_before))

    def database(self, provision_task: bool = True) -> str:
        self.counter += 1
        name = f"bench{self.counter}"
        with psycopg.connect(self.cluster.conninfo(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        if provision_task:
            async def go() -> None:
                async with await psycopg.AsyncConnection.connect(self.cluster.conninfo(name)) as conn:
                    await provision.provision_table(conn, "public", "task", provision.Report())
                    await conn.execute("CREATE TABLE sink (v int)")
                    await conn.commit()
            asyncio.run(go())
        return name

    @contextlib.contextmanager
    def scratch_database(self):
        """A fresh database (database()) for one throughput run, dropped after it: left behind, its
        dead rows would be vacuumed by autovacuum during a later run, and counted in its CPU."""
        db = self.database()
        try:
            yield db
        finally:
            with psycopg.connect(self.cluster.conninfo(), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE "{db}" WITH (FORCE)')

    def connect(self, dbname: str) -> psycopg.Connection:
        """The benchmark's own connection to ``dbname``, its statements planned as the scheduler's
        (PLANNER_SETTINGS): its probes stay on the task table's indexes -- wait_done's ran as a
        sequential scan through the finished rows once the service had analyzed the table at a
        burst's start (0.34 ms a poll instead of 0.06)."""
        conn = psycopg.connect(self.cluster.conninfo(dbname), autocommit=True)
        conn.execute(PLANNER_SETTINGS)
        return conn

    def peer_rate(self, run, n: int, body: str, loop_run) -> float:
        """Jobs per second of a peer's ``run`` (see _pgqueuer) on a scratch database, on the event
        loop its own command line runs it on (``loop_run``): pgqueuer's (`pgq run`) takes uvloop
        when it is installed (it is: pgtask runs on it), procrastinate's is asyncio's own."""
        with self.scratch_database() as db:
            return n / loop_run(run(self.cluster.conninfo(db), n, body))

    def record(self, key: str, what: str, value: float, unit: str, note: str = "") -> None:
        self.figures[key] = value
        digits = 2 if unit == "x" else 1 if value < 100 else 0
        self.rows.append((what, f"{value:,.{digits}f} {unit}", note))
        print(f"  {what}: {self.rows[-1][1]} {note}", flush=True)

    # -- pgbench -------------------------------------------------------------------------------
    def pgbench(self) -> None:
        for key, flag in (("pgbench_N", "-N"), ("pgbench_S", "-S")):
            self.repeated(key, f"pgbench {flag} (4 clients)", "TPS", lambda flag=flag: (self.pgbench_tps(flag), ""))

    def run_pgbench(self, database: str, *args: str) -> str:
        """The cluster's pgbench with ``args`` on ``database``: its output."""
        env = {**os.environ, **self.cluster.env(), "PGDATABASE": database}
        return subprocess.run([str(self.cluster.bindir / "pgbench"), *args], env=env, check=True,
                              capture_output=True, text=True).stdout

    def pgbench_tps(self, *flags: str) -> float:
        """One pgbench run (4 clients, 2 threads, 10 s) on the pgbench database (made once, scale 10)."""
        if not self.pgbench_ready:
            with psycopg.connect(self.cluster.conninfo(), autocommit=True) as conn:
                conn.execute("CREATE DATABASE pgbench")
            self.run_pgbench("pgbench", "-i", "-q", "-s", "10")
            self.pgbench_ready = True
        out = self.run_pgbench("pgbench", *flags, "-c", "4", "-j", "2", "-T", "10")
        return float(re.search(r"tps = ([\d.]+)", out).group(1))

    # -- the two ratio goals, in paired rounds ---------------------------------------------------
    def paired(self) -> None:
        """--repeat rounds, each: pgbench -N, pgtask 16 groups `SELECT 1`, pgqueuer `SELECT 1` (one
        process), back to back; each round's two ratios, and their medians for the goals. This
        machine drifts by 10-40 % within minutes, so figures measured minutes apart (the other
        sections) make a ratio of two phases; a round's three runs take under a minute."""
        n, jobs = self.n(G16_TASKS), self.n(PEER_JOBS)
        rounds = []
        for _ in range(self.repeat):
            tps = self.pgbench_tps("-N")
            rate = n / self.run_tasks(n, 16, 0, TRIVIAL).wall
            peer = self.peer_rate(self._pgqueuer, jobs, TRIVIAL, uvloop.run)
            rounds.append((tps, rate, peer))
            print(f"  round: pgbench -N {tps:,.0f} TPS, pgtask {rate:,.0f} tasks/s, pgqueuer {peer:,.0f} jobs/s "
                  f"({rate / tps:.2f} x, {rate / peer:.2f} x)", flush=True)
        each = "; ".join(f"{r:,.0f}/{t:,.0f}/{p:,.0f}" for t, r, p in rounds)
        self.record("paired_N", "16 groups / pgbench -N, paired rounds (median)",
                    statistics.median(r / t for t, r, p in rounds), "x",
                    f"(pgtask/pgbench -N/pgqueuer per round: {each})")
        self.record("paired_peer", "16 groups / pgqueuer, paired rounds (median)",
                    statistics.median(r / p for t, r, p in rounds), "x")

    # -- the service ---------------------------------------------------------------------------
    def service(self, dbname: str, processes: int = 1, metrics: bool = False, config: str = "") -> subprocess.Popen:
        """A started ``pgtask run`` on ``dbname``; with ``metrics``, its endpoint on a loopback port,
        scraped every METRICS_SCRAPE seconds until stop(); ``config``: more [pgtask] keys."""
        cfg = self.base / f"{dbname}.toml"
        port = free_port()
        cfg.write_text(f'[pgtask]\nlog_level = "info"\nprocesses = {processes}\n' +
                       (f'metrics_listen = "127.0.0.1:{port}"\n' if metrics else "") + config)
        log = open(self.base / f"{dbname}.log", "wb")  # noqa: SIM115 - the service writes to it until stop()
        env = {**os.environ, **self.cluster.env(), "PGDATABASE": dbname}
        cmd = [sys.executable, "-m", "pgtask.cli", "run", "--config", str(cfg)]
        if os.environ.get("BENCH_PROFILE"):  # py-spy collapsed stacks of the service, for profiling
            cmd = [str(Path(sys.executable).parent / "py-spy"), "record", "-r", "250", "-f", "raw", "-o", os.environ["BENCH_PROFILE"] + f".{dbname}",
                   "--", *cmd]
        proc = subprocess.Popen(cmd,
                                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.base)
        deadline = time.monotonic() + 60
        logfile = self.base / f"{dbname}.log"
        while logfile.read_text(errors="replace").count("pgtask running") < processes:  # every process
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pgtask run did not start:\n{logfile.read_text()}")
            time.sleep(0.05)
        time.sleep(0.3)
        if metrics:
            self.scrapers[proc.pid] = Scraper(f"http://127.0.0.1:{port}/metrics")
        return proc

    def stop(self, proc: subprocess.Popen) -> None:
        scraper = self.scrapers.pop(proc.pid, None)
        if scraper is not None:
            scraper.stop()
        if os.environ.get("BENCH_PROFILE"):  # stop the profiled service: py-spy then writes and exits
            for child in children(proc.pid):
                os.kill(child, 15)
            proc.wait(60)
            return
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def wait_done(self, conn: psycopg.Connection, n: int, timeout: float, after: int = 0) -> None:
        """Until no task is left to run, then check that n are done (DONE/FAIL/GONE), of the rows
        whose id is above ``after`` (those finished before are not the burst's). The waiting
        connection asks whether any row is unfinished -- a probe of the state index -- rather than
        counting the finished ones 20 times a second (a scan growing with the burst: 4-5 % of the
        machine's CPU, taken from the service measured; ``conn`` from connect()). The peers are
        waited for the same way."""
        deadline = time.monotonic() + timeout
        while conn.execute("SELECT EXISTS (SELECT FROM task WHERE state IN ('PLAN', 'TAKE', 'WORK'))").fetchone()[0]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"tasks not finished in {timeout}s")
            time.sleep(0.05)
        done = conn.execute("SELECT count(*) FROM task WHERE state IN ('DONE', 'FAIL', 'GONE') AND id > %s",
                            (after,)).fetchone()[0]
        if done < n:
            raise RuntimeError(f"only {done} of {n} tasks finished, none left to run")

    def repeated(self, key: str, what: str, unit: str, measure) -> None:
        """Record the median of --repeat runs of ``measure()`` -> (rate, note): this machine's speed
        drifts by 10-20 % from minute to minute, one run is not a figure."""
        runs = [measure() for _ in range(self.repeat)]
        rates = [r for r, _ in runs]
        mid = statistics.median(rates)
        note = next(n for r, n in runs if r == mid) if mid in rates else runs[0][1]
        spread = f"median of {len(rates)}: " + ", ".join(f"{r:,.0f}" for r in rates) if len(rates) > 1 else ""
        self.record(key, what, mid, unit, " ".join(x for x in (note, spread) if x))

    def tasks(self, key: str, what: str, n: int, groups: int, max_: int, body: str, processes: int = 1,
              warm: int = 0) -> None:
        server = []

        def measure() -> tuple[float, str]:
            run = self.run_tasks(n, groups, max_, body, processes=processes, warm=warm)
            rate, service, server_us, control = run.per_task()
            server.append(server_us)
            return rate, (f"(service CPU {run.cpu / run.wall:.0%} of one core, {service:.0f} us/task; "
                          f"server {server_us:.0f} us/task, of it the control backend {control:.0f})")
        self.repeated(key, what, "tasks/s", measure)
        self.figures[f"{key}_server_us"] = statistics.median(server)

    def postmaster_seconds(self) -> float:
        """CPU of the postmaster and of every child it has reaped (backends that ended, autovacuum)."""
        return cpu_seconds(int((self.cluster.data / "postmaster.pid").read_text().split()[0]))

    def run_tasks(self, n: int, groups: int, max_: int, body: str, remote: str | None = None,
                  processes: int = 1, warm: int = 0, metrics: bool = False) -> Run:
        """n tasks inserted at once into a scratch database with its own service (run_burst)."""
        with self.scratch_database() as db:
            return self.run_burst(db, n, groups, max_, body, remote, processes, warm, metrics)

    def run_burst(self, db: str, n: int, groups: int, max_: int, body: str, remote: str | None = None,
                  processes: int = 1, warm: int = 0, metrics: bool = False, config: str = "",
                  backlog: int = 0) -> Run:
        """n tasks inserted at once into ``db`` with a service of its own; see Run. ``db`` may hold
        rows already (bench.scale's history): only the rows inserted here are waited for and timed.
        With ``warm``, the service first runs that many tasks of the same kind: the wall time and the
        service's CPU are the burst's after them; the server's CPU covers both (its backends' CPU is
        known when they end). With ``backlog``, that many more tasks are inserted with the n, and the
        run times the first n to finish (the rest are still due when it stops: every group keeps
        some). ``metrics``, ``config``: see service."""
        server0, children = self.postmaster_seconds(), self.postmaster_children()
        proc = self.service(db, processes, metrics, config)
        try:
            with self.connect(db) as conn:
                first = conn.execute("SELECT coalesce(max(id), 0) FROM task").fetchone()[0]
                remote_value = remote.replace("DB", db) if remote else None
                insert = ('INSERT INTO task ("group", "max", "input", "remote") '
                          "SELECT 'g' || (i %% %s), %s, %s, %s FROM generate_series(1, %s) i "
                          "RETURNING statement_timestamp()")
                if warm:
                    conn.execute(insert, (groups, max_, body, remote_value, warm))
                    self.wait_done(conn, warm, timeout=300, after=first)
                controls = [pid for pid, in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name LIKE 'pg\\_work %'")]
                cpu0, control0 = tree_cpu_seconds(proc.pid), sum(map(running_seconds, controls))
                t0 = conn.execute(insert, (groups, max_, body, remote_value, n + backlog)).fetchone()[0]
                if backlog:
                    self.wait_finished(conn, n, timeout=600, after=first)
                else:
                    self.wait_done(conn, n + warm, timeout=300, after=first)
                control = sum(map(running_seconds, controls)) - control0
                wall = self.burst_wall(conn, t0, n + warm, first)
                own = running_seconds(conn.info.backend_pid)  # this waiting connection's backend
            cpu = tree_cpu_seconds(proc.pid) - cpu0
            hwm = proc_status(proc.pid, "VmHWM")
        finally:
            self.stop(proc)
        self.wait_children_gone(children)
        # Includes the service's backends starting (about 4 ms each here) and any autovacuum.
        return Run(wall, hwm, cpu, self.postmaster_seconds() - server0 - own, control, n, warm)

    def wait_finished(self, conn: psycopg.Connection, n: int, timeout: float, after: int) -> None:
        """Until n of the rows whose id is above ``after`` have finished (DONE/FAIL/GONE): a count of
        the burst's rows, so every 0.1 s rather than wait_done's 0.05."""
        deadline = time.monotonic() + timeout
        while conn.execute("SELECT count(*) FROM task WHERE id > %s AND state IN ('DONE', 'FAIL', 'GONE')",
                           (after,)).fetchone()[0] < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n} tasks not finished in {timeout}s")
            time.sleep(0.1)

    @staticmethod
    def burst_wall(conn: psycopg.Connection, t0, n: int, after: int) -> float:
        """Seconds from ``t0`` to the n-th finish among the rows whose id is above ``after``, both the
        database's clock; those of them that did not end DONE are reported."""
        wall, fails, err = conn.execute(
            "SELECT extract(epoch FROM max(stop) - %s)::float8, count(*) FILTER (WHERE state <> 'DONE'), "
            "min(error) FROM (SELECT stop, state, error FROM task WHERE id > %s "
            "AND state IN ('DONE', 'FAIL', 'GONE') ORDER BY stop LIMIT %s) f", (t0, after, n)).fetchone()
        if fails:
            print(f"  !! {fails} tasks not DONE, e.g. {err}")
        return wall

    def postmaster_children(self) -> set[int]:
        return children(int((self.cluster.data / "postmaster.pid").read_text().split()[0]))

    def wait_children_gone(self, before: set[int]) -> None:
        """Until every server process started since ``before`` has ended (its CPU is then counted
        in the postmaster's), or 30 s (an autovacuum worker may run longer)."""
        deadline = time.monotonic() + 30
        while self.postmaster_children() - before and time.monotonic() < deadline:
            time.sleep(0.05)

    def pgtask(self) -> None:
        for body, label in ((TRIVIAL, "SELECT 1"), (WRITING, "row-writing INSERT")):
            suffix = "" if body == TRIVIAL else "_w"
            self.tasks(f"g16{suffix}", f"pgtask {label}: 16 groups (max 0)", self.n(G16_TASKS), 16, 0, body)
            if body == TRIVIAL and PROCESSES > 1:  # no goal: the same with [pgtask] processes = the CPUs
                self.tasks("g16_mp", f"pgtask {label}: 16 groups (max 0), {PROCESSES} processes", self.n(G16_TASKS),
                           16, 0, body, PROCESSES)
            if body == TRIVIAL:  # no goal: a service that ran tasks before, as a real one has
                self.tasks("g16_warm", f"pgtask {label}: 16 groups (max 0), after {WARM} tasks", self.n(G16_TASKS),
                           16, 0, body, warm=WARM)
            self.tasks(f"serial{suffix}", f"pgtask {label}: 1 serial group", self.n(2000), 1, 0, body)
            self.tasks(f"max15{suffix}", f"pgtask {label}: 1 group max 15", self.n(6000), 1, 15, body)
        # no goal: a burst in many groups, a task each (the sessions opened a few at a time serve it)
        self.tasks("g1000", "pgtask SELECT 1: 1,000 groups, a task each", 1000, 1000, 0, TRIVIAL)

    # -- peers ---------------------------------------------------------------------------------
    def peers(self) -> None:
        for body, label in ((TRIVIAL, "SELECT 1"), (WRITING, "row-writing INSERT")):
            suffix = "" if body == TRIVIAL else "_w"
            n = self.n(PEER_JOBS)
            runs = [("pgqueuer", "pgqueuer (asyncpg)", "concurrency 16", self._pgqueuer, uvloop.run)]
            if PROCESSES > 1:
                runs.append(("pgqueuer_mp", "pgqueuer (asyncpg)", f"{PROCESSES} processes, concurrency 16 in all",
                             functools.partial(self._pgqueuer, processes=PROCESSES), uvloop.run))
            runs.append(("procrastinate", "procrastinate (psycopg)", "concurrency 16", self._procrastinate,
                         asyncio.run))
            for key, what, how, run, loop_run in runs:
                self.repeated(f"{key}{suffix}", f"{what} {label}: {how}", "jobs/s",
                              lambda run=run, n=n, body=body, loop_run=loop_run:
                              (self.peer_rate(run, n, body, loop_run), ""))

    async def _pgqueuer(self, dsn: str, n: int, body: str, processes: int = 1) -> float:
        """pgqueuer's wall time for n jobs: its worker in this process (concurrency 16), or in
        ``processes`` processes sharing the 16 (as a user scales it out on one host; each has a
        pool of 16 connections, the fleet-wide concurrency_limit keeps 16 jobs at once in all)."""
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries

        url = f"postgresql://postgres@/{psycopg.conninfo.conninfo_to_dict(dsn)['dbname']}" \
              f"?host={self.cluster.socket_dir}&port={self.cluster.port}"
        setup = await asyncpg.connect(url)
        await Queries(AsyncpgDriver(setup)).install()
        if processes == 1:
            stop = asyncio.Event()
            workers = [asyncio.create_task(_pgqueuer_worker(url, body, stop.is_set))]
        else:
            ctx = multiprocessing.get_context("spawn")
            stop = ctx.Event()
            workers = [ctx.Process(target=_pgqueuer_process, args=(url, body, stop))
                       for _ in range(processes)]
            for w in workers:
                w.start()
        await asyncio.sleep(1.0 if processes == 1 else 3.0)  # started and idle
        t0 = await setup.fetchval("SELECT clock_timestamp()")
        await Queries(AsyncpgDriver(setup)).enqueue(["job"] * n, [None] * n, [0] * n)
        while await setup.fetchval("SELECT EXISTS (SELECT FROM pgqueuer WHERE status IN ('queued', 'picked'))"):
            await asyncio.sleep(0.05)
        done, last = await setup.fetchrow("SELECT count(*), max(created) FROM pgqueuer_log "
                                          "WHERE status = 'successful'")
        wall = _peer_wall("pgqueuer", n, done, t0, last)
        stop.set()
        if processes == 1:
            await asyncio.wait_for(workers[0], 30)
        else:
            for w in workers:
                await asyncio.to_thread(w.join, 30)
        await setup.close()
        return wall

    async def _procrastinate(self, dsn: str, n: int, body: str) -> float:
        import procrastinate

        logging.getLogger("procrastinate").setLevel(logging.ERROR)  # "App is instantiated in the main module"
        from psycopg_pool import AsyncConnectionPool

        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
        pool = AsyncConnectionPool(dsn, min_size=16, max_size=16, open=False, kwargs={"autocommit": True})
        await pool.open(wait=True)

        @app.task(name="job", queue="bench")
        async def job() -> None:
            async with pool.connection() as conn:
                await conn.execute(body)

        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            worker = asyncio.create_task(app.run_worker_async(queues=["bench"], concurrency=16,
                                                              install_signal_handlers=False))
            await asyncio.sleep(1.0)
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                t0 = (await (await conn.execute("SELECT clock_timestamp()")).fetchone())[0]
                await job.batch_defer_async(*([{}] * n))
                while (await (await conn.execute(
                        "SELECT EXISTS (SELECT FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))")).fetchone())[0]:
                    await asyncio.sleep(0.05)
                done, last = await (await conn.execute(
                    "SELECT count(*), max(at) FROM procrastinate_events WHERE type = 'succeeded'")).fetchone()
            wall = _peer_wall("procrastinate", n, done, t0, last)
            worker.cancel()
            try:
                await asyncio.wait_for(worker, 30)
            except (asyncio.CancelledError, TimeoutError):
                pass
        await pool.close()
        return wall

    # -- latency -------------------------------------------------------------------------------
    def pickup(self) -> None:
        db = self.database()
        proc = self.service(db)
        n = max(self.n(300), 200)
        try:
            with self.connect(db) as conn:
                for _ in range(n):
                    conn.execute("INSERT INTO task (input) VALUES ('SELECT 1')")
                    time.sleep(0.02)
                self.wait_done(conn, n, timeout=60)
                lat = [r[0] for r in conn.execute(
                    "SELECT extract(epoch FROM start - plan)::float8 * 1000 FROM task ORDER BY id")]
        finally:
            self.stop(proc)
        q = statistics.quantiles(lat, n=100, method="inclusive")
        self.record("pickup_p50", f"pickup latency p50 ({n} tasks, idle queue)", q[49], "ms")
        self.record("pickup_p95", "pickup latency p95", q[94], "ms")
        self.record("pickup_p99", "pickup latency p99", q[98], "ms")

    # -- claim cost ----------------------------------------------------------------------------
    def claim(self) -> None:
        db = self.database()

        def q(name: str) -> str:
            return render_query(name, "public", "task")

        with self.connect(db) as conn:  # planned as on the scheduler's control connection
            oid = conn.execute("SELECT 'task'::regclass::oid").fetchone()[0]

            def fill(total: int) -> None:
                have = conn.execute("SELECT count(*) FROM task").fetchone()[0]
                conn.execute("INSERT INTO task (plan, input) SELECT now() + '1 year'::interval + i * '1 s'::interval, "
                             "'SELECT 1' FROM generate_series(1, %s) i", (total - have,))
                conn.execute("VACUUM ANALYZE task")

            def measure() -> float:
                times = []
                for _ in range(200):
                    conn.execute("INSERT INTO task (input) VALUES ('SELECT 1')")
                    t = time.perf_counter()
                    with conn.transaction():
                        conn.execute(q("claim_lock"))
                        rows = conn.execute(q("claim"), {"token": "00000000-0000-0000", "oid": oid, "limit": 1000,
                                                         "offer_pid": [], "offer_id": []}).fetchall()
                        conn.execute(q("next")).fetchone()
                    times.append((time.perf_counter() - t) * 1000)
                    assert len(rows) == 1, rows
                    conn.execute("UPDATE task SET state = 'DONE' WHERE state = 'TAKE'")
                return statistics.median(times)

            fill(1000)
            small = measure()
            self.record("claim_1k", "claim transaction, 1,000 future rows (median)", small, "ms")
            t = time.monotonic()
            fill(1_000_000)
            print(f"  (filled 1,000,000 rows in {time.monotonic() - t:.0f}s)", flush=True)
            large = measure()
            self.record("claim_1m", "claim transaction, 1,000,000 future rows (median)", large, "ms",
                        f"{large / small:.2f}x the 1k figure")

    # -- remote and memory ---------------------------------------------------------------------
    def remote(self) -> None:
        db = self.database()
        proc = self.service(db)
        try:
            time.sleep(3)
            self.record("idle_rss", "service idle RSS (one scheduler)", proc_status(proc.pid, "VmRSS"), "MB")
        finally:
            self.stop(proc)
        # The cluster's own bound: connections it can start and end a second, each for one
        # transaction (pgbench -C). 1,000 concurrent remote tasks need 1,000 backends started and
        # ended: at full capacity, with every sleep overlapping other backends' starts, that takes
        # about 1,000 / that rate (pgbench's own CPU included), and no client does it in much less.
        self.repeated("pgbench_C", "pgbench -S -C (4 clients, a connection a transaction)", "connections/s",
                      lambda: (self.pgbench_tps("-S", "-C"), ""))
        remote = self.remote_conninfo()
        # --repeat rounds of (floor, C floor, pgtask), medians of each: any one alone moves by 20-30 %
        # with the machine's phase and with what ran just before it (1,000 backends exiting).
        floors, c_floors, runs = [], [], []
        for _ in range(self.repeat):
            floors.append(asyncio.run(self._sleep_floor(self.cluster.conninfo(), 1000)))
            c_floors.append(self.pgbench_sleep_floor(1000))
            runs.append(self.run_tasks(1000, 1000, 0, REMOTE_BODY, remote=remote))
        walls = [run.wall for run in runs]

        def rounds(seconds: list[float]) -> str:
            return f"median of {len(seconds)}: " + ", ".join(f"{x:.1f}" for x in seconds)
        self.record("remote_floor", "floor: 1,000 plain psycopg connections, each pg_sleep(1)",
                    statistics.median(floors), "s", "(what this machine allows without pgtask) " + rounds(floors))
        self.record("remote_floor_c", "floor, a C client: pgbench, 1,000 clients, each pg_sleep(1)",
                    statistics.median(c_floors), "s",
                    "(-C: each client connects as its transaction starts) " + rounds(c_floors))
        self.record("remote_wall", "  wall time for the 1,000 remote sleeps", statistics.median(walls), "s",
                    rounds(walls))
        # The burst is CPU-bound: its wall time is at least the CPU it used spread over the machine's
        # cores, and most of that CPU is the server's backends starting and ending (docs/performance.md,
        # "What limits each figure").
        cores = os.cpu_count() or 1
        ratios, notes = [], []
        for run in runs:
            _, service, server, _ = run.per_task()
            spread = (run.server + run.cpu) / cores  # s of all the cores
            ratios.append(spread / run.wall)
            notes.append(f"{run.wall:.1f} s: server {server:,.0f} + service {service:,.0f} us a task, "
                         f"{spread:.1f} s of {cores} cores")
        self.record("remote_cpu", "  the same: CPU spread over the cores (server + service) / wall, a round",
                    statistics.median(ratios), "x", "median; per round: " + "; ".join(notes))
        self.record("remote_hwm", "  service peak RSS (VmHWM) during them, the highest",
                    max(run.hwm for run in runs), "MB")

    def remote_conninfo(self) -> str:
        """``remote`` for the remote figure: this cluster, the run's database (DB, see run_tasks)."""
        return f"host={self.cluster.socket_dir} port={self.cluster.port} user=postgres dbname=DB"

    def pgbench_sleep_floor(self, n: int) -> float:
        """Wall time of pgbench running n clients, one transaction `SELECT pg_sleep(1)` each, with -C: a
        client written in C, each of its two threads connecting its clients one after another (paced,
        where the psycopg floor opens all n at once); pgbench's own start and end included."""
        script = self.base / "sleep.sql"
        script.write_text(f"{REMOTE_BODY};\n")
        t = time.monotonic()
        self.run_pgbench("postgres", "-n", "-C", "-c", str(n), "-j", "2", "-t", "1", "-f", str(script))
        return time.monotonic() - t

    @staticmethod
    async def _sleep_floor(dsn: str, n: int) -> float:
        """Wall time of n concurrent connections each running pg_sleep(1), opened and closed by psycopg
        alone: connecting n backends is most of it."""
        async def one() -> None:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute("SELECT pg_sleep(1)")
        t = time.monotonic()
        await asyncio.gather(*(one() for _ in range(n)))
        return time.monotonic() - t

    # -- report --------------------------------------------------------------------------------
    def ratios(self) -> list[tuple[str, str, str]]:
        f = self.figures
        out = []

        def add(what: str, value: float, goal: str, ok: bool) -> None:
            out.append((what, f"{value:,.2f}", f"{goal} {'ok' if ok else 'MISSED'}"))

        def info(what: str, value: float, note: str) -> None:
            out.append((what, f"{value:,.2f}", note))

        def goal(what: str, target: float, paired: float | None, apart: float | None) -> None:
            """A ratio goal from the paired rounds when there are any (see paired), the ratio of the
            sections' medians (measured minutes apart) beside it; else from the sections' medians."""
            if paired is not None:
                add(f"{what}, paired rounds", paired, f">= {target:.2f}", paired >= target)
                if apart is not None:
                    info("  the same", apart, "(the sections' medians, minutes apart)")
            elif apart is not None:
                add(what, apart, f">= {target:.2f}", apart >= target)

        goal("16-group trivial / pgbench -N", 0.5, f.get("paired_N"),
             f["g16"] / f["pgbench_N"] if "g16" in f and "pgbench_N" in f else None)
        peer = max(f.get("pgqueuer", 0), f.get("pgqueuer_mp", 0), f.get("procrastinate", 0))
        peer_apart = f["g16"] / peer if "g16" in f and peer else None
        if "paired_peer" in f and peer and peer != f.get("pgqueuer"):
            # the paired rounds ran pgqueuer in one process, and another peer was the better one
            info("16-group trivial / pgqueuer, paired rounds", f["paired_peer"], "(pgqueuer was not the better peer)")
            goal("16-group trivial / better peer", 1.5, None, peer_apart)
        else:
            goal("16-group trivial / better peer (pgqueuer)", 1.5, f.get("paired_peer"), peer_apart)
        if "g16_mp" in f and peer:
            info(f"  the same with {PROCESSES} processes / better peer", f["g16_mp"] / peer, "(no goal)")
        if "g16_warm" in f and "g16" in f:
            info("  16 groups after a warm-up / fresh", f["g16_warm"] / f["g16"], "(no goal; about 1 expected)")
        if "g16_server_us" in f:
            # What the server's share alone allows: the figure if the service cost no CPU at all.
            ceiling = (os.cpu_count() or 1) / (f["g16_server_us"] / 1e6)
            info("16 groups if the service used no CPU, tasks/s", ceiling,
                 f"(CPUs / server CPU per task, {f['g16_server_us']:.0f} us)")
            if "pgbench_N" in f:
                info("  that bound / pgbench -N", ceiling / f["pgbench_N"], "(the goal needs 0.50 of the real figure)")
            if peer:
                info("  that bound / better peer", ceiling / peer, "(the goal needs 1.50 of the real figure)")
        peer_w = max(f.get("pgqueuer_w", 0), f.get("pgqueuer_mp_w", 0), f.get("procrastinate_w", 0))
        if "g16_w" in f and peer_w:
            add("16-group row-writing / better peer", f["g16_w"] / peer_w, "(no goal)", True)
        if "serial" in f:
            add("serial group tasks/s", f["serial"], ">= 300", f["serial"] >= 300)
        if "pickup_p50" in f:
            add("pickup p50 ms", f["pickup_p50"], "<= 5", f["pickup_p50"] <= 5)
            add("pickup p99 ms", f["pickup_p99"], "<= 25", f["pickup_p99"] <= 25)
        if "claim_1m" in f:
            r = f["claim_1m"] / f["claim_1k"]
            add("claim at 1M / at 1k", r, "<= 1.50", r <= 1.5)
        if "remote_wall" in f:
            add("1,000 remote sleeps, s", f["remote_wall"], "<= 3", f["remote_wall"] <= 3)
            add("1,000 remote sleeps / plain-connection floor", f["remote_wall"] / f["remote_floor"], "(no goal)", True)
            if "remote_floor_c" in f:
                least = min(f["remote_floor"], f["remote_floor_c"])
                info("  the least of the two floors, s", least, "(psycopg all at once, pgbench paced" +
                     (": above 3 s, no client meets the goal on this cluster)" if least > 3 else ")"))
            if "pgbench_C" in f:
                info("  the cluster's bound, s", 1000 / f["pgbench_C"],
                     "(1,000 connections at pgbench -C's rate, the sleeps overlapping: about the least any client reaches)")
            add("1,000 remote sleeps, peak RSS MB", f["remote_hwm"], "<= 150", f["remote_hwm"] <= 150)
        return out

    def machine(self) -> str:
        """The machine, the software and the cluster's settings, on one line."""
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), platform.processor())
        with psycopg.connect(self.cluster.conninfo(), autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
        return (f"machine: {os.cpu_count()} CPUs ({cpu}), {platform.platform()}, Python {platform.python_version()}, "
                f"psycopg {psycopg.__version__}, PostgreSQL {version}, synchronous_commit = on, fsync = on, "
                f"huge_pages = {'on' if self.huge_pages else 'off'}")

    def report(self) -> None:
        print()
        print(self.machine())
        width = max(len(r[0]) for r in self.rows) + 2
        print(f"{'measurement':<{width}}{'figure':>18}  notes")
        for what, figure, note in self.rows:
            print(f"{what:<{width}}{figure:>18}  {note}")
        print()
        ratios = self.ratios()
        if ratios:
            width = max(len(r[0]) for r in ratios) + 2
            print(f"{'goal':<{width}}{'value':>12}  target")
            for what, value, goal in ratios:
                print(f"{what:<{width}}{value:>12}  {goal}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="paired,pgbench,pgtask,peers,pickup,claim,remote")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3, help="runs per throughput figure (the median is kept)")
    parser.add_argument("--huge-pages", action="store_true",
                        help="run the cluster with huge_pages = on, reserving vm.nr_hugepages for it (root)")
    args = parser.parse_args()
    b = Bench(args.scale, args.repeat, args.huge_pages)
    t = time.monotonic()
    try:
        b.start()
        for section in args.only.split(","):
            print(f"== {section}", flush=True)
            getattr(b, section.strip())()
        b.report()
        print(f"\n(total {time.monotonic() - t:.0f}s)")
    finally:
        b.close()


if __name__ == "__main__":
    main()
