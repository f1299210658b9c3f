"""What an operator reads: ``pgtask status`` and ``pgtask config``, and the pieces the queue
inspection notebook shares with them -- whether a service looks after a table (the liveness query
of pgtask/patterns/inspect.sql, and the verdict drawn from it), the per-group rows, and numbers
written for people (``4.2 s``, ``3 min``, ``1,759``, ``never``)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from . import config as cfgmod
from . import patterns

# -- numbers for people -----------------------------------------------------------------------------


def missing(value) -> bool:
    """None, NaN, or pandas' NaT (a DataFrame's empty cell)."""
    return value is None or (isinstance(value, float) and math.isnan(value)) or str(value) == "NaT"


def count(n) -> str:
    """1759 -> '1,759'; None -> ''."""
    return "" if missing(n) else f"{int(n):,}"


def duration(seconds, none: str = "") -> str:
    """Seconds rounded for reading: '12 ms', '4.2 s', '73 s', '3 min', '2.5 h', '4 days'."""
    if missing(seconds):
        return none
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    s = float(seconds)
    a = abs(s)
    if a == 0:
        return "0 s"
    if a < 0.01:
        return f"{s * 1000:.1f} ms"
    if a < 1:
        return f"{s * 1000:.0f} ms"
    if a < 10:
        return f"{s:.1f} s"
    if a < 120:
        return f"{s:.0f} s"
    if a < 7200:
        return f"{s / 60:.0f} min"
    if a < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.0f} days"


def timeout(value) -> str:
    """A task's timeout: 0 is 'no timeout'."""
    if missing(value) or (isinstance(value, timedelta) and not value) or value == 0:
        return "no timeout"
    return duration(value)


def timestamp(value, none: str = "never") -> str:
    """A timestamp to the second, with its UTC offset; None is 'never'."""
    if missing(value):
        return none
    if isinstance(value, datetime):
        if value.year in (1, 9999):  # 'infinity' loaded as datetime.max/min
            return "infinity" if value.year == 9999 else "-infinity"
        return value.isoformat(sep=" ", timespec="seconds")
    return str(value)


def size(n) -> str:
    """Bytes: '8,192 bytes', '8.0 kB', '97 MB'."""
    if missing(n):
        return ""
    value, unit = float(n), "bytes"
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            break
        value /= 1024
    if unit == "bytes":
        return f"{int(value):,} bytes"
    return f"{value:.1f} {unit}" if value < 10 else f"{value:,.0f} {unit}"


def rate(per_second) -> str:
    """Tasks a second, three significant digits, a minute or an hour when slower: '35.1/s',
    '1,204/s', '2.5/min', '3.0/h'."""
    if missing(per_second):
        return ""
    x = float(per_second)
    if x == 0:
        return "0/s"
    for value, unit in ((x, "s"), (x * 60, "min"), (x * 3600, "h")):
        if value >= 1 or unit == "h":
            break
    if value >= 100:
        return f"{value:,.0f}/{unit}"
    digits = max(0, 2 - math.floor(math.log10(value)))
    return f"{value:.{digits}f}/{unit}"


def plural(n, noun: str) -> str:
    """'1 orphaned row', '3 orphaned rows' (with thousands separators)."""
    return f"{count(n)} {noun}{'' if n == 1 else 's'}"


def percent(part, whole) -> str:
    """part of whole: '12 %', '0.4 %'; '' when whole is 0."""
    if not whole:
        return ""
    p = 100 * part / whole
    return f"{p:.1f} %" if 0 < p < 1 else f"{p:.0f} %"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[bool]) -> list[str]:
    """Lines of a plain-text table: each column as wide as its widest cell, text to the left and
    numbers to the right."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric)).rstrip()

    return [line(headers), *(line(r) for r in rows)]


# -- liveness --------------------------------------------------------------------------------------


def table_oid(conn: psycopg.Connection, schema: str, table_name: str) -> int | None:
    row = conn.execute("""SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relname = %s""", (schema, table_name)).fetchone()
    return row[0] if row else None


def liveness(conn: psycopg.Connection, schema: str, table_name: str, oid: int) -> dict:
    """The liveness query's one row (see inspect.sql)."""
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute(patterns.query("inspect", "liveness", schema, table_name), {"oid": oid}).fetchone()


@dataclass
class Verdict:
    ok: bool
    headline: str          # 'OK: …' or 'NOT OK: …', the first line an operator reads
    details: list[str]     # the service, the backlog, the last start, one line each


def verdict(live: dict, schema: str, table_name: str, behind_after: float = 60.0) -> Verdict:
    """Whether the queue is looked after: a service connected and claiming (no due row with a free
    slot waiting longer than ``behind_after`` seconds) and no orphaned row."""
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
    return Verdict(not problems, headline, [service, queue, started])


# -- per group -------------------------------------------------------------------------------------

GROUP_COLUMNS = ("group", "due", "oldest due", "planned", "running", "done", "fail", "gone", "stop",
                 "fail %", "rate", "pickup p50", "pickup p99", "done (all)", "fail (all)", "gone (all)",
                 "stop (all)")
