"""The playbook for real, on a booted Debian bookworm host with systemd as PID 1 (systemd-nspawn).

The tests of this module share one host and run in order: check mode on the fresh host, the first
run (PostgreSQL, pgtask from a wheelhouse built from this repository, provisioning, the unit), a task
reaching DONE, a second run with changed=0, check mode on the converged host, the unit verified by
systemd-analyze, then a new entry: the service reloads (same PID) and the entry is provisioned, and
then an upgrade to a new version: the venv is upgraded and the service restarted (new PID), and last
a server setting that needs a restart (listen_addresses): PostgreSQL restarts, the service goes on.
Then a run that both restarts and would reload the service (one restart, no SIGHUP after it), with an
entry that names only its database (its tasks log in as its own role), the startup setting removed
again (PostgreSQL restarts), and a second cluster whose restart check asks that cluster.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil

import pytest
import yaml
from pgtask_playbook import REPO, Run, run_playbook, wait_for

HOST = "box"
pytestmark = pytest.mark.timeout(900)

ENTRIES = [{"data": "postgres"}]
NEW_ENTRY = {"data": "app1", "user": "app1", "schema": "jobs", "table": "task", "sleep": 500}
# the manual's config level, through conf.d/pgtask.conf and a reload of PostgreSQL
PG_SETTINGS = {"pgtask_postgresql_settings": {"pg_task.timeout": "5 min"}}


@pytest.fixture(scope="module")
def deploy(host, wheelhouse, tmp_path_factory):
    """deploy(entries, *args) writes the inventory for the booted host and runs the playbook."""
    inv_dir = tmp_path_factory.mktemp("inventory")

    def run(entries, *args: str, **extra_vars) -> Run:
        inventory = {
            "all": {
                "hosts": {HOST: {
                    "ansible_host": host.name,
                    "ansible_user": "root",
                    "ansible_python_interpreter": "/usr/bin/python3",
                    "ansible_ssh_private_key_file": str(host_key()),
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


def host_key():
    import pgtask_nspawn

    return pgtask_nspawn.ssh_key_path()


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


def test_check_mode_on_a_fresh_host(host, deploy):
    run = deploy(ENTRIES, "--check", "--diff")
    recap = assert_ok(run)
    assert recap["changed"] > 0  # it would change things…
    assert host.sh("test -e /etc/pgtask/pgtask.toml", check=False).returncode != 0  # …and did not


def test_first_run_installs_and_starts_the_service(host, deploy):
    run = deploy(ENTRIES)
    recap = assert_ok(run)
    assert recap["changed"] > 0
    assert any("Provision" in name for name in run.changed_tasks()), run.changed_tasks()
    wait_for(lambda: host.sh("systemctl is-active pgtask", check=False).stdout.strip() == "active",
             30, "pgtask to be active")
    assert host.sh("stat -c '%a %U %G' /etc/pgtask/pgtask.toml /etc/pgtask/pgtask.env").stdout.split(
        "\n")[:2] == ["640 root pgtask", "640 root pgtask"]
    assert host.sh("stat -c %U /proc/$(systemctl show -P MainPID pgtask)").stdout.strip() == "pgtask"


def test_a_task_reaches_done(host):
    task_id = psql(host, "INSERT INTO task (input) VALUES ('SELECT 1') RETURNING id")

    def state():
        return psql(host, f"SELECT state, output FROM task WHERE id = {int(task_id)}")

    final = wait_for(lambda: (s := state()).startswith(("DONE", "FAIL")) and s, 60,
                     f"task {task_id} to finish; journal:\n{journal(host)}")
    assert final == "DONE|1", final


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


def test_the_metrics_endpoint_serves_the_entry(host):
    """The role's default pgtask_metrics_listen: /metrics on the host's loopback has the entry's
    families (its finished task counted), /healthz answers 200, and the alert rules and the
    dashboard are in pgtask_monitoring_dir."""
    entry = {"data": "postgres", "schema": "public", "table": "task"}
    done = int(psql(host, "SELECT count(*) FROM task WHERE state = 'DONE'"))

    def of_entry(got: dict) -> dict:
        return {(name, labels.get("state")): value for name, labels, value in got["samples"]
                if entry.items() <= labels.items()}

    def scraped():
        out = host.sh(f"/opt/pgtask/venv/bin/python -c {shlex.quote(SCRAPE)}", user="pgtask", check=False)
        if out.returncode != 0:
            return None
        got = json.loads(out.stdout)
        # the table's figures are read every metrics_refresh (10 s): wait for a reading of them
        return got if got["health"] == 200 and of_entry(got).get(("pgtask_tasks", "DONE")) == done else None

    got = wait_for(scraped, 60, f"/metrics with the entry's table figures and /healthz 200; journal:\n"
                                f"{journal(host)}")
    figures = of_entry(got)
    for family in ("pgtask_scheduler_up", "pgtask_last_claim_timestamp_seconds", "pgtask_claim_pass_seconds_count",
                   "pgtask_pickup_seconds_count", "pgtask_run_seconds_count"):
        assert (family, None) in figures, (family, sorted(figures))
    assert figures[("pgtask_scheduler_up", None)] == 1
    assert figures[("pgtask_finished_total", "DONE")] == done
    assert any(name == "process_resident_memory_bytes" for name, _, _ in got["samples"])
    assert host.sh("ls /etc/pgtask/monitoring").stdout.split() == ["pgtask-alerts.yml", "pgtask-dashboard.json"]


def test_second_run_changes_nothing(host, deploy):
    pid = main_pid(host)
    run = deploy(ENTRIES)
    recap = assert_ok(run)
    assert recap["changed"] == 0, run.changed_tasks()
    assert main_pid(host) == pid


def test_check_mode_on_the_converged_host(deploy):
    run = deploy(ENTRIES, "--check", "--diff")
    recap = assert_ok(run)
    assert recap["changed"] == 0, run.changed_tasks()


def test_rendered_unit_verifies(host):
    unit = host.sh("cat /etc/systemd/system/pgtask.service").stdout
    assert unit.startswith("#") and "Ansible managed" in unit
    res = host.sh("systemd-analyze verify --man=no /etc/systemd/system/pgtask.service", check=False)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    exposure = host.sh("systemd-analyze security --no-pager pgtask.service | tail -1", check=False).stdout
    print("systemd-analyze security:", exposure.strip())


def test_new_entry_reloads_and_is_provisioned(host, deploy):
    pid = main_pid(host)
    run = deploy([*ENTRIES, NEW_ENTRY], **PG_SETTINGS)
    recap = assert_ok(run)
    changed = run.changed_tasks()
    assert any("Reload pgtask" in name for name in changed), (changed, journal(host))
    assert not any("Restart pgtask" in name for name in changed), changed
    # The new entry is provisioned by the role's Provision task -- or, if the running service re-read
    # its configuration (every pg_conf.restart s) between the role writing it and that task, by the
    # service itself, and the task then rightly finds nothing to do.
    by_service = host.sh("journalctl -u pgtask --no-pager | grep -c 'provision: created database app1'",
                         check=False).stdout.strip() not in ("", "0")
    assert any("Provision" in name for name in changed) or by_service, (changed, journal(host))
    assert any("Reload PostgreSQL" in name for name in changed), changed
    # a reload is a SIGHUP: new sessions see it once the postmaster has read the files
    wait_for(lambda: psql(host, "SHOW pg_task.timeout") == "5 min", 15, "pg_task.timeout after reload")
    # reloaded, not restarted
    assert main_pid(host) == pid, journal(host)
    assert psql(host, "SELECT 1 FROM pg_roles WHERE rolname = 'app1'") == "1"
    assert psql(host, "SELECT to_regclass('jobs.task') IS NOT NULL", db="app1") == "t"
    # the new entry's scheduler runs tasks
    task_id = psql(host, "INSERT INTO jobs.task (input) VALUES ('SELECT 2') RETURNING id", db="app1")
    final = wait_for(
        lambda: (s := psql(host, f"SELECT state, output FROM jobs.task WHERE id = {int(task_id)}",
                           db="app1")).startswith(("DONE", "FAIL")) and s,
        60, f"task {task_id} in app1 to finish; journal:\n{journal(host)}")
    assert final == "DONE|2", final
    assert recap["changed"] >= 2
    again = deploy([*ENTRIES, NEW_ENTRY], **PG_SETTINGS)
    assert assert_ok(again)["changed"] == 0, again.changed_tasks()


def test_provision_report_is_json(host):
    out = host.sh("/opt/pgtask/venv/bin/pgtask provision --config /etc/pgtask/pgtask.toml --json",
                  user="pgtask").stdout
    report = json.loads(out)
    assert report["changed"] is False and report["actions"] == []


def installed_version(host) -> str:
    return host.sh("/opt/pgtask/venv/bin/python -c "
                   "'import importlib.metadata as m; print(m.version(\"pgtask\"))'").stdout.strip()


def test_upgrade_restarts_the_service(host, deploy, tmp_path):
    # a release newer than the one deployed: this checkout with another version number
    src = tmp_path / "src"
    for tree in ("pgtask", "notebooks"):
        shutil.copytree(REPO / tree, src / tree, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, src / name)
    pyproject = (src / "pyproject.toml").read_text()
    old = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE).group(1)
    new = f"{old}.post1"
    (src / "pyproject.toml").write_text(pyproject.replace(f'version = "{old}"', f'version = "{new}"', 1))
    assert installed_version(host) == old
    pid = main_pid(host)
    entries = [*ENTRIES, NEW_ENTRY]
    run = deploy(entries, pgtask_version=new, pgtask_source_dir=str(src), **PG_SETTINGS)
    assert_ok(run)
    changed = run.changed_tasks()
    assert any("Install pgtask into the venv" in name for name in changed), changed
    assert any("Restart pgtask" in name for name in changed), changed
    assert installed_version(host) == new
    wait_for(lambda: host.sh("systemctl is-active pgtask", check=False).stdout.strip() == "active",
             30, "pgtask to be active after the upgrade")
    assert main_pid(host) != pid
    task_id = psql(host, "INSERT INTO task (input) VALUES ('SELECT 3') RETURNING id")
    final = wait_for(lambda: (s := psql(host, f"SELECT state, output FROM task WHERE id = {int(task_id)}"))
                     .startswith(("DONE", "FAIL")) and s, 60, f"task {task_id} after the upgrade")
    assert final == "DONE|3", final
    again = deploy(entries, pgtask_version=new, pgtask_source_dir=str(src), **PG_SETTINGS)
    assert assert_ok(again)["changed"] == 0, again.changed_tasks()


def test_a_setting_that_needs_a_restart_restarts_postgresql(host, deploy):
    entries = [*ENTRIES, NEW_ENTRY]
    settings = {"pgtask_postgresql_settings": {"pg_task.timeout": "5 min", "listen_addresses": "*"}}
    started = psql(host, "SELECT pg_postmaster_start_time()")
    version = installed_version(host)
    run = deploy(entries, pgtask_version=version, pgtask_source_dir=str(REPO), **settings)
    assert_ok(run)
    changed = run.changed_tasks()
    assert any(name.endswith("Restart PostgreSQL") for name in changed), changed
    assert psql(host, "SHOW listen_addresses") == "*"
    assert psql(host, "SELECT pg_postmaster_start_time()") != started
    # the service outlives the server's restart and keeps running tasks
    task_id = psql(host, "INSERT INTO task (input) VALUES ('SELECT 4') RETURNING id")
    final = wait_for(lambda: (s := psql(host, f"SELECT state, output FROM task WHERE id = {int(task_id)}"))
                     .startswith(("DONE", "FAIL")) and s, 60,
                     f"task {task_id} after PostgreSQL restarted; journal:\n{journal(host)}")
    assert final == "DONE|4", final
    again = deploy(entries, pgtask_version=version, pgtask_source_dir=str(REPO), **settings)
    assert assert_ok(again)["changed"] == 0, again.changed_tasks()


def test_restart_and_reload_together_restart_only(host, deploy):
    """A run that changes both the environment (restart) and the config (reload): one restart, no
    SIGHUP on its heels (it can reach pgtask before its handler is installed and end it for good),
    and an entry with only `data` logs in as its own role (pg_ident maps it) instead of SET ROLE."""
    entries = [*ENTRIES, NEW_ENTRY, {"data": "app2"}]
    secret = "pgtask-e2e-secret-3f9c1d"
    pid = main_pid(host)
    run = deploy(entries, "-vvv", pgtask_environment={"PGPASSWORD": secret}, pgtask_sleep=400,
                 pgtask_postgresql_settings={"pg_task.timeout": "5 min", "listen_addresses": "*"})
    assert_ok(run)
    changed = run.changed_tasks()
    assert any("Restart pgtask" in name for name in changed), changed
    assert not any("Reload pgtask" in name for name in changed), changed
    # the password reached no command line and no log line, -vvv included
    assert secret not in run.output
    assert host.sh("grep -c pgtask-e2e-secret /etc/pgtask/pgtask.env").stdout.strip() == "1"
    wait_for(lambda: host.sh("systemctl is-active pgtask", check=False).stdout.strip() == "active",
             30, "pgtask to be active after the restart")
    assert main_pid(host) != pid
    # a task of app2 (postgres may name it: a member of every role) runs in a session app2 logged in
    # (execute_as auto: login, through pg_ident), not in the service's session after SET ROLE
    task_id = psql(host, "INSERT INTO task (input, \"user\") VALUES ('SELECT session_user', 'app2') "
                   "RETURNING id", db="app2")
    final = wait_for(
        lambda: (s := psql(host, f"SELECT state, output FROM task WHERE id = {int(task_id)}",
                           db="app2")).startswith(("DONE", "FAIL")) and s,
        60, f"task {task_id} in app2 to finish; journal:\n{journal(host)}")
    assert final == "DONE|app2", (final, journal(host))
    assert host.sh("systemctl is-active pgtask", check=False).stdout.strip() == "active", journal(host)


def test_a_removed_startup_setting_restarts_postgresql(host, deploy):
    entries = [*ENTRIES, NEW_ENTRY, {"data": "app2"}]
    assert psql(host, "SHOW listen_addresses") == "*"
    started = psql(host, "SELECT pg_postmaster_start_time()")
    run = deploy(entries, pgtask_environment={"PGPASSWORD": "pgtask-e2e-secret-3f9c1d"}, pgtask_sleep=400,
                 **PG_SETTINGS)
    assert_ok(run)
    changed = run.changed_tasks()
    assert any(name.endswith("Restart PostgreSQL") for name in changed), changed
    assert psql(host, "SHOW listen_addresses") == "localhost"
    assert psql(host, "SELECT pg_postmaster_start_time()") != started


def test_the_restart_check_asks_the_configured_cluster(host, deploy):
    """With two clusters, the check whether a setting needs a restart reads the configured one
    (psql alone would ask the default cluster, on port 5432)."""
    host.sh("pg_createcluster --start 15 other -- --no-sync >/dev/null")
    other = "SELECT pg_postmaster_start_time()"

    def psql_other(sql):
        return host.sh(f"psql -XAtq -p 5433 -c {shlex.quote(sql)}", user="postgres").stdout.strip()

    started, main_started = psql_other(other), psql(host, other)
    run = deploy([*ENTRIES, NEW_ENTRY, {"data": "app2"}], pgtask_postgresql_cluster="other",
                 pgtask_environment={"PGPASSWORD": "pgtask-e2e-secret-3f9c1d"}, pgtask_sleep=400,
                 pgtask_postgresql_settings={"listen_addresses": "*"})
    assert_ok(run)
    changed = run.changed_tasks()
    assert any(name.endswith("Restart PostgreSQL") for name in changed), changed
    assert psql_other("SHOW listen_addresses") == "*"
    assert psql_other(other) != started
    assert psql(host, other) == main_started


def test_a_cluster_that_does_not_come_up_fails_the_run_with_its_log(host, deploy):
    """A startup setting the server rejects: the restart that applies it, and the next run's start,
    fail right there (not tasks later at a missing socket), with the server's log lines."""
    entries = [*ENTRIES, NEW_ENTRY, {"data": "app2"}]
    common = {"pgtask_postgresql_cluster": "other", "pgtask_environment": {"PGPASSWORD": "pgtask-e2e-secret-3f9c1d"},
              "pgtask_sleep": 400}
    bad = {"listen_addresses": "*", "max_connections": "many"}
    for attempt in ("restart", "start"):
        run = deploy(entries, pgtask_postgresql_settings=bad, **common)
        assert run.rc != 0 and run.recap(HOST)["failed"] == 1, (attempt, run.output[-6000:])
        failed = run.output.split("fatal: [box]: FAILED!")[1]
        assert "does not accept connections" in failed and 'parameter \\"max_connections\\"' in failed, (
            attempt, run.output[-6000:])
        assert host.sh("systemctl is-active postgresql@15-other", check=False).stdout.strip() != "active"
    again = deploy(entries, pgtask_postgresql_settings={"listen_addresses": "*"}, **common)
    assert_ok(again)
    assert host.sh("systemctl is-active postgresql@15-other", check=False).stdout.strip() == "active"
