"""Privileges: the entry's role's on a table another role owns (the task table and the tables beside
it), and the table's authors' role (author_role) with what it lacks of AUTHOR_PRIVILEGES. Each is
granted only when has_*_privilege says it is missing."""

from __future__ import annotations

import psycopg
from psycopg import sql

from .names import EXTRA_TABLES, admin_role, author_role, beside, function_name, liveness_table
from .provision_context import TableContext, change, look_up
from .provision_verbs import ADMIN_VERBS, AUTHOR_VERBS

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
    # the verbs on an author's own tasks (provision_verbs.py)
    *(("ROUTINE", verb, ("EXECUTE",)) for verb in AUTHOR_VERBS),
)
# The privileges of a table's operator role (admin_role): the verbs on every task, pausing groups,
# reading the tasks it acts on, and the group table (its retry policies are the operator's alone:
# "group_guard" in schedule.sql).
ADMIN_PRIVILEGES = (
    ("SCHEMA", "schema", ("USAGE",)),
    ("TABLE", "table", ("SELECT",)),
    ("TABLE", "groups", ("SELECT", "INSERT", "UPDATE", "DELETE")),
    *(("ROUTINE", verb, ("EXECUTE",)) for verb in ADMIN_VERBS),
)
# each kind's object, from its quoted identifier (the server's name of it goes into the GRANT)
AUTHOR_TARGETS = {
    "SCHEMA": "%s::regnamespace",
    "TABLE": "%s::regclass",
    "SEQUENCE": "pg_get_serial_sequence(%s, 'id')::regclass",
    "FUNCTION": "%s::regproc::oid::regprocedure",
    "ROUTINE": "%s::regproc::oid::regprocedure",  # a function or a procedure
}


class Grants:
    """The privileges of one table's roles (see the module's docstring)."""

    def __init__(self, ctx: TableContext):
        self.ctx = ctx

    async def owner_grants(self) -> None:
        """The entry's role runs the scheduler: it needs the table even when another role owns it."""
        ctx = self.ctx
        if not ctx.owner:
            return
        owner = sql.Identifier(ctx.owner)
        row = await ctx.one(look_up("owner_privileges"),
                            {"r": ctx.owner, "s": ctx.schema, "t": ctx.name_literal()})
        if not row[0]:
            await ctx.conn.execute(change("grant_schema", schema=ctx.ids["schema"], owner=owner))
            ctx.report.add(f"granted usage on schema {ctx.schema} to {ctx.owner}")
        if not row[1]:
            await ctx.conn.execute(change("grant_table", table=ctx.ids["table"], owner=owner))
            ctx.report.add(f"granted {ctx.name} to {ctx.owner}")
        if not row[2]:
            # pg_get_serial_sequence returns the name already quoted by the server
            await ctx.conn.execute(change("grant_sequence", sequence=sql.SQL(row[3]), owner=owner))
            ctx.report.add(f"granted the id sequence of {ctx.name} to {ctx.owner}")

    async def beside_grants(self) -> None:
        """The tables beside the task table, for the entry's role when another role owns them: the
        claim reads and writes the group table, maintenance the schedule, occurrence and key tables
        (the service table is the triggers', granted with it)."""
        ctx = self.ctx
        if not ctx.owner:
            return
        dml = ("SELECT", "INSERT", "UPDATE", "DELETE")
        for kind, suffix in EXTRA_TABLES.items():
            if kind != "service":
                await self.grant_missing(ctx.owner, "TABLE", sql.Identifier(
                    ctx.schema, beside(ctx.table, suffix)), dml)
        await self.grant_missing(ctx.owner, "SEQUENCE", sql.Identifier(
            ctx.schema, beside(ctx.table, EXTRA_TABLES['schedule'])), ("USAGE",))

    async def authors(self, ids: dict) -> None:
        """The table's authors' role (author_role) and its operator role (admin_role): each created
        NOLOGIN when missing, where the provisioning role may create roles (else an administrator's
        provisioning does), and given what it lacks of AUTHOR_PRIVILEGES / ADMIN_PRIVILEGES. A role
        name PostgreSQL reserves (pg_...) gets none."""
        ctx = self.ctx
        for role, wanted in ((author_role(ctx.table), AUTHOR_PRIVILEGES), (admin_role(ctx.table), ADMIN_PRIVILEGES)):
            if not await self.ensure_role(role):
                continue
            for kind, name, privileges in wanted:
                ident = sql.Identifier(ctx.schema, function_name(ctx.table, name)) \
                    if kind in ("FUNCTION", "ROUTINE") else ids[name]
                await self.grant_missing(role, kind, ident, privileges)

    async def admin_liveness(self) -> None:
        """The operator role reads the instance table (sql/liveness.sql), which no other role may:
        whether a service looks after the table is the first thing `pgtask status` and the console
        say. After the liveness tables are made (BesideTables.liveness)."""
        ctx = self.ctx
        role = admin_role(ctx.table)
        if await ctx.one(look_up("role_exists"), (role,)) is not None:
            await self.grant_missing(role, "TABLE", sql.Identifier(ctx.schema, liveness_table(ctx.table, "instance")),
                                     ("SELECT",))

    async def ensure_role(self, role: str) -> bool:
        """Create the NOLOGIN ``role`` when missing and allowed to; whether it exists now."""
        ctx = self.ctx
        if await ctx.one(look_up("role_exists"), (role,)) is not None:
            return True
        if role.startswith("pg_") or not (await ctx.one(look_up("may_create_roles")))[0]:
            return False
        try:
            async with ctx.conn.transaction():  # another database's provisioning may create it meanwhile
                await ctx.conn.execute(change("create_role", role=sql.Identifier(role)))
            ctx.report.add(f"created role {role}")
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateObject):
            pass
        return True

    async def grant_missing(self, role: str, kind: str, ident: sql.Composable, privileges: tuple[str, ...]) -> None:
        """Grant ``role`` what it lacks of ``privileges`` on the object ``ident`` of ``kind`` (a key
        of AUTHOR_TARGETS: a SEQUENCE is the id sequence of the table ``ident``)."""
        ctx = self.ctx
        oid, target = await ctx.one(look_up("grant_target", target=sql.SQL(AUTHOR_TARGETS[kind])),
                                    (ident.as_string(ctx.conn),))
        checker = "function" if kind == "ROUTINE" else kind.lower()
        held = look_up("privileges_held", has_privilege=sql.Identifier(f"has_{checker}_privilege"))
        have = set((await ctx.one(held, (list(privileges), role, oid)))[0])
        missing = [p for p in privileges if p not in have]
        if not missing:
            return
        await ctx.conn.execute(change("grant", privileges=sql.SQL(", ").join(map(sql.SQL, missing)),
                                      kind=sql.SQL(kind), target=sql.SQL(target), role=sql.Identifier(role)))
        # a role that may not grant them gets a warning from the server, not an error
        now = set((await ctx.one(held, (missing, role, oid)))[0])
        if now:
            ctx.report.add(f"granted {', '.join(p for p in missing if p in now)} on {kind.lower()} "
                           f"{target} to {role}")
