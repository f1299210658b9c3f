"""SPI mode (``pg_task.spi = on``): a local task's input as one atomic unit, SPI's restrictions.

The C extension calls ``SPI_execute(input)`` inside a subtransaction of its worker. We have a client
session instead, so we keep what a task author can observe:

* the whole input is one atomic unit: it runs inside ``BEGIN`` ... ``COMMIT`` (``ROLLBACK`` on any
  error), so a failing statement undoes the earlier ones;
* statements are split with PostgreSQL's own parser (pglast: ``stmt_location``/``stmt_len``); the
  first ``COPY`` of any kind fails the task with ``SPI_ERROR_COPY`` and the first transaction
  control statement (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, PREPARE TRANSACTION, ...) with
  ``SPI_ERROR_TRANSACTION`` -- the statements before it run first (their output is kept) and are
  then rolled back, as SPI executes statement by statement and rolls back its subtransaction;
* every statement's result is appended exactly as in local mode (the manual's PostgreSQL 10+
  behaviour);
* an error the server raises while running input carries SPI's extra context line
  ``CONTEXT:  SQL statement "<input>"`` (spec section 5.2).

Where this differs from the C code is listed in docs/execution.md.
"""

from __future__ import annotations

import pglast
from psycopg import pq

from . import wire
from .config import parse_bool
from .output import DEFAULT_STYLE, ErrorStyle, Output, format_error, simple_error
from .sql import query

E = pq.ExecStatus
F = pq.DiagnosticField

# The effective pg_task.spi of the task's author. A login session sees ALTER SYSTEM (after a
# reload), ALTER DATABASE, ALTER ROLE and ALTER ROLE ... IN DATABASE settings itself.
# (An expression, not a scalar subquery: planning a subquery was about 9 us of the server's CPU a
# task, an eighth of the preamble's own.)
SETTING_LOGIN = "nullif(current_setting('pg_task.spi', true), '')"
# After SET ROLE (execute_as = set_role) the session's settings are the service role's: the
# author's own role settings are read from the catalog first.
SETTING_SET_ROLE = query("settings.sql", "spi_set_role")


def setting(set_role: bool) -> str:
    """An expression: the author's effective pg_task.spi (NULL: not set)."""
    return f"({SETTING_SET_ROLE if set_role else SETTING_LOGIN})"


def use_spi(value: str | None, default: bool) -> tuple[bool, str | None]:
    """(use SPI?, the task's error text when the value is not a boolean) for a read setting()."""
    if value is None:
        return default, None
    flag = parse_bool(value)
    if flag is None:
        return False, "\n".join([simple_error(f'invalid value for parameter "pg_task.spi": "{value}"'),
                                  'HINT:  "pg_task.spi" requires a Boolean value'])
    return flag, None


def refusal(text: str) -> tuple[int, str] | None:
    """(where the first statement SPI refuses starts, SPI's error name), or None."""
    try:
        statements = pglast.parse_sql(text)
    except pglast.parser.ParseError:
        return None  # the server reports the syntax error itself
    for raw in statements:
        kind = type(raw.stmt).__name__
        if kind == "CopyStmt":
            return raw.stmt_location, "SPI_ERROR_COPY"
        if kind == "TransactionStmt":
            return raw.stmt_location, "SPI_ERROR_TRANSACTION"
    return None


class _WithContext:
    """A failed result whose CONTEXT gets SPI's ``SQL statement "<input>"`` line appended."""

    def __init__(self, res: pq.abc.PGresult, input_text: str, encoding: str):
        self.res, self.input_text, self.encoding = res, input_text, encoding
        self.error_message = res.error_message

    def error_field(self, code: pq.DiagnosticField) -> bytes | None:
        value = self.res.error_field(code)
        if code != F.CONTEXT:
            return value
        line = f'SQL statement "{self.input_text}"'.encode(self.encoding, "replace")
        return value + b"\n" + line if value else line


def _error(res: pq.abc.PGresult, input_text: str, encoding: str, style: ErrorStyle) -> str:
    with_context = _WithContext(res, input_text, encoding)
    return format_error(with_context, input_text, encoding, style=style)  # type: ignore[arg-type]


async def run(pgconn: pq.abc.PGconn, input_text: str, out: Output, encoding: str,
              style: ErrorStyle = DEFAULT_STYLE) -> str | None:
    """Run ``input_text`` the SPI way on an idle session; returns the error text or None.

    Leaves the session idle (committed or rolled back). Raises psycopg.OperationalError if the
    connection is lost.
    """
    refused = refusal(input_text)
    runnable = input_text if refused is None else input_text[:refused[0]]
    err = await wire.simple(pgconn, "BEGIN", encoding)
    if err is not None:
        return format_error(err, input_text, encoding, style=style)
    error: str | None = None
    if runnable.strip():
        copied: list[int] = []
        out.raw = lambda text: copied.append(len(text))  # COPY data is refused, never kept
        try:
            err = await wire.run(pgconn, runnable, out, local=True, encoding=encoding)
        finally:
            del out.raw
        wire.raise_if_lost(err, pgconn)  # the session ended: not the task's error
        if err is not None:
            error = _error(err, input_text, encoding, style)
        elif copied:  # only reachable if pglast could not parse input
            error = simple_error("SPI_ERROR_COPY", statement=input_text, style=style)
    if error is None and refused is not None:
        error = simple_error(refused[1], statement=input_text, style=style)
    status = pgconn.transaction_status
    if status == pq.TransactionStatus.IDLE:
        # Input ended the transaction itself (only if pglast could not parse it).
        return error or simple_error("SPI_ERROR_TRANSACTION", statement=input_text, style=style)
    end = await wire.simple(pgconn, "COMMIT" if error is None else "ROLLBACK", encoding)
    if end is not None and error is None:
        error = format_error(end, input_text, encoding, style=style)
    return error
