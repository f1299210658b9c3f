"""The notebooks on a host the playbook rolled out: a booted Debian bookworm host (systemd-nspawn, no
network: everything comes from the wheelhouse).

In order, on one host: check mode on the fresh host, the first run, the shipped notebooks read-only
beside a workspace the service account writes in, the headless notebook tools in the venv (no
JupyterLab), libpq's service file (`psql service=<entry>` as the service account, no password in
it), the maintenance unit started by hand (an executed notebook and its HTML copy, OK), the metric
of its last success, a planted NOT OK (a long transaction holding the rows a purge deleted) failing
the unit.

JupyterLab is in the rollouts up to there: its own account and venv, a generated password whose
clear text only root reads, an unauthenticated request refused, and a headless Chromium (Debian's
/usr/bin/chromium driven by Playwright) reaching it through `ssh -L`, as an operator does, logging in,
running queue_inspection.ipynb and finding its summary and figure on the page, and the console behind
the lab's password. Then a second run and check mode change nothing, and, turned off, the lab's units
go. With the lab off: an entry added and removed again (its timer goes), and the passfile
(pgtask_pgpass) logging the service account in, gone with its lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import socket
import subprocess
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest
import pgtask_nspawn
from pgtask_playbook import wait_for
from pgtask_host import assert_ok, psql, scrape

pytestmark = pytest.mark.timeout(900)

ENTRIES = [{"data": "postgres"}]
SERVICE = "postgres"  # the entry's libpq service and its timer's instance
UNIT = f"pgtask-maintenance@{SERVICE}"
RUNS = f"/var/lib/pgtask/maintenance/{SERVICE}"
# the runs do what they report (the NOT OK below needs the purge and VACUUM), hourly at the minute half
# an hour from now: the timer starts no run of its own while the module runs (a quarter of an hour),
# which would add a run directory and a run-log row to those the tests count
SCHEDULE = f"*-*-* *:{(datetime.now(timezone.utc).minute + 30) % 60:02d}:00 UTC"
VARS = {"pgtask_maintenance_overrides": {SERVICE: {"dry_run": False, "schedule": SCHEDULE}}}
# the tests after test_turned_off_the_lab_goes: the lab is gone (and their runs skip its tasks)
VARS_LAB_OFF = {**VARS, "pgtask_lab": False}


def run_dirs(host) -> list[str]:
    return host.sh(f"ls -1 {RUNS}", check=False).stdout.split()


def start_maintenance(host):
    """The unit started by hand, as its timer would: returns when the oneshot run has ended."""
    return host.sh(f"systemctl start {UNIT}.service", check=False, timeout=300)


def maintenance_metric(host) -> dict[str, float]:
    got = scrape(host)
    if got is None:
        return {}
    return {name: value for name, labels, value in got["samples"]
            if name.startswith("pgtask_maintenance_") and labels.get("data") == "postgres"
            and labels.get("table") == "task"}


def test_check_mode_on_a_fresh_host(host, deploy):
    run = deploy(ENTRIES, "--check", **VARS)
    assert assert_ok(run)["changed"] > 0
    assert host.sh("test -e /opt/pgtask/notebooks", check=False).returncode != 0


def test_first_run_puts_the_notebooks_in_place(host, deploy):
    run = deploy(ENTRIES, **VARS)
    assert_ok(run)
    # the generated password: where it is, never what it is
    assert f"JupyterLab's password is in {LAB_PASSWORD}" in run.output, run.output[-3000:]
    assert lab_password(host) not in run.output
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


# --- JupyterLab ----------------------------------------------------------------------------------
LAB_PORT = 8888
LAB_PASSWORD = "/etc/pgtask/jupyter/password"
CHROMIUM = "/usr/bin/chromium"
LAB_DEADLINE = 120  # seconds for the lab to answer, the kernel to start, the notebook to run
# where the browser's screenshot goes (docs/lab-queue-inspection.png is a copy of one)
SCREENSHOT_DIR = os.environ.get("PGTASK_LAB_SCREENSHOT_DIR")


def lab_password(host) -> str:
    return host.sh(f"cat {LAB_PASSWORD}").stdout.strip()


def lab_get(url: str) -> tuple[int, dict[str, str]]:
    """The status and headers of a GET that follows no redirect."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect)
    try:
        with opener.open(url, timeout=10) as res:
            return res.status, dict(res.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


@contextlib.contextmanager
def ssh_forward(host, remote_port: int):
    """`ssh -N -L` to the host, as an operator reaches the lab: a loopback port on this machine
    leads to the host's own 127.0.0.1:<remote_port> (sshd connects there inside the host)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = ["ssh", "-N", "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes",
           "-o", "ControlMaster=no", "-o", "ControlPath=none",
           "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
           "-o", f"ProxyCommand=nsenter -t {host.pid} -a /usr/sbin/sshd -i",
           "-i", str(pgtask_nspawn.ssh_key_path()),
           "-L", f"127.0.0.1:{port}:127.0.0.1:{remote_port}", f"root@{host.name}"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    base = f"http://127.0.0.1:{port}"

    def answers():
        if proc.poll() is not None:
            raise AssertionError(f"ssh -L exited {proc.returncode}: {proc.stderr.read()}")
        try:
            return lab_get(base + "/login")[0] == 200
        except OSError:  # not forwarding yet, or the lab not listening yet
            return False

    try:
        try:
            wait_for(answers, LAB_DEADLINE, "the lab's /login through ssh -L")
        except AssertionError as exc:
            journal = host.sh("journalctl -u pgtask-lab --no-pager -n 40", check=False).stdout
            raise AssertionError(f"{exc}; the lab's journal:\n{journal}") from None
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def lab(host):
    with ssh_forward(host, LAB_PORT) as base:
        yield base


def test_the_lab_runs_as_its_own_account(host):
    assert host.sh("systemctl is-active pgtask-lab").stdout.strip() == "active"
    assert host.sh("systemctl is-enabled pgtask-lab").stdout.strip() == "enabled"
    pid = host.sh("systemctl show -P MainPID pgtask-lab").stdout.strip()
    assert host.sh(f"stat -c %U /proc/{pid}").stdout.strip() == "pgtask-lab"
    groups = host.sh("id -nG pgtask-lab").stdout.split()
    assert "pgtask" in groups and "root" not in groups, groups
    # the clear text for root only, its hash in the lab's configuration
    assert host.sh(f"stat -c '%a %U %G' {LAB_PASSWORD}").stdout.strip() == "600 root root"
    config = json.loads(host.sh("cat /etc/pgtask/jupyter/jupyter_server_config.json").stdout)
    assert config["PasswordIdentityProvider"]["hashed_password"].startswith("argon2:"), config
    assert config["ServerApp"]["ip"] == "127.0.0.1" and config["ServerApp"]["port"] == LAB_PORT
    # the kernel's Python: pgtask importable, the service file on libpq's path
    env = host.sh("systemctl show -P Environment pgtask-lab").stdout
    assert "PGSERVICEFILE=/etc/pgtask/pg_service.conf" in env, env
    host.sh("/opt/pgtask/lab-venv/bin/python -c 'import pgtask, jupyterlab, ipykernel'", user="pgtask-lab")
    # the workspace starts with copies of the shipped notebooks
    listing = host.sh("stat -c '%n %U %G' /var/lib/pgtask/notebooks/*.ipynb").stdout
    assert "/var/lib/pgtask/notebooks/queue_inspection.ipynb pgtask-lab pgtask" in listing, listing
    # the hardening systemd applied
    for prop, want in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("PrivateTmp", "yes"),
                       ("ProtectHome", "yes")):
        assert host.sh(f"systemctl show -P {prop} pgtask-lab").stdout.strip() == want, prop


def test_the_lab_refuses_an_unauthenticated_request(lab):
    status, _ = lab_get(lab + "/api/contents")
    assert status == 403, status
    status, headers = lab_get(lab + "/lab")
    assert status == 302 and headers.get("Location", "").startswith("/login"), (status, headers)
    status, _ = lab_get(lab + "/api/contents?token=")
    assert status == 403, status


def test_a_browser_runs_the_queue_inspection(host, lab, tmp_path_factory):
    """Chromium logs in with the generated password, opens the workspace's queue_inspection.ipynb,
    runs all its cells (Run > Run All Cells), and the page shows the summary line and the figure."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} missing: scripts/bootstrap test installs Debian's chromium")
    from playwright.sync_api import expect, sync_playwright

    # something to inspect: tasks that ran, some of them failed
    psql(host, "INSERT INTO task (input) SELECT 'SELECT 1' FROM generate_series(1, 40)")
    psql(host, "INSERT INTO task (input) SELECT 'SELECT 1/0' FROM generate_series(1, 5)")
    wait_for(lambda: psql(host, "SELECT count(*) FROM task WHERE state NOT IN ('DONE', 'FAIL')") == "0",
             60, "the tasks to finish")
    shots = Path(SCREENSHOT_DIR) if SCREENSHOT_DIR else tmp_path_factory.mktemp("lab")
    shots.mkdir(parents=True, exist_ok=True)
    timeout = LAB_DEADLINE * 1000
    expect.set_options(timeout=timeout)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-proxy-server"])
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        page.set_default_timeout(timeout)
        try:
            page.goto(lab + "/login?next=%2Flab%2Ftree%2Fqueue_inspection.ipynb")
            page.fill("input[name=password]", lab_password(host))
            page.click("#login_submit")
            page.wait_for_url("**/lab/tree/queue_inspection.ipynb*")
            notebook = page.locator(".jp-NotebookPanel")
            expect(notebook.locator(".jp-Cell").first).to_be_visible()
            # the status bar says Idle once the kernel is connected: Run All before that runs nothing
            idle = page.locator(".jp-StatusBar-TextItem",
                                has_text=re.compile(r"^Python 3 \(ipykernel\) \| Idle$"))
            expect(idle).to_have_count(1)
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            outputs = notebook.locator(".jp-OutputArea-output")
            summary = outputs.filter(
                has_text=re.compile(r"rows in the table; [\d,]+ tasks ran in the last 1 hour"))
            expect(summary).to_have_count(1)
            text = summary.inner_text()
            assert re.search(r"(?m)^(OK|NOT OK): ", text), text
            figure = outputs.locator("img")
            expect(figure).to_have_count(1)
            expect(idle).to_have_count(1)
            # the figure and the summary below it, as an operator sees them (file browser folded away)
            page.keyboard.press("Control+b")
            summary.evaluate("e => e.scrollIntoView({block: 'end'})")
            box = figure.bounding_box()
            assert box and box["width"] > 200 and box["height"] > 200, box
            page.screenshot(path=str(shots / "lab-queue-inspection.png"))
        except Exception as exc:
            page.screenshot(path=str(shots / "lab-failed.png"))
            errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            raise AssertionError(f"{exc}\nerror outputs: {errors.all_inner_texts()}\n"
                                 f"the page as it was: {shots / 'lab-failed.png'}") from None
        finally:
            browser.close()


