"""Where each setting's value comes from: the manual's cascade (see config.py) applied to the config
file, the server's settings and pg_task.json's entries.

``resolve`` reads the server (read_server) and checks the intervals with it (check_intervals);
``decide`` and ``convert`` apply the rules to what was read, without a server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import psycopg

from . import config as cfgmod
from . import sql as named
from .config import BY_NAME, Config, Entry
from .connect import without_timeouts
from .provision import check_identifier

# An entry's settings that ALTER ROLE/DATABASE ... SET and pg_task.json may set per entry.
ENTRY_SETTINGS = ("reset", "run", "schema", "table", "sleep", "spi")
# The settings of the service as a whole, after pg_task.data, pg_task.user and pg_task.json.
GLOBAL_SETTINGS = ("pg_task.schema", "pg_task.table", "pg_task.sleep", "pg_task.reset", "pg_task.run",
                   "pg_task.spi", "pg_task.limit", "pg_work.restart", "pg_conf.restart")
SYSTEM = "server (postgresql.conf / ALTER SYSTEM)"

# An interval of the configuration to check: (the key it is named by, its value, must be >= 0).
Interval = tuple[str, str, bool]


@dataclass
class ServerSettings:
    """What the server holds: the role and database connected as, and pg_task's settings at each of
    its levels."""

    user: str
    database: str
    system: dict[str, str | None] = field(default_factory=dict)  # postgresql.conf / ALTER SYSTEM; None: unset
    by_role: dict[str, dict[str, str]] = field(default_factory=dict)  # ALTER ROLE ... SET
    by_db: dict[str, dict[str, str]] = field(default_factory=dict)    # ALTER DATABASE ... SET


@dataclass
class Resolved:
    entries: list[Entry]
    sources: dict[str, str]     # "key" -> where it came from, for `pgtask config`
    values: dict[str, Any]


async def resolve(cfg: Config, conninfo: str) -> Resolved:
    """Entries after the manual's precedence: entry > role settings > database settings > config."""
    async with await psycopg.AsyncConnection.connect(without_timeouts(conninfo), autocommit=True) as conn:
        server = await read_server(conn)
    resolved, intervals = decide(cfg, server)
    await check_intervals(conninfo, intervals)
    return resolved


async def read_server(conn: psycopg.AsyncConnection) -> ServerSettings:
    cur = await conn.execute(named.query("settings.sql", "connected_as"))
    me, mydb = await cur.fetchone()
    server = ServerSettings(me, mydb)
    for s in cfgmod.SETTINGS:
        cur = await conn.execute(named.query("settings.sql", "system_setting"), (s.name,))
        server.system[s.name] = (await cur.fetchone())[0]
    cur = await conn.execute(named.query("settings.sql", "db_role_settings"))
    for db, role, item in await cur.fetchall():
        key, _, value = item.partition("=")
        if role:
            server.by_role.setdefault(role, {})[key] = value
        elif db:
            server.by_db.setdefault(db, {})[key] = value
    return server


def decide(cfg: Config, server: ServerSettings) -> tuple[Resolved, list[Interval]]:
    """The entries, every value and where it came from; and the intervals still to check."""
    resolved = Resolved([], {}, {})
    values, sources = resolved.values, resolved.sources
    raw_entries = global_values(cfg, server, values, sources)
    seen = set()
    intervals = file_intervals(cfg)
    for i, raw in enumerate(raw_entries):
        entry = entry_of(i, raw, server, values, sources)
        if entry.key not in seen:
            seen.add(entry.key)
            resolved.entries.append(entry)
        source = sources[f"entry {i} reset"]
        intervals.append((f"{source}.reset" if source.startswith("pg_task.json") else f"pg_task.reset ({source})",
                          entry.reset, False))
    return resolved, intervals


def global_values(cfg: Config, server: ServerSettings, values: dict[str, Any],
                  sources: dict[str, str]) -> list[dict[str, Any]]:
    """Fill in the service-wide values (config file > server > connection > default) and their
    sources; returns pg_task.json's entries."""

    def pick(name: str, fallback: Any = None) -> Any:
        if name in cfg.settings:
            values[name], sources[name] = cfg.settings[name], cfg.source(name)
        elif server.system.get(name) is not None:
            values[name], sources[name] = convert(name, server.system[name]), SYSTEM
        elif fallback is not None:
            values[name], sources[name] = fallback, "connection"
        else:
            values[name], sources[name] = BY_NAME[name].default, "default"
        return values[name]

    # Unset pg_task.data / pg_task.user fall back to the database and role we connected as.
    pick("pg_task.data", server.database)
    pick("pg_task.user", server.user)
    raw_entries = pick("pg_task.json")
    if isinstance(raw_entries, str):
        raw_entries = cfgmod.parse_entries(raw_entries)
    if sources["pg_task.json"] == "default":
        raw_entries = [{}]
    for name in GLOBAL_SETTINGS:
        pick(name)
    return raw_entries


