"""Named SQL: each ``*.sql`` file here holds queries headed ``-- name --``; load them by name."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)
# {@name}: the text of the file's query ``name`` goes there (a part several queries share, written
# once), before any renderer sees the text -- the service's (psycopg.sql) and the notebooks'
# (pgtask.patterns.render) fill in the same placeholders in the whole.
_INCLUDE = re.compile(r"\{@([a-z_]+)\}")


@cache
def queries(filename: str) -> dict[str, str]:
    return parse(resources.files(__package__).joinpath(filename).read_text(), filename)


def parse(text: str, filename: str = "<text>") -> dict[str, str]:
    """The queries of one file's text by name, each with its includes filled in."""
    parts = _HEADER.split(text)
    raw: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in raw:
            raise ValueError(f"{filename}: query {name} defined twice")
        raw[name] = body.strip()

    def expand(name: str, within: tuple[str, ...]) -> str:
        def part(m: re.Match) -> str:
            if m.group(1) not in raw:
                raise ValueError(f"{filename}: {name} includes {m.group(1)}, which is not defined")
            if m.group(1) in within:
                raise ValueError(f"{filename}: {name} includes itself through {m.group(1)}")
            return expand(m.group(1), (*within, m.group(1)))
        return _INCLUDE.sub(part, raw[name])

    return {name: expand(name, (name,)) for name in raw}


def query(filename: str, name: str) -> str:
    return queries(filename)[name]
