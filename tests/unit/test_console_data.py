"""The console's parameters (the notebook's, else the environment's) and its task id field."""

import pytest

from pgtask.console_data import Target, parse_ids, settings


def test_a_parameter_left_at_its_default_is_taken_from_the_environment():
    env = {"PGTASK_CONSOLE_DSN": "dbname=app", "PGTASK_CONSOLE_SCHEMA": "jobs",
           "PGTASK_CONSOLE_TABLE": "queue", "PGTASK_CONSOLE_REFRESH": "2.5"}
    assert settings("", "public", "task", 5, env) == (Target("dbname=app", "jobs", "queue"), 2.5)
    assert settings("dbname=x", "s", "t", 3, env) == (Target("dbname=x", "s", "t"), 3.0)
    assert settings("", "public", "task", 5, {}) == (Target("", "public", "task"), 5.0)


@pytest.mark.parametrize("refresh, env", [(0, {}), (-1, {}), (5, {"PGTASK_CONSOLE_REFRESH": "0"})])
def test_refresh_must_be_positive(refresh, env):
    with pytest.raises(ValueError, match="refresh"):
        settings("", "public", "task", refresh, env)


def test_task_ids():
    assert parse_ids("") is None and parse_ids("  ") is None
    assert parse_ids("41, 42 43,") == (41, 42, 43)
    for bad in ("41; DROP TABLE task", "-1", "4.2", "0x10"):
        with pytest.raises(ValueError, match="is not a task id"):
            parse_ids(bad)
