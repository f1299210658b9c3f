"""The service's statements as it sends them (``pgtask sql``): each named statement of
sql/queries.sql rendered for one task table, a prepared one as its PREPARE, and the claim pass's
query string; written to a directory (one <name>.sql each) for the checked-in rendering that a test
compares (tests/sql/rendered)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from psycopg import sql

from . import queries
from . import sql as named
from .sql import INCLUDE

# The columns a repeat copies (the answer of "columns") for a table pgtask provisioned: the service
# reads them from the table; a table with columns of its own copies those too (--columns).
PROVISIONED_COPY_COLUMNS = ('active, live, repeat, timeout, count, max, delete, drift, header, save, string, '
                            'delimiter, escape, quote, data, "group", input, "null", remote, "user"')
# The claim pass's query string for these example values (token, limit, offered pids, offered
# task ids), its table's oid 0: a pass with nothing to finish that expires and claims.
PASS_EXAMPLE = ("00000000-0000-0000", 16, [], [])
PASSES = {"pass": False, "pass_limited": True}  # name -> limited (see queries.pass_claim)


def statement_names() -> list[str]:
    """The statements of queries.sql the service sends, in the file's order, then the passes: every
    named query but the parts (included in others, never run alone)."""
    text = resources.files("pgtask.sql").joinpath("queries.sql").read_text()
    included = {name for m in INCLUDE.finditer(text) if m.group(1) is None
                for name in (m.group(2), *(pair.split("=")[1] for pair in m.group(3).split()))}
    names = [name for name in named.queries("queries.sql") if name in queries.PREPARED or name not in included]
    return [*names, *PASSES]


def render(name: str, schema: str = "public", table: str = "task",
           copy_columns: str = PROVISIONED_COPY_COLUMNS) -> str:
    """The text of statement ``name`` as the service sends it for ``schema``.``table``."""
    if name in PASSES:
        return queries.Queries(schema, table).claim_pass_text([], True, PASS_EXAMPLE, PASSES[name]).decode()
    text = queries.render_query(name, schema, table, copy_columns)
    if name not in queries.PREPARED:
        return text
    return (sql.SQL("PREPARE {} AS ").format(sql.Identifier(f"pgtask_{name}"))
            + sql.SQL(queries.numbered(text, queries.PREPARED[name]))).as_string(None)


def write(directory: Path, schema: str = "public", table: str = "task",
          copy_columns: str = PROVISIONED_COPY_COLUMNS) -> list[Path]:
    """Every statement's rendering into ``directory`` as <name>.sql (the files of names no longer
    rendered are removed); returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    names = statement_names()
    for old in directory.glob("*.sql"):
        if old.stem not in names:
            old.unlink()
    written = []
    for name in names:
        path = directory / f"{name}.sql"
        path.write_text(render(name, schema, table, copy_columns) + "\n")
        written.append(path)
    return written
