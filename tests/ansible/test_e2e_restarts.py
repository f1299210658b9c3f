"""The playbook on a deployed host (systemd-nspawn, Debian bookworm), when what it rolls out changes:
an upgrade to a new version (the venv upgraded, the service restarted: new PID), a server setting
that needs a restart (listen_addresses: PostgreSQL restarts, the service goes on), a run that both
restarts and would reload the service (one restart, no SIGHUP after it) with an entry that names
only its database (its tasks log in as its own role), the startup setting removed again (PostgreSQL
restarts), and a second cluster: its restart check asks that cluster, and a setting it rejects
fails the run with its log. The tests share one host and run in order. JupyterLab is off here: the
lab and its console are test_notebooks_e2e.py's, and each run would check its venv and units again.
"""

from __future__ import annotations

import re
import shlex
import shutil

import pytest
from pgtask_host import (HOST, assert_ok, deployer, installed_version, journal, main_pid, psql, task_result,
                         wait_active)
from pgtask_playbook import REPO

pytestmark = pytest.mark.timeout(900)

# the two entries test_e2e.py ends with, both from the first run here
ENTRIES = [{"data": "postgres"}, {"data": "app1", "user": "app1", "schema": "jobs", "table": "task", "sleep": 500}]
PG_SETTINGS = {"pgtask_postgresql_settings": {"pg_task.timeout": "5 min"}}


@pytest.fixture(scope="module")
def deploy(host, wheelhouse, tmp_path_factory):
    return deployer(host, wheelhouse, tmp_path_factory.mktemp("inventory"), pgtask_lab=False)


def test_a_host_with_two_entries_comes_up(host, deploy):
    """The first run with two entries and a server setting: both entries provisioned and running."""
    assert_ok(deploy(ENTRIES, **PG_SETTINGS))
    wait_active(host, "after the first run")
    assert psql(host, "SHOW pg_task.timeout") == "5 min"
    assert task_result(host, "SELECT 1") == "DONE|1"
    assert task_result(host, "SELECT 2", db="app1", table="jobs.task") == "DONE|2"


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
    entries = ENTRIES
    run = deploy(entries, pgtask_version=new, pgtask_source_dir=str(src), **PG_SETTINGS)
    assert_ok(run)
    changed = run.changed_tasks()
    assert any("Install pgtask into the venv" in name for name in changed), changed
    assert any("Restart pgtask" in name for name in changed), changed
    assert installed_version(host) == new
    wait_active(host, "after the upgrade")
    assert main_pid(host) != pid
    final = task_result(host, "SELECT 3")
    assert final == "DONE|3", final
    again = deploy(entries, pgtask_version=new, pgtask_source_dir=str(src), **PG_SETTINGS)
    assert assert_ok(again)["changed"] == 0, again.changed_tasks()


def test_a_setting_that_needs_a_restart_restarts_postgresql(host, deploy):
    entries = ENTRIES
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
    final = task_result(host, "SELECT 4")
    assert final == "DONE|4", final
    again = deploy(entries, pgtask_version=version, pgtask_source_dir=str(REPO), **settings)
    assert assert_ok(again)["changed"] == 0, again.changed_tasks()


def test_restart_and_reload_together_restart_only(host, deploy):
    """A run that changes both the environment (restart) and the config (reload): one restart, no
    SIGHUP on its heels (it can reach pgtask before its handler is installed and end it for good),
    and an entry with only `data` logs in as its own role (pg_ident maps it) instead of SET ROLE."""
    entries = [*ENTRIES, {"data": "app2"}]
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
    wait_active(host, "after the restart")
    assert main_pid(host) != pid
    # a task of app2 (postgres may name it: a member of every role) runs in a session app2 logged in
    # (execute_as auto: login, through pg_ident), not in the service's session after SET ROLE
    final = task_result(host, "SELECT session_user", db="app2", user="app2")
    assert final == "DONE|app2", (final, journal(host))
    assert host.sh("systemctl is-active pgtask", check=False).stdout.strip() == "active", journal(host)


def test_a_removed_startup_setting_restarts_postgresql(host, deploy):
    entries = [*ENTRIES, {"data": "app2"}]
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
    run = deploy([*ENTRIES, {"data": "app2"}], pgtask_postgresql_cluster="other",
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
    entries = [*ENTRIES, {"data": "app2"}]
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
