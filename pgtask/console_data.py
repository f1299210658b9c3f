"""What the operators' console (pgtask/console.py, notebooks/console.ipynb) reads and does: a
snapshot of one task table -- the liveness verdict and the groups of pgtask/status.py, the rows
its filters select -- and the verbs of docs/operations.md called over the same filters, first as a
preview. Every call opens its own autocommit connection and closes it: nothing is held between
refreshes. The statements are in sql/console.sql."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from . import names, status
from . import sql as named
from .sql import placeholders

STATES = ("PLAN", "WAIT", "TAKE", "WORK", "DONE", "FAIL", "GONE", "STOP")
TASK_VERBS = ("retry", "cancel", "delete")
GROUP_VERBS = ("pause", "resume")
# The console's reads end after READ_TIMEOUT (a slow query cannot hang the page); one batch of an
# action after ACT_TIMEOUT (a verb locks at most one batch of rows, for one statement).
READ_TIMEOUT, ACT_TIMEOUT = "5s", "1min"
CONNECT_TIMEOUT = 5
# An action calls its verb batch after batch, at most this many times (10,000 rows each).
MAX_BATCHES = 100
ENV = "PGTASK_CONSOLE_"


@dataclass(frozen=True)
class Target:
    """Where the console looks: a libpq connection string ('' = libpq's environment) and a table."""
    dsn: str
    schema: str = "public"
    table: str = "task"


def settings(dsn: str, schema: str, table: str, refresh: float, env=os.environ) -> tuple[Target, float]:
    """The notebook's parameters, each one left at its default taken from the environment instead
    (Voila runs no papermill): PGTASK_CONSOLE_DSN, _SCHEMA, _TABLE, _REFRESH (seconds)."""
    def pick(value, default, name):
        return env.get(ENV + name, default) if value == default else value

    every = float(pick(refresh, 5, "REFRESH"))
    if every <= 0:
        raise ValueError(f"refresh {every!r}: seconds between refreshes, more than 0")
    return Target(pick(dsn, "", "DSN"), pick(schema, "public", "SCHEMA"), pick(table, "task", "TABLE")), every


@dataclass(frozen=True)
class Filters:
    """The console's filters; None selects every row. ``older``: an interval ('1 hour')."""
    state: str | None = None
    group: str | None = None
    author: str | None = None
    error_has: str | None = None
    older: str | None = None
    ids: tuple[int, ...] | None = None

    def params(self) -> dict:
        return {"state": self.state, "group": self.group, "author": self.author, "error_has": self.error_has,
                "older": self.older, "ids": list(self.ids) if self.ids else None}


def parse_ids(text: str) -> tuple[int, ...] | None:
    """'41, 42 43' -> (41, 42, 43); '' -> None; anything else is refused with the reason."""
    words = [w for w in re.split(r"[\s,]+", text.strip()) if w]
    bad = [w for w in words if not w.isdigit()]
    if bad:
        raise ValueError(f"task ids: {bad[0]!r} is not a task id (give ids separated by commas or spaces)")
    return tuple(int(w) for w in words) or None


@dataclass
class Snapshot:
    """One refresh: the verdict, the groups (each with its flow control), the selected rows. A part
    the console's role may not read (``pgtask status`` reads the instance and group tables beside
    the task table) is left empty, and why is in ``problems`` under its name: the other parts show."""
    verdict: status.Verdict | None = None
    groups: list[dict] = field(default_factory=list)
    tasks: list[dict] = field(default_factory=list)
    matching: int = 0
    problems: dict[str, psycopg.Error] = field(default_factory=dict)


def connect(target: Target, timeout: str) -> psycopg.Connection:
    """An autocommit connection whose statements end after ``timeout``; an unreachable server is
    given up after CONNECT_TIMEOUT seconds."""
    conn = psycopg.connect(target.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT)
    conn.execute(named.query("console.sql", "timeout"), {"timeout": timeout})
    return conn


def statement(target: Target, name: str, fn: str | None = None) -> sql.Composed:
    fn_id = sql.Identifier(target.schema, names.beside(target.table, fn)) if fn else sql.SQL("")
    return placeholders.render(named.query("console.sql", name), target.schema, target.table,
                               extra={"fn": fn_id})


def groups_with_flow(conn: psycopg.Connection, schema: str, table: str, since: str) -> list[dict]:
    """status.groups, each with its row of status.flow (None when it has none)."""
    flow = {g["group"]: g for g in status.flow(conn, schema, table)}
    found = status.groups(conn, schema, table, since)
    for g in found:
        g["flow"] = flow.get(g["group"])
    return found


def snapshot(target: Target, filters: Filters, since: str = "1 hour", limit: int = 100) -> Snapshot:
    """The console's view of the table now, read in one short-lived connection."""
    s, t = target.schema, target.table
    snap = Snapshot()

    def part(name, read):
        try:
            return read()
        except psycopg.errors.InsufficientPrivilege as exc:  # autocommit: the next part goes on
            snap.problems[name] = exc
            return None

    with connect(target, READ_TIMEOUT) as conn:
        oid = status.table_oid(conn, s, t)
        if oid is None:
            snap.verdict = status.Verdict(False, f"NOT OK: no table {s}.{t} in this database "
                                                 "(run `pgtask provision`)", [])
            return snap
        snap.verdict = part("verdict", lambda: status.verdict(status.liveness(conn, s, t, oid), s, t))
        snap.groups = part("groups", lambda: groups_with_flow(conn, s, t, since)) or []
        params = {**filters.params(), "limit": limit}
        snap.tasks = part("tasks", lambda: conn.cursor(row_factory=dict_row).execute(
            statement(target, "tasks"), params).fetchall()) or []
        snap.matching = part("tasks", lambda: conn.execute(
            statement(target, "matching"), params).fetchone()[0]) or 0
    return snap


@dataclass
class Outcome:
    """A verb's answer: how many tasks (and, for a task verb, how many are left), the first ids (and
    the new ids of a retry, beside them), whether a pause or resume changed the group."""
    verb: str
    preview: bool
    tasks: int
    sample: list[int]
    new_sample: list[int] = field(default_factory=list)
    remaining: int = 0
    changed: bool | None = None


def task_verb(target: Target, verb: str, filters: Filters, preview: bool) -> Outcome:
    """retry, cancel or delete what ``filters`` select (the state filter is the verb's states).
    Acting, it goes batch after batch (each its own transaction) until nothing is left that it
    could act on; a retry goes on after the last id it retried, as the verb's *_all procedure."""
    if verb not in TASK_VERBS:
        raise ValueError(f"verb {verb!r}: one of {', '.join(TASK_VERBS)}")
    params = {**filters.params(), "states": [filters.state] if filters.state else None, "preview": preview}
    total = Outcome(verb, preview, 0, [])
    from_id = None
    with connect(target, READ_TIMEOUT if preview else ACT_TIMEOUT) as conn:
        for _ in range(1 if preview else MAX_BATCHES):
            row = conn.execute(statement(target, "task_verb", verb),
                               {**params, "from_id": from_id}).fetchone()
            tasks, remaining, last_id, sample, new_sample = row
            total.tasks += tasks
            total.remaining = remaining
            total.sample += list(sample or [])[:10 - len(total.sample)]
            total.new_sample += list(new_sample or [])[:10 - len(total.new_sample)]
            if verb == "retry":
                from_id = last_id if last_id is not None else from_id
            if not remaining or not tasks:
                break
    return total


def group_verb(target: Target, verb: str, group: str | None, preview: bool) -> Outcome:
    """pause or resume ``group`` (or its preview)."""
    if verb not in GROUP_VERBS:
        raise ValueError(f"verb {verb!r}: one of {', '.join(GROUP_VERBS)}")
    if not group:
        raise ValueError(f"{verb}: choose a group first (the group filter)")
    with connect(target, READ_TIMEOUT) as conn:
        tasks, sample, changed = conn.execute(statement(target, "group_verb", verb),
                                              {"group": group, "preview": preview}).fetchone()
    return Outcome(verb, preview, tasks, list(sample or []), changed=changed)
