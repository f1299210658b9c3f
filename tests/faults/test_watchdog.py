"""A hung service: systemd's watchdog protocol (pgtask/systemd_notify.py). The service pings from its event
loop; a stopped one pings no more (systemd then kills and restarts it), and the first process
kills a worker process of its own that stops pinging, which is then started again."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest
from support import wait_for

INTERVAL_USEC = 400_000  # WATCHDOG_USEC: a ping every 0.2 s


def process_state(pid: int) -> str:
    """R, S, T (stopped), ... of /proc/<pid>/stat."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def notify_socket(tmp_path):
    """A unix datagram socket in the place of systemd's: (its path, a function that reads what
    arrived within a timeout as a list of messages)."""
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))

    def received(timeout: float) -> list[str]:
        sock.settimeout(timeout)
        try:
            first = sock.recv(4096)
        except TimeoutError:
            return []
        messages = [first.decode()]
        sock.setblocking(False)
        try:
            while True:
                messages.append(sock.recv(4096).decode())
        except BlockingIOError:
            return messages

    yield str(path), received
    sock.close()


def pings(received, count: int, timeout: float = 30) -> list[str]:
    """Wait for ``count`` watchdog pings (and whatever else came with them)."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while sum(m == "WATCHDOG=1" for m in got) < count:
        assert time.monotonic() < deadline, f"fewer than {count} watchdog pings in {timeout}s: {got}"
        got += received(deadline - time.monotonic())
    return got


def test_pings_stop_while_the_service_is_stopped(db, service_factory, notify_socket):
    path, received = notify_socket
    svc = service_factory(db.name, env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": str(INTERVAL_USEC)})
    got = pings(received, 3)
    assert any(m.startswith("READY=1\n") for m in got), got
    task_id = db.insert("SELECT 1")
    db.wait_state(task_id)
    svc.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: process_state(svc.proc.pid) == "T", 10, message="the service to stop")
        received(0.05)  # pings sent before it stopped
        assert received(10 * INTERVAL_USEC / 1e6) == []
    finally:
        svc.signal(signal.SIGCONT)
    pings(received, 2)
    assert svc.stop() == 0
    assert any(m.startswith("STOPPING=1\n") for m in received(1))


def test_a_worker_process_that_stops_pinging_is_killed_and_started_again(db, service_factory, notify_socket):
    path, received = notify_socket
    svc = service_factory(db.name, "[pg_work]\nrestart = 1\n[pgtask]\nprocesses = 2\nreset_check = 0.5\n",
                          env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"})
    worker = wait_for(lambda: svc.workers(), 30, message="the worker process")[0]
    wait_for(lambda: "pgtask running" in svc.output().split(f"(pid {worker})")[-1], 30,
             message="the worker to run")
    time.sleep(3)  # longer than its watchdog interval: a worker that pings is not taken for hung
    assert svc.workers() == [worker], svc.output()[-3000:]
    os.kill(worker, signal.SIGSTOP)
    wait_for(lambda: f"(pid {worker}) sent no watchdog ping" in svc.output(), 10,
             message="the first process to find the worker hung")
    wait_for(lambda: svc.workers() and svc.workers()[0] != worker, 30, message="a new worker process")
    assert not Path(f"/proc/{worker}").exists() or process_state(worker) == "Z"
    # the first process still pings systemd, and the service still runs tasks
    pings(received, 2)
    db.wait_state(db.insert("SELECT 1"))
