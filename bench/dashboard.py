"""The shipped Grafana dashboard's panels, drawn from a real run (docs/observability-dashboard.png).

    .venv/bin/python -m bench.dashboard                   # about 7 minutes
    .venv/bin/python -m bench.dashboard --minutes 3 --out /tmp/dashboard.png

Grafana is not packaged for Debian 12, so the panels are drawn here: on bench.run's PostgreSQL 15
cluster, a `pgtask run` with its metrics endpoint on (`metrics_refresh` = 2 s) is scraped every 2 s
by a real Prometheus (Debian's, unpacked into .cache/prometheus by `scripts/bootstrap test`) while
a load runs: a steady stream in eight groups (5 % of it failing), a slow serial group whose backlog
grows (its tasks waiting over 20 s expire) and then drains, a burst of 6,000 tasks in 16 groups, a
schedule, and the service SIGKILLed while three long tasks run and started again (their rows are
orphans the new service resets). Every target of roles/pgtask/files/monitoring/pgtask-dashboard.json
is then asked of Prometheus's HTTP API (query_range over the run, its variables matching every
entry, as Grafana's "All") and each panel drawn with its title, legends and unit.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import yaml

from bench.run import ROOT, Bench
from pgtask.cluster import free_port
from pgtask.readable import count, duration

PROMETHEUS = ROOT / ".cache/prometheus/usr/bin/prometheus"
DASHBOARD = ROOT / "roles/pgtask/files/monitoring/pgtask-dashboard.json"
SCRAPE = 2      # s: Prometheus's scrape interval, and the service's metrics_refresh
STEP = 5        # s: the resolution of the drawn series
LEGEND = 8     # series a panel's legend names
STEADY_GROUPS = ("mail", "billing", "sync", "thumbs", "search", "audit", "export", "notify")


def expressions(panel: dict) -> list[tuple[str, str]]:
    """(expression, legend format) of a panel's targets, the dashboard's variables set to Grafana's
    "All" (their allValue, ".*")."""
    return [(re.sub(r"\$(data|schema|table)\b", ".*", t["expr"]), t.get("legendFormat", "")) for t in panel["targets"]]


def legend(fmt: str, labels: dict) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip() or "value"


class Prometheus:
    """Debian's Prometheus server on a loopback port, scraping one target as job "pgtask"."""

    def __init__(self, base: Path, target: str):
        self.port = free_port()
        config = base / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": f"{SCRAPE}s", "scrape_timeout": f"{SCRAPE * 1000 - 500}ms",
                       "evaluation_interval": f"{SCRAPE}s"},
            "scrape_configs": [{"job_name": "pgtask", "static_configs": [{"targets": [target]}]}]}))
        with open(base / "prometheus.log", "wb") as log:  # the server writes to its own copy
            self.proc = subprocess.Popen([str(PROMETHEUS), f"--config.file={config}",
                                          f"--storage.tsdb.path={base / 'tsdb'}",
                                          f"--web.listen-address=127.0.0.1:{self.port}"],
                                         stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 30
        while not self.ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus did not start:\n{(base / 'prometheus.log').read_text()}")
            time.sleep(0.2)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def query_range(self, expr: str, start: float, end: float) -> list[dict]:
        params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": STEP})
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/query_range?{params}", timeout=30) as resp:
            body = json.load(resp)
        if body["status"] != "success":
            raise RuntimeError(f"{expr}: {body}")
        return body["data"]["result"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


class Load:
    """The run's tasks, inserted on the benchmark's connection; tick() is called every half second."""

    def __init__(self, conn, seconds: float):
        self.conn, self.seconds = conn, seconds
        self.rng = random.Random(38)
        self.events: list[tuple[float, str]] = []  # (time.time(), what happened), marked on the panels
        conn.execute("INSERT INTO task_schedule (name, cron, input) VALUES ('every minute', '* * * * *', 'SELECT 1')")

    def insert(self, group: str, body: str, n: int = 1, plan: str = "now()", active: str | None = None,
               max_: int = 0) -> None:
        self.conn.execute(
            f'INSERT INTO task ("group", input, plan, active, "max") SELECT %s, %s, {plan}, '
            "coalesce(%s::interval, '1 hour'), %s FROM generate_series(1, %s)", (group, body, active, max_, n))

    def tick(self, elapsed: float) -> None:
        share = elapsed / self.seconds
        for _ in range(self.rng.randint(6, 14)):  # the steady stream: about 20 tasks/s
            group, roll = self.rng.choice(STEADY_GROUPS), self.rng.random()
            if roll < 0.05:
                self.insert(group, "SELECT 1/0")
            else:
                self.insert(group, f"SELECT pg_sleep({self.rng.uniform(0.001, 0.08):.3f})", max_=1)
        if 0.08 < share < 0.55 and int(elapsed * 2) % 2 == 0:
            # a slow serial group: its backlog grows, and its tasks waiting over 20 s expire (GONE)
            self.insert("reports", "SELECT pg_sleep(1.5)", active="20 s")

    def once(self, elapsed: float, done: set[str]) -> str | None:
        """The run's one-off events, each once at its share of the run; returns the one to act on."""
        for share, name in ((0.40, "burst"), (0.62, "long"), (0.66, "kill")):
            if elapsed / self.seconds >= share and name not in done:
                done.add(name)
                if name == "burst":
                    self.conn.execute('INSERT INTO task ("group", input) SELECT \'burst-\' || (i % 16), '
                                      "'SELECT pg_sleep(0.02)' FROM generate_series(1, 6000) i")
                    self.events.append((time.time(), "burst of 6,000"))
                elif name == "long":
                    for i in range(3):
                        self.insert(f"long-{i}", "SELECT pg_sleep(30)")
                return name
        return None


def draw(dashboard: dict, series: dict[str, list], start: float, end: float, events, title: str, note: str,
         out: Path) -> None:
    """A grid of the dashboard's panels in its order (two a row, as its gridPos), each line a series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    panels = sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    rows = (len(panels) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(14, 3.3 * rows), layout="constrained", sharex=True)
    fig.suptitle(title, fontsize=14)
    fig.text(0.5, -0.005, note, ha="center", va="top", fontsize=9, color="#555555")
    formatters = {
        "s": FuncFormatter(lambda v, _: duration(v) if v > 0 else "0"),
        "ops": FuncFormatter(lambda v, _: f"{v:g}/s"),
        "short": FuncFormatter(lambda v, _: count(v) if v == int(v) else f"{v:g}"),
    }
    locator = mdates.AutoDateLocator(minticks=4, maxticks=8)
    for ax, panel in zip(axes.flat, panels):
        lines = [(label, points) for result in series[panel["title"]] for label, points in result]
        # the legend names the LEGEND series with the highest peaks (Grafana's would list them all)
        peaks = sorted(lines, key=lambda line: -max(float(v) if v != "NaN" else 0 for _, v in line[1]))
        named = {label for label, _ in peaks[:LEGEND]}
        for label, points in lines:
            xs = [datetime.fromtimestamp(float(t), UTC) for t, _ in points]
            ys = [float(v) for _, v in points]
            ax.plot(xs, ys, label=label if label in named else "_nolegend_", linewidth=1.3)
        if len(lines) > LEGEND:
            ax.plot([], [], " ", label=f"+ {len(lines) - LEGEND} more")
        drawn = min(len(lines), LEGEND + 1)
        for at, what in events:
            ax.axvline(datetime.fromtimestamp(at, UTC), color="#9e9e9e", linestyle=":", linewidth=1)
            if panel is panels[0]:
                ax.annotate(what, (datetime.fromtimestamp(at, UTC), 1), xycoords=("data", "axes fraction"),
                            xytext=(3, -3), textcoords="offset points", va="top", fontsize=8, color="#616161")
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        ax.yaxis.set_major_formatter(formatters.get(unit, formatters["short"]))
        ax.set_ylim(bottom=0)
        ax.set_title(panel["title"])
        if drawn:
            ax.legend(loc="upper right", fontsize="x-small", ncol=2 if drawn > 5 else 1)
        ax.set_xlim(datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC))
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.savefig(out, dpi=90, bbox_inches="tight")


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return f"{os.cpu_count()} CPUs ({cpu}), {platform.platform()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=6.0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs/observability-dashboard.png")
    args = parser.parse_args()
    if not PROMETHEUS.exists():
        raise SystemExit(f"{PROMETHEUS} is missing: run scripts/bootstrap test")
    dashboard = json.loads(DASHBOARD.read_text())
    seconds = args.minutes * 60
    bench = Bench(1.0, 1)
    bench.start()
    base = Path(tempfile.mkdtemp(prefix="pgtask-dashboard-"))
    port = free_port()
    config = f'metrics_listen = "127.0.0.1:{port}"\nmetrics_refresh = {SCRAPE}\n'
    prometheus = None
    proc = None
    try:
        db = bench.database()
        proc = bench.service(db, config=config)
        prometheus = Prometheus(base, f"127.0.0.1:{port}")
        with bench.connect(db) as conn:
            load = Load(conn, seconds)
            start, done = time.time(), set()
            while (elapsed := time.time() - start) < seconds:
                load.tick(elapsed)
                if load.once(elapsed, done) == "kill":
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    load.events.append((time.time(), "service SIGKILLed, started again"))
                    proc = bench.service(db, config=config)
                time.sleep(0.5)
            end = time.time()
            totals = dict(conn.execute("SELECT state::text, count(*) FROM task GROUP BY 1").fetchall())
        time.sleep(2 * SCRAPE)  # the last scrapes in
        series = {panel["title"]: [[(legend(fmt, r["metric"]), r["values"]) for r in prometheus.query_range(expr, start, end)]
                                   for expr, fmt in expressions(panel)]
                  for panel in dashboard["panels"]}
        empty = [title for title, results in series.items() if not any(results)]
        when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        with bench.connect(db) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0].split()[0]
        note = (f"Rendered {when} by bench/dashboard.py on {machine()}, PostgreSQL {version}; Prometheus scraping "
                f"every {SCRAPE} s, metrics_refresh {SCRAPE} s. Rows at the end: "
                + ", ".join(f"{state} {n:,}" for state, n in sorted(totals.items())))
        draw(dashboard, series, start, end, load.events,
             f"{dashboard['title']}: {args.minutes:g} minutes of steady load, a slow group's backlog, "
             "a burst, a killed service", note, args.out)
        print(note)
        print(f"wrote {args.out}" + (f"; panels without data: {', '.join(empty)}" if empty else ""))
    finally:
        if proc is not None:
            bench.stop(proc)
        if prometheus is not None:
            prometheus.stop()
        bench.close()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
