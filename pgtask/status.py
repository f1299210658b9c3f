"""What an operator reads: ``pgtask status`` and ``pgtask config``, and the pieces the queue
inspection notebook shares with them -- whether a service looks after a table (the liveness query
of pgtask/sql/status.sql, and the verdict drawn from it), the per-group rows and the flow control.
Numbers are written for people by pgtask/readable.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta

import psycopg
from psycopg import pq, sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from . import config as cfgmod
from . import sql as named
from .metrics import EXACT_FINISHED, FINISHED
from .readable import count, duration, missing, percent, plural, rate, table
from .sql import placeholders

# -- the queries -----------------------------------------------------------------------------------


def statement(name: str, schema: str, table_name: str) -> sql.Composed:
    """A query of sql/status.sql for the task table ``schema``.``table_name``."""
    return placeholders.render(named.query("status.sql", name), schema, table_name)


def fetch(conn: psycopg.Connection, name: str, schema: str, table_name: str, params: dict | None = None) -> list[dict]:
    """The rows of a query of sql/status.sql, as dicts."""
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute(statement(name, schema, table_name), params).fetchall()


# -- liveness --------------------------------------------------------------------------------------


def table_oid(conn: psycopg.Connection, schema: str, table_name: str) -> int | None:
    row = conn.execute(named.query("status.sql", "table_oid"), {"schema": schema, "table": table_name}).fetchone()
    return row[0] if row else None


def liveness(conn: psycopg.Connection, schema: str, table_name: str, oid: int, bounded: bool = False) -> dict:
    """The liveness query's one row (see status.sql); ``bounded``: "last task started" from the running
    rows and the newest RECENT_STARTED started ones only."""
    return fetch(conn, "liveness", schema, table_name, {"oid": oid, "bounded": bounded, "recent": RECENT_STARTED})[0]


# -- the history's size ----------------------------------------------------------------------------

# Past metrics.EXACT_FINISHED finished rows (the planner's estimate, as the metrics reading decides)
# the "(all)" figures are the planner's estimates and the rest reads the live rows and the newest
# ones only (status.sql, "groups" and "liveness").
# A bounded "last task started" reads the running rows and this many of the newest started ones.
RECENT_STARTED = 1000
# A bounded window reads at most this many of the newest rows (and the live ones).
WINDOW_ROWS = 10_000


def finished_estimate(conn: psycopg.Connection, schema: str, table_name: str) -> dict[str, int]:
    """The planner's estimate of the rows in each finished state (the metrics reading's
    "ended_estimate", metrics.sql)."""
    text = named.query("metrics.sql", "ended_estimate")
    return {state: round(conn.execute(placeholders.render(text, schema, table_name, extra={
        "finished": sql.Literal(state)})).fetchone()[0][0]["Plan"]["Plan Rows"]) for state in FINISHED}


@dataclass
class Verdict:
    ok: bool
    headline: str          # 'OK: …' or 'NOT OK: …', the first line an operator reads
    details: list[str]     # the service, the backlog, the last start, one line each


def verdict(live: dict, schema: str, table_name: str, behind_after: float = 60.0, bounded: bool = False) -> Verdict:
    """Whether the queue is looked after: a service connected and claiming (no due row with a free
    slot waiting longer than ``behind_after`` seconds) and no orphaned row. ``bounded``: the liveness
    row was read bounded, which its "last task started" line says."""
    problems = []
    services = int(live["services"])
    if services == 0:
        problems.append(f"no `pgtask run` is connected for {schema}.{table_name}")
    if live["orphaned"]:
        problems.append(f"{plural(live['orphaned'], 'orphaned row')} (their service died)")
    late = live["oldest_free_due_seconds"]
    if late is not None and float(late) > behind_after:
        problems.append(f"{plural(live['due_free'], 'due task')} not picked up, the oldest for "
                        f"{duration(late)} (over {duration(behind_after)})")
    backlog = f"{count(live['due'])} due" + (f", the oldest {duration(live['oldest_due_seconds'])}"
                                             if live["due"] else "")
    if problems:
        headline = "NOT OK: " + "; ".join(problems) + f"; {backlog}"
    else:
        headline = f"OK: a service is connected and claiming; {backlog}; {count(live['running'])} running"
    if services:
        service = (f"service: {services} scheduler session{'s' if services > 1 else ''} (pid "
                   f"{live['service_pids']}), connected {duration(live['up_seconds'])} ago, last statement "
                   f"{duration(live['idle_seconds'])} ago")
    else:
        service = (f"service: none (no session named 'pg_work {schema} {table_name} …' in this database)")
    queue = (f"backlog: {count(live['due'])} due, {count(live['due_free'])} of them with a free group slot; "
             f"{count(live['running'])} running, {count(live['orphaned'])} orphaned")
    started = f"last task started: {duration(live['last_start_seconds'], 'never')}" + (
        " ago" if live["last_start_seconds"] is not None else "")
    if bounded:
        started += f" (of the running tasks and the newest {RECENT_STARTED:,} started)"
    return Verdict(not problems, headline, [service, queue, started])


# -- per group -------------------------------------------------------------------------------------

GROUP_COLUMNS = ("group", "due", "oldest due", "planned", "running", "orphaned", "done", "fail", "gone",
                 "stop", "fail %", "rate", "pickup p50", "pickup p99", "done (all)", "fail (all)", "gone (all)",
                 "stop (all)")
GROUP_NUMERIC = (False,) + (True,) * (len(GROUP_COLUMNS) - 1)


@dataclass
class Window:
    """What a table past the threshold reads for the window (status.sql, "window_rows")."""
    after: int                   # the rows after this id (and the live ones)
    capped: timedelta | None     # the newest WINDOW_ROWS rows cover only this much of the window


def window_rows(conn: psycopg.Connection, schema: str, table_name: str, since: str) -> Window:
    row = fetch(conn, "window_rows", schema, table_name, {"since": since, "recent": WINDOW_ROWS})[0]
    return Window(row["after"], row["capped"])


def groups(conn: psycopg.Connection, schema: str, table_name: str, since: str | timedelta,
           window: Window | None = None) -> list[dict]:
    """The groups query's rows (see status.sql), the busiest first. ``window``: the live rows and
    those after ``window.after`` only, without the groups' "(all)" figures (None), over the part of
    the window they cover."""
    if window is not None and window.capped is not None:
        since = window.capped
    found = fetch(conn, "groups", schema, table_name,
                  {"since": since, "bounded": window is not None, "after": window.after if window else 0})
    seconds = conn.execute(named.query("status.sql", "window_seconds"), {"since": since}).fetchone()[0]
    for g in found:
        if window is not None:  # counted over the rows read, not the table
            g.update(dict.fromkeys(("done", "fail", "gone", "stop")))
        g["finished_window"] = sum(g[f"{s}_window"] for s in ("done", "fail", "gone", "stop"))
        g["failed_window"] = g["finished_window"] - g["done_window"]
        g["rate"] = g["finished_window"] / seconds if seconds > 0 else None
    found.sort(key=lambda g: (-(g["due"] + g["running"] + g["orphaned"] + g["finished_window"]),
                              g["group"]))
    return found


def group_cells(g: dict) -> list[str]:
    """One group's row as text, in GROUP_COLUMNS' order."""
    return [g["group"], count(g["due"]), duration(g["oldest_due_seconds"]), count(g["planned"]),
            count(g["running"]), count(g["orphaned"]),
            *(count(g[f"{s}_window"]) for s in ("done", "fail", "gone", "stop")),
            percent(g["failed_window"], g["finished_window"]), rate(g["rate"]),
            duration(g["pickup_p50_seconds"]), duration(g["pickup_p99_seconds"]),
            *(count(g[s]) for s in ("done", "fail", "gone", "stop"))]


def total_cells(found: list[dict], estimate: dict[str, int] | None = None) -> list[str]:
    """The all-groups row (no percentiles: they do not add up); ``estimate``: its "(all)" figures are
    these estimates, marked "~"."""
    total = {k: sum(g[k] for g in found)
             for k in ("due", "planned", "running", "orphaned", "done_window", "fail_window", "gone_window",
                       "stop_window", "finished_window", "failed_window")}
    if estimate is None:  # FINISHED is the "(all)" columns' order
        alls = [count(sum(g[s.lower()] for g in found)) for s in FINISHED]
    else:
        alls = [f"~{count(estimate[s])}" for s in FINISHED]
    rates = [g["rate"] for g in found if g["rate"] is not None]
    oldest = [g["oldest_due_seconds"] for g in found if g["oldest_due_seconds"] is not None]
    return ["(all groups)", count(total["due"]), duration(max(oldest) if oldest else None),
            count(total["planned"]), count(total["running"]), count(total["orphaned"]),
            *(count(total[f"{s}_window"]) for s in ("done", "fail", "gone", "stop")),
            percent(total["failed_window"], total["finished_window"]), rate(sum(rates) if rates else None),
            "", "", *alls]


# -- flow control ----------------------------------------------------------------------------------

FLOW_COLUMNS = ("group", "paused", "rate", "burst", "tokens", "capacity", "due", "waiting")
FLOW_NUMERIC = (False, False, True, True, True, True, True, True)


def flow(conn: psycopg.Connection, schema: str, table_name: str) -> list[dict]:
    """The flow query's rows (see status.sql): the groups with a row in the group table."""
    return fetch(conn, "flow", schema, table_name)


