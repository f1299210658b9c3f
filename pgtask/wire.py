"""Driving a libpq connection without blocking: send one simple query and collect every result.

Used for task input on both paths (local and remote): every statement's result is kept (psycopg's
cursor loses the results before an error), COPY TO STDOUT is streamed, COPY FROM STDIN refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
from psycopg import pq

from .output import (
    COMMAND_OK,
    COPY_BOTH,
    COPY_IN,
    COPY_OUT,
    FATAL_ERROR,
    SINGLE_TUPLE,
    TUPLES_OK,
    Output,
    format_error,
)

CANCELLED = "57014"  # query_canceled: a cancel request, or statement_timeout


async def _wait(fd: int, write: bool = False) -> None:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    add, remove = (loop.add_writer, loop.remove_writer) if write else (loop.add_reader, loop.remove_reader)
    add(fd, lambda: fut.done() or fut.set_result(None))
    try:
        await fut
    finally:
        remove(fd)


def _check(pgconn: pq.abc.PGconn) -> None:
    if pgconn.status == pq.ConnStatus.BAD:
        msg = pgconn.error_message.decode("utf-8", "replace").strip()
        raise psycopg.OperationalError(msg or "connection lost")


async def _consume(pgconn: pq.abc.PGconn) -> None:
    await _wait(pgconn.socket)
    try:
        pgconn.consume_input()
    except psycopg.Error:
        _check(pgconn)
        raise


async def send(pgconn: pq.abc.PGconn, text: str | bytes, encoding: str = "utf-8", single_row: bool = False) -> None:
    try:
        pgconn.send_query(text if isinstance(text, bytes) else text.encode(encoding))
        if single_row:
            pgconn.set_single_row_mode()
    except psycopg.Error:
        _check(pgconn)
        raise
    while pgconn.flush() != 0:
        await _wait(pgconn.socket, write=True)


async def send_prepared(pgconn: pq.abc.PGconn, name: bytes, params: list[bytes | None]) -> None:
    """Execute the prepared statement ``name`` with text parameters (the extended protocol)."""
    try:
        pgconn.send_query_prepared(name, params)
    except psycopg.Error:
        _check(pgconn)
        raise
    while pgconn.flush() != 0:
        await _wait(pgconn.socket, write=True)


_BUSY = object()  # _arrived: the next result has not arrived yet


def _arrived(pgconn: pq.abc.PGconn) -> pq.abc.PGresult | object | None:
    """The next result if it has arrived (None: the query is over), else _BUSY -- a plain call,
    for the loops that take every arrived result without a coroutine each (see run)."""
    if pgconn.is_busy():
        return _BUSY
    res = pgconn.get_result()
    if res is None:
        _check(pgconn)
    return res


async def next_result(pgconn: pq.abc.PGconn) -> pq.abc.PGresult | None:
    while (res := _arrived(pgconn)) is _BUSY:
        await _consume(pgconn)
    return res


class LeadFailed(Exception):
    """One of the leading statements ``run`` was told to skip failed: nothing after it ran."""

    def __init__(self, result: pq.abc.PGresult):
        super().__init__("a leading statement failed")
        self.result = result


async def run(pgconn: pq.abc.PGconn, text: str, out: Output, local: bool,
              encoding: str = "utf-8", skip: int = 0) -> pq.abc.PGresult | None:
    """Run ``text`` as one simple query; format results into ``out``; return the first error result.

    ``skip``: the first ``skip`` statements of ``text`` are not input (a preamble sent in the same
    round trip): their results are dropped, and if one of them fails, LeadFailed is raised with
    its error once the query is over (the server ran nothing after it).
    Raises psycopg.OperationalError when the connection is lost (outcome unknown).
    """
    await send(pgconn, text, encoding, single_row=True)
    error: pq.abc.PGresult | None = None
    in_rows = False
    both = False  # a COPY BOTH was refused: its stream's data (libpq reads it as COPY OUT) is not output
    while True:
        if (res := _arrived(pgconn)) is _BUSY:
            await _consume(pgconn)
            continue
        if res is None:
            return error
        status = res.status
        if skip:
            if status == FATAL_ERROR:
                while await next_result(pgconn) is not None:
                    pass
                raise LeadFailed(res)
            if status == TUPLES_OK or status == COMMAND_OK:  # a statement's end (SINGLE_TUPLE: one of its rows)
                skip -= 1
            continue
        if status == SINGLE_TUPLE:
            # single-row mode: rows arrive one by one, so a huge result never sits in memory whole
            if not in_rows:
                out.header(res)
                in_rows = True
            out.row(res)
        elif status == TUPLES_OK:
            in_rows = False
            out.result(res, local)  # zero rows left: only the DML tag, where one is printed
        elif status == FATAL_ERROR:
            in_rows = False
            if error is None:
                error = res
        elif status == COPY_OUT:
            await _copy_out(pgconn, _dropped if both else out.raw, encoding)
            tag = await next_result(pgconn)  # the COPY n tag: not printed, but may be an error
            if tag is not None and tag.status == FATAL_ERROR and error is None:
                error = tag
        elif status == COPY_IN or status == COPY_BOTH:
            what = "COPY FROM STDIN" if status == COPY_IN else "COPY BOTH"
            both = status == COPY_BOTH
            pgconn.put_copy_end(f"{what} is not supported".encode())
            while pgconn.flush() != 0:
                await _wait(pgconn.socket, write=True)
        else:
            out.result(res, local)


def _dropped(text: str) -> None:
    """A sink for copy data that is not output."""


async def _copy_out(pgconn: pq.abc.PGconn, sink: Callable[[str], None], encoding: str) -> None:
    while True:
        nbytes, data = pgconn.get_copy_data(1)
        if nbytes > 0:
            sink(bytes(data).decode(encoding, "replace"))
        elif nbytes == 0:
            await _consume(pgconn)
        else:
            if nbytes == -2:
                _check(pgconn)
                raise psycopg.OperationalError(pgconn.error_message.decode(encoding, "replace").strip())
            return


async def results(pgconn: pq.abc.PGconn) -> tuple[list[pq.abc.PGresult], pq.abc.PGresult | None]:
    """Every result of the query sent: (those with rows, in order; the first error, or None)."""
    rows, error = [], None
    while (res := await next_result(pgconn)) is not None:
        status = res.status
        if status == TUPLES_OK:
            rows.append(res)
        elif status == FATAL_ERROR and error is None:
            error = res
    return rows, error


async def simple(pgconn: pq.abc.PGconn, text: str, encoding: str = "utf-8") -> pq.abc.PGresult | None:
    """Run housekeeping statements; return the first error result (results discarded)."""
    await send(pgconn, text, encoding)
    return (await results(pgconn))[1]


def sqlstate(res: pq.abc.PGresult) -> str:
    return (res.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()


def lost(res: pq.abc.PGresult | None, pgconn: pq.abc.PGconn) -> bool:
    """An error that ended the session itself (server shutdown or crash, a terminated backend, a
    broken connection): the outcome of the input is unknown, so it is not the task's error -- the
    caller treats it as a lost connection. Told by what happened to the session (a FATAL or PANIC,
    or the connection gone), never by the SQLSTATE alone: a task may raise 57P01 or 08006 itself
    (RAISE ... USING ERRCODE), and that is its error like any other, not a reason to run it again."""
    if res is None:
        return False
    severity = (res.error_field(pq.DiagnosticField.SEVERITY_NONLOCALIZED) or b"").decode()
    return severity in ("FATAL", "PANIC") or pgconn.status == pq.ConnStatus.BAD


def raise_if_lost(res: pq.abc.PGresult | None, pgconn: pq.abc.PGconn) -> None:
    """Raise psycopg.OperationalError (a lost connection, to the caller) if ``res`` is lost()."""
    if lost(res, pgconn):
        raise psycopg.OperationalError(format_error(res, None))
