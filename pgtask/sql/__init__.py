"""Named SQL: each ``*.sql`` file here holds queries headed ``-- name --``; load them by name."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)
# {@name}, {@file.sql:name}: the text of the query ``name`` (of this file, or of another one here)
# goes there -- a part several queries share, written once -- before any renderer sees the text:
# the service's (psycopg.sql) and the notebooks' (pgtask.patterns.render) fill in the same
# placeholders in the whole.
INCLUDE = re.compile(r"\{@(?:([a-z_]+\.sql):)?([a-z_]+)\}")


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
            other, included = m.groups()
            if other is not None:  # another file's (read, and its own includes filled in, on its own)
                return include(other, included, f"{filename}: {name}")
            if included not in raw:
                raise ValueError(f"{filename}: {name} includes {included}, which is not defined")
            if included in within:
                raise ValueError(f"{filename}: {name} includes itself through {included}")
            return expand(included, (*within, included))
        return INCLUDE.sub(part, raw[name])

    return {name: expand(name, (name,)) for name in raw}


def include(filename: str, name: str, where: str) -> str:
    """The query ``name`` of ``filename`` for an include in ``where`` (a file and query, for the error)."""
    found = queries(filename).get(name)
    if found is None:
        raise ValueError(f"{where} includes {filename}:{name}, which is not defined")
    return found


def query(filename: str, name: str) -> str:
    return queries(filename)[name]
