"""Each statement the service sends, rendered for public.task (pgtask sql), is the checked-in file of
tests/sql/rendered: a change to the SQL shows in a diff as the statement the server receives."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from pgtask import sql_print

pytestmark = [pytest.mark.any_pg, pytest.mark.quick]  # no server: the first pass of ./test runs it

RENDERED = Path(__file__).parent.parent / "sql" / "rendered"
REGENERATE = f".venv/bin/pgtask sql --write {RENDERED.relative_to(Path(__file__).parent.parent.parent)}"


@pytest.mark.parametrize("name", sql_print.statement_names())
def test_the_statement_is_its_checked_in_rendering(name):
    path = RENDERED / f"{name}.sql"
    want = sql_print.render(name) + "\n"
    have = path.read_text() if path.exists() else ""
    if have != want:
        diff = "".join(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                            f"{path} (checked in)", f"{name} (rendered now)"))
        pytest.fail(f"{name}: the rendering changed; look at the diff, then regenerate with\n"
                    f"    {REGENERATE}\n{diff}", pytrace=False)


def test_no_checked_in_rendering_is_of_a_statement_gone():
    gone = sorted(p.name for p in RENDERED.glob("*.sql") if p.stem not in sql_print.statement_names())
    assert not gone, f"renderings of no statement: {gone}; regenerate with {REGENERATE}"


def test_a_prepared_statement_is_its_prepare_with_numbered_parameters():
    text = sql_print.render("claim_plain", "s", "my task")
    assert text.startswith('PREPARE "pgtask_claim_plain" AS ')
    assert '"s"."my task"' in text and "%(" not in text and "$5" in text


def test_the_parts_are_not_listed_but_the_statements_including_them_are():
    names = sql_print.statement_names()
    assert {"claim", "claim_plain", "next", "pass"} <= set(names)
    assert not {"flow", "lease", "same_table", "next_on_grid"} & set(names)
