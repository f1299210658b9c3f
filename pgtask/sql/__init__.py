"""Named SQL: each ``*.sql`` file here holds queries headed ``-- name --``; load them by name."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^-- ([a-z_]+) --$", re.M)


@cache
def queries(filename: str) -> dict[str, str]:
    text = resources.files(__package__).joinpath(filename).read_text()
    parts = _HEADER.split(text)
    out: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in out:
            raise ValueError(f"{filename}: query {name} defined twice")
        out[name] = body.strip()
    return out


def query(filename: str, name: str) -> str:
    return queries(filename)[name]
