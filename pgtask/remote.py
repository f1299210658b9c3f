"""Remote execution (spec section 6): a task whose ``remote`` is set runs on another server.

The service drives every remote connection itself on its own event loop -- psycopg's asynchronous
connect, then libpq's non-blocking query interface through ``wire`` -- so hundreds of remote tasks
run at once from one process with no thread or process per task.

Per connection: parse ``remote`` (a failure ends the task straight from TAKE), apply the password
rule, connect with pg_task's ``application_name``, ``options`` and ``client_encoding``; then per
task (run): the preamble, TAKE -> WORK with the remote backend pid (awaited from the completer), the
input as one simple query, COMMIT of a transaction left open. The runner (runner.RemoteTarget)
finishes it and, within count/live, runs the next task of the same group and remote on the same
connection (after ``DISCARD ALL``, discard, unless the finished task had ``save``).

A task whose connection failed before its input was sent (the remote server restarting, shutting
down, full or unreachable) raises Unsent: the runner connects again after a while, up to
``remote_attempts`` connections (runner.RemoteTarget.again); one whose input may have run fails as
pg_task's does.

Connection strings are never logged: they may hold passwords.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import Awaitable, Callable

import psycopg
from psycopg import pq, sql
from psycopg.conninfo import conninfo_to_dict

from . import wire
from .connect import Connection, connection_settings, group_settings, with_peer_liveness
from .output import DEFAULT_STYLE, ErrorStyle, Output, format_error, message, simple_error
from .task import NotStarted, Task

log = logging.getLogger("pgtask.remote")

# Seconds a remote connection may take when neither ``remote`` nor PGCONNECT_TIMEOUT bounds it.
DEFAULT_CONNECT_TIMEOUT = 10

PASSWORD_REQUIRED = "password is required"
NO_PASSWORD_KEYWORD = "Non-superusers must provide a password in the connection string."
PASSWORD_NOT_USED = "Non-superuser cannot connect if the server does not request a password."
PASSWORD_NOT_USED_HINT = "Target server's authentication method must be changed."


class RemoteConnection(Connection):
    """One remote connection, for one task."""

    sent = False  # the running task's input was sent (run): from then on it may have run

    async def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a broken connection
            await self.conn.close()


class Unsent(Exception):
    """The task's connection failed before its input was sent: ``error`` is the task's error if it
    does not connect again (see runner.RemoteTarget.again)."""

    def __init__(self, error: str):
        super().__init__(error)
        self.error = error


@functools.lru_cache(maxsize=256)
def parse_remote(remote: str) -> tuple[tuple[str, str], ...]:
    """``remote``'s keywords and values, by libpq's parser (through psycopg); raises psycopg.Error.
    Parsed once per distinct string: a thousand tasks with one ``remote`` cost one parse."""
    return tuple(conninfo_to_dict(remote).items())


def conninfo(params: dict) -> str:
    """libpq's ``keyword='value'`` form, each value quoted as libpq's documentation says (a
    backslash before ``'`` and ``\\``). psycopg's make_conninfo does the same and then parses the
    result to check it; here the connect parses it anyway (about 90 us a parse, twice a connection)."""
    def quote(value: object) -> str:
        return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"
    return " ".join(f"{key}={quote(value)}" for key, value in params.items())


def connect_params(user: dict, schema: str, table: str, oid: int, group: str, encoding: str) -> dict:
    """The connection parameters, in the C extension's order: its own first, then the user's.

    ``application_name`` is pg_task's (overriding the user's; no fallback_application_name);
    ``options`` is the user's plus ``-c pg_task.group/schema/table/oid`` (the group's settings, as a
    local session's); ``client_encoding`` is the local database's; ``connect_timeout`` is bounded
    when neither the string nor the environment gives one, and a vanished server is noticed as the
    service's own connections notice it (connect.PEER_LIVENESS) unless the string says otherwise.
    """
    params = {**connection_settings(group_settings(group, schema, table, oid), user.get("options")),
              "client_encoding": encoding}
    for key, value in user.items():
        if key not in params and key != "fallback_application_name":
            params[key] = value
    if "connect_timeout" not in params and not os.environ.get("PGCONNECT_TIMEOUT"):
        params["connect_timeout"] = str(DEFAULT_CONNECT_TIMEOUT)
    return with_peer_liveness(params)


def preamble(task: Task, check_client: bool = False) -> str:
    """``SET SESSION "pg_task.id"`` and the statement timeout (RESET when none), one simple query.
    ``check_client`` (PostgreSQL 14 and later): the remote server checks every second that this
    service is still there while a query runs (client_connection_check_interval), so a remote
    task's query ends with a service that died, as a local one's does."""
    text = sql.SQL('SET SESSION "pg_task.id" = {};').format(sql.Literal(str(task.id))).as_string(None)
    if check_client:
        text += " SET SESSION client_connection_check_interval = 1000;"
    if task.timeout_ms > 0:
        return f'{text} SET SESSION "statement_timeout" = {int(task.timeout_ms)};'
    return f'{text} RESET "statement_timeout";'


def _connect_error(text: str) -> str:
    """A failed connect as pg_task words it, with libpq's text: psycopg puts "connection is bad: "
    before a connection libpq gave up on at once (PQconnectStart: an option it cannot use), which
    pg_task reports as "PQstatus == CONNECTION_BAD", and "connection failed: " before one that
    failed on the way (PQconnectPoll)."""
    if text.startswith("connection is bad: "):
        return simple_error("PQstatus == CONNECTION_BAD", text.removeprefix("connection is bad: "))
    return simple_error("PQconnectPoll failed", text.removeprefix("connection failed: "))


FACTS_TTL = 2.0  # seconds a role's superuser flag is trusted without asking again


class LocalFacts:
    """(is a role a superuser, the local database's encoding), asked through ``lookup``.

    Remote tasks of one role starting together share one lookup, and its answer is kept for
    FACTS_TTL seconds: a thousand tasks cost one query, not a thousand round trips on the writers.
    """

    def __init__(self, lookup: Callable[[str], Awaitable[tuple[bool, str]]]):
        self.lookup = lookup
        self.cache: dict = {}  # role -> (when, future of (superuser, encoding))

    async def __call__(self, user: str) -> tuple[bool, str]:
        cache = self.cache
        loop = asyncio.get_running_loop()
        entry = cache.get(user)
        if entry is None or (entry[1].done() and loop.time() - entry[0] > FACTS_TTL):
            entry = (loop.time(), asyncio.ensure_future(self.lookup(user)))
            cache[user] = entry
        try:
            return await asyncio.shield(entry[1])
        except psycopg.Error:
            cache.pop(user, None)  # a failed lookup is not cached
            raise


async def connect(task: Task, facts: LocalFacts, schema: str, table: str,
                  oid: int) -> tuple[RemoteConnection | None, str | None]:
    """Open the remote connection of ``task`` (of the table ``schema``.``table``, ``oid``):
    (connection, None) or (None, the task's error); raises Unsent when connecting failed (a try
    later may succeed)."""
    try:
        user_params = dict(parse_remote(task.remote))
    except psycopg.Error as exc:
        return None, simple_error("PQconninfoParse failed", message(exc))
    try:
        superuser, encoding = await facts(task.user)
    except psycopg.Error as exc:  # the local server, asked about the task's role
        raise Unsent(simple_error(f"could not look up role {task.user}", message(exc))) from exc
    if not superuser and not user_params.get("password"):
        # Otherwise the service's own credentials (PGPASSWORD, .pgpass) would be used for the author.
        return None, simple_error(PASSWORD_REQUIRED, NO_PASSWORD_KEYWORD)
    params = connect_params(user_params, schema, table, oid, task.group, encoding)
    try:
        conn = await psycopg.AsyncConnection.connect(conninfo(params), autocommit=True,
                                                     prepare_threshold=None)
    except psycopg.Error as exc:
        raise Unsent(_connect_error(message(exc))) from exc
    if not superuser and not conn.pgconn.used_password:
        await conn.close()
        return None, "\n".join([simple_error(PASSWORD_REQUIRED, PASSWORD_NOT_USED),
                                f"HINT:  {PASSWORD_NOT_USED_HINT}"])
    return RemoteConnection(conn), None


async def run(remote: RemoteConnection, task: Task, output_limit: int,
              started: Awaitable[bool] | None = None,
              style: ErrorStyle = DEFAULT_STYLE) -> tuple[str | None, str | None]:
    """Preamble, input, COMMIT of an open transaction: (output, error), the error written in
    ``style`` (the service's: as pg_task's worker writes a remote task's error).

    ``started`` as in local_input.run_input: awaited after the preamble; False raises NotStarted.
    Raises Lost if the connection is lost.
    """
    await remote.settled()  # a cancel meant for the task before on this connection must not reach this one
    out = Output(task.format(), output_limit, remote.encoding)
    remote.sent = False
    try:
        return await _run(remote, task, out, started, style)
    except psycopg.OperationalError as exc:
        raise Lost(exc, out.value(remote.encoding), remote.sent) from exc


class Lost(Exception):
    """The remote connection broke while a task ran: ``output`` is what had arrived before (the
    task's output, as for any other error); ``sent``: its input had been sent (it may have run)."""

    def __init__(self, exc: psycopg.OperationalError, output: str | None, sent: bool = True):
        super().__init__(str(exc))
        self.exc, self.output, self.sent = exc, output, sent


async def _run(remote: RemoteConnection, task: Task, out: Output, started: Awaitable[bool] | None,
               style: ErrorStyle) -> tuple[str | None, str | None]:
    enc = remote.encoding
    pgconn = remote.pgconn
    error: str | None = None
    err = await wire.simple(pgconn, preamble(task, check_client=pgconn.server_version >= 140000), enc)
    wire.raise_if_lost(err, pgconn)  # the session ended (a server shutting down): not the task's error
    if started is not None and not await started:
        raise NotStarted(task.id)
    if err is not None:
        error = format_error(err, task.input, enc, style=style)
    else:
        remote.sent = True
        err = await wire.run(pgconn, task.input, out, local=False, encoding=enc)
        enc = remote.encoding_now()  # the input may have changed it
        if err is not None:
            error = format_error(err, task.input, enc, style=style)
        if pgconn.transaction_status != pq.TransactionStatus.IDLE:
            # An open (or failed) transaction block left by input: COMMIT (or ROLLBACK); no tag.
            end = await wire.simple(pgconn, "COMMIT", enc)
            if end is not None and error is None:
                error = format_error(end, task.input, enc, style=style)
    return out.outcome(enc, error)


async def discard(remote: RemoteConnection) -> str | None:
    try:
        err = await wire.simple(remote.pgconn, "DISCARD ALL", remote.encoding)
    except psycopg.OperationalError as exc:
        return message(exc)
    return format_error(err, None, remote.encoding) if err is not None else None
