"""Result and error text, exactly as pg_task writes them (spec section 7).

output: pieces (header line, data rows, command tags) joined by "\\n"; NULL until the first piece.
error:  "<SEVERITY>:  <message>[ at character N]" then DETAIL/HINT/QUERY/CONTEXT/STATEMENT lines
        (as log_error_verbosity and log_min_error_statement have them: ErrorStyle).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from psycopg import pq

# Types whose values are never quoted when `string` is on (pg_task's "nonstring" set).
NONSTRING_OIDS = frozenset({16, 1560, 29, 700, 701, 21, 23, 20, 1700, 26, 27, 28})

DML_TAGS = (b"INSERT", b"UPDATE", b"DELETE", b"MERGE")
# Result statuses as plain ints, for the checks made on every result (here and in wire.run): looking
# up an ExecStatus member costs more than the comparison itself (0.1 us each, a dozen results a task).
(COMMAND_OK, TUPLES_OK, SINGLE_TUPLE, FATAL_ERROR, COPY_OUT, COPY_IN, COPY_BOTH) = (
    int(getattr(pq.ExecStatus, name)) for name in (
        "COMMAND_OK", "TUPLES_OK", "SINGLE_TUPLE", "FATAL_ERROR", "COPY_OUT", "COPY_IN", "COPY_BOTH"))
TRUNCATED = "\n... [output truncated at {limit} characters by pgtask]"
_SURROGATE = re.compile("[\udc80-\udcff]")  # a byte decoding kept as it was (surrogateescape)


@dataclass(frozen=True)
class Format:
    delimiter: str = "\t"
    quote: str = ""
    escape: str = ""
    null: str = "\\N"
    header: bool = True
    string: bool = True


class Output:
    """Accumulates output pieces with a cap in characters (bounded memory for huge results).

    Text is decoded in ``encoding``, the connection's client encoding when the input started; bytes
    that are not valid in it are kept (surrogateescape) until value() knows the encoding the input
    left (it may have changed it: SET client_encoding), so decoding never fails mid-result.
    """

    def __init__(self, fmt: Format, limit: int, encoding: str = "utf-8"):
        self.fmt, self.limit, self.encoding = fmt, limit, encoding
        self.parts: list[str] = []
        self.size = 0
        self.pieces = 0
        self.truncated = False

    def _append(self, text: str) -> None:
        if self.truncated:
            return
        if self.size + len(text) > self.limit:
            text = text[: max(self.limit - self.size, 0)]
            self.truncated = True
        self.parts.append(text)
        self.size += len(text)
        if self.truncated:
            self.parts.append(TRUNCATED.format(limit=self.limit))

    def piece(self, text: str) -> None:
        if self.pieces:
            self._append("\n")
        self.pieces += 1
        self._append(text)

    def raw(self, text: str) -> None:
        """COPY TO STDOUT data: appended as is, with no separator -- but for NUL bytes (binary COPY
        has them), which no text column holds: each becomes U+FFFD, as a byte the encoding cannot
        read does (the write of the task's result would be refused, for good)."""
        self.pieces += 1
        self._append(text.replace("\x00", "\ufffd") if "\x00" in text else text)

    def outcome(self, encoding: str | None, error: str | None) -> tuple[str | None, str | None]:
        """A run's (output, error): the output (see value), empty rather than NULL beside an error."""
        output = self.value(encoding)
        if error is not None and output is None:
            output = ""
        return output, error

    def value(self, encoding: str | None = None) -> str | None:
        """The output; ``encoding``: the connection's client encoding now, after the input. If the
        input changed it, what came after the change is in that encoding: the text is decoded again
        in it (the SET statement's own tag and anything ASCII read the same either way). Bytes valid
        in neither become U+FFFD, or ``?`` where the starting encoding (the one the service writes
        the output in) has no such character (SQL_ASCII)."""
        if not self.pieces:
            return None
        text = "".join(self.parts)
        now = encoding or self.encoding
        if now == self.encoding and (text.isascii() or _SURROGATE.search(text) is None):
            return text
        try:
            raw = text.encode(self.encoding, "surrogateescape")
        except UnicodeEncodeError:  # a format character (null, delimiter) the encoding lacks
            return _SURROGATE.sub("\ufffd", text)
        return raw.decode(now, "replace").encode(self.encoding, "replace").decode(self.encoding)

    def _quoted(self, value: str, nonstring: bool) -> str:
        f = self.fmt
        if not f.quote or (f.string and nonstring):
            return value
        if f.escape:
            value = "".join(f.escape + ch if ch in (f.quote, f.escape) else ch for ch in value)
        return f"{f.quote}{value}{f.quote}"

    def result(self, res: pq.PGresult, local: bool) -> None:
        """Append one whole result set: header and rows, or the command tag."""
        if res.status == TUPLES_OK and res.ntuples > 0:
            self.header(res)
            for row in range(res.ntuples):
                self.row(res, row)
                if self.truncated:
                    return
        self.end(res, local)

    def header(self, res: pq.PGresult) -> None:
        """Before a result set's first row: the column names, when asked and more than one column."""
        nfields = res.nfields
        self._nonstring = [res.ftype(i) in NONSTRING_OIDS for i in range(nfields)]
        if self.fmt.header and nfields > 1:
            self.piece(self.fmt.delimiter.join(
                self._quoted((res.fname(i) or b"").decode(self.encoding, "surrogateescape"), False)
                for i in range(nfields)))

    def row(self, res: pq.PGresult, row: int = 0) -> None:
        if self.truncated:
            return  # rows still arrive from the server; they are read and dropped (bounded memory)
        cells = []
        for col in range(res.nfields):
            raw = res.get_value(row, col)
            cells.append(self.fmt.null if raw is None else
                         self._quoted(raw.decode(self.encoding, "surrogateescape"), self._nonstring[col]))
        self.piece(self.fmt.delimiter.join(cells))

    def end(self, res: pq.PGresult, local: bool) -> None:
        """The end of a statement: its tag, unless it returned rows (DML RETURNING: locally, after them)."""
        tag = res.command_status or b""
        status = res.status
        if status == TUPLES_OK:
            if local and tag.startswith(DML_TAGS):
                self.piece(tag.decode(self.encoding, "surrogateescape"))
        elif status == COMMAND_OK and tag:
            self.piece(tag.decode(self.encoding, "surrogateescape"))


def _tabbed(text: str) -> str:
    return text.replace("\n", "\n\t")


# log_min_error_statement's levels, lowest first (the server's order: LOG ranks above ERROR there)
_LEVELS = ("debug5", "debug4", "debug3", "debug2", "debug1", "info", "notice", "warning", "error",
           "log", "fatal", "panic")


@dataclass(frozen=True)
class ErrorStyle:
    """The server settings pg_task writes a task's error by, as its server log would write it:
    log_error_verbosity (terse: no DETAIL, HINT, QUERY or CONTEXT; verbose: the SQLSTATE and a
    LOCATION line too) and log_min_error_statement (the STATEMENT line only for errors at least
    that severe). Read on the connection whose settings count: a local task's session ("error_style"
    in sql/session.sql), the service's own connection for a remote task (pg_task's worker formats
    those: "next" in sql/queries.sql)."""
    verbosity: str = "default"
    min_statement: str = "error"

    @classmethod
    def of(cls, row: tuple | None) -> ErrorStyle:
        return cls(*(str(v).lower() for v in row)) if row else cls()

    def statement(self, severity: str) -> bool:
        level = severity.lower()
        rank = _LEVELS.index(level) if level in _LEVELS else _LEVELS.index("error")
        least = self.min_statement if self.min_statement in _LEVELS else "error"
        return rank >= _LEVELS.index(least)


DEFAULT_STYLE = ErrorStyle()


def format_error(res: pq.PGresult | None, input_text: str | None, encoding: str = "utf-8",
                 message: str | None = None, style: ErrorStyle = DEFAULT_STYLE, offset: int = 0) -> str:
    """The error text of a failed result (or of a bare message with no result).

    ``style``: the verbosity and the STATEMENT line's threshold (see ErrorStyle).
    ``offset``: characters sent before the input in the same query string (a preamble): the
    error's position is counted from the start of the input.
    """
    def field(code: pq.DiagnosticField) -> str | None:
        if res is None:
            return None
        raw = res.error_field(code)
        return raw.decode(encoding, "replace") if raw is not None else None

    F = pq.DiagnosticField
    severity = field(F.SEVERITY) or "ERROR"
    primary = field(F.MESSAGE_PRIMARY)
    if primary is None:
        primary = message or (res.error_message.decode(encoding, "replace").strip() if res else "unknown error")
        if primary.startswith(("ERROR:  ", "FATAL:  ")):
            primary = primary.split(":  ", 1)[1]
    head = f"{severity}:  "
    verbose = style.verbosity == "verbose"
    if verbose and field(F.SQLSTATE):
        head += f"{field(F.SQLSTATE)}: "
    head += primary
    pos = field(F.STATEMENT_POSITION)
    if pos and offset:
        pos = str(int(pos) - offset)
    pos = pos or field(F.INTERNAL_POSITION)
    if pos:
        head += f" at character {pos}"
    lines = [_tabbed(head)]
    for label, code in (("DETAIL", F.MESSAGE_DETAIL), ("HINT", F.MESSAGE_HINT),
                        ("QUERY", F.INTERNAL_QUERY), ("CONTEXT", F.CONTEXT)) if style.verbosity != "terse" else ():
        value = field(code)
        if value:
            lines.append(f"{label}:  {_tabbed(value)}")
    if verbose and (file := field(F.SOURCE_FILE)):
        func, line = field(F.SOURCE_FUNCTION), field(F.SOURCE_LINE)
        lines.append(f"LOCATION:  {func}, {file}:{line}" if func else f"LOCATION:  {file}:{line}")
    if input_text is not None and style.statement(
            field(F.SEVERITY_NONLOCALIZED) or severity):
        lines.append(f"STATEMENT:  {_tabbed(input_text)}")
    return "\n".join(lines)


def simple_error(message: str, detail: str | None = None, statement: str | None = None,
                 style: ErrorStyle = DEFAULT_STYLE) -> str:
    """Error text for failures that have no server result (refused input, connection errors):
    an ERROR, its DETAIL unless terse, the STATEMENT as log_min_error_statement has it."""
    lines = [f"ERROR:  {_tabbed(message)}"]
    if detail and style.verbosity != "terse":
        lines.append(f"DETAIL:  {_tabbed(detail)}")
    if statement is not None and style.statement("error"):
        lines.append(f"STATEMENT:  {_tabbed(statement)}")
    return "\n".join(lines)


def message(exc: BaseException) -> str:
    """An exception's whole message (libpq's text of a failed connection, all its lines)."""
    return str(exc).strip() or type(exc).__name__


def reason(exc: BaseException) -> str:
    """The last line of an exception's message (libpq puts the cause there), for log lines."""
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__
