"""systemd's notify protocol (sd_notify): readiness, status, stopping and watchdog pings.

Under a ``Type=notify`` unit systemd hands the service ``NOTIFY_SOCKET`` (a unix datagram socket;
``@name`` is in the abstract namespace) and, with ``WatchdogSec=``, ``WATCHDOG_USEC`` (and
``WATCHDOG_PID``: the process meant). The pings are sent from the event loop, at half the watchdog
interval: a process stopped (SIGSTOP) or an event loop that stops turning sends none, and systemd
kills and restarts the service; the rows it ran go back to PLAN by the others' orphan checks.
Without ``NOTIFY_SOCKET`` every call here does nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("pgtask.systemd_notify")

ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def watchdog_interval(env: Mapping[str, str]) -> float | None:
    """Seconds between pings (half of WATCHDOG_USEC), or None: no watchdog for this process."""
    usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        log.warning("WATCHDOG_USEC=%r is not a number: no watchdog pings", usec)
        return None
    return value / 2e6 if value > 0 else None


class Notifier:
    """The service's end of the protocol: ``send`` one message (``KEY=value`` lines)."""

    def __init__(self, env: Mapping[str, str] = os.environ):
        path = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + path[1:] if path.startswith("@") else path
        self.interval = watchdog_interval(env) if self.address else None
        self.sock: socket.socket | None = None
        self.failed = False  # a send failed: logged once

    def send(self, *lines: str) -> None:
        if not self.address:
            return
        try:
            if self.sock is None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self.sock.sendto("\n".join(lines).encode(), self.address)
        except OSError as exc:
            if not self.failed:
                log.warning("cannot notify systemd at %s (%s)", self.address.replace("\0", "@"), exc)
                self.failed = True

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=draining")

    async def watchdog(self) -> None:
        """Ping every half interval for as long as the event loop turns (run as a task)."""
        if self.interval is None:
            return
        while True:
            self.send("WATCHDOG=1")
            await asyncio.sleep(self.interval)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class Pings:
    """The other end, kept by the service's first process for one of its worker processes: a
    datagram socket of its own (abstract namespace) that the worker's Notifier pings, as systemd's
    would be (the unit takes notifications from the first process only)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        name = f"pgtask-{os.getpid()}-{os.urandom(8).hex()}"
        self.sock.bind("\0" + name)
        self.env = {"NOTIFY_SOCKET": "@" + name}
        self.last = 0.0

    def _readable(self) -> None:
        try:
            while True:
                if b"WATCHDOG=1" in self.sock.recv(4096).split(b"\n"):
                    self.last = asyncio.get_running_loop().time()
        except OSError:  # nothing more to read
            pass

    async def hung(self, proc: asyncio.subprocess.Process, timeout: float) -> bool:
        """Wait for the worker ``proc`` to exit (False), or, once it has sent its first ping (as
        systemd's watchdog, from the end of its start), to send none for ``timeout`` s (True)."""
        loop = asyncio.get_running_loop()
        loop.add_reader(self.sock.fileno(), self._readable)
        try:
            while proc.returncode is None:
                left = self.last + timeout - loop.time() if self.last else timeout
                if left <= 0:
                    return True
                try:
                    await asyncio.wait_for(asyncio.shield(proc.wait()), left)
                except TimeoutError:
                    pass
            return False
        finally:
            loop.remove_reader(self.sock.fileno())

    def close(self) -> None:
        self.sock.close()