def flow_cells(g: dict) -> list[str]:
    """One group's flow control as text, in FLOW_COLUMNS' order: unlimited values are blank."""
    return [g["group"], "PAUSED" if g["paused"] else "", rate(g["rate"]),
            count(g["burst"]) if g["rate"] is not None else "",
            "" if missing(g["tokens"]) else f"{float(g['tokens']):.1f}", count(g["capacity"]),
            count(g["due"]), count(g["waiting"])]


# -- the commands ----------------------------------------------------------------------------------


def group_lines(conn: psycopg.Connection, schema: str, table_name: str, since: str, limit: int,
                estimate: dict[str, int] | None) -> list[str]:
    """The per-group table; ``estimate``: the table is past the threshold (see groups), and its
    "(all)" figures are these estimates."""
    if estimate is None:
        found = groups(conn, schema, table_name, since)
        lines = [f"groups (done … stop, fail %, rate, pickup: in the last {since}; (all): every row in the table)"]
    else:
        window = window_rows(conn, schema, table_name, since)
        found = groups(conn, schema, table_name, since, window)
        read = (f"the last {duration(window.capped)} of it: the newest {WINDOW_ROWS:,} rows" if window.capped
                else "the rows after the newest planned before it")
        lines = [f"groups (done … stop, fail %, rate, pickup: in the last {since}, read from {read}; "
                 f"(all): ~ the planner's estimates, past {EXACT_FINISHED:,} finished rows, for all groups only)"]
    rows = [group_cells(g) for g in found[:limit]] + [total_cells(found, estimate)]
    lines += ["  " + line for line in table(GROUP_COLUMNS, rows, GROUP_NUMERIC)]
    if len(found) > limit:
        lines.append(f"  … and {len(found) - limit:,} more groups (--groups N shows more)")
    return lines


