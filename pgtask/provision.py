"""Idempotent provisioning: role, database, schema, enum, table, defaults, constraints, indexes,
triggers, the objects beside the table (the operator verbs among them) and the roles its authors
and operators are granted; and, on the server,
placeholders for the manual's settings (ensure_placeholders). Every step checks pg_catalog first and
only creates or alters what is missing or different; the caller gets the list of what changed
(``pgtask provision --json``).

Objects a user added (columns, triggers, indexes, partitions) are never dropped or rewritten.
Here: the server's roles, databases and placeholders, and the task table itself (sql/table.sql,
sql/triggers.sql); the objects beside it in provision_beside.py, the privileges in
provision_grants.py. What each step asks pg_catalog: sql/catalog.sql; what it changes: the files
named and sql/provision.sql.
"""

from __future__ import annotations

import re

import psycopg
from psycopg import sql

from .config import SETTINGS
from .names import beside, channel, function_name
from .provision_beside import BesideTables
from .provision_context import Report, TableContext, change, look_up, one, rows
from .provision_grants import Grants
from .provision_verbs import Verbs

# Column name -> SQL type, in the manual's order, plus attempt/lease for fencing.
COLUMNS: dict[str, str] = {
    "id": "bigint", "parent": "bigint", "plan": "timestamptz", "start": "timestamptz",
    "stop": "timestamptz", "active": "interval", "live": "interval", "repeat": "interval",
    "timeout": "interval", "count": "integer", "max": "integer", "pid": "integer", "state": None,
    "delete": "boolean", "drift": "boolean", "header": "boolean", "save": "boolean",
    "string": "boolean", "delimiter": '"char"', "escape": '"char"', "quote": '"char"', "data": "text",
    "error": "text", "group": "text", "input": "text", "null": "text", "output": "text",
    "remote": "text", "user": "name", "attempt": "integer", "lease": "uuid", "after": "bigint[]",
    "wait": "integer", "waited": "boolean", "retried": "integer",
}
NULLABLE = {"parent", "start", "stop", "pid", "data", "error", "output", "remote", "lease", "after", "wait",
            "waited", "retried"}


def _setting(name: str, default: str, cast: str) -> str:
    return f"COALESCE(NULLIF(current_setting('pg_task.{name}', true), ''), {default})::{cast}"


# Column defaults: the inserting session's pg_task.* setting, else the manual's default.
DEFAULTS: dict[str, str] = {
    "parent": "NULLIF(NULLIF(current_setting('pg_task.id', true), ''), '0')::bigint",
    "plan": ("COALESCE(NULLIF(NULLIF(current_setting('pg_task.plan', true), ''), "
             "'statement_timestamp()')::timestamptz, statement_timestamp())"),
    "active": _setting("active", "'1 hour'", "interval"),
    "live": _setting("live", "'0 sec'", "interval"),
    "repeat": _setting("repeat", "'0 sec'", "interval"),
    "timeout": _setting("timeout", "'0 sec'", "interval"),
    "count": _setting("count", "'0'", "integer"),
    "max": _setting("max", "'0'", "integer"),
    "delete": _setting("delete", "'true'", "boolean"),
    "drift": _setting("drift", "'false'", "boolean"),
    "header": _setting("header", "'true'", "boolean"),
    "save": _setting("save", "'false'", "boolean"),
    "string": _setting("string", "'true'", "boolean"),
    "delimiter": _setting("delimiter", "E'\\t'", '"char"'),
    "escape": "COALESCE(current_setting('pg_task.escape', true), '')::\"char\"",
    "quote": "COALESCE(current_setting('pg_task.quote', true), '')::\"char\"",
    "group": _setting("group", "'group'", "text"),
    "null": _setting("null", "'\\N'", "text"),
    "user": "CURRENT_USER",
    "attempt": "0",
}
CHECKS: dict[str, str] = {
    "active": '"active" > \'0 sec\'::interval',
    "live": '"live" >= \'0 sec\'::interval',
    "repeat": '"repeat" >= \'0 sec\'::interval',
    "timeout": '"timeout" >= \'0 sec\'::interval',
    "count": '"count" >= 0',
    "attempt": '"attempt" >= 0',
    "retried": '"retried" > 0',
}
COMMENTS: dict[str, str] = {
    "id": "Primary key", "parent": "Parent task id (if exists, like foreign key to id, but without constraint, for performance)",
    "plan": "Planned date and time of start", "start": "Actual date and time of start",
    "stop": "Actual date and time of stop",
    "active": "Positive period after plan time, when task is active for executing",
    "live": "Non-negative maximum time of live of current background worker process before exit",
    "repeat": "Non-negative auto repeat tasks interval", "timeout": "Non-negative allowed time for task run",
    "count": "Non-negative maximum count of tasks, are executed by current background worker process before exit",
    "max": "Maximum count of additional concurrently executing tasks in group, negative value means pause between tasks in milliseconds",
    "pid": "Id of process executing task", "state": "Task state",
    "delete": "Auto delete task when both output and error are nulls",
    "drift": "Compute next repeat time by stop time instead by plan time",
    "header": "Show columns headers in output", "save": "Save session state between tasks",
    "string": "Quote only strings", "delimiter": "Results columns delimiter",
    "escape": "Results columns escape", "quote": "Results columns quote", "data": "Some user data",
    "error": "Catched error", "group": "Task grouping by name", "input": "Sql command(s) to execute",
    "null": "Null text value representation", "output": "Received result(s)",
    "remote": "Connect to remote database (if need)",
    "user": "Role that inserted the task; input runs as this role; immutable",
    "attempt": "Claims so far (fencing)", "lease": "Token of the current claim (fencing)",
    "after": "Ids of the tasks that must end DONE before this one runs; immutable",
    "wait": "How many of the tasks in after have not ended yet, while WAIT",
    "waited": "Whether a task waits for this one (its end releases or cascades to them)",
    "retried": "Which retry of its task this row is, by its group's retry policy (NULL: its first run); immutable",
}
# trigger name suffix -> the query names in triggers.sql
TRIGGERS = ("wake_up", "settings", "insert", "update", "stop", "wait", "release", "dropped")
# functions without a trigger in triggers.sql: name suffix -> number of arguments
FUNCTIONS = {"start": 3, "check": 3}
INDEXES = {"plan_idx": "index_plan", "slot_idx": "index_running", "queue_idx": "index_group",
           "parent_idx": "index_parent", "state_idx": "index_state", "after_idx": "index_after",
           "wait_idx": "index_wait"}
