"""The manual's patterns, installable into any task table without Jupyter.

Each pattern's SQL lives in ``<pattern>.sql`` beside this file, in sections headed
``-- kind name --``:

``column NAME``     ``ALTER TABLE … ADD COLUMN NAME …``, run when the table has no column NAME
``function NAME``   ``CREATE OR REPLACE FUNCTION {fn_NAME}(…)``, kept only if the definition changed
``trigger NAME``    ``CREATE TRIGGER {name_NAME} …``, created when missing, replaced when different
``index NAME``      ``CREATE INDEX {name_NAME} …``, created when missing
``table NAME``      ``CREATE TABLE {rel_NAME} …``, created when missing
``sync NAME``       add to ``{rel_NAME}`` every column of the task table it lacks
``task NAME``       a repeating task inserted once (its input is ``query NAME_input``… see partition.sql)
``query NAME``      not installed: SQL for callers (``query(pattern, name, schema, table)``)

Every object is named after the table (``task_retry_backoff``, ``task_archive``, …: names.beside)
and lives in its schema. The SQL is written in the service's one dialect (pgtask/sql/placeholders.py):
psycopg's ``sql.SQL(text).format(...)``, so a literal brace is written ``{{`` or ``}}``, and a
placeholder means what it means in the service's SQL, filled in with quoted identifiers and literals:

``{schema}`` ``{table}`` ``{state}``   the schema, ``schema.table``, ``schema.state``
``{fn_X}`` ``{rel_X}``                 ``schema."table_X"`` (a function, a relation)
``{name_X}``                           ``"table_X"`` (a trigger, an index, a constraint)
``{q_X}`` ``{lit_X}``                  ``'schema."table_X"'`` and ``'table_X'`` as text literals
``{schema_name}`` ``{table_name}``     the names as text literals
``{regclass}``                         ``'schema.table'`` as a text literal (for ``::regclass``)
``{opt_X}``                            the pattern option X as a literal

A section may use a caller's own placeholders too (``extra``): a task's ``{input}`` and
``{marker}``, the retried ``{work}``, the inspection queries' ``{source}``.

``install()`` checks the catalogs before every step and returns what it changed: a second run
changes nothing and returns an empty report. ``uninstall()`` undoes it. Their own statements (the
catalog reads, the lock, the drops) are named SQL of pgtask/sql/patterns.sql.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

import psycopg
from psycopg import sql

from .. import sql as service_sql
from ..names import beside
from ..provision import Report
from ..sql import placeholders

__all__ = [
    "PATTERNS",
    "Pattern",
    "Report",
    "install",
    "installed",
    "marker",
    "query",
    "render",
    "retry_until_success_input",
    "script",
    "uninstall",
]

KINDS = ("column", "function", "trigger", "index", "table", "sync", "task", "query")
_HEADER = re.compile(r"^-- (" + "|".join(KINDS) + r") ([a-z_]+) --$", re.MULTILINE)


@dataclass(frozen=True)
class Pattern:
    name: str
    title: str
    options: dict[str, object] = field(default_factory=dict)
    requires: tuple[str, ...] = ()


PATTERNS: dict[str, Pattern] = {p.name: p for p in [
    Pattern("retry_until_success", "Retry until success"),
    Pattern("retry_backoff", "Retry with exponential backoff"),
    Pattern("depend", "Conditional launch on a parent task"),
    Pattern("cron", "Cron-like scheduling"),
    Pattern("notify", "Notifications on completion", {"channel": None}),  # None: "<table>_done"
    Pattern("archive", "History/archive into a partitioned table"),
    Pattern("partition", "Automatic partitioning via a repeating task",
            {"lead": "1 month", "repeat": "1 day"}, requires=("archive",)),
    Pattern("tags", "Structured tags (jsonb + GIN)"),
    Pattern("idempotency", "Idempotency key"),
    Pattern("trace", "OpenTelemetry trace propagation columns"),
    Pattern("dry_run", "Dry-run validation"),
]}


# Files of queries only (no install): the operations notebooks' SQL.
QUERY_FILES = ("inspect", "maintenance")


@dataclass(frozen=True)
class Section:
    kind: str
    name: str
    text: str


@cache
def sections(pattern: str) -> tuple[Section, ...]:
    """The sections of a pattern's SQL file, in file order."""
    if pattern not in PATTERNS and pattern not in QUERY_FILES:
        raise KeyError(f"unknown pattern {pattern!r}; known: {', '.join(PATTERNS)}")
    text = resources.files(__package__).joinpath(f"{pattern}.sql").read_text()
    parts = _HEADER.split(text)
    raw = []
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3]):
        lines = [line for line in body.strip().splitlines()]
        while lines and lines[0].startswith("--"):  # the section's own comment
            lines.pop(0)
        raw.append((kind, name, "\n".join(lines).strip()))
    queries = {name: text for kind, name, text in raw if kind == "query"}
    out = []
    for kind, name, text in raw:
        # a part of the service's SQL ({@file.sql:name}, see pgtask.sql), or a query of this file ({@name})
        text = service_sql.INCLUDE.sub(functools.partial(_included, where=f"{pattern}.sql: {name}",
                                                         own=queries), text)
        out.append(Section(kind, name, text))
    return tuple(out)


