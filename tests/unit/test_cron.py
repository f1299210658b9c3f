"""Cron expressions (pgtask.cron), without a cluster: the run times docs/schedules.md promises,
worked out by hand from the calendar (June 2026 starts on a Monday; Europe/Berlin leaves CET on
2026-03-29 at 01:00 UTC and returns to it on 2026-10-25 at 01:00 UTC), and refusals that are a
CronError -- never another exception -- however hostile the text."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from pgtask.cron import Cron, CronError

pytestmark = [pytest.mark.any_pg, pytest.mark.quick]  # no server: the first pass of ./test runs it

T0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)  # a Monday, noon UTC


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_the_next_times_are_strictly_after_the_start():
    assert Cron("*/15 * * * *").next(T0, 3) == [utc(2026, 6, 1, 12, 15), utc(2026, 6, 1, 12, 30),
                                                utc(2026, 6, 1, 12, 45)]
    assert Cron("0 12 * * *").next(T0) == [utc(2026, 6, 2, 12, 0)]  # noon itself is not after noon


def test_the_times_are_utc_instants_even_in_another_zone():
    (first,) = Cron("0 9 * * *", "Europe/Berlin").next(T0)
    assert first == utc(2026, 6, 2, 7, 0) and first.tzinfo is UTC  # 09:00 CEST


def test_six_fields_put_the_seconds_first():
    start = T0 + timedelta(seconds=5)
    assert Cron("*/10 * * * * *").next(start, 3) == [T0 + timedelta(seconds=s) for s in (10, 20, 30)]
    assert Cron("30 0 12 * * *").next(T0) == [T0 + timedelta(seconds=30)]


def test_whitespace_between_fields_is_one_space():
    assert Cron("  0\t12   * *  * ").expr == "0 12 * * *"


@pytest.mark.parametrize(("expr", "times"), [
    ("@hourly", [utc(2026, 6, 1, 13), utc(2026, 6, 1, 14)]),
    ("@daily", [utc(2026, 6, 2), utc(2026, 6, 3)]),
    ("@midnight", [utc(2026, 6, 2), utc(2026, 6, 3)]),
    ("@weekly", [utc(2026, 6, 7), utc(2026, 6, 14)]),  # Sundays
    ("@monthly", [utc(2026, 7, 1), utc(2026, 8, 1)]),
    ("@yearly", [utc(2027, 1, 1), utc(2028, 1, 1)]),
    ("@annually", [utc(2027, 1, 1), utc(2028, 1, 1)]),
])
def test_macros(expr, times):
    assert Cron(expr).next(T0, 2) == times


@pytest.mark.parametrize("spelling", ["5L", "FRIL", "fril", "L5", "LFRI"])
def test_the_last_friday_in_every_spelling(spelling):
    """docs/schedules.md: `0 18 * * 5L` runs at 18:00 on the last Friday of every month."""
    assert Cron(f"0 18 * * {spelling}").next(T0, 2) == [utc(2026, 6, 26, 18), utc(2026, 7, 31, 18)]


def test_the_last_sunday_is_7l_or_sunl():
    # June 2026's last Sunday is the 28th, July's the 26th
    for spelling in ("7L", "SUNL", "0L"):
        assert Cron(f"0 0 * * {spelling}").next(T0, 2) == [utc(2026, 6, 28), utc(2026, 7, 26)], spelling


def test_the_last_day_of_the_month_and_the_second_monday():
    assert Cron("0 0 L * *").next(T0, 2) == [utc(2026, 6, 30), utc(2026, 7, 31)]
    assert Cron("0 0 * * MON#2").next(T0, 2) == [utc(2026, 6, 8), utc(2026, 7, 13)]


def test_names_ranges_steps_and_lists():
    assert Cron("10-50/20 * * * *").next(T0, 3) == [utc(2026, 6, 1, 12, m) for m in (10, 30, 50)]
    assert Cron("0 0 1 JAN,jul *").next(T0, 2) == [utc(2026, 7, 1), utc(2027, 1, 1)]
    assert Cron("0 0 * * SAT-SUN").next(T0, 2) == [utc(2026, 6, 6), utc(2026, 6, 7)]


def test_day_of_month_and_day_of_week_both_restricted_means_either():
    # the 13th or a Friday: Friday 5th, Friday 12th, Saturday 13th, Friday 19th
    assert Cron("0 0 13 * FRI").next(T0, 4) == [utc(2026, 6, d) for d in (5, 12, 13, 19)]


def test_a_local_time_in_the_spring_gap_runs_once_at_the_first_instant_after_it():
    """02:30 does not exist in Berlin on 2026-03-29: 03:00 CEST, 01:00 UTC; the next day 02:30 CEST."""
    start = utc(2026, 3, 28, 12)
    assert Cron("30 2 * * *", "Europe/Berlin").next(start, 2) == [utc(2026, 3, 29, 1, 0),
                                                                   utc(2026, 3, 30, 0, 30)]


def test_a_fixed_hour_in_the_autumn_overlap_runs_once_at_the_first_of_the_two():
    start = utc(2026, 10, 24, 12)
    assert Cron("30 2 * * *", "Europe/Berlin").next(start, 2) == [utc(2026, 10, 25, 0, 30),  # CEST
                                                                   utc(2026, 10, 26, 1, 30)]  # CET


@pytest.mark.parametrize("expr", ["*/30 * * * *", "0,30 */2 * * *"])
def test_a_wildcard_or_step_hour_in_the_autumn_overlap_runs_at_both(expr):
    # 02:00 and 02:30 CEST (00:00, 00:30 UTC), then 02:00 and 02:30 CET (01:00, 01:30 UTC)
    start = utc(2026, 10, 24, 23, 45)
    got = Cron(expr, "Europe/Berlin").next(start, 4)
    assert got == [utc(2026, 10, 25, 0, 0), utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 0),
                   utc(2026, 10, 25, 1, 30)]


@pytest.mark.parametrize("hours", ["0-23/2", "0/2"])
def test_a_step_hour_field_without_a_star_in_the_autumn_overlap_runs_at_both(hours):
    # 02:00 CEST (00:00 UTC), 02:00 CET (01:00 UTC), 04:00 CET (03:00 UTC)
    got = Cron(f"0 {hours} * * *", "Europe/Berlin").next(utc(2026, 10, 24, 23, 45), 3)
    assert got == [utc(2026, 10, 25, 0), utc(2026, 10, 25, 1), utc(2026, 10, 25, 3)]


def test_the_previous_times_are_at_or_before_oldest_first_and_after_the_bound():
    hourly = Cron("0 * * * *")
    assert hourly.prev(T0, 3) == [utc(2026, 6, 1, 10), utc(2026, 6, 1, 11), utc(2026, 6, 1, 12)]
    assert hourly.prev(T0 + timedelta(microseconds=500000), 1) == [T0]
    assert hourly.prev(T0, 3, after=utc(2026, 6, 1, 10)) == [utc(2026, 6, 1, 11), T0]
    assert hourly.prev(T0, 3, after=T0) == []


def test_the_previous_times_across_the_autumn_overlap_keep_one_of_a_fixed_hour():
    got = Cron("30 2 * * *", "Europe/Berlin").prev(utc(2026, 10, 25, 3), 2)
    assert got == [utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30)]


def test_an_expression_that_never_runs_says_so():
    for expr in ("0 0 30 2 *", "0 0 31 4 *"):
        with pytest.raises(CronError, match=rf"^cron expression {re.escape(repr(expr))} never runs"):
            Cron(expr).next(T0)


@pytest.mark.parametrize("expr", ["", "@reboot", "* * * *", "* * * * * * *", "every day"])
def test_the_wrong_number_of_fields_is_refused(expr):
    with pytest.raises(CronError, match=r"expected 5 fields \(minute hour day month weekday\) or 6 "
                                        r"\(second first\)$"):
        Cron(expr)


@pytest.mark.parametrize("expr", [
    "61 * * * *", "0 24 * * *", "0 0 0 * *", "0 0 32 * *", "0 0 * 13 *", "0 0 * * 8", "-1 * * * *",
    "*/0 * * * *", "99999999999999999999 * * * *", "0 0 * * 8L", "0 0 * * XYZL", "0 0 * FOO *",
    "'; DROP TABLE x; -- * * * *"[:24], "0 0 * * *\x00", "0\x00 0 * * *", "0 0 * * MON#6",
])
def test_an_invalid_expression_is_a_cron_error_naming_it(expr):
    with pytest.raises(CronError) as caught:
        Cron(expr)
    assert str(caught.value).startswith(f"cron expression {expr!r}")


@pytest.mark.parametrize("zone", [
    "Mars/Olympus", "", "UTC\x00", "../../etc/passwd", "/etc/localtime", "Europe/" + "x" * 200,
    "Europe/" + "x" * 300,  # longer than a file name can be
])
def test_an_unknown_time_zone_is_a_cron_error_naming_it(zone):
    with pytest.raises(CronError) as caught:
        Cron("0 0 * * *", zone)
    assert str(caught.value) == f"unknown time zone {zone!r}"


def test_a_long_list_is_still_one_field():
    assert Cron(",".join(["5"] * 5000) + " * * * *").next(T0) == [utc(2026, 6, 1, 12, 5)]