LABELS = ("PLAN", "GONE", "TAKE", "WORK", "DONE", "FAIL", "STOP", "WAIT")


async def ensure_role(conn: psycopg.AsyncConnection, role: str, report: Report) -> None:
    if await one(conn, look_up("role_exists"), (role,)) is None:
        await conn.execute(change("create_login_role", role=sql.Identifier(role)))
        report.add(f"created role {role}")


async def ensure_database(conn: psycopg.AsyncConnection, data: str, owner: str, report: Report) -> None:
    """``conn`` must be in autocommit mode (CREATE DATABASE cannot run in a transaction)."""
    if await one(conn, look_up("database_exists"), (data,)) is None:
        await conn.execute(change("create_database", data=sql.Identifier(data), owner=sql.Identifier(owner)))
        report.add(f"created database {data}")


class TableProvisioner:
    """Brings one schema.table to the current definition, inside the entry's database: the task
    table itself here; the objects beside it (provision_beside.py) and the privileges
    (provision_grants.py) by their own classes, in run's order."""

    def __init__(self, conn: psycopg.AsyncConnection, schema: str, table: str, report: Report,
                 owner: str | None = None, service: str | None = None):
        self.ctx = TableContext(conn, schema, table, report, owner, service)
        self.conn, self.schema, self.table, self.report = conn, schema, table, report
        self.ids, self.name = self.ctx.ids, self.ctx.name

    async def run(self) -> int:
        """Provision everything; returns the table's oid."""
        grants, beside = Grants(self.ctx), BesideTables(self.ctx)
        await self.schema_and_type()
        oid = await self.table_and_columns()
        await grants.owner_grants()
        await self.defaults_and_constraints()
        await self.indexes()
        await self.triggers(oid)
        ids = beside.ids(oid)
        await beside.objects(ids, oid)
        await Verbs(self.ctx).objects(ids)
        await grants.authors(ids)
        await grants.beside_grants()
        await beside.register_service()
        await beside.liveness()
        await grants.admin_liveness()
        return oid

    async def schema_and_type(self) -> None:
        c, ctx = self.conn, self.ctx
        if await ctx.one(look_up("schema_exists"), (self.schema,)) is None:
            create = ctx.q("provision.sql", "create_schema_owned", owner=sql.Identifier(ctx.owner)) \
                if ctx.owner else ctx.q("table.sql", "create_schema")
            await c.execute(create)
            self.report.add(f"created schema {self.schema}")

        have = await ctx.one(look_up("state_labels"), (self.schema,))
        if have is None:
            await c.execute(ctx.q("table.sql", "create_state"))
            await ctx.own("type", self.ids["state"])
            self.report.add(f"created type {self.schema}.state")
        else:
            for label in LABELS:
                if label not in (have[0] or []):
                    await c.execute(change("add_label", state=self.ids["state"], label=sql.Literal(label)))
                    self.report.add(f"added label {label} to {self.schema}.state")

    async def table_and_columns(self) -> int:
        c, ctx = self.conn, self.ctx
        row = await ctx.one(look_up("table_oid"), (self.schema, self.table))
        if row is None:
            await c.execute(ctx.q("table.sql", "create_table"))
            await ctx.own("table", self.ids["table"])
            self.report.add(f"created table {self.name}")
            row = await ctx.one(look_up("regclass_oid"), (ctx.name_literal(),))
        oid = row[0]
        have = {r[0] for r in await rows(c, look_up("live_columns"), (oid,))}
        for col, typ in COLUMNS.items():
            if col in have:
                continue
            coltype = self.ids["state"] if typ is None else sql.SQL(typ)
            await c.execute(change("add_column", table=self.ids["table"], column=sql.Identifier(col),
                                   type=coltype))
            self.report.add(f"added column {col} to {self.name}")
        comments = dict(await rows(c, look_up("table_comments"), (oid,)))
        if comments.get(0) is None:
            await c.execute(change("comment_table", table=self.ids["table"]))
        for name, num in await rows(c, look_up("column_numbers"), (oid,)):
            if name in COMMENTS and comments.get(num) != COMMENTS[name]:
                await c.execute(change("comment_column", table=self.ids["table"], column=sql.Identifier(name),
                                       comment=sql.Literal(COMMENTS[name])))
        return oid

    async def defaults_and_constraints(self) -> None:
        c, table = self.conn, self.ids["table"]
        state_default = f"'PLAN'::{self.ids['state'].as_string(c)}"
        wanted = {**DEFAULTS, "state": state_default}
        current = {name: (expr, notnull) for name, expr, notnull
                   in await rows(c, look_up("column_defaults"), (self.ctx.name_literal(),))}
        # The server's own deparsed text of each wanted default, from a throwaway temp table:
        # compare, and ALTER only what differs (so a table owned by another role is left alone).
        probe = sql.SQL(", ").join(
            change("probe_column", column=sql.Identifier(col), expr=sql.SQL(expr),
                   type=self.ids["state"] if COLUMNS[col] is None else sql.SQL(COLUMNS[col]))
            for col, expr in wanted.items())
        await c.execute(change("probe", columns=probe))
        canonical = dict(await rows(c, look_up("probe_defaults")))
        await c.execute(change("drop_probe"))
        for col, expr in wanted.items():
            if current[col][0] == canonical[col]:
                continue
            await c.execute(change("set_default", table=table, column=sql.Identifier(col),
                                   expr=sql.SQL(expr)))
            await c.execute(change("fill_default", table=table, column=sql.Identifier(col)))
            self.report.add(f"set default of {self.name}.{col}")
        for col in COLUMNS:
            notnull = current[col][1]
            if col in NULLABLE and notnull:
                await c.execute(change("drop_not_null", table=table, column=sql.Identifier(col)))
                self.report.add(f"dropped NOT NULL on {self.name}.{col}")
            elif col not in NULLABLE and not notnull:
                await c.execute(change("set_not_null", table=table, column=sql.Identifier(col)))
                self.report.add(f"set NOT NULL on {self.name}.{col}")
        have = {r[0] for r in await rows(c, look_up("check_constraints"), (self.ctx.name_literal(),))}
        for col, check in CHECKS.items():
            name = beside(self.table, f"{col}_check")
            if name not in have:
                await c.execute(change("add_check", table=table, constraint=sql.Identifier(name),
                                       check=sql.SQL(check)))
                self.report.add(f"added check {name}")

    async def indexes(self) -> None:
        c = self.conn
        have = {r[0] for r in await rows(c, look_up("index_names"), (self.ctx.name_literal(),))}
        for suffix, query_name in INDEXES.items():
            name = beside(self.table, suffix)
            if name not in have:
                await c.execute(self.ctx.q("table.sql", query_name, index=sql.Identifier(name)))
                self.report.add(f"created index {name}")

    async def triggers(self, oid: int) -> None:
        c = self.conn
        have_triggers = {r[0] for r in await rows(c, look_up("user_triggers"), (oid,))}
        for kind, nargs in (*((k, 0) for k in TRIGGERS), *FUNCTIONS.items()):
            fn_name = function_name(self.table, kind)
            fn = sql.Identifier(self.schema, fn_name)
            create_fn = self.ctx.q("triggers.sql", kind, fn=fn, channel=sql.Literal(channel(oid)))
            text = create_fn.as_string(c)
            body = text.split("$body$")[1]
            row = await self.ctx.one(look_up("function_body_of_arity"), (self.schema, fn_name, nargs))
            if row is None or row[0] != body:
                await c.execute(create_fn)
                self.report.add(f"{'created' if row is None else 'replaced'} function {self.schema}.{fn_name}")
            if kind in TRIGGERS and fn_name not in have_triggers:
                await c.execute(self.ctx.q("triggers.sql", f"{kind}_trigger", fn=fn,
                                           trigger=sql.Identifier(fn_name)))
                self.report.add(f"created trigger {fn_name} on {self.name}")


