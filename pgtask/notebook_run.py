"""One scheduled run of notebooks/maintenance.ipynb for one entry (the appliance's
pgtask-maintenance@<entry> unit, roles/pgtask): papermill executes the notebook into a run directory
of its own, nbconvert writes an HTML copy beside it, and the outcome goes to the entry's run log,
``<schema>.<table>_maintenance_run`` (read by pgtask/metrics.py as
``pgtask_maintenance_last_success_timestamp_seconds``).

    python -m pgtask.notebook_run /etc/pgtask/maintenance/<entry>.json

The JSON file holds ``notebook``, ``runs_dir``, ``keep_days``, ``schedule`` (systemd's OnCalendar,
for the period the alert compares with) and ``parameters`` (the notebook's: ``dsn`` is a libpq
``service=<entry>``, the credentials are libpq's: peer or a passfile, never in here). Exit status 0
when the notebook's summary line is ``OK: …``; 1 when it is anything else or a cell failed (the
executed notebook and its HTML copy are written either way), so the unit shows failed.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from psycopg import sql

from pgtask import sql as named
from pgtask.sql import placeholders


def run_log(name: str, schema: str, table: str) -> sql.Composed:
    """A statement of sql/maintenance_run.sql on the entry's run log of maintenance runs, beside its
    task table."""
    return placeholders.render(named.query("maintenance_run.sql", name), schema, table)


def summary(executed: Path) -> str:
    """The notebook's verdict: the last ``OK…``/``NOT OK…`` line its last code cell printed ('' if none)."""
    found = ""
    cells = [c for c in json.loads(executed.read_text()).get("cells", []) if c.get("cell_type") == "code"]
    for cell in cells[-1:]:
        for out in cell.get("outputs", []):
            text = out.get("text", "") if out.get("output_type") == "stream" else ""
            for line in ("".join(text) if isinstance(text, list) else text).splitlines():
                if line.startswith(("OK", "NOT OK")):
                    found = line
    return found


def period_seconds(schedule: str) -> float | None:
    """The time between two elapses of an OnCalendar ``schedule`` (systemd-analyze's), or None."""
    try:
        out = subprocess.run(["systemd-analyze", "calendar", "--iterations=2", schedule], capture_output=True,
                             text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    stamps = [line.split(":", 1)[1].strip() for line in out.splitlines()
              if line.strip().startswith(("Next elapse:", "Iter. #2:"))]
    try:
        first, second = (datetime.strptime(s.rsplit(" ", 1)[0], "%a %Y-%m-%d %H:%M:%S") for s in stamps)
    except ValueError:
        return None
    return (second - first).total_seconds()


def prune(runs_dir: Path, keep_days: float, now: float) -> None:
    """Delete the run directories older than ``keep_days``."""
    for run in runs_dir.iterdir():
        if run.is_dir() and now - run.stat().st_mtime > keep_days * 86400:
            shutil.rmtree(run, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    import nbformat
    import papermill
    from nbconvert import HTMLExporter

    spec = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    params = spec["parameters"]
    runs_dir = Path(spec["runs_dir"])
    runs_dir.mkdir(parents=True, exist_ok=True)
    prune(runs_dir, float(spec["keep_days"]), time.time())
    started = datetime.now(UTC)
    run_dir = runs_dir / started.strftime("%Y%m%dT%H%M%SZ")
    run_dir.mkdir()
    executed = run_dir / "maintenance.ipynb"
    failure = ""
    try:
        papermill.execute_notebook(spec["notebook"], str(executed), parameters=params, cwd=str(run_dir),
                                   progress_bar=False, log_output=False)
    except papermill.PapermillExecutionError as exc:
        failure = f"NOT OK: cell {exc.exec_count} raised {exc.ename}: {exc.evalue}"
    except Exception as exc:  # the kernel did not start, died, … : a failed run, recorded as one
        failure = f"NOT OK: the notebook did not run: {type(exc).__name__}: {exc}"
    verdict = failure or summary(executed) or "NOT OK: the notebook printed no summary"
    if executed.exists():
        html, _ = HTMLExporter().from_notebook_node(nbformat.read(executed, as_version=4))
        (run_dir / "maintenance.html").write_text(html)
    ok = verdict.startswith("OK")
    with psycopg.connect(params["dsn"], autocommit=True,
                         application_name=f"pgtask maintenance {params['schema']} {params['table']}") as conn:
        conn.execute(run_log("create", params["schema"], params["table"]))
        conn.execute(run_log("insert", params["schema"], params["table"]),
                     {"started": started, "ok": ok, "summary": verdict,
                      "period": period_seconds(spec.get("schedule") or ""), "host": socket.gethostname(),
                      "run_dir": str(run_dir)})
    print(f"{verdict}\nrun: {run_dir}/maintenance.ipynb, {run_dir}/maintenance.html")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
