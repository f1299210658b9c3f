"""The placeholders of a task table's SQL: one dialect for the service's named SQL (pgtask/sql/*.sql)
and the patterns (pgtask/patterns/*.sql), psycopg's ``sql.SQL(text).format(...)``.

A text names its placeholders ``{name}`` (``{{`` and ``}}`` are literal braces), found as psycopg's
format finds them (``string.Formatter().parse``). These mean the same in every text, filled in with
quoted identifiers and literals for the task table ``schema.table``:

``{schema}`` ``{table}`` ``{state}``   the schema, ``schema.table``, ``schema.state`` (the state type)
``{regclass}``                         ``'schema.table'`` as a text literal (for ``::regclass``)
``{schema_name}`` ``{table_name}``     the names as text literals
``{fn_X}`` ``{rel_X}``                 ``schema.<table>_X`` (a function, a relation: names.beside)
``{name_X}``                           ``<table>_X`` (a trigger, an index, a constraint)
``{q_X}`` ``{lit_X}``                  ``'schema.<table>_X'`` and ``'<table>_X'`` as text literals
``{opt_X}``                            the option X (of a pattern) as a literal

Any other placeholder is the caller's own (``extra``: a function's body, a column list, ...). An
extra may not give one of the names above another value: a placeholder means the same everywhere.
"""

from __future__ import annotations

import string
from collections.abc import Mapping

from psycopg import sql

from ..names import beside

# the placeholders that name the table itself
FIXED = ("schema", "table", "state", "regclass", "schema_name", "table_name")
# {PREFIX_X}: a thing beside the table (<table>_X), or the option X
PREFIXES = ("fn", "rel", "name", "q", "lit", "opt")

_FORMATTER = string.Formatter()


def fields(text: str) -> tuple[str, ...]:
    """The named placeholders of ``text``, in the order of their first use."""
    return tuple(dict.fromkeys(name for _, name, _, _ in _FORMATTER.parse(text)
                               if name and not name.isdigit()))


def value(name: str, schema: str, table: str,
          opts: Mapping[str, object] | None = None) -> sql.Composable | None:
    """The value of the placeholder ``name`` for ``schema.table`` (``opts``: the values of
    ``{opt_X}``); None when ``name`` is not one of the table's (see the module's docstring)."""
    if name == "schema":
        return sql.Identifier(schema)
    if name == "table":
        return sql.Identifier(schema, table)
    if name == "state":
        return sql.Identifier(schema, "state")
    if name == "regclass":
        return sql.Literal(sql.Identifier(schema, table).as_string(None))
    if name == "schema_name":
        return sql.Literal(schema)
    if name == "table_name":
        return sql.Literal(table)
    prefix, _, rest = name.partition("_")
    if not rest:
        return None
    if prefix in ("fn", "rel"):
        return sql.Identifier(schema, beside(table, rest))
    if prefix == "name":
        return sql.Identifier(beside(table, rest))
    if prefix == "q":
        return sql.Literal(sql.Identifier(schema, beside(table, rest)).as_string(None))
    if prefix == "lit":
        return sql.Literal(beside(table, rest))
    if prefix == "opt" and opts is not None and rest in opts:
        return sql.Literal(opts[rest])
    return None


def values(text: str, schema: str, table: str, opts: Mapping[str, object] | None = None,
           extra: Mapping[str, sql.Composable] | None = None) -> dict[str, sql.Composable]:
    """The values of the placeholders ``text`` uses: the table's (``value``), and the others from
    ``extra``. KeyError for a placeholder neither gives; ValueError for an extra that gives one of
    the table's another value."""
    extra = extra or {}
    out: dict[str, sql.Composable] = {}
    for name in fields(text):
        own, given = value(name, schema, table, opts), extra.get(name)
        if own is not None and given is not None and given != own:
            raise ValueError(f"placeholder {{{name}}} is {own!r} for {schema}.{table}; the extra "
                             f"{given!r} may not change it")
        found = own if own is not None else given
        if found is None:
            raise KeyError(f"unknown placeholder {{{name}}}")
        out[name] = found
    return out


def render(text: str, schema: str, table: str, opts: Mapping[str, object] | None = None,
           extra: Mapping[str, sql.Composable] | None = None) -> sql.Composed:
    """``text`` with its placeholders filled in for ``schema.table`` (see ``values``)."""
    return sql.SQL(text).format(**values(text, schema, table, opts, extra))
