"""The manual's cascade without a cluster: pg_task.json's entry > ALTER ROLE > ALTER DATABASE > the
config file > postgresql.conf / ALTER SYSTEM > the connection (data, user) > the manual's default.
What the server holds is given as precedence.ServerSettings, as read_server reads it."""

from __future__ import annotations

import pytest

from pgtask.config import ConfigError, from_dict
from pgtask.precedence import SYSTEM, ServerSettings, convert, decide

pytestmark = pytest.mark.any_pg  # no server: the first pass of ./test runs it


def server(**kwargs) -> ServerSettings:
    return ServerSettings(user="alice", database="shop", **kwargs)


def test_nothing_set_is_one_entry_for_the_connection_with_the_manuals_defaults():
    resolved, _ = decide(from_dict({}), server())
    (entry,) = resolved.entries
    assert (entry.data, entry.user, entry.schema, entry.table) == ("shop", "alice", "public", "task")
    assert (entry.sleep, entry.reset, entry.run, entry.spi) == (1000, "1 hour", 2147483647, False)
    assert resolved.sources["pg_task.data"] == resolved.sources["pg_task.user"] == "connection"
    assert resolved.sources["pg_task.json"] == resolved.sources["pg_task.sleep"] == "default"
    assert resolved.sources["entry 0 sleep"] == "default"


def test_the_config_file_beats_the_server_which_beats_the_default():
    cfg = from_dict({"pg_task": {"sleep": 500}})
    system = {"pg_task.sleep": "2000", "pg_task.run": "7", "pg_task.schema": None}
    resolved, _ = decide(cfg, server(system=system))
    assert resolved.values["pg_task.sleep"] == 500
    assert resolved.sources["pg_task.sleep"].startswith("config file")
    assert resolved.values["pg_task.run"] == 7 and resolved.sources["pg_task.run"] == SYSTEM
    assert resolved.values["pg_task.schema"] == "public" and resolved.sources["pg_task.schema"] == "default"
    assert (resolved.entries[0].sleep, resolved.entries[0].run) == (500, 7)


def test_the_file_and_the_server_name_data_and_user_before_the_connection():
    resolved, _ = decide(from_dict({"pg_task": {"data": "books"}}), server(system={"pg_task.user": "bob"}))
    assert (resolved.entries[0].data, resolved.entries[0].user) == ("books", "bob")
    assert resolved.sources["pg_task.user"] == SYSTEM


def test_an_entry_beats_alter_role_which_beats_alter_database_which_beats_the_file():
    cfg = from_dict({"pg_task": {"sleep": 500, "run": 3, "json": [{"data": "shop", "user": "alice", "reset": 9}]},
                     "pgtask": {}})
    by_role = {"alice": {"pg_task.sleep": "20", "pg_task.reset": "2 hours"}}
    by_db = {"shop": {"pg_task.sleep": "30", "pg_task.run": "4", "pg_task.table": "jobs"}}
    resolved, _ = decide(cfg, server(by_role=by_role, by_db=by_db))
    (entry,) = resolved.entries
    assert (entry.reset, entry.sleep, entry.run, entry.table, entry.schema) == ("9 sec", 20, 4, "jobs", "public")
    sources = resolved.sources
    assert sources["entry 0 reset"] == "pg_task.json[0]"
    assert sources["entry 0 sleep"] == "ALTER ROLE alice SET"
    assert sources["entry 0 run"] == sources["entry 0 table"] == "ALTER DATABASE shop SET"
    assert sources["entry 0 schema"] == "default"


def test_settings_of_another_role_or_database_do_not_apply():
    by_role, by_db = {"bob": {"pg_task.sleep": "20"}}, {"books": {"pg_task.sleep": "30"}}
    resolved, _ = decide(from_dict({}), server(by_role=by_role, by_db=by_db))
    assert resolved.entries[0].sleep == 1000


def test_an_entry_names_its_database_by_its_user_and_its_user_by_its_database():
    cfg = from_dict({"pg_task": {"json": [{"user": "bob"}, {"data": "books"}]}})
    resolved, _ = decide(cfg, server())
    assert [(e.data, e.user) for e in resolved.entries] == [("bob", "bob"), ("books", "books")]


def test_the_same_entry_twice_runs_once():
    cfg = from_dict({"pg_task": {"json": [{"data": "shop"}, {"data": "shop", "sleep": 1000}]}})
    resolved, _ = decide(cfg, server())
    assert len(resolved.entries) == 1


def test_pg_task_json_set_in_the_server():
    resolved, _ = decide(from_dict({}), server(system={"pg_task.json": '[{"data": "a"}, {"data": "b"}]'}))
    assert [e.data for e in resolved.entries] == ["a", "b"]
    assert resolved.sources["pg_task.json"] == SYSTEM


def test_a_name_postgresql_cannot_hold_is_refused_naming_the_entry():
    cfg = from_dict({"pg_task": {"json": [{"data": "shop"}, {"data": "x" * 64}]}})
    with pytest.raises(ConfigError, match=r"pg_task\.json\[1\]\.database"):
        decide(cfg, server())


def test_the_intervals_to_check_are_named_by_where_they_were_set():
    cfg = from_dict({"pg_task": {"reset": "5 min", "json": [{"data": "a", "reset": "1 min"}, {"data": "b"}]},
                     "pgtask": {"retention": "7 days"}})
    _, intervals = decide(cfg, server(by_db={"b": {"pg_task.reset": "2 min"}}))
    assert intervals == [("pg_task.reset", "5 min", False), ("pgtask.retention", "7 days", True),
                         ("pg_task.json[0].reset", "1 min", False),
                         ("pg_task.reset (ALTER DATABASE b SET)", "2 min", False)]


@pytest.mark.parametrize(("name", "raw", "value"), [
    ("pg_task.sleep", "250", 250), ("pg_task.sleep", " +250 ", 250), ("pg_task.spi", "fal", False),
    ("pg_task.spi", "ON", True), ("pg_task.schema", "jobs", "jobs"), ("pg_task.reset", "1 day", "1 day"),
    ("pg_task.json", '[{"data": "a"}]', [{"data": "a"}]),
])
def test_a_value_set_in_the_server_is_read_as_its_type(name, raw, value):
    assert convert(name, raw) == value


@pytest.mark.parametrize(("name", "raw", "words"), [
    ("pg_task.sleep", "0", r"pg_task\.sleep: must be >= 1, got 0 \(set in the server\)"),
    ("pg_task.sleep", "soon", r"pg_task\.sleep: invalid value 'soon' \(expected int\)"),
    ("pg_task.spi", "o", r"pg_task\.spi: invalid value 'o' \(expected bool\)"),
    ("pg_task.json", "[", r"pg_task\.json: invalid value"),
    ("pg_task.json", '[{"nope": 1}]', r"pg_task\.json: invalid value '\[\{\"nope\": 1\}\]' \(expected json\)"),
])
def test_a_wrong_value_set_in_the_server_is_refused_naming_it(name, raw, words):
    with pytest.raises(ConfigError, match=words):
        convert(name, raw)
