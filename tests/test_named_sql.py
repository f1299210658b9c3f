"""The named-SQL files: a part several queries share is written once and included ({@name}); a
variant of a query is that query with some of its parts swapped ({@name a=b})."""

import pytest

from pgtask import patterns
from pgtask.sql import parse, query

pytestmark = [pytest.mark.any_pg, pytest.mark.quick]  # no server: the first pass of ./test runs it


def test_an_include_is_filled_in_before_any_renderer_sees_the_text():
    got = parse("-- a --\nSELECT 1 FROM {table} WHERE {@b}\n\n-- b --\n-- (part of a)\nx = {@c}\n\n-- c --\n%(p)s\n")
    assert got["a"] == "SELECT 1 FROM {table} WHERE -- (part of a)\nx = %(p)s"
    assert got["b"] == "-- (part of a)\nx = %(p)s"


@pytest.mark.parametrize(("text", "words"), [
    ("-- a --\nSELECT {@nope}\n", "a includes nope, which is not defined"),
    ("-- a --\nSELECT {@b}\n-- b --\n{@a}\n", "includes itself"),
    ("-- a --\nSELECT 1\n-- a --\nSELECT 2\n", "query a defined twice"),
    ("-- a --\nSELECT {@table.sql:nope}\n", "x.sql: a includes table.sql:nope, which is not defined"),
    ("-- a --\nSELECT {@b}\n-- b --\n1\n-- v --\n{@a b=nope}\n", "v includes nope, which is not defined"),
    ("-- a --\nSELECT {@b}\n-- b --\n1\n-- c --\n2\n-- v --\n{@a c=b}\n", "v swaps c, which a does not include"),
    ("-- a --\nSELECT {@b}\n-- b --\n{@v}\n-- v --\n{@a b=b}\n", "includes itself"),
    ("-- v --\n{@table.sql:slot_held a=b}\n", "with swaps: a swap is of a part of the same file"),
])
def test_a_broken_file_is_refused_naming_the_query(text, words):
    with pytest.raises(ValueError, match=words):
        parse(text, "x.sql")


def test_a_variant_swaps_a_part_however_deep_it_is_included():
    got = parse("-- a --\nSELECT {@b}, {@c}\n-- b --\nx AND {@c}\n-- c --\ny\n-- z --\nfalse\n"
                "-- v --\n{@a c=z}\n")
    assert got["a"] == "SELECT x AND y, y"
    assert got["v"] == "SELECT x AND false, false"


def test_the_plain_claim_is_the_claim_without_the_group_table_but_for_its_guard():
    """claim_plain (no group paused or rate-limited) is claim with its flow parts swapped out: the
    group table is read once, by the guard that makes it claim nothing once a group is limited."""
    claim, plain = query("queries.sql", "claim"), query("queries.sql", "claim_plain")
    for part in ("flow", "spend", "flow_allows"):
        assert query("queries.sql", part) in claim and query("queries.sql", part) not in plain
    assert plain.count("{rel_group}") == 1 and query("queries.sql", "unlimited") in plain
    assert query("queries.sql", "next_token") in query("queries.sql", "next")
    assert "{rel_group}" not in query("queries.sql", "next_plain").replace(query("queries.sql", "limited"), "")


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
