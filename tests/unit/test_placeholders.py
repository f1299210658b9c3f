"""The placeholders of a task table's SQL (pgtask/sql/placeholders.py), without a cluster: one
dialect, psycopg's format, for the service's named SQL and the patterns; a placeholder means the
same in every text."""

from __future__ import annotations

import pytest
from psycopg import sql

from pgtask import names, patterns
from pgtask import sql as named
from pgtask.sql import placeholders

pytestmark = [pytest.mark.any_pg, pytest.mark.quick]  # no server: the first pass of ./test runs it

SCHEMA, TABLE = "odd schema", 'Weird "T"'
LONG = "t" * 60  # long enough that the names beside it are shortened with a hash (names.beside)


def text(value: sql.Composable) -> str:
    return value.as_string(None)


def test_the_fields_are_the_named_placeholders_in_order_of_first_use():
    got = placeholders.fields("SELECT {b}, {a}, %(p)s, '{{}}', {b} FROM {table}")
    assert got == ("b", "a", "table")


@pytest.mark.parametrize(("name", "want"), [
    ("schema", '"odd schema"'),
    ("table", '"odd schema"."Weird ""T"""'),
    ("state", '"odd schema"."state"'),
    ("regclass", "'\"odd schema\".\"Weird \"\"T\"\"\"'"),
    ("schema_name", "'odd schema'"),
    ("table_name", "'Weird \"T\"'"),
    ("fn_retry", '"odd schema"."Weird ""T""_retry"'),
    ("rel_archive", '"odd schema"."Weird ""T""_archive"'),
    ("name_meta_gin", '"Weird ""T""_meta_gin"'),
    ("q_archive", "'\"odd schema\".\"Weird \"\"T\"\"_archive\"'"),
    ("lit_archive", "'Weird \"T\"_archive'"),
])
def test_the_tables_own_placeholders(name, want):
    assert text(placeholders.value(name, SCHEMA, TABLE)) == want


@pytest.mark.parametrize("kind", ["archive", "schedule_due_idx", "cron_next"])
def test_a_thing_beside_the_table_is_named_by_names_beside(kind):
    beside = names.beside(LONG, kind)
    assert beside != f"{LONG}_{kind}"  # shortened with a hash
    assert placeholders.value(f"rel_{kind}", "s", LONG) == sql.Identifier("s", beside)
    assert placeholders.value(f"fn_{kind}", "s", LONG) == sql.Identifier("s", beside)
    assert placeholders.value(f"name_{kind}", "s", LONG) == sql.Identifier(beside)
    assert placeholders.value(f"lit_{kind}", "s", LONG) == sql.Literal(beside)
    assert placeholders.value(f"q_{kind}", "s", LONG) == sql.Literal(f'"s"."{beside}"')


def test_the_service_names_the_tables_beside_it_as_the_patterns_do():
    """{rel_group} of queries.sql is the group table, {rel_instance} and {rel_claim} the liveness
    tables: the names provisioning gives them."""
    group = names.extra_table(LONG, "groups")
    assert placeholders.value("rel_group", "s", LONG) == sql.Identifier("s", group)
    for kind in names.LIVENESS_TABLES:
        liveness = names.liveness_table(LONG, kind)
        assert placeholders.value(f"rel_{kind}", "s", LONG) == sql.Identifier("s", liveness)


def test_an_option_is_a_literal():
    assert placeholders.value("opt_lead", "s", "t", {"lead": "1 month"}) == sql.Literal("1 month")
    assert placeholders.value("opt_lead", "s", "t", {}) is None
    with pytest.raises(KeyError, match="unknown placeholder {opt_lead}"):
        placeholders.values("SELECT {opt_lead}", "s", "t")


def test_anything_else_is_the_callers():
    assert placeholders.value("fn", "s", "t") is None and placeholders.value("work", "s", "t") is None
    got = placeholders.render("SELECT {fn}({table}) -- {{x}} %(p)s", "s", "t",
                              extra={"fn": sql.Identifier("f"), "unused": sql.SQL("x")})
    assert text(got) == 'SELECT "f"("s"."t") -- {x} %(p)s'
    with pytest.raises(KeyError, match="unknown placeholder {nope}"):
        placeholders.render("SELECT {nope}", "s", "t")


def test_an_extra_may_not_change_what_a_placeholder_of_the_table_means():
    same = {"table": sql.Identifier("s", "t"), "rel_group": sql.Identifier("s", "t_group")}
    assert text(placeholders.render("{table} {rel_group}", "s", "t", extra=same)) == '"s"."t" "s"."t_group"'
    with pytest.raises(ValueError, match="placeholder {table}"):
        placeholders.render("SELECT {table}", "s", "t", extra={"table": sql.Identifier("other")})
    with pytest.raises(ValueError, match="placeholder {state}"):
        placeholders.render("SELECT {state}", "s", "t", extra={"state": sql.Literal("DONE")})


def test_a_pattern_renders_with_the_services_placeholders():
    section = next(s for s in patterns.sections("archive") if s.kind == "table")
    want = text(placeholders.render(section.text, SCHEMA, TABLE))
    assert patterns.render(section.text, SCHEMA, TABLE) == want
    # a caller's own placeholder, given as SQL text or as a Composable
    got = patterns.render("SELECT {x} FROM {table}", "s", "t", extra={"x": "1 + 1"})
    assert got == 'SELECT 1 + 1 FROM "s"."t"'
    assert patterns.render("SELECT {x}", "s", "t", extra={"x": sql.Literal("a")}) == "SELECT 'a'"


# the placeholders the patterns' callers give (a repeating task's input and marker, the retried
# work, the inspection queries' source): every other placeholder of a pattern is the table's
PATTERN_EXTRAS = {"input", "marker", "work", "source"}


@pytest.mark.parametrize("pattern", [*patterns.PATTERNS, *patterns.QUERY_FILES])
def test_every_placeholder_of_a_pattern_is_the_tables_or_a_known_extra(pattern):
    for s in patterns.sections(pattern):
        opts = patterns.options(pattern, "t")
        for name in placeholders.fields(s.text):
            known = placeholders.value(name, "s", "t", opts) is not None or name in PATTERN_EXTRAS
            assert known, (pattern, s.name, name)


@pytest.mark.parametrize("file", ["queries.sql", "status.sql", "maintenance_run.sql"])
def test_the_services_table_placeholders_are_the_dialects(file):
    """A placeholder of these files named like one of the table's is the table's: rendered with no
    extra but the statement's own (queries.sql's column lists), none is left."""
    own = {"task_columns", "copy_columns", "copy_columns_t"}
    for name, body in named.queries(file).items():
        extra = {f: sql.SQL("x") for f in placeholders.fields(body) if f in own}
        rendered = text(placeholders.render(body, SCHEMA, TABLE, extra=extra))
        assert "{" not in rendered.replace("'{}'", ""), (file, name)
