"""The named-SQL files: a part several queries share is written once and included ({@name})."""

import pytest

from pgtask import patterns
from pgtask.sql import parse, query


def test_an_include_is_filled_in_before_any_renderer_sees_the_text():
    got = parse("-- a --\nSELECT 1 FROM {table} WHERE {@b}\n\n-- b --\n-- (part of a)\nx = {@c}\n\n-- c --\n%(p)s\n")
    assert got["a"] == "SELECT 1 FROM {table} WHERE -- (part of a)\nx = %(p)s"
    assert got["b"] == "-- (part of a)\nx = %(p)s"


@pytest.mark.parametrize(("text", "words"), [
    ("-- a --\nSELECT {@nope}\n", "a includes nope, which is not defined"),
    ("-- a --\nSELECT {@b}\n-- b --\n{@a}\n", "includes itself"),
    ("-- a --\nSELECT 1\n-- a --\nSELECT 2\n", "query a defined twice"),
    ("-- a --\nSELECT {@table.sql:nope}\n", "x.sql: a includes table.sql:nope, which is not defined"),
])
def test_a_broken_file_is_refused_naming_the_query(text, words):
    with pytest.raises(ValueError, match=words):
        parse(text, "x.sql")


def test_the_purge_and_its_preview_share_one_predicate():
    shared = query("maintenance.sql", "retention_deletable")
    assert shared in query("maintenance.sql", "retention_delete")
    assert shared in query("maintenance.sql", "retention_purgeable")
    assert query("queries.sql", "flush_finished") in query("queries.sql", "flush_finish")


def test_another_files_part_is_included_by_its_file_and_name():
    got = parse("-- a --\nSELECT count(*) FROM {table} WHERE {@table.sql:slot_held}\n")
    assert got["a"].endswith(query("table.sql", "slot_held"))


def test_the_slot_index_predicate_is_written_once_for_the_index_and_its_readers():
    """The claim's count must write the slot index's predicate as the index does (the planner
    matches the text) -- and the orphan check and the notebook's "stuck" read the same rows."""
    held = query("table.sql", "slot_held")
    for text in (query("table.sql", "index_running"), query("queries.sql", "claim"),
                 query("queries.sql", "reset"), patterns.query("inspect", "stuck")):
        assert held in text