def _included(m: re.Match, where: str, own: dict[str, str]) -> str:
    other, included = m.group(1), m.group(2)
    if service_sql.swaps_of(m, where):
        raise ValueError(f"{where} includes {included} with swaps: the notebooks' SQL has none")
    if other is not None:
        return service_sql.include(other, included, where)
    if included not in own:
        raise ValueError(f"{where} includes {included}, which is not a query of its file")
    # one level: a query included here includes only the service's SQL
    return service_sql.INCLUDE.sub(functools.partial(_included, where=f"{where} via {included}", own={}),
                                   own[included])


def options(pattern: str, table: str, given: dict | None = None) -> dict[str, object]:
    p = PATTERNS.get(pattern) or Pattern(pattern, pattern)
    unknown = set(given or {}) - set(p.options)
    if unknown:
        raise TypeError(f"pattern {pattern} has no option {', '.join(sorted(unknown))}; "
                        f"options: {', '.join(p.options) or 'none'}")
    opts = {**p.options, **(given or {})}
    if pattern == "notify" and opts.get("channel") is None:
        opts["channel"] = f"{table}_done"
    return opts


def marker(pattern: str, schema: str, table: str, name: str) -> str:
    """The ``data`` of a task a pattern inserts, to find it again."""
    return f"pgtask.patterns {pattern} {name} {schema}.{table}"


def render(text: str, schema: str, table: str, opts: dict | None = None, extra: dict | None = None,
           conn: psycopg.Connection | None = None) -> str:
    """Fill in the placeholders of one section (see the module docstring); ``extra``: the caller's
    own placeholders, as ``sql.Composable`` or as SQL text."""
    given = {k: sql.SQL(v) if isinstance(v, str) else v for k, v in (extra or {}).items()}
    return placeholders.render(text, schema, table, opts or {}, given).as_string(conn)


# Queries a notebook runs that are exactly what the service does itself: (file, name) in pgtask/sql.
SERVICE_QUERIES = {("maintenance", "reset_orphans"): ("queries.sql", "reset"),
                   ("maintenance", "purge_batch"): ("maintenance.sql", "retention_delete"),
                   ("maintenance", "purgeable"): ("maintenance.sql", "retention_purgeable")}


def query(pattern: str, name: str, schema: str = "public", table: str = "task", extra: dict | None = None,
          **opts) -> str:
    """A ``query`` section, rendered (it may still hold ``%(param)s`` parameters)."""
    if (pattern, name) in SERVICE_QUERIES:  # the service's own statement, not a copy of it
        text = service_sql.query(*SERVICE_QUERIES[pattern, name])
        return render(text, schema, table, options(pattern, table, opts), extra)
    for s in sections(pattern):
        if s.kind == "query" and s.name == name:
            return render(s.text, schema, table, options(pattern, table, opts), extra)
    raise KeyError(f"pattern {pattern} has no query {name}")


def retry_until_success_input(work: str, schema: str = "public", table: str = "task") -> str:
    """The input of a "retry until success" task: ``work``, then the task cancels its own repeat."""
    text = next(s.text for s in sections("retry_until_success") if s.name == "input")
    body = work.strip().rstrip(";").strip()
    return render(text, schema, table, extra={"work": body})


def script(pattern: str, schema: str = "public", table: str = "task", **opts) -> str:
    """Everything ``install`` may run, as one readable SQL script (for showing, not for running:
    ``install`` checks the catalogs first and runs only what is missing)."""
    o = options(pattern, table, opts)
    out = []
    for s in sections(pattern):
        if s.kind in ("query", "sync"):
            continue
        extra = {}
        if s.kind == "task":
            extra = {"input": sql.Literal(query(pattern, f"{s.name}_input", schema, table, **opts)),
                     "marker": sql.Literal(marker(pattern, schema, table, s.name))}
        out.append(f"-- {s.kind} {beside(table, s.name) if s.kind != 'column' else s.name}\n"
                   + render(s.text, schema, table, o, extra) + ";")
    return "\n\n".join(out)


# -- installing ------------------------------------------------------------------------------------

