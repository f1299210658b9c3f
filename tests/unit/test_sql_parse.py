"""The named-SQL loader (pgtask.sql.parse), without a cluster: what a header is, what an include is
and is not, swaps however deep, and the refusals; every file the service ships loads with every
include filled in. (tests/test_named_sql.py has the first cases.)"""

from __future__ import annotations

from importlib import resources

import pytest

from pgtask.sql import parse, queries

pytestmark = [pytest.mark.any_pg, pytest.mark.quick]  # no server: the first pass of ./test runs it

FILES = sorted(p.name for p in resources.files("pgtask.sql").iterdir() if p.name.endswith(".sql"))


def test_a_header_is_a_whole_line_of_a_lower_case_name():
    text = "-- a --\n  x  \n\n--  b --\n-- B --\n-- c--\n-- d -- e\n  -- f --\n-- g1 --\n"
    assert parse(text) == {"a": "x  \n\n--  b --\n-- B --\n-- c--\n-- d -- e\n  -- f --\n-- g1 --"}


def test_text_before_the_first_header_is_no_query():
    assert parse("-- a file's comment\nSELECT 0;\n-- a --\nSELECT 1\n") == {"a": "SELECT 1"}
    assert parse("") == {} and parse("SELECT 1") == {}


def test_an_empty_query_and_text_kept_as_written():
    assert parse("-- a --\n-- b --\n\tx\x00y 'é' \"z\"\n\n") == {"a": "", "b": "x\x00y 'é' \"z\""}


def test_only_a_lower_case_name_in_braces_is_an_include():
    got = parse("-- a --\n{@A} {@ b} {@b1} {table} {@} {{@b}} {@b }{@b}\n-- b --\nB\n")
    assert got["a"] == "{@A} {@ b} {@b1} {table} {@} {B} {@b }B"


def test_an_include_is_filled_in_where_it_is_each_time():
    assert parse("-- a --\n{@b} AND {@b}\n-- b --\nx = 1\n")["a"] == "x = 1 AND x = 1"


def test_a_swap_reaches_a_part_included_twice_and_through_a_plain_include():
    text = "-- a --\n{@b} {@b}\n-- b --\n1\n-- c --\n2\n-- v --\n{@a b=c}\n-- w --\n{@a}\n-- x --\n{@w b=c}\n"
    got = parse(text)
    assert (got["a"], got["v"], got["w"], got["x"]) == ("1 1", "2 2", "1 1", "2 2")


def test_several_swaps_at_once():
    text = "-- a --\n{@b}+{@c}\n-- b --\nb\n-- c --\nc\n-- d --\nd\n-- e --\ne\n-- v --\n{@a b=d c=e}\n"
    assert parse(text)["v"] == "d+e"


@pytest.mark.parametrize(("text", "error"), [
    ("-- a --\n{@a}\n", "x.sql: a includes itself through a"),
    ("-- a --\n{@b}\n-- b --\n{@c}\n-- c --\n{@b}\n", "x.sql: c includes itself through b"),
    ("-- a --\n{@b b=c}\n-- b --\n1\n-- c --\n2\n", "x.sql: a swaps b, which b does not include"),
    ("-- a --\n1\n-- b --\n2\n-- a --\n1\n", "x.sql: query a defined twice"),
    ("-- a --\n{@queries.sql:no_such_query}\n",
     "x.sql: a includes queries.sql:no_such_query, which is not defined"),
    ("-- a --\n{@no_such_file.sql:b}\n", "x.sql: a includes no_such_file.sql:b, and there is no no_such_file.sql"),
    ("-- a --\n{@b c=d c=e}\n-- b --\n{@c}\n-- c --\n1\n-- d --\n2\n-- e --\n3\n",
     "x.sql: a swaps c twice in one include"),
])
def test_a_broken_file_is_refused_with_the_reason(text, error):
    with pytest.raises(ValueError) as caught:
        parse(text, "x.sql")
    assert str(caught.value) == error


@pytest.mark.parametrize("filename", FILES)
def test_every_shipped_file_loads_with_its_includes_filled_in(filename):
    loaded = queries(filename)
    assert loaded, filename
    for name, text in loaded.items():
        assert "{@" not in text and text == text.strip(), (filename, name)