async def provision_table(conn: psycopg.AsyncConnection, schema: str, table: str, report: Report,
                          owner: str | None = None, service: str | None = None) -> int:
    """Run all table steps in one transaction; returns the table oid.

    ``owner``: provision as an administrator on behalf of that role: the schema, enum and table
    created are owned by it, so the entry's role needs no CREATE right on a database it does not own.
    ``service``: the role the entry's service runs as (register_service).
    """
    async with conn.transaction():
        # one provisioner at a time per table, across service instances
        await conn.execute(change("lock_table"), (f"pgtask provision {schema}.{table}",))
        return await TableProvisioner(conn, schema, table, report, owner, service).run()


_IDENT = re.compile(r"^[^\x00]+$")


def check_identifier(kind: str, value: str) -> None:
    if not value or not _IDENT.match(value) or len(value.encode()) > 63:
        raise ValueError(f"{kind} {value!r}: must be 1-63 bytes without NUL")


# The manual's settings that ALTER SYSTEM must take from any session (see ensure_placeholders): the
# GUC table, and pg_conf.max, which pgtask does not read; not pg_task.id, which only a task's own
# session sets.
PLACEHOLDERS = (*(s.name for s in SETTINGS), "pg_conf.max")


async def ensure_placeholders(conn: psycopg.AsyncConnection, report: Report) -> None:
    """Before PostgreSQL 17, ALTER SYSTEM SET/RESET refuses a custom setting its session does not
    know ("unrecognized configuration parameter"), and a session knows pg_task's settings only from
    the library that registers them, a SET of its own or the configuration files. So each of
    PLACEHOLDERS that no configuration file names gets the placeholder '' (which pgtask reads as
    unset) in postgresql.auto.conf, and the server reads its files again: every session knows them.
    (A placeholder set by ALTER DATABASE / ROLE would reach only that database's or role's
    sessions, and hide the server's value from them.) ``conn`` is autocommit: ALTER SYSTEM runs
    outside a transaction block. Only a superuser may write them (ALTER SYSTEM, pg_file_settings),
    and from PostgreSQL 17 on they are not needed: skipped then.

    postgresql.auto.conf is read last: a placeholder there would override a value another file sets
    later (a DBA's postgresql.conf, the Ansible role's conf.d file). So a placeholder whose setting a
    file other than postgresql.auto.conf now sets is reset (that file makes the setting known)."""
    if not (await one(conn, look_up("placeholders_needed")))[0]:
        return
    named = {name: (elsewhere, placeholder) for name, elsewhere, placeholder
             in await rows(conn, look_up("placeholder_files"), (list(PLACEHOLDERS),))}
    missing = [name for name in PLACEHOLDERS if name not in named]
    covering = [name for name, (elsewhere, placeholder) in named.items() if elsewhere and placeholder]
    if not missing and not covering:
        return
    for name in missing:
        await conn.execute(change("know_setting"), (name,))
        await conn.execute(change("set_placeholder", setting=sql.Identifier(name)))
    for name in covering:
        await conn.execute(change("reset_placeholder", setting=sql.Identifier(name)))
    await conn.execute(change("reload"))
    if missing:
        report.add(f"placeholder '' in postgresql.auto.conf for {', '.join(missing)}")
    if covering:
        report.add(f"placeholder removed from postgresql.auto.conf (a configuration file sets it) for "
                   f"{', '.join(covering)}")
