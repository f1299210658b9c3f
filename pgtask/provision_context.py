"""What one table's provisioning works on (TableContext: its connection, names, the roles it
provisions for) and what it reports having changed (Report), shared by provision.py and the modules
that provision the objects beside the table (provision_beside.py) and its grants
(provision_grants.py). Its named statements: sql/catalog.sql (the look-ups), sql/provision.sql."""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from . import sql as named
from .names import beside
from .sql import placeholders


@dataclass
class Report:
    actions: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.actions)

    def add(self, what: str) -> None:
        self.actions.append(what)


async def one(conn: psycopg.AsyncConnection, query, params=()) -> tuple | None:
    cur = await conn.execute(query, params)
    return await cur.fetchone()


async def rows(conn: psycopg.AsyncConnection, query, params=()) -> list[tuple]:
    cur = await conn.execute(query, params)
    return await cur.fetchall()


def look_up(name: str, **extra: sql.Composable) -> str | sql.Composed:
    """A look-up of catalog.sql; with ``extra``, its placeholders filled in."""
    text = named.query("catalog.sql", name)
    return sql.SQL(text).format(**extra) if extra else text


def change(name: str, **extra: sql.Composable) -> sql.Composed:
    """A statement of provision.sql, its placeholders filled in with ``extra``."""
    return sql.SQL(named.query("provision.sql", name)).format(**extra)


class TableContext:
    """One schema.table being provisioned, inside the entry's database: ``owner``, provisioning as
    an administrator on behalf of that role; ``service``, the role the entry's service runs as."""

    def __init__(self, conn: psycopg.AsyncConnection, schema: str, table: str, report: Report,
                 owner: str | None = None, service: str | None = None):
        self.conn, self.schema, self.table, self.report = conn, schema, table, report
        self.owner, self.service = owner, service
        self.ids = {
            **{name: placeholders.value(name, schema, table) for name in ("schema", "table", "state")},
            # the roles the service runs as for this table (see "update" in triggers.sql)
            "service": sql.Identifier(schema, beside(table, "service")),
            # whether a role writes for the service (is_service in schedule.sql): every guard asks it
            "is_service": sql.Identifier(schema, beside(table, "is_service")),
            # the names of a jsonb of task columns a user may not set (unsettable in schedule.sql)
            "unsettable": sql.Identifier(schema, beside(table, "unsettable")),
        }
        self.name = f"{schema}.{table}"

    def q(self, file: str, name: str, **extra: sql.Composable) -> sql.Composed:
        """A named statement for this table: the table's placeholders (sql/placeholders.py), ids
        and ``extra``."""
        return placeholders.render(named.query(file, name), self.schema, self.table,
                                   extra={**self.ids, **extra})

    def name_literal(self) -> str:
        return sql.Identifier(self.schema, self.table).as_string(None)

    async def one(self, query, params=()) -> tuple | None:
        return await one(self.conn, query, params)

    async def relation(self, name: str) -> tuple | None:
        """The oid of this schema's relation ``name`` (of any kind), or None."""
        return await self.one(look_up("relation"), (self.schema, name))

    async def own(self, kind: str, ident: sql.Composable) -> None:
        """Provisioning on behalf of the entry's role: the object it created is that role's
        (``kind``: table, type, view or function, as in provision.sql's <kind>_owner)."""
        if self.owner:
            await self.conn.execute(change(f"{kind}_owner", object=ident, owner=sql.Identifier(self.owner)))
