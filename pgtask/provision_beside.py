"""The objects beside a task table: the schedule, occurrence, key, group and service tables with
their indexes, functions, triggers, policies and the view of open tasks (sql/schedule.sql); the claim
lock's and the instance table (sql/liveness.sql); and the registration of the entry's service role.
Each is created only when pg_catalog lacks it; a function is replaced when its body changed."""

from __future__ import annotations

from psycopg import sql

from . import sql as named
from .names import EXTRA_TABLES, LIVENESS_TABLES, admin_role, beside, channel, extra_table, liveness_table
from .provision_context import TableContext, change, look_up

# index name suffix -> (table it is on, query in schedule.sql)
EXTRA_INDEXES = {"schedule_due_idx": ("schedule", "index_schedule_due"),
                 "key_expires_idx": ("keys", "index_keys_expires")}
# index name suffixes of the task table's own indexes that earlier versions created and nothing
# uses any more: dropped when found (each cost every task's every state change an index entry).
# running_idx: the running count's, TAKE/WORK only; slot_idx replaces it (see index_running).
OBSOLETE_INDEXES = ("live_group_idx", "running_idx")
# function name suffix -> (query in schedule.sql, the table its trigger is on or None)
EXTRA_FUNCTIONS = {"is_service": ("is_service", None), "unsettable": ("unsettable", None),
                   "capacity": ("capacity", "table"), "retry_policy": ("retry_policy", "table"),
                   "enqueue": ("enqueue", None),
                   "schedule_next": ("schedule_next", None),
                   "schedule_guard": ("schedule_guard", "schedule"),
                   "schedule_delete_guard": ("schedule_delete_guard", "schedule"),
                   "schedule_wake": ("schedule_wake", "schedule"),
                   "group_wake": ("group_wake", "groups"), "group_guard": ("group_guard", "groups")}
OPEN_VIEW = "open"  # the view of the caller's queued or running task ids (create_open)


