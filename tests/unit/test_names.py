"""The names of a task table's objects (pgtask.names), without a cluster: identifiers cut to
PostgreSQL's 63 bytes as the catalog stores them (never inside a character), the objects beside a
table named ``<table>_<kind>``, its NOTIFY channel."""

from __future__ import annotations

import pytest
from psycopg import sql

from pgtask import names, patterns, provision, provision_beside, provision_verbs
from pgtask.names import ident_name

pytestmark = [pytest.mark.any_pg, pytest.mark.quick]  # no server: the first pass of ./test runs it


def test_the_channel_is_the_tables_oid():
    assert names.channel(16384) == "pg_task_16384"
    assert names.channel(4294967295) == "pg_task_4294967295"  # the largest oid


def test_the_objects_beside_a_table():
    kinds = ("schedule", "occurrence", "keys", "groups", "service")
    assert [names.extra_table("task", k) for k in kinds] == \
        ["task_schedule", "task_occurrence", "task_key", "task_group", "task_service"]
    assert [names.liveness_table("task", k) for k in names.LIVENESS_TABLES] == ["task_claim", "task_instance"]
    assert names.author_role("task") == "task_user"
    assert names.function_name("jobs", "enqueue") == "jobs_enqueue"
    with pytest.raises(KeyError):
        names.extra_table("task", "nope")


@pytest.mark.parametrize("name", ["", "x", "x" * 63, "é" * 31 + "x", 'a"b', "it's; DROP", "a\x00b",
                                  "tâsk \"x\""])
def test_a_name_of_at_most_63_bytes_is_kept_as_it_is(name):
    assert ident_name(name) == name


@pytest.mark.parametrize(("name", "stored"), [
    ("x" * 64, "x" * 63),
    ("x" * 1000, "x" * 63),
    ("é" * 32, "é" * 31),             # 64 bytes; the 32nd é would be cut in two: dropped whole (62 bytes)
    ("x" + "é" * 31, "x" + "é" * 31),  # 63 bytes exactly
    ("xx" + "é" * 31, "xx" + "é" * 30),
    ("x" * 60 + "\U0001F600", "x" * 60),  # a 4-byte character across the limit (64 bytes)
    ("x" * 59 + "\U0001F600", "x" * 59 + "\U0001F600"),  # 63 bytes
])
def test_a_longer_name_is_cut_as_the_catalog_stores_it(name, stored):
    assert ident_name(name) == stored and len(stored.encode()) <= 63


def test_a_long_table_names_objects_keep_their_kind_within_63_bytes():
    long = "t" * 60
    for made, kind in ((names.extra_table(long, "schedule"), "_schedule"),
                       (names.function_name(long, "enqueue"), "_enqueue"), (names.author_role(long), "_user")):
        assert made.startswith("t" * 40) and made.endswith(kind) and len(made.encode()) == 63, made


def test_the_identifiers_of_a_hostile_name_are_quoted():
    ids = names.table_names("it's a schema", 'my "table";')
    assert ids["table"].as_string(None) == '"it\'s a schema"."my ""table"";"'
    assert ids["enqueue"].as_string(None) == '"it\'s a schema"."my ""table"";_enqueue"'
    assert ids["groups"].as_string(None) == '"it\'s a schema"."my ""table"";_group"'
    assert set(ids) == {"table", "enqueue", *names.EXTRA_TABLES}


def test_the_task_table_keeps_its_own_name_uncut():
    """PostgreSQL cuts the table's own name itself; the names made from it are cut here."""
    ids = names.table_names("s", "x" * 70)
    assert ids["table"] == sql.Identifier("s", "x" * 70)
    assert ids["enqueue"] == sql.Identifier("s", names.beside("x" * 70, "enqueue"))
    assert names.beside("x" * 70, "enqueue").endswith("_enqueue")


# the relations (tables, views, indexes: one namespace per schema) provisioning makes beside a table
# the functions the patterns install beside a table (pgtask/patterns/*.sql, "-- function NAME --")
PATTERN_FUNCTIONS = tuple(s.name for p in patterns.PATTERNS for s in patterns.sections(p) if s.kind == "function")

