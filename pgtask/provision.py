"""Idempotent provisioning: role, database, schema, enum, table, defaults, constraints, indexes,
triggers, the objects beside the table and the role its authors are granted; and, on the server,
placeholders for the manual's settings (ensure_placeholders). Every step checks pg_catalog first and
only creates or alters what is missing or different; the caller gets the list of what changed
(``pgtask provision --json``).

Objects a user added (columns, triggers, indexes, partitions) are never dropped or rewritten.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from . import sql as named
from .config import SETTINGS
from .names import (
    EXTRA_TABLES,
    LIVENESS_TABLES,
    author_role,
    channel,
    extra_table,
    function_name,
    ident_name,
    liveness_table,
)

# Column name -> SQL type, in the manual's order, plus attempt/lease for fencing.
COLUMNS: dict[str, str] = {
    "id": "bigint", "parent": "bigint", "plan": "timestamptz", "start": "timestamptz",
    "stop": "timestamptz", "active": "interval", "live": "interval", "repeat": "interval",
    "timeout": "interval", "count": "integer", "max": "integer", "pid": "integer", "state": None,
    "delete": "boolean", "drift": "boolean", "header": "boolean", "save": "boolean",
    "string": "boolean", "delimiter": '"char"', "escape": '"char"', "quote": '"char"', "data": "text",
    "error": "text", "group": "text", "input": "text", "null": "text", "output": "text",
    "remote": "text", "user": "name", "attempt": "integer", "lease": "uuid", "after": "bigint[]",
    "wait": "integer", "waited": "boolean",
}
NULLABLE = {"parent", "start", "stop", "pid", "data", "error", "output", "remote", "lease", "after", "wait",
            "waited"}


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
}
# trigger name suffix -> the query names in triggers.sql
TRIGGERS = ("wake_up", "settings", "insert", "update", "stop", "wait", "release", "dropped")
# functions without a trigger in triggers.sql: name suffix -> number of arguments
FUNCTIONS = {"start": 3, "check": 3}
INDEXES = {"plan_idx": "index_plan", "slot_idx": "index_running", "queue_idx": "index_group",
           "parent_idx": "index_parent", "state_idx": "index_state", "after_idx": "index_after",
           "wait_idx": "index_wait"}
LABELS = ("PLAN", "GONE", "TAKE", "WORK", "DONE", "FAIL", "STOP", "WAIT")


@dataclass
class Report:
    actions: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.actions)

    def add(self, what: str) -> None:
        self.actions.append(what)


async def _one(conn: psycopg.AsyncConnection, query, params=()) -> tuple | None:
    cur = await conn.execute(query, params)
    return await cur.fetchone()


async def ensure_role(conn: psycopg.AsyncConnection, role: str, report: Report) -> None:
    if await _one(conn, "SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)) is None:
        await conn.execute(sql.SQL("CREATE ROLE {} WITH LOGIN").format(sql.Identifier(role)))
        report.add(f"created role {role}")


async def ensure_database(conn: psycopg.AsyncConnection, data: str, owner: str, report: Report) -> None:
    """``conn`` must be in autocommit mode (CREATE DATABASE cannot run in a transaction)."""
    if await _one(conn, "SELECT 1 FROM pg_database WHERE datname = %s", (data,)) is None:
        await conn.execute(sql.SQL("CREATE DATABASE {} WITH OWNER = {}").format(
            sql.Identifier(data), sql.Identifier(owner)))
        report.add(f"created database {data}")


class TableProvisioner:
    """Brings one schema.table to the current definition, inside the entry's database."""

    def __init__(self, conn: psycopg.AsyncConnection, schema: str, table: str, report: Report,
                 owner: str | None = None, service: str | None = None):
        self.conn, self.schema, self.table, self.report = conn, schema, table, report
        self.owner, self.service = owner, service
        self.ids = {
            "schema": sql.Identifier(schema),
            "table": sql.Identifier(schema, table),
            "state": sql.Identifier(schema, "state"),
            # the roles the service runs as for this table (see "update" in triggers.sql)
            "service": sql.Identifier(schema, ident_name(f"{table}_service")),
            # whether a role writes for the service (is_service in schedule.sql): every guard asks it
            "is_service": sql.Identifier(schema, ident_name(f"{table}_is_service")),
            # the names of a jsonb of task columns a user may not set (unsettable in schedule.sql)
            "unsettable": sql.Identifier(schema, ident_name(f"{table}_unsettable")),
        }
        self.name = f"{schema}.{table}"

    def q(self, file: str, name: str, **extra) -> sql.Composed:
        return sql.SQL(named.query(file, name)).format(**self.ids, **extra)

    async def run(self) -> int:
        """Provision everything; returns the table's oid."""
        await self.schema_and_type()
        oid = await self.table_and_columns()
        await self.grants()
        await self.defaults_and_constraints()
        await self.indexes()
        await self.triggers(oid)
        await self.extras(oid)
        await self.extra_grants()
        await self.register_service()
        await self.liveness()
        return oid

    async def liveness(self) -> None:
        """The claim lock's table and the instance table (sql/liveness.sql): created when missing,
        owned like the task table, no privilege for PUBLIC, and their privileges for the role the
        entry's service runs as when another role owns them."""
        c = self.conn
        ids = {kind: sql.Identifier(self.schema, liveness_table(self.table, kind)) for kind in LIVENESS_TABLES}

        def q(name: str, **extra) -> sql.Composed:
            return sql.SQL(named.query("liveness.sql", name)).format(**ids, **extra)

        created = False
        for kind in LIVENESS_TABLES:
            rel = liveness_table(self.table, kind)
            if await self._relation(rel) is None:
                await c.execute(q(f"create_{kind}"))
                await c.execute(q(f"comment_{kind}"))
                if self.owner:
                    await c.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(ids[kind], sql.Identifier(self.owner)))
                self.report.add(f"created table {self.schema}.{rel}")
                created = True
        if created:
            await c.execute(q("revoke"))
        for role in {r for r in (self.owner, self.service) if r}:
            literals = {kind: ids[kind].as_string(c) for kind in LIVENESS_TABLES}
            if not (await _one(c, named.query("liveness.sql", "granted"), {"role": role, **literals}))[0]:
                await c.execute(q("grant", role=sql.Identifier(role)))
                self.report.add(f"granted the claim lock and instance tables of {self.name} to {role}")

    async def register_service(self) -> None:
        """The role the entry's service runs as may write the tasks' progress (see "update" in
        triggers.sql): registered in <table>_service, unless it owns the table or is a superuser."""
        if not self.service:
            return
        cur = await self.conn.execute(sql.SQL(
            """INSERT INTO {} ("role") SELECT %s WHERE NOT EXISTS (SELECT FROM pg_roles
               WHERE rolname = %s AND (rolsuper OR pg_has_role(%s, (SELECT relowner FROM pg_class
                                                                     WHERE oid = %s::regclass), 'USAGE')))
               ON CONFLICT DO NOTHING RETURNING "role" """).format(self.ids["service"]),
            (self.service, self.service, self.service, self.name_literal()))
        if await cur.fetchone() is not None:
            self.report.add(f"registered role {self.service} as the service of {self.name}")

    async def schema_and_type(self) -> None:
        c = self.conn
        if await _one(c, "SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,)) is None:
            create = self.q("table.sql", "create_schema")
            if self.owner:
                create = sql.SQL("{} AUTHORIZATION {}").format(create, sql.Identifier(self.owner))
            await c.execute(create)
            self.report.add(f"created schema {self.schema}")

        have = await _one(c, """SELECT array_agg(e.enumlabel::text ORDER BY e.enumsortorder)
            FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
            LEFT JOIN pg_enum e ON e.enumtypid = t.oid
            WHERE n.nspname = %s AND t.typname = 'state' GROUP BY t.oid""", (self.schema,))
        if have is None:
            await c.execute(self.q("table.sql", "create_state"))
            if self.owner:
                await c.execute(sql.SQL("ALTER TYPE {} OWNER TO {}").format(
                    self.ids["state"], sql.Identifier(self.owner)))
            self.report.add(f"created type {self.schema}.state")
        else:
            for label in LABELS:
                if label not in (have[0] or []):
                    await c.execute(sql.SQL("ALTER TYPE {} ADD VALUE {}").format(
                        self.ids["state"], sql.Literal(label)))
                    self.report.add(f"added label {label} to {self.schema}.state")

    async def table_and_columns(self) -> int:
        c = self.conn
        row = await _one(c, """SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')""", (self.schema, self.table))
        if row is None:
            await c.execute(self.q("table.sql", "create_table"))
            if self.owner:
                await c.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(
                    self.ids["table"], sql.Identifier(self.owner)))
            self.report.add(f"created table {self.name}")
            row = await _one(c, "SELECT %s::regclass::oid", (self.name_literal(),))
        oid = row[0]
        cur = await c.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 "
                              "AND NOT attisdropped", (oid,))
        have = {r[0] for r in await cur.fetchall()}
        for col, typ in COLUMNS.items():
            if col in have:
                continue
            coltype = self.ids["state"] if typ is None else sql.SQL(typ)
            await c.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
                self.ids["table"], sql.Identifier(col), coltype))
            self.report.add(f"added column {col} to {self.name}")
        cur = await c.execute("SELECT objsubid, description FROM pg_description WHERE objoid = %s "
                              "AND classoid = 'pg_class'::regclass", (oid,))
        comments = dict(await cur.fetchall())
        if comments.get(0) is None:
            await c.execute(sql.SQL("COMMENT ON TABLE {} IS 'Tasks'").format(self.ids["table"]))
        cur = await c.execute("SELECT attname, attnum FROM pg_attribute WHERE attrelid = %s AND attnum > 0",
                              (oid,))
        for name, num in await cur.fetchall():
            if name in COMMENTS and comments.get(num) != COMMENTS[name]:
                await c.execute(sql.SQL("COMMENT ON COLUMN {}.{} IS {}").format(
                    self.ids["table"], sql.Identifier(name), sql.Literal(COMMENTS[name])))
        return oid

    async def grants(self) -> None:
        """The entry's role runs the scheduler: it needs the table even when another role owns it."""
        if not self.owner:
            return
        c = self.conn
        row = await _one(c, """SELECT has_schema_privilege(%(r)s, %(s)s, 'USAGE'),
                   has_table_privilege(%(r)s, %(t)s, 'SELECT, INSERT, UPDATE, DELETE'),
                   has_sequence_privilege(%(r)s, pg_get_serial_sequence(%(t)s, 'id'), 'USAGE'),
                   pg_get_serial_sequence(%(t)s, 'id')""",
                         {"r": self.owner, "s": self.schema, "t": self.name_literal()})
        if not row[0]:
            await c.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                self.ids["schema"], sql.Identifier(self.owner)))
            self.report.add(f"granted usage on schema {self.schema} to {self.owner}")
        if not row[1]:
            await c.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
                self.ids["table"], sql.Identifier(self.owner)))
            self.report.add(f"granted {self.name} to {self.owner}")
        if not row[2]:
            # pg_get_serial_sequence returns the name already quoted by the server
            await c.execute(sql.SQL("GRANT USAGE ON SEQUENCE {} TO {}").format(
                sql.SQL(row[3]), sql.Identifier(self.owner)))
            self.report.add(f"granted the id sequence of {self.name} to {self.owner}")

    async def extra_grants(self) -> None:
        """The tables beside the task table, for the entry's role when another role owns them: the
        claim reads and writes the group table, maintenance the schedule, occurrence and key tables
        (the service table is the triggers', granted with it)."""
        if not self.owner:
            return
        dml = ("SELECT", "INSERT", "UPDATE", "DELETE")
        for kind, suffix in EXTRA_TABLES.items():
            if kind != "service":
                await self.grant_missing(self.owner, "TABLE", sql.Identifier(
                    self.schema, ident_name(f"{self.table}_{suffix}")), dml)
        await self.grant_missing(self.owner, "SEQUENCE", sql.Identifier(
            self.schema, ident_name(f"{self.table}_{EXTRA_TABLES['schedule']}")), ("USAGE",))

    def name_literal(self) -> str:
        return sql.Identifier(self.schema, self.table).as_string(None)

    async def defaults_and_constraints(self) -> None:
        c = self.conn
        state_default = f"'PLAN'::{self.ids['state'].as_string(c)}"
        wanted = {**DEFAULTS, "state": state_default}
        cur = await c.execute("""SELECT a.attname, pg_get_expr(d.adbin, d.adrelid), a.attnotnull
            FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
            WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped""", (self.name_literal(),))
        current = {name: (expr, notnull) for name, expr, notnull in await cur.fetchall()}
        # The server's own deparsed text of each wanted default, from a throwaway temp table:
        # compare, and ALTER only what differs (so a table owned by another role is left alone).
        probe = sql.SQL(", ").join(
            sql.SQL("{} {} DEFAULT {}").format(
                sql.Identifier(col), self.ids["state"] if COLUMNS[col] is None else sql.SQL(COLUMNS[col]),
                sql.SQL(expr))
            for col, expr in wanted.items())
        await c.execute(sql.SQL("CREATE TEMP TABLE pgtask_probe ({}) ON COMMIT DROP").format(probe))
        cur = await c.execute("""SELECT a.attname, pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a
            JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
            WHERE a.attrelid = 'pg_temp.pgtask_probe'::regclass""")
        canonical = dict(await cur.fetchall())
        await c.execute("DROP TABLE pg_temp.pgtask_probe")
        for col, expr in wanted.items():
            if current[col][0] == canonical[col]:
                continue
            await c.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET DEFAULT {}").format(
                self.ids["table"], sql.Identifier(col), sql.SQL(expr)))
            await c.execute(sql.SQL("UPDATE {} SET {} = DEFAULT WHERE {} IS NULL").format(
                self.ids["table"], sql.Identifier(col), sql.Identifier(col)))
            self.report.add(f"set default of {self.name}.{col}")
        for col in COLUMNS:
            notnull = current[col][1]
            if col in NULLABLE and notnull:
                await c.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP NOT NULL").format(
                    self.ids["table"], sql.Identifier(col)))
                self.report.add(f"dropped NOT NULL on {self.name}.{col}")
            elif col not in NULLABLE and not notnull:
                await c.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET NOT NULL").format(
                    self.ids["table"], sql.Identifier(col)))
                self.report.add(f"set NOT NULL on {self.name}.{col}")
        cur = await c.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'",
                              (self.name_literal(),))
        have = {r[0] for r in await cur.fetchall()}
        for col, check in CHECKS.items():
            name = ident_name(f"{self.table}_{col}_check")
            if name not in have:
                await c.execute(sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} CHECK ({})").format(
                    self.ids["table"], sql.Identifier(name), sql.SQL(check)))
                self.report.add(f"added check {name}")

    async def indexes(self) -> None:
        c = self.conn
        cur = await c.execute("""SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
            WHERE x.indrelid = %s::regclass""", (self.name_literal(),))
        have = {r[0] for r in await cur.fetchall()}
        for suffix, query_name in INDEXES.items():
            name = ident_name(f"{self.table}_{suffix}")
            if name not in have:
                await c.execute(self.q("table.sql", query_name, index=sql.Identifier(name)))
                self.report.add(f"created index {name}")

    async def triggers(self, oid: int) -> None:
        c = self.conn
        cur = await c.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = %s AND NOT tgisinternal", (oid,))
        have_triggers = {r[0] for r in await cur.fetchall()}
        for kind, nargs in (*((k, 0) for k in TRIGGERS), *FUNCTIONS.items()):
            fn_name = function_name(self.table, kind)
            fn = sql.Identifier(self.schema, fn_name)
            create_fn = self.q("triggers.sql", kind, fn=fn, channel=sql.Literal(channel(oid)))
            text = create_fn.as_string(c)
            body = text.split("$body$")[1]
            row = await _one(c, """SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE n.nspname = %s AND p.proname = %s AND p.pronargs = %s""", (self.schema, fn_name, nargs))
            if row is None or row[0] != body:
                await c.execute(create_fn)
                self.report.add(f"{'created' if row is None else 'replaced'} function {self.schema}.{fn_name}")
            if kind in TRIGGERS and fn_name not in have_triggers:
                await c.execute(self.q("triggers.sql", f"{kind}_trigger", fn=fn,
                                       trigger=sql.Identifier(fn_name)))
                self.report.add(f"created trigger {fn_name} on {self.name}")


    # -- schedules, idempotency keys, group capacity (sql/schedule.sql) ---------------------------
    async def extras(self, oid: int) -> None:
        """The tables and functions beside the task table: <table>_schedule, _occurrence, _key,
        _group; <table>_enqueue(), <table>_schedule_next(); the capacity trigger on the task table;
        the view <table>_open, the row-level security of _key and _schedule, the authors' role."""
        c = self.conn
        ids = {**self.ids, **{kind: sql.Identifier(self.schema, ident_name(f"{self.table}_{suffix}"))
                              for kind, suffix in {**EXTRA_TABLES, "open": OPEN_VIEW}.items()},
               "regclass": sql.Literal(self.name_literal()), "channel": sql.Literal(channel(oid))}

        def q(name: str, **extra) -> sql.Composed:
            return sql.SQL(named.query("schedule.sql", name)).format(**ids, **extra)

        for kind, suffix in EXTRA_TABLES.items():
            rel = ident_name(f"{self.table}_{suffix}")
            if await self._relation(rel) is None:
                await c.execute(q(f"create_{kind}"))
                await c.execute(q(f"comment_{kind}"))
                if kind == "service":  # the triggers read it as whoever writes the task table
                    await c.execute(q("grant_service"))
                if self.owner:  # provisioning on behalf of the entry's role: it owns these too
                    await c.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(
                        ids[kind], sql.Identifier(self.owner)))
                self.report.add(f"created table {self.schema}.{rel}")
        await self._groups_flow(q)
        for suffix, (on, query_name) in EXTRA_INDEXES.items():
            rel = ident_name(f"{self.table}_{suffix}")
            if await self._relation(rel) is None:
                await c.execute(q(query_name, index=sql.Identifier(rel)))
                self.report.add(f"created index {rel}")
        for suffix in OBSOLETE_INDEXES:
            rel = ident_name(f"{self.table}_{suffix}")
            if await _one(c, "SELECT 1 FROM pg_index WHERE indexrelid = to_regclass(%s) AND indrelid = %s",
                          (sql.Identifier(self.schema, rel).as_string(c), oid)) is not None:
                await c.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(self.schema, rel)))
                self.report.add(f"dropped index {self.schema}.{rel} (no longer used)")
        for suffix, (query_name, trigger_on) in EXTRA_FUNCTIONS.items():
            fn_name = ident_name(f"{self.table}_{suffix}")
            create_fn = q(query_name, fn=sql.Identifier(self.schema, fn_name))
            body = create_fn.as_string(c).split("$body$")[1]
            row = await _one(c, """SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE n.nspname = %s AND p.proname = %s""", (self.schema, fn_name))
            if row is None or row[0] != body:
                await c.execute(create_fn)
                if self.owner and row is None:
                    await c.execute(sql.SQL("ALTER FUNCTION {} OWNER TO {}").format(
                        sql.Identifier(self.schema, fn_name), sql.Identifier(self.owner)))
                self.report.add(f"{'created' if row is None else 'replaced'} function {self.schema}.{fn_name}")
            if trigger_on is None:
                continue
            target = self.name_literal() if trigger_on == "table" else sql.Identifier(
                self.schema, ident_name(f"{self.table}_{EXTRA_TABLES[trigger_on]}")).as_string(c)
            have = await _one(c, "SELECT 1 FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname = %s",
                              (target, fn_name))
            if have is None:
                await c.execute(q(f"{query_name}_trigger", fn=sql.Identifier(self.schema, fn_name),
                                  trigger=sql.Identifier(fn_name)))
                self.report.add(f"created trigger {fn_name}")
        rel = ident_name(f"{self.table}_{OPEN_VIEW}")
        if await self._relation(rel) is None:  # after is_service, which it asks
            await c.execute(q("create_open"))
            await c.execute(q("comment_open"))
            if self.owner:
                await c.execute(sql.SQL("ALTER VIEW {} OWNER TO {}").format(ids["open"], sql.Identifier(self.owner)))
            self.report.add(f"created view {self.schema}.{rel}")
        await self._keys_per_role(ids["keys"], q)
        for kind, query_name in (("keys", "keys_policy"), ("schedule", "schedule_policy")):
            await self._policy(kind, query_name, q)
        await self.authors(ids)

    async def _groups_flow(self, q) -> None:
        """A group table without pause and rate (capacities only) gets them (groups_flow)."""
        rel = extra_table(self.table, "groups")
        if await _one(self.conn, "SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'paused' "
                                 "AND NOT attisdropped", (sql.Identifier(self.schema, rel).as_string(self.conn),)) is None:
            await self.conn.execute(q("groups_flow"))
            self.report.add(f"added paused, rate and burst to {self.schema}.{rel}")

    async def _keys_per_role(self, keys: sql.Identifier, q) -> None:
        """Idempotency keys are each role's own: the "user" column in the primary key (an older
        table is converted; the row-level security policy keeps a role to its rows: _policy)."""
        c = self.conn
        rel = ident_name(f"{self.table}_{EXTRA_TABLES['keys']}")
        regclass = keys.as_string(c)
        if await _one(c, "SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'user' "
                         "AND NOT attisdropped", (regclass,)) is None:
            orphans, pkey = await _one(c, sql.SQL(
                """SELECT (SELECT count(*) FROM {} k WHERE NOT EXISTS (SELECT FROM {} t WHERE t."id" = k."task")),
                          (SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p')"""
            ).format(keys, self.ids["table"]), (regclass,))
            await c.execute(q("keys_per_role", pkey=sql.Identifier(pkey)))
            self.report.add(f"made the keys of {self.schema}.{rel} per role"
                            + (f" ({orphans} whose task is gone now the owner's)" if orphans else ""))

    async def _policy(self, kind: str, query_name: str, q) -> None:
        """The row-level security that keeps a role to its own rows of a table beside the task table."""
        rel = ident_name(f"{self.table}_{EXTRA_TABLES[kind]}")
        policy = ident_name(f"{rel}_role")
        if await _one(self.conn, "SELECT 1 FROM pg_policy WHERE polrelid = %s::regclass AND polname = %s",
                      (sql.Identifier(self.schema, rel).as_string(self.conn), policy)) is None:
            await self.conn.execute(q(query_name, policy=sql.Identifier(policy)))
            self.report.add(f"created policy {policy} on {self.schema}.{rel}")

    async def authors(self, ids: dict) -> None:
        """The table's authors' role (author_role): created NOLOGIN when missing, where the
        provisioning role may create roles (else an administrator's provisioning does), and given
        what it lacks of AUTHOR_PRIVILEGES. A role name PostgreSQL reserves (pg_...) gets none."""
        c, role = self.conn, author_role(self.table)
        if await _one(c, "SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)) is None:
            if role.startswith("pg_") or not (await _one(
                    c, "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user"))[0]:
                return
            try:
                async with c.transaction():  # another database's provisioning may create it meanwhile
                    await c.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
                self.report.add(f"created role {role}")
            except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateObject):
                pass
        for kind, name, privileges in AUTHOR_PRIVILEGES:
            ident = sql.Identifier(self.schema, function_name(self.table, name)) if kind == "FUNCTION" \
                else ids[name]
            await self.grant_missing(role, kind, ident, privileges)

    async def grant_missing(self, role: str, kind: str, ident: sql.Composable, privileges: tuple[str, ...]) -> None:
        """Grant ``role`` what it lacks of ``privileges`` on the object ``ident`` of ``kind`` (a key
        of AUTHOR_TARGETS: a SEQUENCE is the id sequence of the table ``ident``)."""
        c = self.conn
        oid, target = await _one(c, sql.SQL("SELECT x::oid, x::text FROM (SELECT {} AS x) t").format(
            sql.SQL(AUTHOR_TARGETS[kind])), (ident.as_string(c),))
        held = sql.SQL("SELECT coalesce(array_agg(p), '{{}}') FROM unnest(%s::text[]) p WHERE {}(%s, %s, p)").format(
            sql.Identifier(f"has_{kind.lower()}_privilege"))
        have = set((await _one(c, held, (list(privileges), role, oid)))[0])
        missing = [p for p in privileges if p not in have]
        if not missing:
            return
        await c.execute(sql.SQL("GRANT {} ON {} {} TO {}").format(
            sql.SQL(", ").join(map(sql.SQL, missing)), sql.SQL(kind), sql.SQL(target), sql.Identifier(role)))
        # a role that may not grant them gets a warning from the server, not an error
        now = set((await _one(c, held, (missing, role, oid)))[0])
        if now:
            self.report.add(f"granted {', '.join(p for p in missing if p in now)} on {kind.lower()} "
                            f"{target} to {role}")

    async def _relation(self, name: str) -> tuple | None:
        return await _one(self.conn, """SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = %s AND c.relname = %s""", (self.schema, name))


