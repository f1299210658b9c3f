"""Running one task's input on its author's session (the manual's pg_task, locally): the preamble
-- its settings, the fenced start, the author's pg_task.spi -- then the input, in one round trip or
two, through the simple-query protocol (wire.py); its output and error as pg_task writes them."""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Awaitable, Callable

import pglast
from psycopg import pq, sql

from . import spi as spi_mode
from . import sql as named
from . import wire
from .connect import group_settings
from .inputs import INLINE
from .names import function_name
from .output import Output, format_error, simple_error
from .session import Session
from .task import NotStarted, Task

# The session's reset (see session.RESET_SESSION) as a preamble sends it: the statements before its
# SELECT, whose advisory unlock is a column of the SELECT (one statement less a task).
_RESET_STATEMENTS = named.query("session.sql", "reset")
_UNLOCK = named.query("session.sql", "unlock")
_PREAMBLE = named.query("session.sql", "preamble")
_ONE_TRIP_PREAMBLE = named.query("session.sql", "one_trip_preamble")

_COPY = re.compile("copy", re.IGNORECASE)


def refused_copy(text: str) -> str | None:
    """Local input may not use COPY ... FROM STDIN / TO STDOUT (there is no client to stream to)."""
    if _COPY.search(text) is None:
        return None  # a keyword cannot be quoted, escaped or split: no COPY statement (skips the parse)
    try:
        statements = pglast.parse_sql(text)
    except pglast.parser.ParseError:
        return None  # the server reports the syntax error itself
    for raw in statements:
        stmt = raw.stmt
        if type(stmt).__name__ == "CopyStmt" and stmt.filename is None and not stmt.is_program:
            return "COPY FROM STDIN is not supported" if stmt.is_from else "COPY TO STDOUT is not supported"
    return None


@functools.lru_cache(maxsize=4096)
def _set_configs(wanted: tuple[tuple[str, str], ...], own: tuple[tuple[str, str], ...]) -> str:
    """``set_config(...), `` for each of ``wanted`` that the session's ``own`` settings do not
    already give it (quoted once, then cached)."""
    have = dict(own)
    return "".join(
        sql.SQL("set_config({}, {}, false), ").format(sql.Literal(name), sql.Literal(value)).as_string(None)
        for name, value in wanted if have.get(name) != value)


@functools.lru_cache(maxsize=1024)
def _set_role(user: str) -> str:
    return sql.SQL("SET ROLE {}; ").format(sql.Identifier(user)).as_string(None)


@functools.lru_cache(maxsize=64)
def _table_function(schema: str, table: str, kind: str) -> str:
    return sql.Identifier(schema, function_name(table, kind)).as_string(None)


def _start(task: Task, schema: str, table: str) -> str:
    """The task's start: the table's start function (TAKE -> WORK on this session), or for a task
    the claim started on this session already, its check function (see "check" in triggers.sql)."""
    lease = task.lease if isinstance(task.lease, uuid.UUID) else uuid.UUID(str(task.lease))  # into SQL text
    kind = "start" if task.session_pid is None else "check"
    return f"{_table_function(schema, table, kind)}({int(task.id)}, {int(task.attempt)}, '{lease}'::uuid)"


def _session_settings(task: Task, schema: str, table: str, oid: int, reset: bool, own: tuple) -> str:
    """The preamble's settings: pg_task.id, the group's settings the session does not have of its
    own, statement_timeout; synchronous_commit off for the preamble's own commit."""
    return (f"set_config('pg_task.id', '{int(task.id)}', false), "
            f"{_set_configs(group_settings(task.group, schema, table, oid), own)}"
            f"set_config('statement_timeout', '{int(task.timeout_ms)}', false), "
            f"set_config('synchronous_commit', 'off', true){', ' + _UNLOCK if reset else ''}")


def _lead(task: Task, set_role: bool, reset: bool) -> str:
    """The statements before the preamble's SELECT: the reset (its advisory unlock is in the
    SELECT, see _session_settings), then SET ROLE in set_role mode."""
    return f"{_RESET_STATEMENTS + '; ' if reset else ''}{_set_role(task.user) if set_role else ''}"


