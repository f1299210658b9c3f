"""The operators' console as HTML: the verdict, the groups, the task table, a verb's preview and
result, an error -- every value escaped (a task's error, input, group and author are anyone's
text). Numbers are written by pgtask/readable.py, as `pgtask status` writes them."""

from __future__ import annotations

from html import escape

import psycopg

from .console_data import Outcome, Snapshot
from .readable import count, duration, ident, percent, rate

STYLE = ("<style>.pgtask-console table{border-collapse:collapse;font-size:12px}"
         ".pgtask-console td,.pgtask-console th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:left}"
         ".pgtask-console td.n{text-align:right}.pgtask-ok{color:#176317;font-weight:bold}"
         ".pgtask-not-ok{color:#a11;font-weight:bold}.pgtask-error-text{color:#a11}</style>")
VERBED = {"retry": "retried", "cancel": "cancelled", "delete": "deleted", "pause": "paused",
          "resume": "resumed"}


def table(headers, rows, numeric) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td{' class=n' if n else ''}>{escape(str(c))}</td>"
                                    for c, n in zip(r, numeric)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def cannot(snap: Snapshot, part: str, what: str) -> str:
    """Why a part of the snapshot is missing: the role may not read it."""
    return f"<div class='pgtask-cannot'>{what}: {error(snap.problems[part])}</div>"


def verdict(snap: Snapshot) -> str:
    if snap.verdict is None:
        return STYLE + cannot(snap, "verdict", "is a service looking after the table? cannot tell")
    v = snap.verdict
    cls = "pgtask-ok" if v.ok else "pgtask-not-ok"
    details = "".join(f"<div>{escape(d)}</div>" for d in v.details)
    return f"{STYLE}<div class='pgtask-verdict {cls}'>{escape(v.headline)}</div>{details}"


GROUP_COLUMNS = ("group", "due", "oldest due", "running", "orphaned", "failed", "fail %", "rate", "paused",
                 "rate limit")
GROUP_NUMERIC = (False, True, True, True, True, True, True, True, False, True)


def groups(snap: Snapshot, since: str) -> str:
    if "groups" in snap.problems:
        return cannot(snap, "groups", "groups")
    if not snap.groups:
        return "<i>no tasks</i>"
    rows = []
    for g in snap.groups:
        flow = g.get("flow") or {}
        rows.append([g["group"], count(g["due"]), duration(g["oldest_due_seconds"]), count(g["running"]),
                     count(g["orphaned"]), count(g["failed_window"]),
                     percent(g["failed_window"], g["finished_window"]), rate(g["rate"]),
                     "PAUSED" if flow.get("paused") else "", rate(flow.get("rate"))])
    return f"<b>groups</b> (failed, fail %, rate: in the last {escape(since)})" + table(
        GROUP_COLUMNS, rows, GROUP_NUMERIC)


TASK_COLUMNS = ("id", "state", "group", "author", "age", "parent", "error", "input")
TASK_NUMERIC = (True, False, False, False, True, True, False, False)


def tasks(snap: Snapshot) -> str:
    if "tasks" in snap.problems:
        return cannot(snap, "tasks", "tasks")
    rows = [[ident(t["id"]), t["state"], t["group"], t["user"], duration(t["age_seconds"], "waiting"),
             ident(t["parent"]), t["error"], t["input"]] for t in snap.tasks]
    shown = f", the newest {count(len(rows))} shown" if len(rows) < snap.matching else ""
    return (f"<b class='pgtask-matching'>{count(snap.matching)} tasks match the filters</b>{shown}"
            + table(TASK_COLUMNS, rows, TASK_NUMERIC))


def ids(values) -> str:
    return ", ".join(str(i) for i in values) if values else "none"


def preview(o: Outcome) -> str:
    if o.verb in ("pause", "resume"):
        change = "" if o.changed else f" (it is already {VERBED[o.verb]}: nothing would change)"
        return (f"<b>{o.verb}</b> the group{change}: its queued tasks: <b class='pgtask-preview-count'>"
                f"{count(o.tasks)}</b>; the first: {ids(o.sample)}.")
    return (f"<b>{o.verb}</b> would act on <b class='pgtask-preview-count'>{count(o.tasks)}</b> tasks; "
            f"the first: {ids(o.sample)}. Confirm?")


def result(o: Outcome) -> str:
    if o.verb in ("pause", "resume"):
        done = VERBED[o.verb] if o.changed else f"already {VERBED[o.verb]}, unchanged"
        return f"<span class='pgtask-result'>group {done}; its queued tasks: {count(o.tasks)}.</span>"
    pairs = ids(o.sample) if not o.new_sample else ", ".join(
        f"{old} → {new}" for old, new in zip(o.sample, o.new_sample))
    left = f" {count(o.remaining)} left (held by others, or more than the console does at once)." \
        if o.remaining else ""
    return (f"<span class='pgtask-result'>{VERBED[o.verb]} <b class='pgtask-result-count'>{count(o.tasks)}"
            f"</b> tasks; the first: {pairs}.{left}</span>")


def error(exc: BaseException) -> str:
    """An error as the page shows it: PostgreSQL's message, its hint and SQLSTATE; else the text."""
    if isinstance(exc, psycopg.Error) and exc.diag.message_primary:
        hint = f" {exc.diag.message_hint}" if exc.diag.message_hint else ""
        text = f"{exc.diag.message_primary}.{hint} (SQLSTATE {exc.diag.sqlstate})"
    else:
        text = str(exc) or type(exc).__name__
    return f"<span class='pgtask-error-text'>{escape(text)}</span>"