# index name suffix -> (table it is on, query in schedule.sql)
EXTRA_INDEXES = {"schedule_due_idx": ("schedule", "index_schedule_due"),
                 "key_expires_idx": ("keys", "index_keys_expires")}
# index name suffixes of the task table's own indexes that earlier versions created and nothing
# uses any more: dropped when found (each cost every task's every state change an index entry).
# running_idx: the running count's, TAKE/WORK only; slot_idx replaces it (see index_running).
OBSOLETE_INDEXES = ("live_group_idx", "running_idx")
# function name suffix -> (query in schedule.sql, the table its trigger is on or None)
EXTRA_FUNCTIONS = {"is_service": ("is_service", None), "unsettable": ("unsettable", None),
                   "capacity": ("capacity", "table"), "enqueue": ("enqueue", None),
                   "schedule_next": ("schedule_next", None),
                   "schedule_guard": ("schedule_guard", "schedule"),
                   "schedule_delete_guard": ("schedule_delete_guard", "schedule"),
                   "schedule_wake": ("schedule_wake", "schedule"),
                   "group_wake": ("group_wake", "groups")}


OPEN_VIEW = "open"  # the view of the caller's queued or running task ids (create_open)
# The privileges a table's authors' role holds: (kind of object, which object, privileges). The
# tables beside the task table keep a role to its own rows (row-level security, the guards);
# task_group is shared: its members set any group's capacity.
AUTHOR_PRIVILEGES = (
    ("SCHEMA", "schema", ("USAGE",)),
    ("TABLE", "table", ("INSERT",)),
    ("SEQUENCE", "table", ("USAGE",)),
    ("FUNCTION", "enqueue", ("EXECUTE",)),
    ("TABLE", "keys", ("SELECT", "INSERT", "UPDATE", "DELETE")),
    ("TABLE", "open", ("SELECT",)),
    ("TABLE", "schedule", ("SELECT", "INSERT", "UPDATE", "DELETE")),
    ("SEQUENCE", "schedule", ("USAGE",)),
    ("FUNCTION", "schedule_next", ("EXECUTE",)),
    ("TABLE", "groups", ("SELECT", "INSERT", "UPDATE", "DELETE")),
)
# each kind's object, from its quoted identifier (the server's name of it goes into the GRANT)
AUTHOR_TARGETS = {
    "SCHEMA": "%s::regnamespace",
    "TABLE": "%s::regclass",
    "SEQUENCE": "pg_get_serial_sequence(%s, 'id')::regclass",
    "FUNCTION": "%s::regproc::oid::regprocedure",
}