CONSOLE_PORT = 8866


def test_a_browser_opens_the_console_behind_the_labs_password(host, tmp_path_factory):
    """The console's own unit (Voila, the lab's account and password, 127.0.0.1): a request without
    the password goes to the login; Chromium logs in and the page shows the verdict of the entry."""
    assert host.sh("systemctl is-active pgtask-console").stdout.strip() == "active"
    pid = host.sh("systemctl show -P MainPID pgtask-console").stdout.strip()
    assert host.sh(f"stat -c %U /proc/{pid}").stdout.strip() == "pgtask-lab"
    config = json.loads(host.sh("cat /etc/pgtask/console/voila.json").stdout)
    lab_config = json.loads(host.sh("cat /etc/pgtask/jupyter/jupyter_server_config.json").stdout)
    assert config["PasswordIdentityProvider"]["hashed_password"] == \
        lab_config["PasswordIdentityProvider"]["hashed_password"]
    assert (config["Voila"]["ip"], config["Voila"]["port"]) == ("127.0.0.1", CONSOLE_PORT)
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} missing: scripts/bootstrap test installs Debian's chromium")
    from playwright.sync_api import expect, sync_playwright

    shots = tmp_path_factory.mktemp("console")
    with ssh_forward(host, CONSOLE_PORT) as console:
        wait_for(lambda: lab_get_quiet(console + "/login") == 200, LAB_DEADLINE, "the console to answer")
        status, headers = lab_get(console + "/")
        assert status == 302 and headers.get("Location", "").startswith("/login"), (status, headers)
        timeout = LAB_DEADLINE * 1000
        expect.set_options(timeout=timeout)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-proxy-server"])
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(timeout)
            try:
                page.goto(console + "/login?next=%2F")
                page.fill("input[name=password]", lab_password(host))
                page.click("#login_submit")
                expect(page.locator(".pgtask-verdict")).to_contain_text(re.compile(r"(OK|NOT OK): "))
                page.screenshot(path=str(shots / "console.png"))
            except Exception as exc:
                page.screenshot(path=str(shots / "console-failed.png"))
                journal = host.sh("journalctl -u pgtask-console --no-pager", check=False).stdout
                raise AssertionError(f"{exc}\nthe page: {shots / 'console-failed.png'}\n"
                                     f"the console's journal:\n{journal[-3000:]}") from None
            finally:
                browser.close()


