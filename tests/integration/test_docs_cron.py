"""Every cron expression docs/schedules.md shows is accepted as shown: each full expression
becomes a schedule with run times (the ones the page shows as invalid or never matching get an
error instead), and each field form its list of expressions names is accepted in a field."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from test_schedules import add, materialise

from pgtask.cron import Cron, CronError

DOC = Path(__file__).resolve().parents[2] / "docs" / "schedules.md"
NAMES = "JAN|FEB|MAR|APR|MAY|JUN|JUL|AUG|SEP|OCT|NOV|DEC|SUN|MON|TUE|WED|THU|FRI|SAT"
# one field: digits, * / , - # and the names, L (last)
FIELD = re.compile(rf"^(?:[0-9*/,#-]|L|{NAMES})+$", re.IGNORECASE)
MACRO = re.compile(r"^@[a-z]+$")
# the expressions the page shows as examples of a schedule that does not run, with its error
NOT_RUNNING = {"61 * * * *": "cron expression '61 * * * *'", "0 0 30 2 *": "never runs"}
T0 = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)


def shown(text: str) -> set[str]:
    """Code spans and SQL string literals that are cron text: one field, a whole expression, or
    macros (a span listing several gives each)."""
    out: set[str] = set()
    for span in re.findall(r"`([^`\n]+)`", text) + re.findall(r"'([^'\n]+)'", text):
        parts = span.split(" ")
        if all(MACRO.match(p) for p in parts):
            out.update(parts)
        elif all(FIELD.match(p) for p in parts):
            out.add(span)
    return out


def expressions_and_fields() -> tuple[set[str], set[str]]:
    text = DOC.read_text()
    found = shown(text)
    expressions = {s for s in found if MACRO.match(s) or len(s.split(" ")) in (5, 6)}
    section = text.split("### Expressions", 1)[1].split("\n#", 1)[0]
    fields = {s for s in shown(section) if " " not in s and not MACRO.match(s)}
    return expressions, fields


def test_the_page_shows_what_this_test_reads():
    expressions, fields = expressions_and_fields()
    assert {"30 2 * * *", "0 18 * * 5L", "*/10 * * * * *", "0 0 9 * * MON#1", "@hourly", *NOT_RUNNING} <= expressions
    assert {"5L", "L5", "FRIL", "MON#2", "L", "*/15", "10-50/20", "JAN", "SAT"} <= fields


def test_every_expression_shown_makes_a_schedule_run(db):
    expressions, _ = expressions_and_fields()
    names = {f"doc-{i}": expr for i, expr in enumerate(sorted(expressions))}
    for name, expr in names.items():
        add(db, name=name, cron=expr, tz="Europe/Berlin", paused=True)
    materialise(db, T0)
    rows = {r[0]: r[1:] for r in db.execute("SELECT name, cardinality(preview), error FROM task_schedule")}
    for name, expr in names.items():
        previews, error = rows[name]
        if expr in NOT_RUNNING:
            assert previews is None and NOT_RUNNING[expr] in error, (expr, error)
        else:
            assert error is None and previews == 20, (expr, error)


def test_every_field_form_shown_is_accepted_in_a_field():
    _, fields = expressions_and_fields()
    for form in sorted(fields):
        accepted = []
        for position in range(5):
            expr = " ".join(form if i == position else "*" for i in range(5))
            try:
                accepted.append(Cron(expr).next(T0))
            except CronError:
                pass
        assert accepted, f"{form!r} is refused in every field"


def test_last_weekday_in_both_spellings():
    """5L (the docs' and Quartz's spelling), FRIL and L5 (croniter's) are the last Friday."""
    last_fridays = [datetime(2026, 6, 26, tzinfo=UTC), datetime(2026, 7, 31, tzinfo=UTC)]
    for expr in ("0 0 * * 5L", "0 0 * * 5l", "0 0 * * FRIL", "0 0 * * L5", "0 0 * * LFRI", "0 0 0 * * 5L"):
        assert Cron(expr).next(T0, 2) == last_fridays, expr
