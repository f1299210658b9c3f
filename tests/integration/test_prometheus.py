"""The shipped alert rules and Grafana dashboard against a real Prometheus server scraping a real
``pgtask run`` (Debian's prometheus, unpacked into .cache/ by scripts/bootstrap test)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from support import wait_for
from test_metrics import metrics_config

from pgtask.cluster import free_port

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / ".cache/prometheus/usr/bin/prometheus"
PROMTOOL = ROOT / ".cache/prometheus/usr/bin/promtool"
MONITORING = ROOT / "roles/pgtask/files/monitoring"
RULES = MONITORING / "pgtask-alerts.yml"
DASHBOARD = MONITORING / "pgtask-dashboard.json"


def api(port: int, path: str, **params) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]


def panel_expressions() -> list[tuple[str, str]]:
    """(panel title, expression) of every dashboard target, its variables set to match everything."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], re.sub(r"\$(data|schema|table)\b", ".*", target["expr"]))
            for panel in dashboard["panels"] for target in panel["targets"]]


@pytest.fixture
def prometheus(tmp_path):
    """Start Prometheus on a loopback port with the shipped rules, their `for` shortened to 1 s (the
    expressions are the shipped ones); yields (its port, the scrape config's path to fill in)."""
    assert PROMETHEUS.exists(), f"{PROMETHEUS} is missing: run scripts/bootstrap test"
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "1s"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    port = free_port()

    def start(target_port: int) -> subprocess.Popen:
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "rule_files": [str(tmp_path / "rules.yml")],
            "scrape_configs": [{"job_name": "pgtask", "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}],
        }))
        with open(tmp_path / "prometheus.log", "wb") as log:  # the server writes to its own copy
            proc = subprocess.Popen([str(PROMETHEUS), f"--config.file={tmp_path / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={tmp_path / 'data'}",
                                     f"--web.listen-address=127.0.0.1:{port}"],
                                    stdout=subprocess.DEVNULL, stderr=log)
        started.append(proc)

        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                return False
        wait_for(ready, 30, message="Prometheus to be ready")
        return proc

    started: list[subprocess.Popen] = []
    yield port, start
    for proc in started:
        proc.terminate()
        proc.wait(10)


def test_the_shipped_rules_pass_promtool():
    result = subprocess.run([str(PROMTOOL), "check", "rules", str(RULES)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_and_dashboard_evaluate_and_not_claiming_fires(db, service_factory, prometheus):
    port, start = prometheus
    metrics_port = free_port()
    svc = service_factory(db.name, metrics_config(metrics_port))
    start(metrics_port)
    # something for every panel: finished and failed tasks, a due one held back, a schedule
    for i in range(10):
        db.wait_state(db.insert("SELECT 1", group=f"g{i % 3}"))
    db.wait_state(db.insert("SELECT 1/0"))
    slow = db.insert("SELECT pg_sleep(60)", group="slow")
    db.wait_state(slow, states=("WORK",))
    db.insert("SELECT 1", group="slow")
    db.execute("INSERT INTO task_schedule (name, cron, input) VALUES ('nightly', '0 3 * * *', 'SELECT 1')")

    expressions = panel_expressions()

    missing: list[str] = []

    def check() -> bool:
        missing[:] = [title for title, expr in expressions if not api(port, "query", query=expr)["result"]]
        return not missing
    wait_for(check, 60, interval=1, message=f"every dashboard panel to have data (missing: {missing})")

    rules = [rule for group in api(port, "rules")["groups"] for rule in group["rules"]]
    assert {r["name"] for r in rules} == {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"]
                                          for r in g["rules"]}
    wait_for(lambda: all(r.get("lastEvaluation", "").startswith("2") for r in
                         (rule for group in api(port, "rules")["groups"] for rule in group["rules"])),
             15, interval=0.5, message="every rule evaluated")
    for rule in (rule for group in api(port, "rules")["groups"] for rule in group["rules"]):
        assert rule["health"] == "ok", rule

    def firing(name: str) -> bool:
        return any(a["labels"]["alertname"] == name and a["state"] == "firing" for a in api(port, "alerts")["alerts"])

    assert not firing("PgtaskNotClaiming")
    svc.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: firing("PgtaskNotClaiming"), 30, interval=0.5, message="PgtaskNotClaiming to fire")
    finally:
        svc.signal(signal.SIGCONT)
    wait_for(lambda: not firing("PgtaskNotClaiming"), 30, interval=0.5, message="PgtaskNotClaiming to resolve")
    db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (slow,))
    svc.stop()
