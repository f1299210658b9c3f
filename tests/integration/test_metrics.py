"""The metrics endpoint of a real ``pgtask run``: /metrics parsed with prometheus-client's own
parser and held against the table; /healthz following the server."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import Service, wait_for

from pgtask.cluster import Cluster, free_port
from pgtask.config import ConfigError, from_dict
from pgtask.metrics import OTHER_GROUPS, fold_groups
from pgtask.names import liveness_table


def metrics_config(port: int, extra: str = "", reset_check: float = 0.5) -> str:
    return (f'[pgtask]\nmetrics_listen = "127.0.0.1:{port}"\nmetrics_refresh = 0.2\n'
            f'reset_check = {reset_check}\ngrace = 5\nlog_level = "debug"\n{extra}')


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics: (name, sorted labels) -> value."""
    status, text = get(port, "/metrics")
    assert status == 200, text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(samples: dict, name: str, **labels) -> float | None:
    """The one sample of ``name`` whose labels include ``labels`` (None: there is none)."""
    found = [v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items()]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def test_the_figures_match_the_table(db, service_factory):
    port = free_port()
    svc = service_factory(db.name, metrics_config(port))
    done = [db.insert("SELECT 1", group=f"g{i % 4}") for i in range(20)]
    failed = [db.insert("SELECT 1/0", group="bad") for _ in range(3)]
    for task_id in done + failed:
        db.wait_state(task_id)
    slow = db.insert("SELECT pg_sleep(60)", group="slow")
    db.wait_state(slow, states=("WORK",))
    waiting = db.insert("SELECT 1", group="slow")  # due, held back by the running one (max 0)
    for _ in range(5):
        db.insert("SELECT 1", group="later", plan="infinity")
    for _ in range(2):  # waiting for the sleeping one (WAIT)
        db.insert("SELECT 1", group="after", after=[slow])

    def settled() -> dict | None:
        samples = scrape(port)
        return samples if sample(samples, "pgtask_due_tasks", group="slow") == 1 and \
            sample(samples, "pgtask_tasks", group="later", state="PLAN") == 5 and \
            sample(samples, "pgtask_tasks", group="after", state="WAIT") == 2 else None

    samples = wait_for(settled, 15, message="the table's figures")
    entry = {"data": db.name, "schema": "public", "table": "task"}
    assert sample(samples, "pgtask_finished_total", state="DONE", **entry) == 20
    assert sample(samples, "pgtask_finished_total", state="FAIL", **entry) == 3
    for state in ("DONE", "FAIL"):
        assert sample(samples, "pgtask_tasks", group="~all", state=state) == \
            db.value("SELECT count(*) FROM task WHERE state = %s", (state,))
    assert sample(samples, "pgtask_tasks", group="slow", state="WORK") == 1
    assert sample(samples, "pgtask_due_tasks", group="later") == 0
    oldest = sample(samples, "pgtask_oldest_due_seconds", group="slow")
    assert 0 <= oldest <= db.value("SELECT extract(epoch FROM now() - plan) FROM task WHERE id = %s",
                                   (waiting,)) + 1
    assert sample(samples, "pgtask_run_seconds_count", **entry) == 23
    # every claimed task was picked up: the 23 and the sleeping one
    assert sample(samples, "pgtask_pickup_seconds_count", **entry) == 24
    assert sample(samples, "pgtask_claim_pass_seconds_count", **entry) > 0
    assert sample(samples, "pgtask_scheduler_up", **entry) == 1
    assert sample(samples, "pgtask_sessions", role=db.value("SELECT current_user")) >= 1
    assert sample(samples, "process_resident_memory_bytes") > 0
    svc.stop()


def test_every_entry_has_its_table_figures(db, service_factory):
    """Two entries, two tables: each has its own rows by state."""
    port = free_port()
    entry = f'data = "{db.name}", user = "postgres"'
    entries = f"json = [{{{entry}}}, {{{entry}, table = \"t2\"}}]"
    svc = service_factory(db.name, f"[pg_task]\n{entries}\n" + metrics_config(port))
    wait_for(lambda: db.value("SELECT to_regclass('t2') IS NOT NULL"), 15, message="the second table")
    db.wait_state(db.insert("SELECT 1"))
    ids = [db.value("INSERT INTO t2 (input) VALUES ('SELECT 2') RETURNING id") for _ in range(2)]
    wait_for(lambda: db.value("SELECT count(*) FROM t2 WHERE state = 'DONE' AND id = ANY(%s)", (ids,)) == 2, 15,
             message="the tasks of t2")

    def both() -> bool:
        samples = scrape(port)
        return (sample(samples, "pgtask_tasks", table="task", state="DONE") == 1
                and sample(samples, "pgtask_tasks", table="t2", state="DONE") == 2)
    wait_for(both, 15, message="each table's DONE rows")
    svc.stop()


def test_groups_beyond_the_busiest_are_folded():
    queue = [("a", 5, 5, 3.0), ("b", 1, 1, 9.0), ("c", 1, 0, None)]
    running = [("c", "WORK", 3), ("d", "TAKE", 1)]
    reading = fold_groups(queue, running, keep=2)
    # a (5 rows) and c (4) are the busiest; b and d are folded
    assert reading.tasks == {("a", "PLAN"): 5, ("c", "PLAN"): 1, ("c", "WORK"): 3, (OTHER_GROUPS, "PLAN"): 1,
                             (OTHER_GROUPS, "TAKE"): 1}
    assert reading.due == {"a": 5, "c": 0, OTHER_GROUPS: 1}
    assert reading.oldest_due == {"a": 3.0, OTHER_GROUPS: 9.0}


