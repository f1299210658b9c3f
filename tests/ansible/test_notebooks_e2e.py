"""The notebooks on a host the playbook rolled out (issue 52, items 1, 2 and 4): a booted Debian
bookworm host (systemd-nspawn, no network: everything comes from the wheelhouse).

In order, on one host: check mode on the fresh host, the first run, the shipped notebooks read-only
beside a workspace the service account writes in, the headless notebook tools in the venv (no
JupyterLab), libpq's service file (`psql service=<entry>` as the service account, no password in
it), the maintenance unit started by hand (an executed notebook and its HTML copy, OK), the metric
of its last success, a planted NOT OK (a long transaction holding the rows a purge deleted) failing
the unit, a second run that changes nothing, an entry added and removed again (its timer goes), and
the passfile (pgtask_pgpass) logging the service account in, gone with its lines.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest
from pgtask_playbook import wait_for
from test_e2e import SCRAPE, assert_ok, deploy, psql  # noqa: F401 (deploy: a fixture)

pytestmark = pytest.mark.timeout(900)

ENTRIES = [{"data": "postgres"}]
SERVICE = "postgres"  # the entry's libpq service and its timer's instance
UNIT = f"pgtask-maintenance@{SERVICE}"
RUNS = f"/var/lib/pgtask/maintenance/{SERVICE}"
# the runs do what they report (the NOT OK below needs the purge and VACUUM), hourly
VARS = {"pgtask_maintenance_overrides": {SERVICE: {"dry_run": False, "schedule": "hourly"}}}


def run_dirs(host) -> list[str]:
    return host.sh(f"ls -1 {RUNS}", check=False).stdout.split()


def start_maintenance(host):
    """The unit started by hand, as its timer would: returns when the oneshot run has ended."""
    return host.sh(f"systemctl start {UNIT}.service", check=False, timeout=300)


def maintenance_metric(host) -> dict[str, float]:
    out = host.sh(f"/opt/pgtask/venv/bin/python -c {shlex.quote(SCRAPE)}", user="pgtask", check=False)
    if out.returncode != 0:
        return {}
    return {name: value for name, labels, value in json.loads(out.stdout)["samples"]
            if name.startswith("pgtask_maintenance_") and labels.get("data") == "postgres"
            and labels.get("table") == "task"}


def test_check_mode_on_a_fresh_host(host, deploy):
    run = deploy(ENTRIES, "--check", **VARS)
    assert assert_ok(run)["changed"] > 0
    assert host.sh("test -e /opt/pgtask/notebooks", check=False).returncode != 0


def test_first_run_puts_the_notebooks_in_place(host, deploy):
    assert_ok(deploy(ENTRIES, **VARS))
    shipped = host.sh("cd /opt/pgtask/notebooks && stat -c '%n %a %U' *.ipynb").stdout.splitlines()
    assert "maintenance.ipynb 644 root" in shipped and "queue_inspection.ipynb 644 root" in shipped, shipped
    assert all(line.endswith(" 644 root") for line in shipped), shipped
    # read-only for the service account, its workspace writable
    assert host.sh("touch /opt/pgtask/notebooks/x.ipynb", user="pgtask", check=False).returncode != 0
    host.sh("touch /var/lib/pgtask/notebooks/mine.ipynb && rm /var/lib/pgtask/notebooks/mine.ipynb", user="pgtask")
    # headless tools in the service's venv, not JupyterLab
    venv = "/opt/pgtask/venv/bin/python -c "
    host.sh(venv + shlex.quote("import papermill, nbconvert, pandas, matplotlib, ipykernel, pgtask"), user="pgtask")
    assert host.sh(venv + shlex.quote("import jupyterlab"), check=False).returncode != 0


def test_the_service_file_reaches_the_entry(host):
    got = host.sh("psql -XAtq 'service=postgres' -c 'SELECT current_user, current_database()'",
                  user="pgtask").stdout.strip()
    assert got == "postgres|postgres", got
    text = host.sh("cat /etc/pgtask/pg_service.conf").stdout
    assert "[postgres]" in text and not re.search(r"^\s*password\s*=", text, re.MULTILINE), text
    assert host.sh("stat -c '%a %U %G' /etc/pgtask/pg_service.conf").stdout.strip() == "640 root pgtask"
    env = host.sh("systemctl show -P Environment pgtask").stdout
    assert "PGSERVICEFILE=/etc/pgtask/pg_service.conf" in env, env


def test_the_maintenance_unit_writes_an_ok_run(host):
    assert host.sh(f"systemctl is-enabled {UNIT}.timer").stdout.strip() == "enabled"
    assert host.sh(f"systemctl is-active {UNIT}.timer").stdout.strip() == "active"
    res = start_maintenance(host)
    log = host.sh(f"journalctl -u {UNIT} --no-pager -n 40", check=False).stdout
    if res.returncode != 0:
        pytest.fail(f"{UNIT} failed:\n{log}\n" + host.sh(f"ls -lR {RUNS}; systemctl status {UNIT} --no-pager",
                                                           check=False).stdout)
    (run,) = run_dirs(host)
    files = host.sh(f"ls -1 {RUNS}/{run}").stdout.split()
    assert files == ["maintenance.html", "maintenance.ipynb"], files
    html = host.sh(f"cat {RUNS}/{run}/maintenance.html").stdout
    # the summary is an output line of its own (the cell's earlier prints may share its <pre>); the
    # cells' source holds the text "NOT OK" too, never at the start of an output line
    assert "<html" in html and re.search(r"(?m)^(<pre>)?OK: maintenance done$", html), html[-3000:]
    assert not re.search(r"(?m)^(<pre>)?NOT OK", html), html[-3000:]
    assert "OK: maintenance done" in log, log
    assert psql(host, "SELECT ok FROM task_maintenance_run") == "t"


def test_the_metric_shows_the_last_success(host):
    finished = float(psql(host, "SELECT extract(epoch FROM finished) FROM task_maintenance_run WHERE ok"))
    got = wait_for(lambda: (m := maintenance_metric(host)).get(
        "pgtask_maintenance_last_success_timestamp_seconds") == pytest.approx(finished) and m, 60,
        "pgtask_maintenance_last_success_timestamp_seconds of the run")
    assert got["pgtask_maintenance_period_seconds"] == 3600  # hourly


def test_a_not_ok_summary_fails_the_unit(host):
    """Finished rows the purge deletes, while a transaction older than the purge still sees them:
    VACUUM cannot remove them, the notebook says NOT OK, the unit fails; the metric keeps the last
    success."""
    before = maintenance_metric(host)["pgtask_maintenance_last_success_timestamp_seconds"]
    psql(host, "INSERT INTO task (input, state, stop) SELECT 'SELECT 1', 'DONE', now() - interval '8 days' "
               "FROM generate_series(1, 2000)")
    host.sh("systemd-run --unit=pgtask-test-holder --uid=postgres -p Environment=PGAPPNAME=holder "
            "psql -XAtq -d postgres -c 'BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM task; "
            "SELECT pg_sleep(600);'")
    try:
        wait_for(lambda: psql(host, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'holder' "
                                    "AND backend_xmin IS NOT NULL") == "1", 30, "the holder's snapshot")
        res = start_maintenance(host)
        assert res.returncode != 0
        assert host.sh(f"systemctl is-failed {UNIT}.service", check=False).stdout.strip() == "failed"
        newest = sorted(run_dirs(host))[-1]
        html = host.sh(f"cat {RUNS}/{newest}/maintenance.html").stdout
        assert "NOT OK: VACUUM left 2,000 dead rows" in html, html[-3000:]
        assert host.sh(f"test -s {RUNS}/{newest}/maintenance.ipynb", check=False).returncode == 0
        assert psql(host, "SELECT string_agg(ok::text, ',' ORDER BY id) FROM task_maintenance_run") == "true,false"
    finally:
        host.sh("systemctl stop pgtask-test-holder", check=False)
    host.sh(f"systemctl reset-failed {UNIT}.service")
    # the figure is re-read every metrics_refresh: it stays the OK run's
    wait_for(lambda: maintenance_metric(host).get("pgtask_maintenance_last_success_timestamp_seconds") == before,
             30, "the last success to stay")


def test_second_run_changes_nothing(host, deploy):
    run = deploy(ENTRIES, **VARS)
    assert assert_ok(run)["changed"] == 0, run.changed_tasks()
    # the operators' workspace and the run records are where they were
    assert len(run_dirs(host)) == 2


def test_check_mode_on_the_converged_host(deploy):
    run = deploy(ENTRIES, "--check", **VARS)
    assert assert_ok(run)["changed"] == 0, run.changed_tasks()


def timer_files(host) -> list[str]:
    return host.sh("cd /etc/systemd/system && ls -1 pgtask-maintenance@*.timer", check=False).stdout.split()


def test_a_removed_entry_loses_its_timer(host, deploy):
    """An entry added gets a timer and a run's parameters; removed again, both go (the timer stopped
    first), the other entry's stay, and the rollout after that changes nothing."""
    extra = {"data": "app1"}
    assert_ok(deploy([*ENTRIES, extra], **VARS))
    assert timer_files(host) == ["pgtask-maintenance@app1.timer", f"{UNIT}.timer"]
    assert host.sh("systemctl is-active pgtask-maintenance@app1.timer").stdout.strip() == "active"
    host.sh("test -f /etc/pgtask/maintenance/app1.json")
    run = deploy(ENTRIES, **VARS)
    assert any("Stop the maintenance timers" in name for name in run.changed_tasks()), run.changed_tasks()
    assert timer_files(host) == [f"{UNIT}.timer"]
    assert host.sh("systemctl is-active pgtask-maintenance@app1.timer", check=False).stdout.strip() == "inactive"
    assert host.sh("test -e /etc/pgtask/maintenance/app1.json", check=False).returncode != 0
    assert host.sh(f"systemctl is-active {UNIT}.timer").stdout.strip() == "active"
    again = deploy(ENTRIES, **VARS)
    assert assert_ok(again)["changed"] == 0, again.changed_tasks()