class BesideTables:
    """The objects beside one task table (see the module's docstring)."""

    def __init__(self, ctx: TableContext):
        self.ctx = ctx

    def ids(self, oid: int) -> dict:
        """The placeholders of schedule.sql besides the table's own (sql/placeholders.py): the task
        table's ids, the tables beside it and the view by kind, its NOTIFY channel."""
        ctx = self.ctx
        return {**ctx.ids, **{kind: sql.Identifier(ctx.schema, beside(ctx.table, suffix))
                              for kind, suffix in {**EXTRA_TABLES, "open": OPEN_VIEW}.items()},
                "channel": sql.Literal(channel(oid)), "admin": sql.Literal(admin_role(ctx.table))}

    async def objects(self, ids: dict, oid: int) -> None:
        """<table>_schedule, _occurrence, _key, _group, _service; <table>_enqueue(),
        <table>_schedule_next(); the capacity trigger on the task table; the view <table>_open and
        the row-level security of _key and _schedule. ``ids``: see ids."""
        def q(name: str, **extra) -> sql.Composed:
            return self.ctx.q("schedule.sql", name, **ids, **extra)

        await self.tables(ids, q)
        await self.group_columns(q, "paused", "groups_flow", "paused, rate and burst")
        await self.group_columns(q, "retry_attempts", "groups_retry", "the retry policy's columns")
        await self.indexes(oid, q)
        for suffix, (query_name, trigger_on) in EXTRA_FUNCTIONS.items():
            await self.function(suffix, query_name, trigger_on, q)
        await self.open_view(ids, q)  # after is_service, which it asks
        await self.keys_per_role(ids["keys"], q)
        for kind, query_name in (("keys", "keys_policy"), ("schedule", "schedule_policy")):
            await self.policy(kind, query_name, q)

    async def tables(self, ids: dict, q) -> None:
        ctx = self.ctx
        for kind, suffix in EXTRA_TABLES.items():
            rel = beside(ctx.table, suffix)
            if await ctx.relation(rel) is None:
                await ctx.conn.execute(q(f"create_{kind}"))
                await ctx.conn.execute(q(f"comment_{kind}"))
                if kind == "service":  # the triggers read it as whoever writes the task table
                    await ctx.conn.execute(q("grant_service"))
                await ctx.own("table", ids[kind])  # on behalf of the entry's role: it owns these too
                ctx.report.add(f"created table {ctx.schema}.{rel}")

    async def indexes(self, oid: int, q) -> None:
        ctx = self.ctx
        for suffix, (on, query_name) in EXTRA_INDEXES.items():
            rel = beside(ctx.table, suffix)
            if await ctx.relation(rel) is None:
                await ctx.conn.execute(q(query_name, index=sql.Identifier(rel)))
                ctx.report.add(f"created index {rel}")
        for suffix in OBSOLETE_INDEXES:
            rel = beside(ctx.table, suffix)
            index = sql.Identifier(ctx.schema, rel)
            if await ctx.one(look_up("index_on"), (index.as_string(ctx.conn), oid)) is not None:
                await ctx.conn.execute(change("drop_index", index=index))
                ctx.report.add(f"dropped index {ctx.schema}.{rel} (no longer used)")

    async def function(self, suffix: str, query_name: str, trigger_on: str | None, q) -> None:
        """One function of EXTRA_FUNCTIONS, and its trigger on ``trigger_on``'s table."""
        ctx, c = self.ctx, self.ctx.conn
        fn_name = beside(ctx.table, suffix)
        fn = sql.Identifier(ctx.schema, fn_name)
        create_fn = q(query_name, fn=fn)
        body = create_fn.as_string(c).split("$body$")[1]
        row = await ctx.one(look_up("function_body"), (ctx.schema, fn_name))
        if row is None or row[0] != body:
            await c.execute(create_fn)
            if row is None:
                await ctx.own("function", fn)
            ctx.report.add(f"{'created' if row is None else 'replaced'} function {ctx.schema}.{fn_name}")
        if trigger_on is None:
            return
        target = ctx.name_literal() if trigger_on == "table" else sql.Identifier(
            ctx.schema, beside(ctx.table, EXTRA_TABLES[trigger_on])).as_string(c)
        if await ctx.one(look_up("trigger_exists"), (target, fn_name)) is None:
            await c.execute(q(f"{query_name}_trigger", fn=fn, trigger=sql.Identifier(fn_name)))
            ctx.report.add(f"created trigger {fn_name}")

    async def open_view(self, ids: dict, q) -> None:
        ctx = self.ctx
        rel = beside(ctx.table, OPEN_VIEW)
        if await ctx.relation(rel) is None:
            await ctx.conn.execute(q("create_open"))
            await ctx.conn.execute(q("comment_open"))
            await ctx.own("view", ids["open"])
            ctx.report.add(f"created view {ctx.schema}.{rel}")

    async def group_columns(self, q, marker: str, query: str, added: str) -> None:
        """A group table of an earlier version, without the column ``marker``, gets the columns of
        ``query`` (groups_flow: pause and rate; groups_retry: the retry policy)."""
        ctx = self.ctx
        rel = extra_table(ctx.table, "groups")
        if await ctx.one(look_up("column_exists", column=sql.Literal(marker)),
                         (sql.Identifier(ctx.schema, rel).as_string(ctx.conn),)) is None:
            await ctx.conn.execute(q(query))
            ctx.report.add(f"added {added} to {ctx.schema}.{rel}")

    async def keys_per_role(self, keys: sql.Identifier, q) -> None:
        """Idempotency keys are each role's own: the "user" column in the primary key (an older
        table is converted; the row-level security policy keeps a role to its rows: policy)."""
        ctx = self.ctx
        rel = beside(ctx.table, EXTRA_TABLES['keys'])
        regclass = keys.as_string(ctx.conn)
        if await ctx.one(look_up("column_exists", column=sql.Literal("user")), (regclass,)) is None:
            orphans, pkey = await ctx.one(look_up("keys_to_convert", keys=keys, table=ctx.ids["table"]),
                                          (regclass,))
            await ctx.conn.execute(q("keys_per_role", pkey=sql.Identifier(pkey)))
            ctx.report.add(f"made the keys of {ctx.schema}.{rel} per role"
                           + (f" ({orphans} whose task is gone now the owner's)" if orphans else ""))

    async def policy(self, kind: str, query_name: str, q) -> None:
        """The row-level security that keeps a role to its own rows of a table beside the task table."""
        ctx = self.ctx
        rel = beside(ctx.table, EXTRA_TABLES[kind])
        policy = beside(ctx.table, f"{EXTRA_TABLES[kind]}_role")  # <table>_key_role, named from the table as the rest
        if await ctx.one(look_up("policy_exists"),
                         (sql.Identifier(ctx.schema, rel).as_string(ctx.conn), policy)) is None:
            await ctx.conn.execute(q(query_name, policy=sql.Identifier(policy)))
            ctx.report.add(f"created policy {policy} on {ctx.schema}.{rel}")

    async def register_service(self) -> None:
        """The role the entry's service runs as may write the tasks' progress (see "update" in
        triggers.sql): registered in <table>_service, unless it owns the table or is a superuser."""
        ctx = self.ctx
        if not ctx.service:
            return
        row = await ctx.one(change("register_service", service=ctx.ids["service"]),
                            (ctx.service, ctx.service, ctx.service, ctx.name_literal()))
        if row is not None:
            ctx.report.add(f"registered role {ctx.service} as the service of {ctx.name}")

    async def liveness(self) -> None:
        """The claim lock's table and the instance table (sql/liveness.sql): created when missing,
        owned like the task table, no privilege for PUBLIC, and their privileges for the role the
        entry's service runs as when another role owns them."""
        ctx, c = self.ctx, self.ctx.conn
        ids = {kind: sql.Identifier(ctx.schema, liveness_table(ctx.table, kind)) for kind in LIVENESS_TABLES}

        def q(name: str, **extra) -> sql.Composed:
            return ctx.q("liveness.sql", name, **ids, **extra)

        created = False
        for kind in LIVENESS_TABLES:
            rel = liveness_table(ctx.table, kind)
            if await ctx.relation(rel) is None:
                await c.execute(q(f"create_{kind}"))
                await c.execute(q(f"comment_{kind}"))
                await ctx.own("table", ids[kind])
                ctx.report.add(f"created table {ctx.schema}.{rel}")
                created = True
        if created:
            await c.execute(q("revoke"))
        for role in {r for r in (ctx.owner, ctx.service) if r}:
            literals = {kind: ids[kind].as_string(c) for kind in LIVENESS_TABLES}
            if not (await ctx.one(named.query("liveness.sql", "granted"), {"role": role, **literals}))[0]:
                await c.execute(q("grant", role=sql.Identifier(role)))
                ctx.report.add(f"granted the claim lock and instance tables of {ctx.name} to {role}")
