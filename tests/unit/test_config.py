"""Settings without a server (pgtask.config): the manual's GUC table as data (spec section 9 for
the names, types, defaults and lower bounds; section 2.4 for the columns that default to them),
the TOML config file and its refusals, pg_task.json entries, metrics_listen. Not the precedence
between the levels (supervisor.resolve), which reads the server."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgtask.config import (BY_NAME, INT_MAX, SERVICE_BOUNDS, SERVICE_KEYS, SETTINGS, Config, ConfigError,
                           Entry, check_minimum, from_dict, load, parse_entries, parse_listen)

pytestmark = [pytest.mark.any_pg, pytest.mark.quick]  # no server: the first pass of ./test runs it

# spec section 9: name -> (type, default, lowest); pg_task.plan's default is the text
# statement_timestamp(), which pgtask leaves to the column (None)
MANUAL = {
    "pg_task.delete": ("bool", True, None), "pg_task.drift": ("bool", False, None),
    "pg_task.header": ("bool", True, None), "pg_task.save": ("bool", False, None),
    "pg_task.spi": ("bool", False, None), "pg_task.string": ("bool", True, None),
    "pg_conf.fetch": ("int", 10, 1), "pg_conf.restart": ("int", 60, 1), "pg_task.count": ("int", 0, 0),
    "pg_task.fetch": ("int", 100, 1), "pg_task.limit": ("int", 1000, 0), "pg_task.max": ("int", 0, None),
    "pg_task.run": ("int", 2147483647, 1), "pg_task.sleep": ("int", 1000, 1),
    "pg_work.fetch": ("int", 100, 1),
    "pg_work.idle": ("int", 60, 1), "pg_work.restart": ("int", 60, 1),
    "pg_task.active": ("interval", "1 hour", None), "pg_task.data": ("text", "postgres", None),
    "pg_task.delimiter": ("char", "\t", None), "pg_task.escape": ("char", "", None),
    "pg_task.group": ("text", "group", None), "pg_task.json": ("json", [{"data": "postgres"}], None),
    "pg_task.live": ("interval", "0 sec", None), "pg_task.null": ("text", "\\N", None),
    "pg_task.plan": ("timestamptz", None, None), "pg_task.quote": ("char", "", None),
    "pg_task.repeat": ("interval", "0 sec", None), "pg_task.reset": ("interval", "1 hour", None),
    "pg_task.schema": ("text", "public", None), "pg_task.table": ("text", "task", None),
    "pg_task.timeout": ("interval", "0 sec", None), "pg_task.user": ("text", "postgres", None),
}
# spec section 2.4: the task columns whose default is current_setting('pg_task.<column>')
COLUMNS = {"plan", "active", "live", "repeat", "timeout", "count", "max", "delete", "drift", "header", "save",
           "string", "delimiter", "escape", "quote", "group", "null"}


def test_the_settings_are_the_manuals():
    assert INT_MAX == 2**31 - 1
    assert {s.name: (s.type, s.default, s.minimum) for s in SETTINGS} == MANUAL
    assert len(BY_NAME) == len(SETTINGS)


def test_the_columns_that_default_to_a_setting():
    assert {s.name: s.column for s in SETTINGS if s.column} == {f"pg_task.{c}": c for c in COLUMNS}


def test_nothing_set_is_the_manuals_defaults():
    cfg = from_dict({})
    assert cfg.dsn == "" and cfg.path is None
    assert [cfg.get(n) for n in ("pg_task.sleep", "pg_task.run", "pg_task.reset", "pg_task.json")] == \
        [1000, 2147483647, "1 hour", [{"data": "postgres"}]]
    assert cfg.source("pg_task.sleep") == "default"
    assert {k: cfg.svc(k) for k in SERVICE_KEYS} == {k: dflt for k, (_, dflt) in SERVICE_KEYS.items()}


def test_every_bounded_service_key_is_a_number():
    assert all(SERVICE_KEYS[k][0] in (int, float) for k in SERVICE_BOUNDS)


def test_a_file_sets_settings_and_says_where_they_came_from(tmp_path):
    path = tmp_path / "pgtask.toml"
    path.write_text('dsn = "host=/tmp dbname=x"\n[pgtask]\ngrace = 5\nlog_level = "DEBUG"\n'
                    '[pg_task]\nsleep = 250\nreset = 30\n'
                    'json = \'[{"data": "a"}, {"user": "b", "reset": 5}]\'\n'
                    '[pg_work]\nidle = 1\n')
    cfg = load(path)
    assert cfg.dsn == "host=/tmp dbname=x" and cfg.path == path
    assert cfg.svc("grace") == 5.0 and isinstance(cfg.svc("grace"), float) and cfg.svc("log_level") == "DEBUG"
    assert cfg.get("pg_task.sleep") == 250 and cfg.get("pg_work.idle") == 1
    assert cfg.get("pg_task.reset") == "30 sec"  # a number of seconds
    assert cfg.get("pg_task.json") == [{"data": "a"}, {"user": "b", "reset": "5 sec"}]
    assert cfg.source("pg_task.sleep") == f"config file {path}" and cfg.source("pg_task.run") == "default"


def test_no_file_named_is_no_file(monkeypatch):
    monkeypatch.delenv("PGTASK_CONFIG", raising=False)
    assert load() == Config()


def test_the_file_named_by_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "from-env.toml"
    path.write_text("[pg_task]\nsleep = 7\n")
    monkeypatch.setenv("PGTASK_CONFIG", str(path))
    assert load().get("pg_task.sleep") == 7


def test_a_missing_or_broken_file_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=rf"^config file {tmp_path}/nope.toml does not exist$"):
        load(tmp_path / "nope.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[pgtask\n")
    with pytest.raises(ConfigError, match=rf"^config file {broken}: "):
        load(broken)


@pytest.mark.parametrize(("raw", "error"), [
    ({"dsn": 5}, "dsn: expected a libpq connection string, got 5"),
    ({"nope": 1}, "nope: unknown key (known: dsn, pgtask, pg_task, pg_conf, pg_work)"),
    ({"pgtask": 1}, "pgtask: expected a table"),
    ({"pg_task": "sleep=5"}, "pg_task: expected a table of settings"),
    ({"pgtask": {"nope": 1}}, f"pgtask.nope: unknown key (known: {', '.join(SERVICE_KEYS)})"),
    ({"pgtask": {"processes": True}}, "pgtask.processes: expected int, got True"),
    ({"pgtask": {"grace": True}}, "pgtask.grace: expected float, got True"),
    ({"pgtask": {"processes": 1.5}}, "pgtask.processes: expected int, got 1.5"),
    ({"pgtask": {"processes": "2"}}, "pgtask.processes: expected int, got '2'"),
    ({"pgtask": {"processes": 0}}, "pgtask.processes: must be >= 1, got 0"),
    ({"pgtask": {"embedded_port": 65536}}, "pgtask.embedded_port: must be <= 65535, got 65536"),
    ({"pgtask": {"embedded_port": 0}}, "pgtask.embedded_port: must be >= 1, got 0"),
    ({"pgtask": {"reset_check": 0}}, "pgtask.reset_check: must be > 0, got 0.0"),
    ({"pgtask": {"grace": -0.5}}, "pgtask.grace: must be >= 0, got -0.5"),
    ({"pgtask": {"grace": float("nan")}}, "pgtask.grace: must be a finite number, got nan"),
    ({"pgtask": {"grace": float("inf")}}, "pgtask.grace: must be a finite number, got inf"),
    ({"pgtask": {"remote_backoff": 3600.5}}, "pgtask.remote_backoff: must be <= 3600, got 3600.5"),
    ({"pgtask": {"log_level": "verbose"}},
     "pgtask.log_level: expected one of debug, info, warning, error, critical, got 'verbose'"),
    ({"pgtask": {"execute_as": "LOGIN"}},
     "pgtask.execute_as: expected 'auto', 'login' or 'set_role', got 'LOGIN'"),
    ({"pgtask": {"metrics_listen": "9464"}},
     "pgtask.metrics_listen: expected HOST:PORT (e.g. 127.0.0.1:9464), got '9464'"),
    ({"pg_task": {"nope": 1}}, "pg_task.nope: unknown setting"),
    ({"pg_conf": {"sleep": 1}}, "pg_conf.sleep: unknown setting"),
    ({"pg_task": {"sleep": 0}}, "pg_task.sleep: must be >= 1, got 0"),
    ({"pg_task": {"limit": -1}}, "pg_task.limit: must be >= 0, got -1"),
    ({"pg_task": {"sleep": "5"}}, "pg_task.sleep: expected int, got str '5'"),
    ({"pg_task": {"sleep": True}}, "pg_task.sleep: expected int, got bool True"),
    ({"pg_task": {"reset": True}}, "pg_task.reset: expected interval, got bool True"),
    ({"pg_task": {"reset": 1.5}}, "pg_task.reset: expected interval, got float 1.5"),
    ({"pg_task": {"schema": 1}}, "pg_task.schema: expected text, got int 1"),
    ({"pg_task": {"json": {"data": "x"}}}, "pg_task.json: expected json, got dict {'data': 'x'}"),
    ({"pg_task": {"json": "[{"}}, "pg_task.json: not valid JSON: "),
    ({"pg_task": {"delete": False}},
     "pg_task.delete: the default of task column 'delete' is read by PostgreSQL itself; set it there "
     "(postgresql.conf, ALTER DATABASE/ROLE ... SET, or SET)"),
    ({"pg_task": {"id": 1}}, "pg_task.id: read-only, set per task"),
])
def test_a_wrong_value_is_refused_naming_the_key(raw, error):
    with pytest.raises(ConfigError) as caught:
        from_dict(raw)
    assert str(caught.value).startswith(error) and (error.endswith(": ") or str(caught.value) == error)


@pytest.mark.parametrize(("raw", "want"), [
    ({"pgtask": {"processes": 2**70}}, 2**70),  # no upper bound
    ({"pgtask": {"embedded_port": 65535}}, 65535),
    ({"pgtask": {"grace": 0}}, 0.0),
    ({"pgtask": {"remote_backoff": 3600}}, 3600.0),
])
def test_values_at_the_bounds_are_taken(raw, want):
    ((key, _),) = raw["pgtask"].items()
    assert from_dict(raw).svc(key) == want


def test_the_lowest_int_of_each_bounded_setting_is_taken():
    for s in SETTINGS:
        if s.type == "int" and s.minimum is not None:
            group, key = s.name.split(".")
            if s.column is None:
                assert from_dict({group: {key: s.minimum}}).get(s.name) == s.minimum
            assert check_minimum(s.name, s.minimum) == s.minimum


def test_a_value_below_the_minimum_names_where_it_came_from():
    with pytest.raises(ConfigError) as caught:
        check_minimum("pg_task.run", 0, "ALTER ROLE alice SET")
    assert str(caught.value) == "pg_task.run: must be >= 1, got 0 (ALTER ROLE alice SET)"
    assert check_minimum("pg_task.max", -2**31) == -2**31  # no minimum
    assert check_minimum("not.a.setting", -1) == -1


@pytest.mark.parametrize(("value", "address"), [
    ("127.0.0.1:9464", ("127.0.0.1", 9464)), (":9464", ("127.0.0.1", 9464)), ("[::1]:9464", ("::1", 9464)),
    ("0.0.0.0:1", ("0.0.0.0", 1)), ("host:65535", ("host", 65535)), ("[::]:80", ("::", 80)),
])
def test_metrics_listen(value, address):
    assert parse_listen(value) == address


@pytest.mark.parametrize("value", [
    "", ":", "host", "host:", "host:0", "host:65536", "host:-1", "host:+80", "host: 80", "host:80 ",
    "host:0x50", "host:99999999999999999999999",
    "host:\u00b2", "host:\u0664\u0664",  # digits to str.isdigit, not ASCII ones
])
def test_metrics_listen_refused(value):
    with pytest.raises(ConfigError, match=r"^pgtask\.metrics_listen: expected HOST:PORT "):
        parse_listen(value)


def test_entries_of_pg_task_json():
    assert parse_entries('[{"data": "a", "sleep": 5, "spi": true}, {"user": "b", "reset": 60}, {}]') == \
        [{"data": "a", "sleep": 5, "spi": True}, {"user": "b", "reset": "60 sec"}, {}]
    assert parse_entries([]) == []


@pytest.mark.parametrize(("raw", "error"), [
    ("{", "pg_task.json: not valid JSON: "),
    ('{"data": "a"}', "pg_task.json: expected a list of objects"),
    ("null", "pg_task.json: expected a list of objects"),
    ('[1]', "pg_task.json[0]: expected an object, got 1"),
    ('[{}, {"nope": 1}]',
     "pg_task.json[1].nope: unknown key (known: data, user, schema, table, sleep, reset, run, spi)"),
    ('[{"sleep": true}]', "pg_task.json[0].sleep: expected int, got True"),
    ('[{"sleep": "5"}]', "pg_task.json[0].sleep: expected int, got '5'"),
    ('[{"run": 0}]', "pg_task.json[0].run: must be >= 1, got 0"),
    ('[{"sleep": -9223372036854775808}]',
     "pg_task.json[0].sleep: must be >= 1, got -9223372036854775808"),
    ('[{"spi": "yes"}]', "pg_task.json[0].spi: expected bool, got 'yes'"),
    ('[{"spi": 1}]', "pg_task.json[0].spi: expected bool, got 1"),
    ('[{"reset": true}]', "pg_task.json[0].reset: expected str, got True"),
    ('[{"data": ""}]', "pg_task.json[0].data: must not be empty"),
    ('[{"table": null}]', "pg_task.json[0].table: expected str, got None"),
])
def test_a_wrong_entry_is_refused_naming_it(raw, error):
    with pytest.raises(ConfigError) as caught:
        parse_entries(raw)
    assert str(caught.value).startswith(error) and (error.endswith(": ") or str(caught.value) == error)


def test_an_entry_names_its_scheduler():
    e = Entry(data="d", user="u", schema="s", table="t", sleep=1000, reset="1 hour", run=4, spi=False)
    assert e.key == ("d", "u", "s", "t") and e.label() == "u@d s.t"


def test_a_server_is_configured_by_a_dsn_or_the_libpq_environment(monkeypatch):
    for var in ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGSERVICE", "PGUSER"):
        monkeypatch.delenv(var, raising=False)
    assert not Config().server_configured
    assert Config(dsn="host=x").server_configured
    monkeypatch.setenv("PGPORT", "5433")
    assert Config().server_configured
    monkeypatch.setenv("PGPORT", "")
    assert not Config().server_configured  # set but empty is not set


def test_a_path_is_taken_as_a_string_too(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("")
    assert load(str(path)).path == Path(str(path))