def preamble(task: Task, schema: str, table: str, oid: int, set_role: bool, reset: bool,
             own: tuple[tuple[str, str], ...]) -> str:
    """What the manual's pg_task worker sets before input (session settings pg_task.id, .group,
    .schema, .table, .oid, application_name, statement_timeout), then, in the same statement: the
    task's start (the table's start function: the fenced TAKE -> WORK write, see triggers.sql) and
    the author's pg_task.spi. One round trip and one transaction, which commits without waiting for
    the WAL flush, as the service's own TAKE -> WORK writes. Its one row: (started, spi, ...).
    ``reset``: the session is first reset from its previous task (session.RESET_SESSION);
    ``own``: the session's own settings (Session.settings), which need no set_config. Its
    transaction is READ WRITE (first, before any statement takes a snapshot) whatever the author's
    default_transaction_read_only: the start is pgtask's write, not the author's.
    """
    return _PREAMBLE.format(lead=_lead(task, set_role, reset), start=_start(task, schema, table),
                            spi=spi_mode.setting(set_role),
                            settings=_session_settings(task, schema, table, oid, reset, own))


# Input that may not share its query string with the preamble: statements that refuse to run in a
# transaction block or a multi-statement string (VACUUM, CREATE DATABASE, ... CONCURRENTLY, a CALL
# or DO that commits), that act differently inside one (LOCK, DECLARE), transaction control, and
# whatever shows the query string itself. Matched as words anywhere, so some plain input (a CASE
# ... END) takes the two round trips too: that costs time, never a difference in behaviour.
_OWN_TRIP = re.compile(
    r"\b(vacuum|concurrently|database|tablespace|system|cluster|subscription|prepared?|discard|"
    r"call|do|reindex|lock|declare|savepoint|release|begin|start|commit|rollback|end|abort|copy|"
    r"current_query|pg_stat_activity)\b|--|/\*", re.IGNORECASE)


def one_trip(session: Session, text: str, spi_default: bool) -> bool:
    """Whether the task's input can follow its preamble in the same round trip (see
    one_trip_preamble). A large input takes two: it is sent as it is, not copied behind a preamble."""
    return (len(text) <= INLINE and session.spi_known and not spi_mode.use_spi(session.spi, spi_default)[0]
            and not text.isspace() and text != "" and _OWN_TRIP.search(text) is None)


def one_trip_preamble(task: Task, schema: str, table: str, oid: int, session: Session,
                      reset: bool) -> tuple[str, int]:
    """(preamble, its statement count) to send in the same query string before the input.

    The preamble is a transaction block of its own (BEGIN ... COMMIT) that commits before the input
    runs, as in two round trips. (A COMMIT without the BEGIN would end the string's implicit
    transaction too, but with a WARNING "there is no transaction in progress" -- in the server log
    for every task.) It fails -- and then nothing of it, nor the input, runs -- when the task cannot
    start (its lease was lost) or the author's pg_task.spi is no longer the value this session last
    read (the input would run in the wrong mode): the caller then rolls the block back and takes
    the two round trips. The block is READ WRITE whatever the author's default_transaction_read_only
    (as the preamble of two round trips): the start is pgtask's write, the input runs as the author
    set it.
    """
    expected = sql.Literal(session.spi).as_string(None) if session.spi is not None else "NULL"
    # 1 / false::int: an error (division by zero) computed at run time, after the start function;
    # the input follows the COMMIT after a space
    text = _ONE_TRIP_PREAMBLE.format(
        lead=_lead(task, session.set_role, reset), start=_start(task, schema, table),
        spi=spi_mode.setting(session.set_role), expected=expected,
        settings=_session_settings(task, schema, table, oid, reset, session.settings)) + " "
    statements = 1 + (_RESET_STATEMENTS.count(";") + 1 if reset else 0) + int(session.set_role) + 2
    return text, statements


async def run_preamble(session: Session, text: str) -> tuple[pq.abc.PGresult | None, bool, str | None]:
    """(error result, started?, the author's pg_task.spi) of preamble(); on an error nothing of it
    took effect (one implicit transaction)."""
    await wire.send(session.pgconn, text, session.encoding)
    rows, error = await wire.results(session.pgconn)
    if error is not None or not rows:
        return error, False, None
    res = rows[-1]  # the SELECT: the only statement with rows
    raw = res.get_value(0, 1)
    return None, res.get_value(0, 0) == b"t", raw.decode(session.encoding) if raw is not None else None