def report(conn: psycopg.Connection, schema: str, table_name: str, since: str = "1 hour",
           behind_after: float = 60.0, limit: int = 20, exact_finished: int = EXACT_FINISHED) -> list[str]:
    """`pgtask status` for one task table: the verdict first, then the busiest groups. Sets the
    connection's settings for it (status.sql, "settings"). Past ``exact_finished`` finished rows (the
    planner's estimate) it reads the live rows and the newest ones, not the history, and says so."""
    conn.execute(named.query("status.sql", "settings"))
    oid = table_oid(conn, schema, table_name)
    if oid is None:
        return [f"NOT OK: no table {schema}.{table_name} in this database (run `pgtask provision`)"]
    estimate = finished_estimate(conn, schema, table_name)
    bounded = sum(estimate.values()) > exact_finished
    v = verdict(liveness(conn, schema, table_name, oid, bounded), schema, table_name, behind_after, bounded)
    lines = [v.headline, *v.details]
    for longest in fetch(conn, "longest", schema, table_name):  # one row at most
        lines.append(f"longest running: task {longest['id']} (group {longest['group']}, {longest['state']}) for "
                     f"{duration(longest['seconds'])}: {longest['input']}")
    lines += group_lines(conn, schema, table_name, since, limit, estimate if bounded else None)
    controlled = flow(conn, schema, table_name)
    if controlled:
        paused = sum(1 for g in controlled if g["paused"])
        lines.append(f"flow control ({schema}.{table_name}_group): {plural(paused, 'paused group')}, "
                     f"{plural(sum(1 for g in controlled if g['rate'] is not None), 'rate-limited group')}")
        lines += ["  " + line for line in table(FLOW_COLUMNS, [flow_cells(g) for g in controlled[:limit]],
                                                FLOW_NUMERIC)]
        if len(controlled) > limit:
            lines.append(f"  … and {len(controlled) - limit:,} more groups (--groups N shows more)")
    return lines


