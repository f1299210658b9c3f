"""notebooks/console.ipynb served by Voila (a subprocess on 127.0.0.1, pointed at the test database
through its PGTASK_CONSOLE_* environment) and driven by Debian's Chromium through Playwright:
filter, retry with its preview and confirmation, and the database says exactly which tasks ran
again; an action cancelled at its confirmation and one the verb refuses change nothing.

PGTASK_CONSOLE_SCREENSHOTS=<dir> keeps the screenshots (bench/console_figure.py: docs/)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from support import wait_for

from pgtask.cluster import free_port

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
DEADLINE = 90  # seconds: a loaded 2-core machine starts Voila and its kernel slowly


@contextmanager
def voila(db, tmp_path: Path):
    """Voila serving the console for ``db``; its URL. Its log is printed when the test fails."""
    port = free_port()
    log_path = tmp_path / "voila.log"
    env = {**os.environ, "PGTASK_CONSOLE_DSN": db.dsn, "PGTASK_CONSOLE_REFRESH": "1",
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("voila")), str(ROOT / "notebooks/console.ipynb"),
             "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1"],
            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        def listening():
            assert proc.poll() is None, f"voila exited ({proc.returncode}):\n{log_path.read_text()}"
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0
        wait_for(listening, DEADLINE, interval=0.2, message="voila to listen")
        yield f"http://127.0.0.1:{port}/"
    except BaseException:
        print(f"--- voila's log ---\n{log_path.read_text()}")
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def finished(db, ids):
    for i in ids:
        db.wait_state(i, timeout=30)


def rows(db):
    return db.execute('SELECT id, state::text, parent, "group" FROM task ORDER BY id')


def test_the_console_retries_what_its_filters_select(db, service, tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} missing: scripts/bootstrap test installs Debian's chromium")
    from playwright.sync_api import expect, sync_playwright

    billing = [db.insert("SELECT 1/0", group="billing") for _ in range(3)]
    reports = [db.insert("SELECT 1/0", group="reports") for _ in range(2)]
    done = [db.insert("SELECT 1", group="billing") for _ in range(2)]
    finished(db, billing + reports + done)
    assert [r[1] for r in rows(db)] == ["FAIL"] * 5 + ["DONE"] * 2
    shots = Path(os.environ.get("PGTASK_CONSOLE_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    expect.set_options(timeout=DEADLINE * 1000)
    with voila(db, tmp_path) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-proxy-server"])
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.set_default_timeout(DEADLINE * 1000)
        try:
            page.goto(url)
            expect(page.locator(".pgtask-verdict")).to_contain_text("OK: a service is connected")
            page.locator(".pgtask-state select").select_option("FAIL")
            page.locator(".pgtask-group select").select_option("billing")
            expect(page.locator(".pgtask-matching")).to_have_text("3 tasks match the filters")
            page.screenshot(path=str(shots / "console.png"), full_page=True)

            page.locator("button.pgtask-retry").click()
            expect(page.locator(".pgtask-preview-count")).to_have_text("3")
            expect(page.locator(".pgtask-prompt")).to_contain_text(", ".join(map(str, billing)))
            page.screenshot(path=str(shots / "console-confirm.png"), full_page=True)
            assert db.value("SELECT count(*) FROM task WHERE parent IS NOT NULL") == 0  # a preview
            page.locator("button.pgtask-confirm").click()
            expect(page.locator(".pgtask-result-count")).to_have_text("3")
            retried = db.execute('SELECT parent, id, "group", input FROM task WHERE parent IS NOT NULL '
                                 'ORDER BY parent')
            assert [r[0] for r in retried] == billing
            assert all(r[2] == "billing" and r[3] == "SELECT 1/0" for r in retried)
            expect(page.locator(".pgtask-message")).to_contain_text(
                ", ".join(f"{old} → {new}" for old, new, *_ in retried))
            finished(db, [r[1] for r in retried])
            expect(page.locator(".pgtask-matching")).to_have_text("6 tasks match the filters")
            # live: a task that fails now shows up with no one touching the page
            finished(db, [db.insert("SELECT 1/0", group="billing")])
            expect(page.locator(".pgtask-matching")).to_have_text("7 tasks match the filters")

            # the other group: a delete previewed, then called off at the confirmation
            before = rows(db)
            page.locator(".pgtask-group select").select_option("reports")
            expect(page.locator(".pgtask-matching")).to_have_text("2 tasks match the filters")
            page.locator("button.pgtask-delete").click()
            expect(page.locator(".pgtask-preview-count")).to_have_text("2")
            page.locator("button.pgtask-dismiss").click()
            expect(page.locator(".pgtask-message")).to_have_text("delete: not done, nothing changed.")
            expect(page.locator(".pgtask-confirm-box")).to_be_hidden()
            # a cancel of FAIL tasks: the verb refuses (it cancels PLAN, WAIT, WORK), the page says why
            page.locator("button.pgtask-cancel").click()
            expect(page.locator(".pgtask-message")).to_contain_text("argument states: {FAIL} is not among")
            expect(page.locator(".pgtask-confirm-box")).to_be_hidden()
            assert rows(db) == before
        finally:
            browser.close()
