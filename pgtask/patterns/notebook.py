"""Small helpers the notebooks share: connecting, waiting with a deadline, demo bookkeeping, and
the read-only inspection queries as pandas DataFrames. Importable without Jupyter (pandas and
SQLAlchemy are imported only by the functions that need them)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.datetime import TimestamptzLoader

from .. import config, readable, status
from .. import sql as named
from ..cluster import Cluster
from ..names import beside
from ..provision import Report
from ..sql import placeholders
from . import query


class _TimestamptzLoader(TimestamptzLoader):
    """'infinity' (a waiting child's plan) as datetime.max instead of an error."""

    def load(self, data):
        if bytes(data) == b"infinity":
            return datetime.max.replace(tzinfo=UTC)
        if bytes(data) == b"-infinity":
            return datetime.min.replace(tzinfo=UTC)
        return super().load(data)


def server(dsn: str = "") -> tuple[str, str]:
    """The connection string to use and where it leads. ``dsn`` when given; else the server
    `pgtask run` would use: the config file's dsn (``PGTASK_CONFIG``), libpq's environment
    (``PGHOST``, …), or the embedded cluster ``./run`` started (``[pgtask] embedded_dir``, or a
    ``.pgtask`` directory here or in a directory above: JupyterLab runs a notebook in its own
    directory, ``notebooks/``)."""
    if dsn:
        return dsn, status.server(dsn)
    cfg = config.load(None)
    if cfg.server_configured:
        return cfg.dsn, f"{status.server(cfg.dsn)} (from {'the config file' if cfg.dsn else 'the environment'})"
    here = Path.cwd()
    bases = [Path(cfg.svc("embedded_dir"))] if cfg.svc("embedded_dir") else \
        [d / ".pgtask" for d in (here, *here.parents)]
    for base in bases:
        if (base / "run").is_dir():  # the embedded cluster's socket directory
            # only its connection string is needed here, not its binaries
            conninfo = Cluster(base.absolute(), Path(), cfg.svc("embedded_port")).conninfo()
            return conninfo, f"{status.server(conninfo)} (the embedded cluster in {base.absolute()})"
    return "", (f"{status.server('')} (libpq's defaults: no dsn, no PGHOST, no embedded cluster found "
                "-- set dsn)")


def connect(dsn: str) -> psycopg.Connection:
    """An autocommit connection (``dsn`` is a libpq string; '' means libpq's environment: PGHOST, …).
    Timestamps 'infinity'/'-infinity' load as datetime.max/min (UTC)."""
    conn = psycopg.connect(dsn, autocommit=True)
    conn.adapters.register_loader("timestamptz", _TimestamptzLoader)
    return conn


def engine(dsn: str):
    """A SQLAlchemy 2 engine over psycopg 3 for pandas.read_sql, from the same libpq string."""
    import sqlalchemy

    return sqlalchemy.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn),
                                    poolclass=sqlalchemy.pool.NullPool)


def frame(dsn_or_engine, text: str, params: dict | None = None):
    """A query as a pandas DataFrame (through SQLAlchemy; ``text`` may hold %(name)s parameters)."""
    import pandas
    import sqlalchemy

    eng = engine(dsn_or_engine) if isinstance(dsn_or_engine, str) else dsn_or_engine
    with eng.connect() as c:
        return pandas.read_sql(sqlalchemy.text(_colon_params(text)), c, params=params or {})


def _colon_params(text: str) -> str:
    """%(name)s -> :name for sqlalchemy.text(); literal colons (::casts) are escaped."""
    import re

    text = re.sub(r"(?<!:):(?!:)", r"\\:", text)  # a lone ':' (not part of '::')
    return re.sub(r"%\((\w+)\)s", r"(:\1)", text).replace("%%", "%")


def table_oid(conn: psycopg.Connection, schema: str, table: str) -> int:
    """The task table's oid; a clear error when it is missing."""
    oid = status.table_oid(conn, schema, table)
    if oid is None:
        raise LookupError(f"no table {schema}.{table} in this database: start `pgtask run` for it "
                          "(or run `pgtask provision`) first")
    return oid


def serving(conn: psycopg.Connection, schema: str, table: str) -> bool:
    """Whether a ``pgtask run`` scheduler is connected for this table (its application_name)."""
    prefix = f"pg_work {schema} {table} "[:63]
    row = conn.execute(named.query("notebook.sql", "serving"), (len(prefix), prefix)).fetchone()
    return row[0] > 0


def require_service(conn: psycopg.Connection, schema: str, table: str) -> None:
    if not serving(conn, schema, table):
        raise RuntimeError(f"no `pgtask run` is serving {schema}.{table} in this database: the demo "
                           "needs it (or set demo = False to only install)")


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, message: str = "condition",
               interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def _statement(name: str, schema: str, table: str, **extra: sql.Composable) -> sql.Composed:
    """The statement ``name`` of sql/notebook.sql for ``schema.table``; ``extra``: its own placeholders."""
    return placeholders.render(named.query("notebook.sql", name), schema, table, extra=extra)


def rows(conn: psycopg.Connection, text, params=None) -> list[dict]:
    cur = conn.cursor(row_factory=dict_row)
    cur.execute(text, params)
    return cur.fetchall() if cur.description else []


