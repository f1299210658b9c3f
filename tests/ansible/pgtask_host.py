"""Helpers of the modules that roll the playbook out on one booted host: the inventory and its run
(the ``deploy`` fixture in conftest.py), and what the tests ask of the host afterwards."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pgtask_nspawn
import yaml
from psycopg.sql import Literal
from pgtask_playbook import Run, run_playbook, wait_for

HOST = "box"
ENTRIES = [{"data": "postgres"}]

# Run on the host with the service's own venv: /metrics parsed by prometheus-client's parser, the
# samples of the entry's families and /healthz's status printed as JSON.
SCRAPE = """
import json, urllib.error, urllib.request
from prometheus_client.parser import text_string_to_metric_families
base = "http://127.0.0.1:9464"
text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
samples = [[s.name, s.labels, s.value] for f in text_string_to_metric_families(text) for s in f.samples]
try:
    health = urllib.request.urlopen(base + "/healthz", timeout=5).status
except urllib.error.HTTPError as exc:
    health = exc.code
print(json.dumps({"samples": samples, "health": health}))
"""


def deployer(host, wheelhouse, inv_dir: Path, **module_vars):
    """deploy(entries, *args, **extra_vars) writes the inventory for the booted host and runs the
    playbook; ``module_vars``: variables every run of the module sets (extra_vars win)."""

    def run(entries, *args: str, **extra_vars) -> Run:
        inventory = {
            "all": {
                "hosts": {HOST: {
                    "ansible_host": host.name,
                    "ansible_user": "root",
                    "ansible_python_interpreter": "/usr/bin/python3",
                    "ansible_ssh_private_key_file": str(pgtask_nspawn.ssh_key_path()),
                    "ansible_ssh_args": host.ssh_args(),
                }},
                "vars": {
                    "pgtask_manage_postgresql": True,
                    # the host has no network: its packages came with the root filesystem
                    "pgtask_apt_update_cache": False,
                    "pgtask_wheelhouse_dir": str(wheelhouse),
                    "pgtask_entries": entries,
                    "pgtask_sleep": 500,
                    "pgtask_grace": 5,
                    "pgtask_log_level": "debug",
                    **module_vars,
                    **extra_vars,
                },
                "children": {"pgtask_db": {"hosts": {HOST: {}}},
                             "pgtask_scheduler": {"hosts": {HOST: {}}}},
            }
        }
        path = inv_dir / "hosts.yml"
        path.write_text(yaml.safe_dump(inventory))
        return run_playbook(path, *args)

    return run


def scrape(host) -> dict | None:
    """/metrics samples ([name, labels, value]) and /healthz's status, as the host's service account
    reads them; None while the endpoint does not answer."""
    out = host.sh(f"/opt/pgtask/venv/bin/python -c {shlex.quote(SCRAPE)}", user="pgtask", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def psql(host, sql: str, db: str = "postgres") -> str:
    return host.sh(f"psql -XAtq -d {shlex.quote(db)} -c {shlex.quote(sql)}", user="postgres").stdout.strip()


def main_pid(host) -> int:
    return int(host.sh("systemctl show -P MainPID pgtask").stdout.strip())


def assert_ok(run: Run) -> dict[str, int]:
    recap = run.recap(HOST)
    assert run.rc == 0 and recap["failed"] == 0 and recap["unreachable"] == 0, run.output[-6000:]
    return recap


def journal(host) -> str:
    return host.sh("journalctl -u pgtask --no-pager -n 80", check=False).stdout


def installed_version(host) -> str:
    return host.sh("/opt/pgtask/venv/bin/python -c "
                   "'import importlib.metadata as m; print(m.version(\"pgtask\"))'").stdout.strip()


def wait_active(host, what: str) -> None:
    wait_for(lambda: host.sh("systemctl is-active pgtask", check=False).stdout.strip() == "active",
             30, f"pgtask to be active {what}")


def task_result(host, sql_input: str, db: str = "postgres", table: str = "task", user: str | None = None) -> str:
    """Insert a task and return "state|output" once it has finished (60 s at most)."""
    given = [sql_input] if user is None else [sql_input, user]
    columns = "(input)" if user is None else '(input, "user")'
    values = "(" + ", ".join(Literal(v).as_string(None) for v in given) + ")"
    task_id = int(psql(host, f"INSERT INTO {table} {columns} VALUES {values} RETURNING id", db=db))

    def state():
        s = psql(host, f"SELECT state, output FROM {table} WHERE id = {task_id}", db=db)
        return s if s.startswith(("DONE", "FAIL")) else None

    return wait_for(state, 60, f"task {task_id} in {db} to finish; journal:\n{journal(host)}")
