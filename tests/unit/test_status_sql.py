"""`pgtask status`'s queries (pgtask/sql/status.sql), without a cluster: each renders for a task
table, and whether a row is orphaned is written once for the status and the notebooks."""

from __future__ import annotations

import pytest

from pgtask import patterns, status
from pgtask.sql import queries, query

pytestmark = [pytest.mark.any_pg, pytest.mark.quick]  # no server: the first pass of ./test runs it


@pytest.mark.parametrize("name", sorted(queries("status.sql")))
def test_every_query_renders_for_a_task_table(name):
    text = status.statement(name, "my schema", "my table").as_string(None)
    assert "{" not in text  # every placeholder filled in


def test_the_status_and_the_notebooks_stuck_rows_decide_orphaned_alike():
    orphaned = query("status.sql", "orphaned")
    stuck = next(s.text for s in patterns.sections("inspect") if s.name == "stuck")
    assert orphaned in query("status.sql", "liveness") and orphaned in stuck
