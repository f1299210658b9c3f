"""pgtask's one boolean parser for settings (pg_task.spi, pg_task.* set in the server), without a
cluster: the expectations are what PostgreSQL 15 answered for SELECT 'x'::bool."""

from __future__ import annotations

import pytest

from pgtask import spi
from pgtask.config import ConfigError, parse_bool
from pgtask.precedence import convert

pytestmark = [pytest.mark.any_pg, pytest.mark.quick]  # no server: the first pass of ./test runs it

TRUE = ["on", "ON", "true", "tru", "tr", "t", "TRUE", "yes", "ye", "y", "1", " on ", "t ", "\ton"]
FALSE = ["off", "of", "Of", "false", "fals", "fal", "fa", "f", "no", "n", "0"]
# "o" could be on or off; longer than the word, other digits, or words inside a word are no boolean
NEITHER = ["", " ", "o", "onn", "offf", "yess", "tr ue", "01", "10", "+1", "2", "x", "nope", "of f"]


@pytest.mark.parametrize("value", TRUE)
def test_true(value):
    assert parse_bool(value) is True


@pytest.mark.parametrize("value", FALSE)
def test_false(value):
    assert parse_bool(value) is False


@pytest.mark.parametrize("value", NEITHER)
def test_not_a_boolean(value):
    assert parse_bool(value) is None


def test_spi_setting_uses_it():
    """pg_task.spi: a boolean decides, no value leaves the default, anything else is the task's error."""
    assert spi.use_spi("fal", default=True) == (False, None)
    assert spi.use_spi(None, default=True) == (True, None)
    flag, error = spi.use_spi("o", default=True)
    assert flag is False and 'invalid value for parameter "pg_task.spi": "o"' in error


@pytest.mark.parametrize("value", TRUE + FALSE + NEITHER)
def test_a_setting_the_server_holds_uses_it(value):
    """pg_task.spi set by postgresql.conf, ALTER SYSTEM/DATABASE/ROLE: the same spellings, and a
    non-boolean refused naming the setting."""
    flag = parse_bool(value)
    if flag is None:
        with pytest.raises(ConfigError, match=r"^pg_task\.spi: invalid value .* \(expected bool\)$"):
            convert("pg_task.spi", value)
    else:
        assert convert("pg_task.spi", value) is flag
