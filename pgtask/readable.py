"""Numbers written for people -- ``4.2 s``, ``3 min``, ``1,759``, ``never`` -- task ids and pids as
plain integers, and plain-text tables:
what ``pgtask status``, the notebooks' tables and their figures print."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta


def missing(value) -> bool:
    """None, NaN, or pandas' NaT (a DataFrame's empty cell)."""
    return value is None or (isinstance(value, float) and math.isnan(value)) or str(value) == "NaT"


def count(n) -> str:
    """1759 -> '1,759'; None -> ''."""
    return "" if missing(n) else f"{int(n):,}"


def ident(n) -> str:
    """A task id or a pid: 12345 -> '12345' (no separators: it is pasted into SQL); None -> ''."""
    return "" if missing(n) else str(int(n))


def identifier_column(name: str) -> bool:
    """Whether a table column holds task ids or pids ('id', 'pid', 'parent', 'example id', …)."""
    return name in ("id", "pid", "parent") or name.endswith((" id", "_id"))


def duration(seconds, none: str = "") -> str:
    """Seconds rounded for reading: '12 ms', '4.2 s', '73 s', '3 min', '2.5 h', '4 days'."""
    if missing(seconds):
        return none
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    s = float(seconds)
    a = abs(s)
    if a == 0:
        return "0 s"
    if a < 0.01:
        return f"{s * 1000:.1f} ms"
    if a < 1:
        return f"{s * 1000:.0f} ms"
    if a < 10:
        return f"{s:.1f} s"
    if a < 120:
        return f"{s:.0f} s"
    if a < 7200:
        return f"{s / 60:.0f} min"
    if a < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.0f} days"


def timeout(value) -> str:
    """A task's timeout: 0 is 'no timeout'."""
    if missing(value) or (isinstance(value, timedelta) and not value) or value == 0:
        return "no timeout"
    return duration(value)


def timestamp(value, none: str = "never") -> str:
    """A timestamp to the second, with its UTC offset; None is 'never'."""
    if missing(value):
        return none
    if isinstance(value, datetime):
        if value.year in (1, 9999):  # 'infinity' loaded as datetime.max/min
            return "infinity" if value.year == 9999 else "-infinity"
        return value.isoformat(sep=" ", timespec="seconds")
    return str(value)


def size(n) -> str:
    """Bytes: '8,192 bytes', '8.0 kB', '97 MB'."""
    if missing(n):
        return ""
    value, unit = float(n), "bytes"
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            break
        value /= 1024
    if unit == "bytes":
        return f"{int(value):,} bytes"
    return f"{value:.1f} {unit}" if value < 10 else f"{value:,.0f} {unit}"


def rate(per_second) -> str:
    """Tasks a second, three significant digits, a minute or an hour when slower: '35.1/s',
    '1,204/s', '2.5/min', '3.0/h'."""
    if missing(per_second):
        return ""
    x = float(per_second)
    if x == 0:
        return "0/s"
    for value, unit in ((x, "s"), (x * 60, "min"), (x * 3600, "h")):
        if value >= 1 or unit == "h":
            break
    if value >= 100:
        return f"{value:,.0f}/{unit}"
    digits = max(0, 2 - math.floor(math.log10(value)))
    return f"{value:.{digits}f}/{unit}"


def plural(n, noun: str) -> str:
    """'1 orphaned row', '3 orphaned rows' (with thousands separators)."""
    return f"{count(n)} {noun}{'' if n == 1 else 's'}"


def percent(part, whole) -> str:
    """part of whole: '12 %', '0.4 %'; '' when whole is 0."""
    if not whole:
        return ""
    p = 100 * part / whole
    return f"{p:.1f} %" if 0 < p < 1 else f"{p:.0f} %"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[bool]) -> list[str]:
    """Lines of a plain-text table: each column as wide as its widest cell, text to the left and
    numbers to the right."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric)).rstrip()

    return [line(headers), *(line(r) for r in rows)]