GROUP_NUMERIC = (False,) + (True,) * (len(GROUP_COLUMNS) - 1)


def groups(conn: psycopg.Connection, schema: str, table_name: str, since: str) -> list[dict]:
    """The groups query's rows (see inspect.sql), the busiest first."""
    cur = conn.cursor(row_factory=dict_row)
    found = cur.execute(patterns.query("inspect", "groups", schema, table_name), {"since": since}).fetchall()
    window = conn.execute("SELECT extract(epoch FROM %s::interval)::float8", (since,)).fetchone()[0]
    for g in found:
        g["finished_window"] = sum(g[f"{s}_window"] for s in ("done", "fail", "gone", "stop"))
        g["failed_window"] = g["finished_window"] - g["done_window"]
        g["rate"] = g["finished_window"] / window if window > 0 else None
    found.sort(key=lambda g: (-(g["due"] + g["running"] + g["finished_window"]), g["group"]))
    return found


def group_cells(g: dict) -> list[str]:
    """One group's row as text, in GROUP_COLUMNS' order."""
    return [g["group"], count(g["due"]), duration(g["oldest_due_seconds"]), count(g["planned"]),
            count(g["running"]), *(count(g[f"{s}_window"]) for s in ("done", "fail", "gone", "stop")),
            percent(g["failed_window"], g["finished_window"]), rate(g["rate"]),
            duration(g["pickup_p50_seconds"]), duration(g["pickup_p99_seconds"]),
            *(count(g[s]) for s in ("done", "fail", "gone", "stop"))]


def total_cells(found: list[dict]) -> list[str]:
    """The all-groups row (no percentiles: they do not add up)."""
    total = {k: sum(g[k] for g in found) for k in ("due", "planned", "running", "done_window", "fail_window",
                                                     "gone_window", "stop_window", "done", "fail", "gone",
                                                     "stop", "finished_window", "failed_window")}
    rates = [g["rate"] for g in found if g["rate"] is not None]
    oldest = [g["oldest_due_seconds"] for g in found if g["oldest_due_seconds"] is not None]
    return ["(all groups)", count(total["due"]), duration(max(oldest) if oldest else None),
            count(total["planned"]), count(total["running"]),
            *(count(total[f"{s}_window"]) for s in ("done", "fail", "gone", "stop")),
            percent(total["failed_window"], total["finished_window"]), rate(sum(rates) if rates else None),
            "", "", *(count(total[s]) for s in ("done", "fail", "gone", "stop"))]


# -- flow control ----------------------------------------------------------------------------------

FLOW_COLUMNS = ("group", "paused", "rate", "burst", "tokens", "capacity", "due", "waiting")
FLOW_NUMERIC = (False, False, True, True, True, True, True, True)


def flow(conn: psycopg.Connection, schema: str, table_name: str) -> list[dict]:
    """The flow query's rows (see inspect.sql): the groups with a row in the group table."""
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute(patterns.query("inspect", "flow", schema, table_name)).fetchall()


def flow_cells(g: dict) -> list[str]:
    """One group's flow control as text, in FLOW_COLUMNS' order: unlimited values are blank."""
    return [g["group"], "PAUSED" if g["paused"] else "", rate(g["rate"]),
            count(g["burst"]) if g["rate"] is not None else "",
            "" if missing(g["tokens"]) else f"{float(g['tokens']):.1f}", count(g["capacity"]),
            count(g["due"]), count(g["waiting"])]


# -- the commands ----------------------------------------------------------------------------------


def report(conn: psycopg.Connection, schema: str, table_name: str, since: str = "1 hour",
           behind_after: float = 60.0, limit: int = 20) -> list[str]:
    """`pgtask status` for one task table: the verdict first, then the busiest groups."""
    oid = table_oid(conn, schema, table_name)
    if oid is None:
        return [f"NOT OK: no table {schema}.{table_name} in this database (run `pgtask provision`)"]
    v = verdict(liveness(conn, schema, table_name, oid), schema, table_name, behind_after)
    lines = [v.headline, *v.details]
    cur = conn.cursor(row_factory=dict_row)
    longest = cur.execute(patterns.query("inspect", "longest", schema, table_name)).fetchone()
    if longest:
        lines.append(f"longest running: task {longest['id']} (group {longest['group']}, {longest['state']}) for "
                     f"{duration(longest['seconds'])}: {longest['input']}")
    found = groups(conn, schema, table_name, since)
    lines.append(f"groups (done … stop, fail %, rate, pickup: in the last {since}; (all): every row in the table)")
    shown = found[:limit]
    rows = [group_cells(g) for g in shown] + [total_cells(found)]
    lines += ["  " + line for line in table(GROUP_COLUMNS, rows, GROUP_NUMERIC)]
    if len(found) > limit:
        lines.append(f"  … and {len(found) - limit:,} more groups (--groups N shows more)")
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