def entry_of(i: int, raw: dict[str, Any], server: ServerSettings, values: dict[str, Any],
             sources: dict[str, str]) -> Entry:
    """pg_task.json's entry ``i``: its own keys > ALTER ROLE > ALTER DATABASE > the service-wide
    ``values``; each one's source goes to ``sources`` as "entry <i> <key>"."""
    data = raw.get("data") or raw.get("user") or values["pg_task.data"]
    user = raw.get("user") or raw.get("data") or values["pg_task.user"]
    resolved: dict[str, Any] = {}
    for key in ENTRY_SETTINGS:
        name = f"pg_task.{key}"
        if key in raw:
            value, source = raw[key], f"pg_task.json[{i}]"
        elif name in server.by_role.get(user, {}):
            value, source = convert(name, server.by_role[user][name]), f"ALTER ROLE {user} SET"
        elif name in server.by_db.get(data, {}):
            value, source = convert(name, server.by_db[data][name]), f"ALTER DATABASE {data} SET"
        else:
            value, source = values[name], sources[name]
        resolved[key] = value
        sources[f"entry {i} {key}"] = source
    entry = Entry(data=data, user=user, schema=resolved["schema"], table=resolved["table"],
                  sleep=int(resolved["sleep"]), reset=str(resolved["reset"]), run=int(resolved["run"]),
                  spi=bool(resolved["spi"]))
    for kind, value in (("database", data), ("user", user), ("schema", entry.schema), ("table", entry.table)):
        try:
            check_identifier(kind, value)
        except ValueError as exc:
            raise cfgmod.ConfigError(f"pg_task.json[{i}].{kind}: {exc}") from None
    return entry


def file_intervals(cfg: Config) -> list[Interval]:
    """The config file's intervals to check (its pg_task.* intervals, [pgtask] retention)."""
    intervals = [(name, str(value), False) for name, value in cfg.settings.items()
                 if name in BY_NAME and BY_NAME[name].type == "interval"]
    if cfg.svc("retention"):
        intervals.append(("pgtask.retention", cfg.svc("retention"), True))
    return intervals


async def check_intervals(conninfo: str, intervals: list[Interval]) -> None:
    """Interval values of the configuration, as PostgreSQL reads them: (key, value, must be >= 0).
    A wrong one is refused naming its key (the config file cannot tell, PostgreSQL's syntax is
    its own)."""
    async with await psycopg.AsyncConnection.connect(without_timeouts(conninfo), autocommit=True) as conn:
        for key, value, positive in intervals:
            try:
                cur = await conn.execute(named.query("settings.sql", "interval_check"), (value,))
                above = (await cur.fetchone())[0]
            except psycopg.Error as exc:
                raise cfgmod.ConfigError(f"{key}: invalid interval {value!r} ({str(exc).strip()})") from None
            if positive and not above:  # a negative retention would delete what just finished
                raise cfgmod.ConfigError(f"{key}: must not be a negative interval, got {value!r}")


def convert(name: str, raw: str) -> Any:
    """A value set in the server (postgresql.conf, ALTER SYSTEM/DATABASE/ROLE), checked as the
    config file's are."""
    kind = BY_NAME[name].type if name in BY_NAME else "text"
    if kind == "int" and raw.strip().lstrip("+-").isdigit():
        return cfgmod.check_minimum(name, int(raw), "set in the server")
    try:
        if kind == "int":
            return int(raw)
        if kind == "bool":
            if (flag := cfgmod.parse_bool(raw)) is None:
                raise ValueError(raw)
            return flag
        if kind == "json":
            return cfgmod.parse_entries(json.loads(raw), name)
    except (ValueError, json.JSONDecodeError):
        raise cfgmod.ConfigError(f"{name}: invalid value {raw!r} (expected {kind})") from None
    return raw