def _one(conn: psycopg.Connection, query_text, params=()) -> tuple | None:
    return conn.execute(query_text, params).fetchone()


def _statement(name: str, schema: str, table: str, **extra: sql.Composable) -> sql.Composed:
    """The statement ``name`` of sql/patterns.sql for ``schema.table``; ``extra``: its own placeholders."""
    return placeholders.render(service_sql.query("patterns.sql", name), schema, table, extra=extra)


def _relation_oid(conn, schema: str, name: str) -> int | None:
    row = _one(conn, service_sql.query("catalog.sql", "relation"), (schema, name))
    return row[0] if row else None


def _functions(conn, schema: str, name: str) -> dict[int, str]:
    return dict(conn.execute(service_sql.query("patterns.sql", "functions"), (schema, name)).fetchall())


def _trigger(conn, table_oid: int, name: str) -> str | None:
    row = _one(conn, service_sql.query("patterns.sql", "trigger"), (table_oid, name))
    return row[0] if row else None


def _columns(conn, rel_oid: int) -> dict[str, str]:
    return dict(conn.execute(service_sql.query("patterns.sql", "column_types"), (rel_oid,)).fetchall())


def _lock(conn: psycopg.Connection, schema: str, table: str) -> None:
    """Serialise the installers of one table (until the transaction ends)."""
    conn.execute(service_sql.query("patterns.sql", "lock"), (f"pgtask patterns {schema}.{table}",))


def _changes(conn: psycopg.Connection, text: str, state: Callable[[], object], before: object) -> bool:
    """Run ``text`` in a savepoint; keep it only if ``state()`` differs from ``before`` afterwards."""
    try:
        with conn.transaction():
            conn.execute(text)
            if state() == before:
                raise _Unchanged
    except _Unchanged:
        return False
    return True


class _Unchanged(Exception):
    """Raised inside a savepoint to roll back a no-op CREATE OR REPLACE."""


def _install_one(conn: psycopg.Connection, pattern: str, schema: str, table: str, opts: dict,
                 report: Report) -> None:
    table_oid = _relation_oid(conn, schema, table)
    if table_oid is None:
        raise LookupError(f"no table {schema}.{table}: start pgtask (or run `pgtask provision`) first")
    qualified = f"{schema}.{table}"
    for s in sections(pattern):
        obj = beside(table, s.name)
        if s.kind == "query":
            continue
        if s.kind == "column":
            if s.name not in _columns(conn, table_oid):
                conn.execute(render(s.text, schema, table, opts, conn=conn))
                report.add(f"added column {s.name} to {qualified}")
        elif s.kind in ("table", "index"):
            if _relation_oid(conn, schema, obj) is None:
                conn.execute(render(s.text, schema, table, opts, conn=conn))
                report.add(f"created {s.kind} {schema}.{obj}")
        elif s.kind == "sync":
            _sync(conn, schema, table_oid, obj, report)
        elif s.kind == "function":
            before = _functions(conn, schema, obj)
            text = render(s.text, schema, table, opts, conn=conn)
            if _changes(conn, text, lambda obj=obj: _functions(conn, schema, obj), before):
                report.add(f"{'replaced' if before else 'created'} function {schema}.{obj}")
        elif s.kind == "trigger":
            text = render(s.text, schema, table, opts, conn=conn)
            before = _trigger(conn, table_oid, obj)
            if before is None:
                conn.execute(text)
                report.add(f"created trigger {obj} on {qualified}")
                continue
            if _changes(conn, text.replace("CREATE TRIGGER", "CREATE OR REPLACE TRIGGER", 1),
                        lambda obj=obj: _trigger(conn, table_oid, obj), before):
                report.add(f"replaced trigger {obj} on {qualified}")
        elif s.kind == "task":
            mark = marker(pattern, schema, table, s.name)
            task_input = query(pattern, f"{s.name}_input", schema, table,
                               **{k: v for k, v in opts.items() if k in PATTERNS[pattern].options})
            ins = render(s.text, schema, table, opts, extra={
                "input": sql.Literal(task_input), "marker": sql.Literal(mark)}, conn=conn)
            live = conn.execute(_statement("live_tasks", schema, table, repeat=sql.Literal(opts.get("repeat"))),
                                (mark,)).fetchall()
            if any(inp == task_input and same_repeat for _, _, inp, same_repeat in live):
                continue
            planned = [i for i, state, _, _ in live if state == "PLAN"]
            if planned:  # options changed: the planned occurrence takes the new ones
                conn.execute(_statement("update_planned", schema, table),
                             (task_input, opts.get("repeat"), planned))
                report.add(f"updated repeating task {', '.join(map(str, planned))} in {qualified}")
            elif not live:
                task_id = conn.execute(ins + ' RETURNING "id"').fetchone()[0]
                report.add(f"inserted repeating task {task_id} into {qualified}")


