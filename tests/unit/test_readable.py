"""Numbers written for people (pgtask.readable), without a cluster: what `pgtask status` and the
notebooks print."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pgtask import readable

pytestmark = [pytest.mark.any_pg, pytest.mark.quick]  # no server: the first pass of ./test runs it


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"), (0.0042, "4.2 ms"), (0.012, "12 ms"), (4.2, "4.2 s"), (73, "73 s"), (180, "3 min"),
    (9000, "2.5 h"), (4 * 86400, "4 days"), (-4.2, "-4.2 s"), (timedelta(minutes=3), "3 min"),
])
def test_a_duration_is_rounded_for_reading(seconds, text):
    assert readable.duration(seconds) == text


@pytest.mark.parametrize("empty", [None, float("nan"), "NaT"])
def test_a_missing_value_is_blank_or_what_the_caller_says(empty):
    assert readable.missing(empty)
    assert readable.duration(empty) == "" and readable.duration(empty, "never") == "never"
    assert readable.count(empty) == "" and readable.size(empty) == "" and readable.rate(empty) == ""
    assert readable.timestamp(empty) == "never" and readable.timeout(empty) == "no timeout"


def test_counts_sizes_and_rates():
    assert readable.count(1759) == "1,759" and readable.count(3.0) == "3"
    assert readable.size(8192) == "8.0 kB" and readable.size(1000) == "1,000 bytes"
    assert readable.size(97 * 1024 ** 2) == "97 MB"
    assert readable.rate(35.14) == "35.1/s" and readable.rate(1204) == "1,204/s" and readable.rate(0) == "0/s"
    assert readable.rate(2.5 / 60) == "2.50/min" and readable.rate(3 / 3600) == "3.00/h"


def test_plurals_and_percentages():
    assert readable.plural(1, "orphaned row") == "1 orphaned row"
    assert readable.plural(1200, "orphaned row") == "1,200 orphaned rows"
    assert readable.percent(12, 100) == "12 %" and readable.percent(4, 1000) == "0.4 %"
    assert readable.percent(1, 0) == ""


def test_timeouts_and_timestamps():
    assert readable.timeout(0) == readable.timeout(timedelta(0)) == "no timeout"
    assert readable.timeout(timedelta(seconds=90)) == "90 s"
    assert readable.timestamp(datetime(2026, 1, 2, 3, 4, 5, 678, tzinfo=UTC)) == "2026-01-02 03:04:05+00:00"
    assert readable.timestamp(datetime.max.replace(tzinfo=UTC)) == "infinity"
    assert readable.timestamp(datetime.min.replace(tzinfo=UTC)) == "-infinity"


def test_a_table_aligns_text_left_and_numbers_right():
    lines = readable.table(["group", "due"], [["a", "1,759"], ["bcd", "3"]], [False, True])
    assert lines == ["group    due", "a      1,759", "bcd        3"]


def test_ids_and_pids_are_plain_integers_to_paste_into_sql():
    assert readable.ident(1234567) == "1234567" and readable.ident(48213.0) == "48213"
    assert readable.ident(None) == "" and readable.ident(float("nan")) == ""
    assert [c for c in ("id", "pid", "parent", "example id", "latest_id", "tasks", "idle", "paid")
            if readable.identifier_column(c)] == ["id", "pid", "parent", "example id", "latest_id"]
