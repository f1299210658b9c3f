"""NOTIFY payloads (pgtask.listener.parse), without a cluster: any role may NOTIFY the channel
with any text, so only the exact hints count -- 'wake', 'schedule', 'stop <id>' with a task id as
PostgreSQL's bigint prints it -- and anything else is None (ignored), never an exception."""

from __future__ import annotations

import pytest

from pgtask.listener import SCHEDULE, STOP, WAKE, parse

pytestmark = [pytest.mark.any_pg, pytest.mark.quick]  # no server: the first pass of ./test runs it


@pytest.mark.parametrize(("payload", "hint"), [
    ("wake", (WAKE, None)), ("schedule", (SCHEDULE, None)),
    ("stop 1", (STOP, 1)), ("stop 10", (STOP, 10)),
    ("stop 9223372036854775807", (STOP, 2**63 - 1)),  # the largest bigint
])
def test_a_hint(payload, hint):
    assert parse(payload) == hint


@pytest.mark.parametrize("payload", [
    "", " ", "WAKE", "Wake", " wake", "wake ", "wake\n", "wake\x00", "wakeup", "schedule now", "schedules",
    "stop", "stop ", "stop  1", " stop 1", "stop 1 ", "stop\t1", "stop\n1", "Stop 1", "STOP 1",
    "stop 0", "stop 00", "stop 01", "stop -1", "stop +1", "stop 1.0", "stop 1e3", "stop 0x10", "stop 1_000",
    "stop 1\x00", "stop \x001", "stop 1\n",
    "stop 9223372036854775808",          # one more than a bigint
    "stop 9999999999999999999",          # 19 digits, too large
    "stop 99999999999999999999",         # 20 digits
    "stop " + "9" * 4000,                # a huge number is not converted
    # digits int() would read: Arabic-Indic, fullwidth, ²
    "stop \u0664\u0662", "stop \uff14\uff12", "stop \u00b2",
    "stop 1 2", "stop 1,2", "stop 1;DROP TABLE task", "wake; stop 1", "'wake'", '"wake"',
    "x" * 7999,                          # the longest payload NOTIFY takes
    "\udcff",                            # a byte the client encoding could not read
])
def test_anything_else_is_ignored(payload):
    assert parse(payload) is None