RELATIONS = (*names.EXTRA_TABLES.values(), *names.LIVENESS_TABLES, provision_beside.OPEN_VIEW,
             *provision_beside.EXTRA_INDEXES, *provision.INDEXES)


@pytest.mark.parametrize("length", range(1, 64))  # provisioning accepts up to 63 bytes (check_identifier)
@pytest.mark.parametrize("letter", ["t", "\u00e9"])  # 1 and 2 bytes a character
def test_every_relation_beside_a_table_has_a_name_of_its_own(length, letter):
    table = (letter * length).encode()[:length].decode(errors="ignore") or letter
    provision.check_identifier("table", table)  # accepted
    made = [names.beside(table, suffix) for suffix in RELATIONS]
    assert len(set(made)) == len(made) and table not in made, sorted(made)
    assert all(len(name.encode()) <= 63 for name in made)


def test_a_table_name_of_up_to_52_bytes_names_its_objects_as_postgresql_cuts_them():
    """The names tables provisioned before keep: <table>_<kind>, cut to 63 bytes."""
    table = "t" * 52
    assert names.beside(table, "schedule_due_idx") == (table + "_schedule_due_idx")[:63]
    assert names.beside("task", "schedule") == "task_schedule"


def test_a_53_byte_table_name_keeps_the_names_that_fit_and_hashes_the_ones_a_cut_would_merge():
    """Cut to 63 bytes, "schedule_next", "schedule_guard", ... of a 53-byte table would all be
    <table>_schedule_: one function for four."""
    table = "t" * 53
    assert names.beside(table, "schedule") == table + "_schedule"  # 62 bytes: as before
    made = {names.beside(table, kind) for kind in ("schedule_next", "schedule_guard", "schedule_wake",
                                                    "schedule_delete_guard")}
    assert len(made) == 4 and all(len(n.encode()) == 63 and "_schedule_" in n for n in made), made


@pytest.mark.parametrize("length", range(1, 64))
@pytest.mark.parametrize("letter", ["t", "\u00e9"])
def test_every_routine_beside_a_table_has_a_name_of_its_own(length, letter):
    """Functions and procedures share a namespace per schema: the trigger functions, the helper
    functions, the verbs and the patterns' functions beside one table never share a name (a
    pattern's uninstall drops its functions by name)."""
    table = (letter * length).encode()[:length].decode(errors="ignore") or letter
    kinds = (*provision.TRIGGERS, *provision.FUNCTIONS, *provision_beside.EXTRA_FUNCTIONS,
             *provision_verbs.FUNCTIONS, *provision_verbs.PROCEDURES, *PATTERN_FUNCTIONS)
    made = [names.beside(table, kind) for kind in kinds]
    assert len(set(made)) == len(made), sorted(made)


def test_a_longer_table_name_is_shortened_with_a_hash_of_it_before_the_kind():
    one, other = "a" * 60 + "one", "a" * 60 + "two"
    made = names.beside(one, "schedule_due_idx")
    assert made.endswith("_schedule_due_idx") and len(made.encode()) == 63
    assert made.startswith("a" * 37) and made != names.beside(other, "schedule_due_idx")
    assert made == names.beside(one, "schedule_due_idx")  # the same every time


@pytest.mark.parametrize("length", range(1, 64))
@pytest.mark.parametrize("letter", ["t", "\u00e9"])
def test_every_verb_beside_a_table_has_a_name_of_its_own(length, letter):
    """The verbs (provision_verbs) are functions and procedures: their names differ from each other
    and from every other routine beside the table; the operator role's from the authors'."""
    table = (letter * length).encode()[:length].decode(errors="ignore") or letter
    verbs = [names.beside(table, kind) for kind in (*provision_verbs.FUNCTIONS, *provision_verbs.PROCEDURES)]
    others = {names.beside(table, kind) for kind in (*provision.TRIGGERS, *provision.FUNCTIONS,
                                                     *provision_beside.EXTRA_FUNCTIONS)}
    assert len(set(verbs)) == len(verbs) and not others & set(verbs), sorted(verbs)
    assert names.admin_role(table) != names.author_role(table)
    assert all(len(name.encode()) <= 63 for name in (*verbs, names.admin_role(table)))
    assert names.admin_role("task") == "task_admin"
