"""Cron expressions, evaluated with croniter in an IANA time zone.

Fields: 5 (``minute hour day-of-month month day-of-week``) or 6 (``second`` first, then the five),
ranges, steps, lists, names (JAN-DEC, SUN-SAT), the macros @yearly @monthly @weekly @daily @hourly,
and croniter's extensions (``L`` last day of month, ``MON#2`` second Monday, ``5L`` last Friday).
The last weekday of the month is taken in both spellings, ``5L`` / ``FRIL`` (Quartz's) and ``L5``
(croniter's own).

Daylight saving time (the rule of Vixie cron, which most crontabs assume):
  * a local time that does not exist (the clock jumps 02:00 -> 03:00) runs at the first instant
    after the gap: ``30 2 * * *`` runs at 03:00 on that day, once;
  * a local time that happens twice (03:00 -> 02:00): an expression whose hour field is fixed
    (``30 2 * * *``) runs once, at the first of the two; one whose hour field is a wildcard or a
    step (``*/30 * * * *``, ``0 * * * *``) runs at both, since it means "every so often".
All times handed out are UTC-aware datetimes, i.e. instants; the database stores timestamptz.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterError

MACROS = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
# a last-weekday item of the day-of-week field: 5L, FRIL (a day, then L) or L5, LFRI
_LAST_WEEKDAY = re.compile(r"^(?:([0-7]|[A-Z]{3})L|L([0-7]|[A-Z]{3}))$", re.IGNORECASE)


class CronError(ValueError):
    """An invalid expression or time zone; the message says which."""


def _last_weekday(item: str) -> str:
    """croniter's spelling (L5) of a last-weekday item of the day-of-week field; others unchanged."""
    m = _LAST_WEEKDAY.match(item)
    if m is None:
        return item
    day = (m.group(1) or m.group(2)).upper()
    return f"L{DAYS.index(day) if day in DAYS else day}"


class Cron:
    def __init__(self, expr: str, timezone: str = "UTC"):
        self.expr = " ".join(expr.split())
        try:
            self.tz = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name no file can have
            raise CronError(f"unknown time zone {timezone!r}") from None
        fields = self.expr.split(" ")
        if len(fields) == 1 and fields[0].lower() in MACROS:
            self.hour_field = "0" if fields[0].lower() != "@hourly" else "*"
            self.seconds = False
        elif len(fields) in (5, 6):
            self.seconds = len(fields) == 6
            self.hour_field = fields[2] if self.seconds else fields[1]
            fields[-1] = ",".join(_last_weekday(item) for item in fields[-1].split(","))
            self.expr = " ".join(fields)
        else:
            raise CronError(f"cron expression {expr!r}: expected 5 fields (minute hour day month weekday) "
                            "or 6 (second first)")
        try:
            croniter(self.expr, datetime.now(self.tz), second_at_beginning=self.seconds)
        except (CroniterError, ValueError, KeyError) as exc:
            raise CronError(f"cron expression {expr!r}: {exc}") from None
        # "every so often" (both passes of a repeated hour): a wildcard or a step in any form --
        # */2, 0/2 and 0-23/2 name the same hours
        self.every_hour = self.hour_field.startswith("*") or "/" in self.hour_field

    def _iter(self, start: datetime, backwards: bool = False) -> croniter:
        return croniter(self.expr, start.astimezone(self.tz), second_at_beginning=self.seconds,
                        is_prev=backwards, max_years_between_matches=50)

    def _keep(self, local: datetime) -> bool:
        """False for the second pass of an ambiguous local time when the hour field is fixed."""
        if self.every_hour:
            return True
        wall = local.replace(tzinfo=None)
        first, second = wall.replace(tzinfo=self.tz, fold=0), wall.replace(tzinfo=self.tz, fold=1)
        if first.utcoffset() == second.utcoffset():
            return True
        return local.utcoffset() == first.utcoffset()

    def next(self, after: datetime, n: int = 1) -> list[datetime]:
        """The first ``n`` occurrences strictly after ``after``, as UTC instants."""
        out: list[datetime] = []
        it = self._iter(after)
        try:
            while len(out) < n:
                local = it.get_next(datetime)
                instant = local.astimezone(UTC)
                if instant > after and self._keep(local) and (not out or instant > out[-1]):
                    out.append(instant)
        except CroniterError as exc:
            if not out:
                raise CronError(f"cron expression {self.expr!r} never runs: {exc}") from None
        if not out:
            raise CronError(f"cron expression {self.expr!r} never runs")
        return out

    def prev(self, upto: datetime, n: int = 1, after: datetime | None = None) -> list[datetime]:
        """Up to ``n`` most recent occurrences at or before ``upto`` and strictly after ``after``,
        oldest first, as UTC instants. Walks back at most ``n`` (kept) occurrences: bounded."""
        out: list[datetime] = []
        # get_prev is strictly before its start: start one second after upto (floored to the second)
        it = self._iter(upto.replace(microsecond=0) + timedelta(seconds=1), backwards=True)
        try:
            while len(out) < n:
                local = it.get_prev(datetime)
                instant = local.astimezone(UTC)
                if after is not None and instant <= after:
                    break
                if instant <= upto and self._keep(local) and (not out or instant < out[-1]):
                    out.append(instant)
        except CroniterError:
            pass
        return out[::-1]