async def run_input(session: Session, task: Task, schema: str, table: str, oid: int,
                    output_limit: int, spi: bool = False,
                    start_work: Callable[[], Awaitable[bool]] | None = None) -> tuple[str | None, str | None]:
    """Run one task's input on ``session``; returns (output, error).

    ``spi`` is the entry's pg_task.spi; the author's session value (ALTER SYSTEM/DATABASE/ROLE)
    wins when set, and is read in the preamble's round trip.
    The task's fenced TAKE -> WORK write (state, start, this session's pid) is made by the session
    itself in the preamble's round trip; if the lease was lost, NotStarted is raised and the input
    never runs. If the preamble fails, ``start_work`` writes it the service's way first.
    Once the session has read the author's pg_task.spi, plain input travels in the preamble's
    query string (one round trip, see one_trip_preamble); anything else takes two.
    Raises psycopg.OperationalError if the connection was lost (the outcome is unknown).
    """
    await session.settled()  # a cancel meant for the task before must not reach this one
    await session.style()  # read again after a configuration reload
    if session.needs_reset and session.encoding_changed():
        # The previous task changed the session's client encoding: the server would read this
        # task's text in that encoding. The reset (ASCII) first, on its own, restores it.
        await session.reset()
    out = Output(task.format(), output_limit, session.encoding)
    if not one_trip(session, task.input, spi):
        return await _two_trips(session, task, schema, table, oid, out, spi, start_work)
    lead, statements = one_trip_preamble(task, schema, table, oid, session, session.needs_reset)
    try:
        err = await wire.run(session.pgconn, lead + task.input, out, local=True,
                             encoding=session.encoding, skip=statements)
    except wire.LeadFailed as failed:
        # Nothing of it ran: two round trips -- unless it was cancelled (STOP, shutdown): then the
        # input must not run at all, and the task ends as a cancelled two-trip preamble does.
        wire.raise_if_lost(failed.result, session.pgconn)
        if session.pgconn.transaction_status == pq.TransactionStatus.INERROR:  # the preamble's block
            wire.raise_if_lost(await wire.simple(session.pgconn, "ROLLBACK", session.encoding), session.pgconn)
        session.needs_reset = True
        cancelled = failed.result if wire.sqlstate(failed.result) == wire.CANCELLED else None
        return await _two_trips(session, task, schema, table, oid, out, spi, start_work, cancelled)
    session.needs_reset = True
    return await _end_input(session, task, out, err, offset=len(lead))


async def _two_trips(session: Session, task: Task, schema: str, table: str, oid: int, out: Output, spi: bool,
                     start_work: Callable[[], Awaitable[bool]] | None,
                     cancelled: pq.abc.PGresult | None = None) -> tuple[str | None, str | None]:
    """The preamble (which reads the author's pg_task.spi), then the input; ``cancelled``: the
    preamble already failed that way (see run_input)."""
    error: str | None = None
    if cancelled is not None:
        err, started, spi_value = cancelled, False, None
    else:
        err, started, spi_value = await run_preamble(
            session, preamble(task, schema, table, oid, session.set_role, reset=session.needs_reset,
                              own=session.settings))
    wire.raise_if_lost(err, session.pgconn)
    session.needs_reset = True  # it holds this task's settings now (or still the previous task's)
    if err is None:
        session.spi, session.spi_known = spi_value, True
    use_spi, bad_setting = spi_mode.use_spi(spi_value, spi) if err is None else (spi, None)
    if err is not None and start_work is not None:
        started = await start_work()
    if not started:
        raise NotStarted(task.id)
    if err is not None:
        error = format_error(err, task.input, session.encoding, style=session.error_style)
    elif bad_setting is not None:
        error = bad_setting
    elif use_spi:
        error = await spi_mode.run(session.pgconn, task.input, out, session.encoding, session.error_style)
    elif (refusal := refused_copy(task.input)) is not None:
        error = simple_error(refusal, statement=task.input, style=session.error_style)
    else:
        err = await wire.run(session.pgconn, task.input, out, local=True, encoding=session.encoding)
        return await _end_input(session, task, out, err)
    return out.outcome(session.encoding_now(), error)


async def _end_input(session: Session, task: Task, out: Output, err: pq.abc.PGresult | None,
                     offset: int = 0) -> tuple[str | None, str | None]:
    """After the input ran: its error (positions counted from the input's start, ``offset``
    characters into the query string), a transaction it left open ended; (output, error)."""
    wire.raise_if_lost(err, session.pgconn)
    encoding = session.encoding_now()  # the input may have changed it
    style = session.error_style
    error = format_error(err, task.input, encoding, style=style, offset=offset) if err is not None else None
    status = session.pgconn.transaction_status
    if status in (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR):
        # A transaction left open by input is committed (a failed one rolls back); tag not printed.
        end = await wire.simple(session.pgconn, "COMMIT", encoding)
        wire.raise_if_lost(end, session.pgconn)
        if end is not None and error is None:
            error = format_error(end, task.input, encoding, style=style)
    return out.outcome(encoding, error)
