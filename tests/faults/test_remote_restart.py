"""A remote server that restarts, stops or refuses: a remote task whose connection failed before its
input was sent is tried again later (bounded), never failed for a fault of the moment; one whose
input may have run keeps pg_task's rule (it fails). Each input records its id in `runs` on the
remote server, so every test counts how often each task ran there."""

from __future__ import annotations

import tempfile
from pathlib import Path

import psycopg
import pytest
from support import wait_for

from pgtask.cluster import Cluster, free_port

BODY = "INSERT INTO runs VALUES (current_setting('pg_task.id')::bigint); SELECT pg_sleep({sleep})"
SERVICE = '[pgtask]\nreset_check = 0.5\ngrace = 5\nlog_level = "debug"\nremote_backoff = 0.2\n'


@pytest.fixture
def far_cluster(cluster):
    """A remote server of its own (restarted and stopped by the tests), its `runs` table ready."""
    c = Cluster(base=Path(tempfile.mkdtemp(prefix="pgtask-far-")), bindir=cluster.bindir, port=free_port())
    c.init({"max_connections": "100", "fsync": "off", "synchronous_commit": "off"})
    c.start()
    with psycopg.connect(c.conninfo(), autocommit=True) as conn:
        conn.execute("CREATE TABLE runs (id bigint)")
    yield c
    c.destroy()


def runs(far: Cluster) -> dict[int, int]:
    with psycopg.connect(far.conninfo(), autocommit=True) as conn:
        return dict(conn.execute("SELECT id, count(*) FROM runs GROUP BY id").fetchall())


def insert(db, far: Cluster, groups: int, per_group: int, sleep: float) -> list[int]:
    db.execute("""INSERT INTO task (input, remote, "group")
                  SELECT %s, %s, 'g' || (i %% %s) FROM generate_series(1, %s) i""",
               (BODY.format(sleep=sleep), far.conninfo(), groups, groups * per_group))
    return [r[0] for r in db.execute("SELECT id FROM task ORDER BY id")]


def ended(db, n: int) -> bool:
    return db.value("SELECT count(*) FROM task WHERE state IN ('DONE', 'FAIL')") == n


def failures(db) -> list[tuple[int, str]]:
    return db.execute("SELECT id, error FROM task WHERE state = 'FAIL' ORDER BY id")


def test_remote_tasks_wait_out_a_stopped_remote_server(db, service_factory, far_cluster):
    """The remote server is down when its tasks are claimed: each task connects again, later each
    time, instead of failing, and runs -- once -- when the server is back, in the claim it had."""
    far_cluster.stop()
    svc = service_factory(db.name, SERVICE + "remote_attempts = 8\n")
    ids = insert(db, far_cluster, groups=10, per_group=1, sleep=0)

    def refused() -> int:
        return svc.output().count("failed before its input was sent")

    wait_for(lambda: refused() >= 2 * len(ids) or failures(db), 15,
             message="every task's connection to have failed twice")
    assert not failures(db), failures(db)[:3]
    far_cluster.start()
    wait_for(lambda: ended(db, len(ids)), 20, message="every task to end once the server is back")
    assert not failures(db), failures(db)[:3]
    assert runs(far_cluster) == {i: 1 for i in ids}
    assert db.value("SELECT max(attempt) FROM task") == 1  # one claim each


def test_remote_server_restarted_mid_load_fails_only_tasks_whose_input_was_sent(db, service_factory, far_cluster):
    """`pg_ctl restart -m fast` of the remote server while its tasks are claimed and connecting
    (groups of max 0: each task's connection opens as the one before ends): a task whose input
    was cut off fails as pg_task's does (`PQconsumeInput failed`, the server's FATAL); a task
    whose connection failed before its input was sent -- refused, or the server shutting down or
    starting up -- runs once the server is back, once (not FAIL with `PQconnectPoll failed`)."""
    svc = service_factory(db.name, SERVICE)
    ids = insert(db, far_cluster, groups=20, per_group=12, sleep=0.05)
    wait_for(lambda: len(runs(far_cluster)) >= 40, 30, message="the load to get going")
    far_cluster.restart("fast")
    wait_for(lambda: ended(db, len(ids)), 60, message="every task to end")
    for _, error in failures(db):
        assert error.startswith("ERROR:  PQconsumeInput failed\n"), error
    counts = runs(far_cluster)
    done = [r[0] for r in db.execute("SELECT id FROM task WHERE state = 'DONE'")]
    assert all(counts.get(i) == 1 for i in done), "a DONE task ran other than once"
    # the restart turned connections away: their tasks connected again (and are DONE, above)
    assert "failed before its input was sent" in svc.output()


def test_retries_of_an_unreachable_remote_are_bounded(db, service_factory):
    """A remote server that never comes back: the task connects `remote_attempts` times, then
    fails with the last reason (pg_task's text), its input never sent."""
    refused_port = free_port()
    svc = service_factory(db.name, SERVICE + "remote_attempts = 3\n")
    task_id = db.insert("SELECT 1", remote=f"host=127.0.0.1 port={refused_port} user=x password=y")
    row = db.wait_state(task_id, timeout=15)
    assert (row["state"], row["attempt"], row["start"], row["output"]) == ("FAIL", 1, None, ""), row
    assert [f"{n} of 3" in svc.output() for n in (1, 2, 3)] == [True] * 3
    assert row["error"].startswith(
        "ERROR:  PQconnectPoll failed\nDETAIL:  connection to server at "
        f'"127.0.0.1", port {refused_port} failed: Connection refused'), row["error"]