def server(conninfo: str) -> str:
    """Where a connection string (with libpq's environment and defaults) leads, without a password."""
    given = {k: v for k, v in conninfo_to_dict(conninfo).items() if v not in (None, "")}
    defaults = {o.keyword.decode(): o.val.decode() for o in pq.Conninfo.get_defaults() if o.val}
    parts = []
    for key in ("service", "host", "hostaddr", "port", "dbname", "user"):
        value = given.get(key) or defaults.get(key)
        if value:
            parts.append(f"{key}={value}")
    if not (given.get("host") or defaults.get("host") or given.get("hostaddr") or defaults.get("hostaddr")):
        parts.insert(0, "host=(libpq's default socket directory)")
    return " ".join(parts)


# What an empty (or zero) value of a setting means, printed beside it.
EMPTY_MEANS = {
    "pgtask.retention": "finished tasks are kept for ever",
    "pgtask.embedded_dir": "./.pgtask in the working directory",
    "pg_task.escape": "no escape character",
    "pg_task.quote": "no quote character",
    "pg_task.timeout": "no timeout",
    "pg_task.repeat": "does not repeat",
    "pg_task.plan": "statement_timestamp(): as soon as inserted",
}


def _meaning(name: str, value) -> str:
    empty = value in (None, "", "0 sec", "00:00:00", 0) and not isinstance(value, bool)
    return f"; {EMPTY_MEANS[name]}" if empty and name in EMPTY_MEANS else ""


def config_lines(cfg: cfgmod.Config, conninfo: str, embedded: object | None, values: dict, sources: dict,
                 entries: list) -> list[str]:
    """`pgtask config`: the server, then every setting with where it came from and what an empty
    value means."""
    if cfg.dsn:
        where = "the dsn in the config file"
    elif cfg.server_configured:
        where = "libpq's environment (PGHOST, PGPORT, …)"
    else:
        where = f"the embedded cluster in {getattr(embedded, 'base', '?')}"
    lines = [f"# config file: {cfg.path or '(none)'}", f"# server: {server(conninfo)}    # {where}"]
    for name, value in sorted(values.items()):
        lines.append(f"{name} = {json.dumps(value)}    # {sources[name]}{_meaning(name, value)}")
    for key in cfgmod.SERVICE_KEYS:
        src = f"config file {cfg.path}" if key in cfg.service else "default"
        lines.append(f"pgtask.{key} = {json.dumps(cfg.svc(key))}    # {src}{_meaning('pgtask.' + key, cfg.svc(key))}")
    for i, e in enumerate(entries):
        lines.append(f"entry {i}: data={e.data} user={e.user} schema={e.schema} table={e.table} sleep={e.sleep} "
                     f"reset={e.reset!r} run={e.run} spi={e.spi}")
    return lines
