"""The operator verbs beside a task table (sql/verbs.sql, docs/operations.md): retry, cancel and
delete by id or filter with their batch-looping procedures, pause and resume. Each is created when
missing (callable by no one but the roles granted it: provision_grants.py grants the table's authors'
and operator roles) and replaced when its body changed."""

from __future__ import annotations

from psycopg import sql

from .names import admin_role, beside
from .provision_context import TableContext, change, look_up

# function name suffix -> query of verbs.sql
FUNCTIONS = {"retry": "retry", "cancel": "cancel", "delete": "delete", "pause": "pause", "resume": "resume"}
# procedure name suffix -> (the function it loops over, whether its batches go on after the last id)
PROCEDURES = {"retry_all": ("retry", True), "cancel_all": ("cancel", False), "delete_all": ("delete", False)}
# what an author may call (on its own tasks), and the operator role (on every task, and groups)
AUTHOR_VERBS = ("retry", "cancel", "delete", "retry_all", "cancel_all", "delete_all")
ADMIN_VERBS = (*AUTHOR_VERBS, "pause", "resume")


class Verbs:
    """The verbs of one task table (see the module's docstring)."""

    def __init__(self, ctx: TableContext):
        self.ctx = ctx

    def placeholders(self, ids: dict) -> dict:
        ctx = self.ctx
        return {**ids, "admin": sql.Literal(admin_role(ctx.table))}

    async def objects(self, ids: dict) -> None:
        """Every function and procedure; ``ids``: BesideTables.ids (the table, groups, ...)."""
        ph = self.placeholders(ids)
        for suffix, query_name in FUNCTIONS.items():
            await self.routine(suffix, query_name, ph)
        for suffix, (verb, cursor) in PROCEDURES.items():
            await self.routine(suffix, "every", {
                **ph, "verb": sql.Identifier(self.ctx.schema, beside(self.ctx.table, verb)),
                "cursor": sql.SQL("true" if cursor else "false")})

    async def routine(self, suffix: str, query_name: str, ph: dict) -> None:
        ctx, c = self.ctx, self.ctx.conn
        fn_name = beside(ctx.table, suffix)
        fn = sql.Identifier(ctx.schema, fn_name)
        create = ctx.q("verbs.sql", query_name, **ph, fn=fn)
        body = create.as_string(c).split("$body$")[1]
        row = await ctx.one(look_up("function_body"), (ctx.schema, fn_name))
        if row is not None and row[0] == body:
            return
        await c.execute(create)
        if row is None:
            await c.execute(change("revoke_routine", object=fn))
            if ctx.owner:
                await c.execute(change("routine_owner", object=fn, owner=sql.Identifier(ctx.owner)))
        ctx.report.add(f"{'created' if row is None else 'replaced'} function {ctx.schema}.{fn_name}")