def tasks(conn: psycopg.Connection, schema: str, table: str, where: str, params=None,
          columns: str = '"id", "parent", "state"::text AS "state", "plan", "start", "stop", "output", "error"',
          order: bool = True) -> list[dict]:
    """Rows of the task table: ``where`` is SQL over its columns (with %s / %(name)s parameters)."""
    return rows(conn, _statement("tasks_ordered" if order else "tasks", schema, table,
                                 columns=sql.SQL(columns), where=sql.SQL(where)), params)


FINAL = ("DONE", "FAIL", "GONE", "STOP")


def wait_settled(conn: psycopg.Connection, schema: str, table: str, where: str, params=None,
                 count: int = 1, timeout: float = 30.0) -> list[dict]:
    """Wait until at least ``count`` rows match ``where`` and all of them are DONE/FAIL/GONE/STOP."""
    def settled():
        found = tasks(conn, schema, table, where, params)
        return found if len(found) >= count and all(r["state"] in FINAL for r in found) else None
    return wait_until(settled, timeout, f"{count} task(s) where {where} {params or ''} to settle")


def check(condition: object, message: str) -> None:
    """A notebook's outcome check: raises (also under python -O) when ``condition`` is false."""
    if not condition:
        raise AssertionError(message)


def demo_reset(conn: psycopg.Connection, schema: str, table: str, mark: str, timeout: float = 30.0) -> int:
    """Remove the rows an earlier run of a demo left (``data = mark``): planned ones are STOPped,
    running ones waited for, then all deleted. Returns how many were deleted."""
    conn.execute(_statement("demo_stop", schema, table), (mark,))
    wait_until(lambda: not conn.execute(_statement("demo_running", schema, table), (mark,)).fetchone(),
               timeout, "the previous demo's running tasks to finish")
    return conn.execute(_statement("demo_delete", schema, table), (mark,)).rowcount


def show(report: Report) -> None:
    """Print what an install/maintenance step changed."""
    if not report.actions:
        print("nothing to change: already in place")
    for action in report.actions:
        print(action)


class Table:
    """A DataFrame shown for people: every cell written by a formatter of pgtask.readable (counts with
    thousands separators, task ids and pids without, durations rounded, timestamps to the second,
    "never", "no timeout"), text
    columns left-aligned and numbers right-aligned, as HTML in JupyterLab and as text elsewhere."""

    def __init__(self, df, formats: dict[str, Callable[[Any], str]] | None = None):
        formats = formats or {}
        self.columns = [str(c) for c in df.columns]
        self.numeric = [c in formats and formats[c] not in (str, readable.timestamp) or
                        (c not in formats and df[c].dtype.kind in "iuf") for c in df.columns]
        fmt = {c: formats.get(c) or _default_format(str(c), df[c].dtype.kind) for c in df.columns}
        self.rows = [[fmt[c](v) for c, v in zip(df.columns, row)] for row in df.itertuples(index=False)]

    def __repr__(self) -> str:
        return "\n".join(readable.table(self.columns, self.rows, self.numeric)) if self.rows else "(none)"

    def _repr_html_(self) -> str:
        from html import escape

        def row(cells, tag):
            return "<tr>" + "".join(f'<{tag} style="text-align: {"right" if n else "left"}">{escape(c)}</{tag}>'
                                    for c, n in zip(cells, self.numeric)) + "</tr>"

        body = "".join(row(r, "td") for r in self.rows) or f'<tr><td colspan="{len(self.columns)}">(none)</td></tr>'
        return f"<table><thead>{row(self.columns, 'th')}</thead><tbody>{body}</tbody></table>"


def _default_format(column: str, kind: str) -> Callable[[Any], str]:
    if readable.identifier_column(column):  # a nullable pid column loads as float
        return readable.ident
    return readable.count if kind in "iu" else _cell


def _cell(value) -> str:
    if readable.missing(value):
        return ""
    if isinstance(value, datetime):
        return readable.timestamp(value)
    if isinstance(value, float):
        return f"{value:,.3g}"
    return str(value)


def source(conn: psycopg.Connection, schema: str, table: str, include_archive: bool = True) -> str:
    """The task table, or the task table UNION ALL its archive (the archive pattern), as SQL text:
    the common columns of both, for the inspection queries over finished tasks."""
    t = sql.Identifier(schema, table).as_string(conn)
    archive = beside(table, "archive")
    row = conn.execute(named.query("notebook.sql", "archive_partitioned"), (schema, archive)).fetchone()
    if not include_archive or row is None:
        return t
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in
                              ("id", "group", "state", "plan", "active", "start", "stop", "error", "input"))
    return _statement("with_archive", schema, table, columns=cols).as_string(conn)


def inspect(dsn: str, schema: str, table: str, name: str, include_archive: bool = True, **params):
    """One query of inspect.sql as a DataFrame."""
    with connect(dsn) as conn:
        extra = {"source": source(conn, schema, table, include_archive)}
        oid = table_oid(conn, schema, table)
    text = query("inspect", name, schema, table, extra=extra)
    return frame(dsn, text, {"oid": oid, **params})