def _sync(conn: psycopg.Connection, schema: str, table_oid: int, obj: str, report: Report) -> None:
    """Add to ``schema.obj`` every column of the task table it lacks (types only: no defaults)."""
    rel = _relation_oid(conn, schema, obj)
    if rel is None:
        return
    have = _columns(conn, rel)
    for col, typ in _columns(conn, table_oid).items():
        if col not in have:
            conn.execute(_statement("add_column", schema, obj, relation=sql.Identifier(schema, obj),
                                    column=sql.Identifier(col), type=sql.SQL(typ)))
            report.add(f"added column {col} to {schema}.{obj}")


def install(conn: psycopg.Connection, pattern: str, schema: str = "public", table: str = "task",
            **opts) -> Report:
    """Install one pattern (and the patterns it requires) into ``schema.table``, idempotently.

    Runs in one transaction (committed on return unless the caller has one open), serialised with
    other installers of the same table by an advisory lock. Returns what changed.
    """
    o = options(pattern, table, opts)
    report = Report()
    with conn.transaction():
        _lock(conn, schema, table)
        for required in PATTERNS[pattern].requires:
            _install_one(conn, required, schema, table, options(required, table), report)
        _install_one(conn, pattern, schema, table, o, report)
        # columns this pattern added to the task table go to an archive installed before it too
        for s in sections("archive"):
            if s.kind == "sync":
                _sync(conn, schema, _relation_oid(conn, schema, table), beside(table, s.name), report)
    return report


def installed(conn: psycopg.Connection, pattern: str, schema: str = "public", table: str = "task") -> bool:
    """Whether every object of the pattern exists (not whether it is identical)."""
    table_oid = _relation_oid(conn, schema, table)
    if table_oid is None:
        return False
    for s in sections(pattern):
        obj = beside(table, s.name)
        if s.kind == "column" and s.name not in _columns(conn, table_oid):
            return False
        if s.kind in ("table", "index") and _relation_oid(conn, schema, obj) is None:
            return False
        if s.kind == "function" and not _functions(conn, schema, obj):
            return False
        if s.kind == "trigger" and _trigger(conn, table_oid, obj) is None:
            return False
    return all(installed(conn, r, schema, table) for r in PATTERNS[pattern].requires)


def uninstall(conn: psycopg.Connection, pattern: str, schema: str = "public", table: str = "task",
              drop_columns: bool = False, drop_tables: bool = False) -> Report:
    """Undo ``install``: STOP the pattern's planned tasks, drop its triggers, functions and indexes;
    its columns only with ``drop_columns`` and its tables (the archive, with its rows) only with
    ``drop_tables``. Patterns it requires are left alone."""
    report = Report()
    table_oid = _relation_oid(conn, schema, table)
    with conn.transaction():
        _lock(conn, schema, table)
        for s in reversed(sections(pattern)):
            obj = beside(table, s.name)
            if s.kind == "task" and table_oid is not None:
                cur = conn.execute(_statement("stop_tasks", schema, table),
                                   (marker(pattern, schema, table, s.name),))
                for (task_id,) in cur.fetchall():
                    report.add(f"stopped task {task_id}")
            elif s.kind == "trigger" and table_oid is not None and _trigger(conn, table_oid, obj):
                conn.execute(_statement("drop_trigger", schema, table, trigger=sql.Identifier(obj)))
                report.add(f"dropped trigger {obj}")
            elif s.kind == "function":
                for oid in _functions(conn, schema, obj):
                    sig = _one(conn, service_sql.query("patterns.sql", "signature"), (oid,))[0]
                    conn.execute(_statement("drop_function", schema, table, signature=sql.SQL(sig)))
                    report.add(f"dropped function {sig}")
            elif s.kind == "index" and _relation_oid(conn, schema, obj) is not None:
                conn.execute(_statement("drop_index", schema, table, relation=sql.Identifier(schema, obj)))
                report.add(f"dropped index {schema}.{obj}")
            elif s.kind == "column" and drop_columns and table_oid is not None \
                    and s.name in _columns(conn, table_oid):
                conn.execute(_statement("drop_column", schema, table, column=sql.Identifier(s.name)))
                report.add(f"dropped column {s.name} of {schema}.{table}")
            elif s.kind == "table" and drop_tables and _relation_oid(conn, schema, obj) is not None:
                conn.execute(_statement("drop_table", schema, table, relation=sql.Identifier(schema, obj)))
                report.add(f"dropped table {schema}.{obj}")
    return report