def test_the_lab_starts_again_after_a_kernel_ran(host, lab):
    """A kernel leaves ~/.ipython behind, which jupyter_core offers to migrate at the next start: the
    lab must start again all the same (its config dir is read-only to it)."""
    host.sh("test -d /var/lib/pgtask-lab/.ipython")
    since = host.sh("date '+%F %T'").stdout.strip()
    host.sh("systemctl restart pgtask-lab")
    try:
        wait_for(lambda: lab_get_quiet(lab + "/login") == 200, LAB_DEADLINE,
                 "the lab to answer after its restart")
    except AssertionError as exc:
        journal = host.sh(f"journalctl -u pgtask-lab --no-pager --since '{since}'", check=False).stdout
        raise AssertionError(f"{exc}; the lab's journal:\n{journal[-4000:]}") from None
    assert host.sh("systemctl is-active pgtask-lab").stdout.strip() == "active"


def lab_get_quiet(url: str) -> int | None:
    try:
        return lab_get(url)[0]
    except OSError:
        return None


def test_second_run_changes_nothing(host, deploy):
    run = deploy(ENTRIES, **VARS)
    assert assert_ok(run)["changed"] == 0, run.changed_tasks()
    # the operators' workspace and the run records are where they were
    assert len(run_dirs(host)) == 2


