"""The names of a task table's objects: PostgreSQL identifiers as the catalog stores them, the
functions, tables and roles beside the table (``<table>_<kind>``), and its NOTIFY channel."""

from __future__ import annotations

import hashlib

from psycopg import sql


def channel(table_oid: int) -> str:
    """The NOTIFY channel of a task table."""
    return f"pg_task_{table_oid}"


# placeholder -> table name suffix (the table is <task table>_<suffix> in the same schema)
EXTRA_TABLES = {"schedule": "schedule", "occurrence": "occurrence", "keys": "key", "groups": "group",
                "service": "service"}


def author_role(table: str) -> str:
    """The NOLOGIN role provisioning creates for a task table's authors, ``<table>_user``: granted
    to a role, it holds every privilege that role needs to schedule work (docs/security.md).
    Roles are the cluster's: one per table name, for the tables of that name in every database."""
    return function_name(table, "user")


# the tables of the claim lock and of the running instances (sql/liveness.sql): <table>_<kind>
LIVENESS_TABLES = ("claim", "instance")


def liveness_table(table: str, kind: str) -> str:
    """The name of a table's claim lock table (``kind`` claim) or instance table (instance)."""
    return beside(table, kind)


def extra_table(table: str, kind: str) -> str:
    """The name of a table beside the task table: ``kind`` a key of EXTRA_TABLES (``groups``: the
    group table, read by the claim)."""
    return beside(table, EXTRA_TABLES[kind])


def function_name(table: str, kind: str) -> str:
    """The name of a table's trigger function or helper function (``<table>_<kind>``)."""
    return beside(table, kind)


# A table name up to this many bytes names the objects beside it <table>_<kind> cut to 63 bytes as
# PostgreSQL cuts them, as long as the cut keeps KIND_KEPT bytes of the kind: the kinds differ within
# their first 10 ("schedule_n", "schedule_g", "schedule_d", "schedule_w"), so those names stay unique.
# A longer table name (provisioning accepts up to 63 bytes), or a cut that would keep less, would make
# two of them one name, so the table's part is shortened and a hash of it added instead.
PLAIN_CUT_UP_TO = 53
KIND_KEPT = 10


def beside(table: str, kind: str) -> str:
    """The name of an object beside ``table``: ``<table>_<kind>``, cut as PostgreSQL would (see
    PLAIN_CUT_UP_TO), or ``<table, shortened>_<8 hex of its hash>_<kind>``."""
    raw = table.encode()
    plain = f"{table}_{kind}"
    if len(raw) <= PLAIN_CUT_UP_TO and (len(plain.encode()) <= 63 or 63 - len(raw) - 1 >= KIND_KEPT):
        return ident_name(plain)
    tail = f"_{hashlib.sha256(raw).hexdigest()[:8]}_{kind}"
    return ident_name(raw[:63 - len(tail.encode())].decode(errors="ignore") + tail)


def ident_name(name: str) -> str:
    """PostgreSQL truncates identifiers to 63 bytes; compare names the way the catalog stores them."""
    raw = name.encode()
    if len(raw) <= 63:
        return name
    return raw[:63].decode(errors="ignore")


def table_names(schema: str, table: str) -> dict[str, sql.Composable]:
    """The task table and the tables beside it (EXTRA_TABLES), with its enqueue function."""
    ids: dict[str, sql.Composable] = {"table": sql.Identifier(schema, table),
                                      "enqueue": sql.Identifier(schema, beside(table, "enqueue"))}
    for kind, suffix in EXTRA_TABLES.items():
        ids[kind] = sql.Identifier(schema, beside(table, suffix))
    return ids


def admin_role(table: str) -> str:
    """The NOLOGIN operator role provisioning creates for a task table, ``<table>_admin``: granted to
    a role, it may use the verbs (docs/operations.md) on every task of the table, and pause and
    resume groups. Like author_role, one per table name in the cluster."""
    return beside(table, "admin")