async def provision_table(conn: psycopg.AsyncConnection, schema: str, table: str, report: Report,
                          owner: str | None = None, service: str | None = None) -> int:
    """Run all table steps in one transaction; returns the table oid.

    ``owner``: provision as an administrator on behalf of that role: the schema, enum and table
    created are owned by it, so the entry's role needs no CREATE right on a database it does not own.
    ``service``: the role the entry's service runs as (register_service).
    """
    async with conn.transaction():
        # one provisioner at a time per table, across service instances
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"pgtask provision {schema}.{table}",))
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
    cur = await conn.execute("SELECT current_setting('server_version_num')::int < 170000 "
                             "AND current_setting('is_superuser') = 'on'")
    if not (await cur.fetchone())[0]:
        return
    cur = await conn.execute(
        "SELECT lower(name), bool_or(sourcefile <> auto), bool_or(sourcefile = auto AND setting = '') "
        "FROM pg_file_settings, (SELECT current_setting('data_directory') || '/postgresql.auto.conf' AS auto) a "
        "WHERE lower(name) = ANY(%s) GROUP BY 1", (list(PLACEHOLDERS),))
    named = {name: (elsewhere, placeholder) for name, elsewhere, placeholder in await cur.fetchall()}
    missing = [name for name in PLACEHOLDERS if name not in named]
    covering = [name for name, (elsewhere, placeholder) in named.items() if elsewhere and placeholder]
    if not missing and not covering:
        return
    for name in missing:
        await conn.execute("SELECT set_config(%s, '', false)", (name,))  # now this session knows it
        await conn.execute(sql.SQL("ALTER SYSTEM SET {} = ''").format(sql.Identifier(name)))
    for name in covering:
        await conn.execute(sql.SQL("ALTER SYSTEM RESET {}").format(sql.Identifier(name)))
    await conn.execute("SELECT pg_reload_conf()")
    if missing:
        report.add(f"placeholder '' in postgresql.auto.conf for {', '.join(missing)}")
    if covering:
        report.add(f"placeholder removed from postgresql.auto.conf (a configuration file sets it) for "
                   f"{', '.join(covering)}")