def test_the_passfile_logs_the_service_account_in(host, deploy):
    """pgtask_pgpass: the service account's 0600 passfile, a password with ':' and '\\' in it escaped
    as libpq reads them; libpq logs in with it over TCP (scram-sha-256, never prompting); the run's
    output never shows it; and with no lines any more the file is gone."""
    password = "pa:ss\\word-3f9c1d"
    psql(host, f"CREATE ROLE pw_reader LOGIN PASSWORD '{password}'")
    run = deploy(ENTRIES, pgtask_pgpass=[{"host": "127.0.0.1", "database": "postgres", "user": "pw_reader",
                                          "password": password}], **VARS)
    assert_ok(run)
    assert password not in run.output and "ss\\\\word" not in run.output
    assert host.sh("stat -c '%a %U' /var/lib/pgtask/.pgpass").stdout.strip() == "600 pgtask"
    login = "psql -XAtqw 'host=127.0.0.1 dbname=postgres user=pw_reader' -c 'SELECT current_user'"
    assert host.sh(login, user="pgtask").stdout.strip() == "pw_reader"
    assert_ok(deploy(ENTRIES, **VARS))
    assert host.sh("test -e /var/lib/pgtask/.pgpass", check=False).returncode != 0
    assert host.sh(login, user="pgtask", check=False).returncode != 0