def test_check_mode_on_the_converged_host(deploy):
    run = deploy(ENTRIES, "--check", **VARS)
    assert assert_ok(run)["changed"] == 0, run.changed_tasks()


def test_turned_off_the_lab_goes(host, deploy):
    """pgtask_lab false: the unit stopped, disabled and removed, with its configuration, password and
    venv; nothing listens on its port; the rollout after that changes nothing."""
    assert_ok(deploy(ENTRIES, **VARS_LAB_OFF))
    assert host.sh("systemctl is-active pgtask-lab", check=False).stdout.strip() in ("inactive", "unknown")
    assert host.sh("systemctl is-active pgtask-console", check=False).stdout.strip() in ("inactive", "unknown")
    for path in ("/etc/systemd/system/pgtask-lab.service", "/etc/pgtask/jupyter", "/opt/pgtask/lab-venv",
                 "/etc/systemd/system/pgtask-console.service", "/etc/pgtask/console"):
        assert host.sh(f"test -e {path}", check=False).returncode != 0, path
    probe = f"import socket; socket.create_connection(('127.0.0.1', {LAB_PORT}), 5)"
    assert host.sh(f"python3 -c {shlex.quote(probe)}", check=False).returncode != 0
    assert host.sh("systemctl is-active pgtask").stdout.strip() == "active"
    again = deploy(ENTRIES, **VARS_LAB_OFF)
    assert assert_ok(again)["changed"] == 0, again.changed_tasks()


def timer_files(host) -> list[str]:
    return host.sh("cd /etc/systemd/system && ls -1 pgtask-maintenance@*.timer", check=False).stdout.split()


def test_a_removed_entry_loses_its_timer(host, deploy):
    """An entry added gets a timer and a run's parameters; removed again, both go (the timer stopped
    first), the other entry's stay, and the rollout after that changes nothing."""
    extra = {"data": "app1"}
    assert_ok(deploy([*ENTRIES, extra], **VARS_LAB_OFF))
    assert timer_files(host) == ["pgtask-maintenance@app1.timer", f"{UNIT}.timer"]
    assert host.sh("systemctl is-active pgtask-maintenance@app1.timer").stdout.strip() == "active"
    host.sh("test -f /etc/pgtask/maintenance/app1.json")
    run = deploy(ENTRIES, **VARS_LAB_OFF)
    assert any("Stop the maintenance timers" in name for name in run.changed_tasks()), run.changed_tasks()
    assert timer_files(host) == [f"{UNIT}.timer"]
    assert host.sh("systemctl is-active pgtask-maintenance@app1.timer", check=False).stdout.strip() == "inactive"
    assert host.sh("test -e /etc/pgtask/maintenance/app1.json", check=False).returncode != 0
    assert host.sh(f"systemctl is-active {UNIT}.timer").stdout.strip() == "active"
    again = deploy(ENTRIES, **VARS_LAB_OFF)
    assert assert_ok(again)["changed"] == 0, again.changed_tasks()


def test_the_passfile_logs_the_service_account_in(host, deploy):
    """pgtask_pgpass: the service account's 0600 passfile, a password with ':' and '\\' in it escaped
    as libpq reads them; libpq logs in with it over TCP (scram-sha-256, never prompting); the run's
    output never shows it; and with no lines any more the file is gone."""
    password = "pa:ss\\word-3f9c1d"
    psql(host, f"CREATE ROLE pw_reader LOGIN PASSWORD '{password}'")
    run = deploy(ENTRIES, pgtask_pgpass=[{"host": "127.0.0.1", "database": "postgres", "user": "pw_reader",
                                          "password": password}], **VARS_LAB_OFF)
    assert_ok(run)
    assert password not in run.output and "ss\\\\word" not in run.output
    assert host.sh("stat -c '%a %U' /var/lib/pgtask/.pgpass").stdout.strip() == "600 pgtask"
    login = "psql -XAtqw 'host=127.0.0.1 dbname=postgres user=pw_reader' -c 'SELECT current_user'"
    assert host.sh(login, user="pgtask").stdout.strip() == "pw_reader"
    assert_ok(deploy(ENTRIES, **VARS_LAB_OFF))
    assert host.sh("test -e /var/lib/pgtask/.pgpass", check=False).returncode != 0
    assert host.sh(login, user="pgtask", check=False).returncode != 0
