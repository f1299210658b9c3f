"""Named SQL: each ``*.sql`` file here holds queries headed ``-- name --``; load them by name."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)
# {@name}, {@file.sql:name}: the text of the query ``name`` (of this file, or of another one here)
# goes there -- a part several queries share, written once -- before the text is rendered: the
# service and the notebooks (pgtask.patterns.render) fill in the same placeholders in the whole,
# one dialect (placeholders.py). {@name a=b c=d}: a variant of ``name`` (of this file) -- wherever
# it, or a part within it, includes ``a``, ``b`` goes there instead: a statement and its variant
# are written once.
INCLUDE = re.compile(r"\{@(?:([a-z_]+\.sql):)?([a-z_]+)((?: [a-z_]+=[a-z_]+)*)\}")


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

    def expand(name: str, within: tuple[str, ...], swaps: dict[str, str], used: set[str]) -> str:
        def part(m: re.Match) -> str:
            other, included, swapping = m.group(1), m.group(2), swaps_of(m, f"{filename}: {name}")
            if other is not None:  # another file's (read, and its own includes filled in, on its own)
                return include(other, included, f"{filename}: {name}")
            for new in (included, *swapping.values()):
                if new not in raw:
                    raise ValueError(f"{filename}: {name} includes {new}, which is not defined")
            if included in swaps:
                used.add(included)
                included = swaps[included]
            if included in within:
                raise ValueError(f"{filename}: {name} includes itself through {included}")
            inner_used: set[str] = set()
            text = expand(included, (*within, included), {**swapping, **swaps}, inner_used)
            unused = set(swapping) - inner_used
            if unused:
                raise ValueError(f"{filename}: {name} swaps {', '.join(sorted(unused))}, which "
                                 f"{included} does not include")
            used.update(inner_used - set(swapping))
            return text
        return INCLUDE.sub(part, raw[name])

    return {name: expand(name, (name,), {}, set()) for name in raw}


def swaps_of(m: re.Match, where: str) -> dict[str, str]:
    """An include's swaps ({@name a=b}: a -> b); only within one file."""
    pairs = [pair.split("=") for pair in m.group(3).split()]
    swapping = dict(pairs)
    if len(swapping) < len(pairs):
        twice = sorted({a for a, _ in pairs if sum(x == a for x, _ in pairs) > 1})
        raise ValueError(f"{where} swaps {', '.join(twice)} twice in one include")
    if swapping and m.group(1) is not None:
        raise ValueError(f"{where} includes {m.group(1)}:{m.group(2)} with swaps: a swap is of a part "
                         f"of the same file")
    return swapping


def include(filename: str, name: str, where: str) -> str:
    """The query ``name`` of ``filename`` for an include in ``where`` (a file and query, for the error)."""
    try:
        found = queries(filename).get(name)
    except FileNotFoundError:
        raise ValueError(f"{where} includes {filename}:{name}, and there is no {filename}") from None
    if found is None:
        raise ValueError(f"{where} includes {filename}:{name}, which is not defined")
    return found


def query(filename: str, name: str) -> str:
    return queries(filename)[name]
