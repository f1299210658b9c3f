"""The service's connections: liveness and timeouts of its own connections, the settings a task's
connection is opened with, what every connection that runs task input can do (cancel), and the
backoff of reconnects."""

from __future__ import annotations

import asyncio
import functools
import random
import re

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo


# A peer that vanished without a word (its host's network cut, its power gone) is noticed on TCP
# connections within DEAD_PEER_SECONDS, on both sides. The keepalives find it on an idle connection;
# tcp_user_timeout on one with data unacknowledged (a query sent, no answer), where keepalives never
# fire and the kernel would retry for about 15 minutes. Kernels ACK for a busy server, so a slow
# query is no dead peer. A connection string that sets any of them keeps its own.
DEAD_PEER_SECONDS = 10
PEER_LIVENESS = (("keepalives", "1"), ("keepalives_idle", "5"), ("keepalives_interval", "2"),
                 ("keepalives_count", "3"), ("tcp_user_timeout", str(DEAD_PEER_SECONDS * 1000)))


def with_peer_liveness(params: dict[str, str]) -> dict[str, str]:
    """``params`` (connection parameters) with PEER_LIVENESS after them, where they do not set it."""
    return {**params, **{k: v for k, v in PEER_LIVENESS if k not in params}}


def with_liveness(conninfo: str) -> str:
    """Let either side notice the other vanished: PEER_LIVENESS, and a running query checks its client
    every second (client_connection_check_interval) so an orphaned task is cancelled, not finished."""
    params = conninfo_to_dict(conninfo) if conninfo else {}
    extra = {k: v for k, v in PEER_LIVENESS if k not in params}
    options = params.get("options", "")
    if "client_connection_check_interval" not in options:
        extra["options"] = (options + " -c client_connection_check_interval=1000").strip()
    return make_conninfo(conninfo, **extra)


# The service's own connections (control, writers, listener, maintenance) set the timeouts their
# statements need themselves: a role's or database's statement_timeout or lock_timeout (ALTER ROLE
# ... SET) would cancel claims and finishes -- read as a lost connection -- over and over. Executor
# sessions start with no statement_timeout either (their preamble would run under it): each task's
# input gets its own (the row's timeout); the author's lock_timeout and the rest stay theirs.
OWN_TIMEOUTS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")


def without_timeouts(conninfo: str, names: tuple[str, ...] = OWN_TIMEOUTS) -> str:
    """``conninfo`` with the timeouts ``names`` off (0) in its options, unless the options set them."""
    options = conninfo_to_dict(conninfo).get("options", "") if conninfo else ""
    extra = " ".join(f"-c {name}=0" for name in names if name not in options)
    return make_conninfo(conninfo, options=f"{options} {extra}".strip()) if extra else conninfo


class Backoff:
    """Bounded exponential backoff with jitter for reconnects."""

    def __init__(self, first: float = 0.1, cap: float = 3.0):
        self.first, self.cap, self.delay = first, cap, first

    def next(self) -> float:
        delay = self.delay * (0.5 + random.random() / 2)
        self.delay = min(self.delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        self.delay = self.first


def escape_option(value: str) -> str:
    """A value inside libpq's ``options``: backslash and whitespace get a backslash before them."""
    return re.sub(r"([\\\s])", r"\\\1", value)


def connection_settings(settings: tuple[tuple[str, str], ...], options: str | None) -> dict[str, str]:
    """``settings`` as connection parameters: application_name as itself, the others as ``-c``
    options after ``options`` (the connection string's own)."""
    own = dict(settings)
    params = {"application_name": own.pop("application_name")} if "application_name" in own else {}
    extra = " ".join(f"-c {name}={escape_option(value)}" for name, value in own.items())
    if extra:
        params["options"] = f"{options} {extra}" if options else extra
    return params


@functools.lru_cache(maxsize=1024)
def group_settings(group: str, schema: str, table: str, oid: int) -> tuple[tuple[str, str], ...]:
    """What the manual's worker sets for every task of a group: pg_task.group, .schema, .table,
    .oid and application_name. A session is opened with them (SessionPool.get)."""
    return (("pg_task.group", group), ("pg_task.schema", schema), ("pg_task.table", table),
            ("pg_task.oid", str(oid)), ("application_name", f"pg_task {schema} {table} {group}"))


class Connection:
    """A connection that runs task input; ``cancel`` is how ``runner.Runner.cancel`` cancels it."""

    def __init__(self, conn: psycopg.AsyncConnection):
        self.conn = conn
        self.pgconn: pq.abc.PGconn = conn.pgconn
        self.pid: int = conn.info.backend_pid
        # The connection's own client_encoding, which a session reset restores (read once: psycopg
        # builds a ConnectionInfo for every .info).
        self.encoding: str = conn.info.encoding
        self.pg_encoding = self.pgconn.parameter_status(b"client_encoding")
        self.cancels = 0  # cancel requests on their way to the server (see cancel)
        self.no_cancels = asyncio.Event()
        self.no_cancels.set()

    async def cancel(self) -> None:
        """Cancel the query in flight (a STOP, the shutdown's grace period over). Until the server
        has taken the request, nothing more is sent on this connection (see settled): the query
        may end meanwhile, and a cancel that reached the server after the next task's query would
        cancel that one instead."""
        self.cancels += 1
        self.no_cancels.clear()
        try:
            await self.conn.cancel_safe()
        finally:
            self.cancels -= 1
            if not self.cancels:
                self.no_cancels.set()

    async def settled(self) -> None:
        """Wait for the cancel requests in flight (see cancel): once the server has taken one, it
        cancels the query running then, or none (an idle session ignores it)."""
        if self.cancels:
            await self.no_cancels.wait()

    def encoding_changed(self) -> bool:
        """Whether a task's input changed the connection's client encoding (SET client_encoding,
        SET NAMES); the server reports a change once its query is over."""
        return self.pgconn.parameter_status(b"client_encoding") != self.pg_encoding

    def encoding_now(self) -> str:
        """The client encoding the server sends text in now (see encoding_changed)."""
        return self.conn.info.encoding if self.encoding_changed() else self.encoding
