"""The playbook for real, on a booted Debian bookworm host with systemd as PID 1 (systemd-nspawn):
a host's life from nothing to its second entry.

The tests of this module share one host and run in order: check mode on the fresh host, the first
run (PostgreSQL, pgtask from a wheelhouse built from this repository, provisioning, the unit), a task
reaching DONE, the metrics endpoint, a second run with changed=0, check mode on the converged host,
the unit verified by systemd-analyze, then a new entry: the service reloads (same PID) and the entry
is provisioned. test_e2e_restarts.py goes on from a deployed host: upgrades and restarts.
"""

from __future__ import annotations

import json

import pytest
from pgtask_host import ENTRIES, assert_ok, journal, main_pid, psql, scrape, task_result, wait_active
from pgtask_playbook import wait_for

pytestmark = pytest.mark.timeout(900)

NEW_ENTRY = {"data": "app1", "user": "app1", "schema": "jobs", "table": "task", "sleep": 500}
# the manual's config level, through conf.d/pgtask.conf and a reload of PostgreSQL
PG_SETTINGS = {"pgtask_postgresql_settings": {"pg_task.timeout": "5 min"}}


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
    wait_active(host, "after the first run")
    assert host.sh("stat -c '%a %U %G' /etc/pgtask/pgtask.toml /etc/pgtask/pgtask.env").stdout.split(
        "\n")[:2] == ["640 root pgtask", "640 root pgtask"]
    assert host.sh("stat -c %U /proc/$(systemctl show -P MainPID pgtask)").stdout.strip() == "pgtask"


def test_a_task_reaches_done(host):
    final = task_result(host, "SELECT 1")
    assert final == "DONE|1", final


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
        got = scrape(host)
        # the table's figures are read every metrics_refresh (10 s): wait for a reading of them
        return got if got is not None and got["health"] == 200 and of_entry(got).get(("pgtask_tasks", "DONE")) == done else None

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
    final = task_result(host, "SELECT 2", db="app1", table="jobs.task")
    assert final == "DONE|2", final
    assert recap["changed"] >= 2
    again = deploy([*ENTRIES, NEW_ENTRY], **PG_SETTINGS)
    assert assert_ok(again)["changed"] == 0, again.changed_tasks()


def test_provision_report_is_json(host):
    out = host.sh("/opt/pgtask/venv/bin/pgtask provision --config /etc/pgtask/pgtask.toml --json",
                  user="pgtask").stdout
    report = json.loads(out)
    assert report["changed"] is False and report["actions"] == []