def test_counters_add_up_across_processes(db, service_factory):
    """processes = 3: each process in turn is the only one running (the others SIGSTOPped) and runs
    a batch of its own; the one endpoint's counters are the sums of the three batches."""
    port = free_port()
    svc = service_factory(db.name, metrics_config(port, "processes = 3\n"))
    workers = wait_for(lambda: svc.running_workers(2), 30, message="the worker processes")
    processes = [svc.proc.pid, *workers]
    batches = {pid: (4 + 3 * i, i + 1) for i, pid in enumerate(processes)}  # pid -> (DONE, FAIL)
    claim_lock = liveness_table("task", "claim")
    # each scheduler provisions the table (under a lock) before it registers: all three registered,
    # none is stopped inside its provisioning
    instances = liveness_table("task", "instance")
    wait_for(lambda: db.value(f'SELECT count(*) FROM "{instances}"') == 3, 30, message="three schedulers")

    def only(pid: int) -> list[int]:
        """SIGSTOP every process but ``pid``; none of them is stopped inside a claim pass (holding
        the table's claim lock, which would keep ``pid`` from claiming) or any other transaction."""
        others = [p for p in processes if p != pid]
        stuck = ("SELECT (SELECT count(*) FROM pg_locks WHERE relation = %s::regclass)"
                 " + (SELECT count(*) FROM pg_stat_activity"
                 "    WHERE state LIKE 'idle in transaction%%' AND pid <> pg_backend_pid())")
        while True:
            for other in others:
                os.kill(other, signal.SIGSTOP)
            try:
                wait_for(lambda: not db.value(stuck, (claim_lock,)), 1, interval=0.01)
                return others
            except AssertionError:  # one of them holds it: let it finish its pass, and stop them again
                for other in others:
                    os.kill(other, signal.SIGCONT)

    for pid, (done, failed) in batches.items():
        others = only(pid)
        try:
            ids = [db.insert("SELECT pg_sleep(0.01)", group=f"g{i}") for i in range(done)]
            ids += [db.insert("SELECT 1/0", group=f"f{i}") for i in range(failed)]
            for task_id in ids:
                db.wait_state(task_id)
        finally:
            for other in others:
                os.kill(other, signal.SIGCONT)
    done = sum(d for d, _ in batches.values())
    failed = sum(f for _, f in batches.values())
    samples = scrape(port)
    assert sample(samples, "pgtask_finished_total", state="DONE") == done
    assert sample(samples, "pgtask_finished_total", state="FAIL") == failed
    assert sample(samples, "pgtask_run_seconds_count") == done + failed
    assert sample(samples, "pgtask_pickup_seconds_count") == done + failed
    assert db.value("SELECT count(*) FROM task WHERE state = 'DONE'") == done
    svc.stop()


def test_orphans_reset_are_counted(db, service_factory):
    first = service_factory(db.name, "[pgtask]\nreset_check = 0.5\n")
    orphan = db.insert("SELECT pg_sleep(60)")
    db.wait_state(orphan, states=("WORK",))
    first.kill()
    port = free_port()
    second = service_factory(db.name, metrics_config(port))
    wait_for(lambda: sample(scrape(port), "pgtask_orphans_reset_total") == 1, 30,
             message="the dead service's row to be reset")
    db.wait_state(orphan, states=("WORK",))  # run again: STOP is allowed from WORK, not from TAKE
    db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (orphan,))
    second.stop()


def test_a_lost_lease_is_counted(db, service_factory):
    port = free_port()
    svc = service_factory(db.name, metrics_config(port, reset_check=600))
    stale = db.insert("SELECT pg_sleep(1.5)")
    db.wait_state(stale, states=("WORK",))
    with db.conn.transaction():  # another instance took it over (see test_stale_executor_writes_nothing)
        db.execute("UPDATE task SET state = 'PLAN' WHERE id = %s", (stale,))
        db.claim(stale)
    wait_for(lambda: sample(scrape(port), "pgtask_lease_lost_total") == 1, 15, message="the lease lost")
    assert sample(scrape(port), "pgtask_finished_total", state="DONE") == 0
    svc.stop()


def test_healthz_follows_the_server(tmp_path, cluster):
    own = Cluster(Path(tempfile.mkdtemp(prefix="pgtask-health-")), cluster.bindir, port=free_port())
    own.init({"fsync": "off"})
    own.start()
    port = free_port()
    svc = Service(own, "postgres", metrics_config(port), tmp=tmp_path)
    try:
        svc.start()
        wait_for(lambda: get(port, "/healthz")[0] == 200, 15, message="healthy")
        assert json.loads(get(port, "/healthz")[1]) == {"status": "ok", "problems": []}
        own.stop("fast")
        _, body = wait_for(lambda: (r := get(port, "/healthz"))[0] == 503 and r, 20,
                           message="unhealthy while the server is down")
        assert "not connected" in body or "no claim pass" in body, body
        own.start()
        wait_for(lambda: get(port, "/healthz")[0] == 200, 30, message="healthy again")
    finally:
        svc.stop()
        own.destroy()


@pytest.mark.parametrize("value", ["9464", "localhost", "127.0.0.1:0", "127.0.0.1:70000", "[::1]:x"])
def test_a_bad_listen_address_is_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match="metrics_listen"):
        from_dict({"pgtask": {"metrics_listen": value}})
