"""Connection slots: how many executor sessions one scheduler's pool may have open at once.

PostgreSQL refuses a connection beyond ``max_connections`` (SQLSTATE 53300: "sorry, too many
clients already", "remaining connection slots are reserved ..."), and then every other client is
refused too. A pool keeps its sessions under a cap -- ``[pgtask] max_sessions``, or one derived from
the server (see derived_cap) -- and a session the server refuses for want of a slot means that the
task never ran: it waits for a slot (session_pool.SessionPool), it does not fail.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Awaitable, Callable

# The derived cap leaves this share of the usable slots (at least HEADROOM_MIN) to other clients.
HEADROOM_SHARE = 10
HEADROOM_MIN = 3

# The server's words for a connection refused for want of a slot (SQLSTATE 53300, which libpq does
# not report for a failed connection): its whole slots, the reserved ones, a role's or a database's
# CONNECTION LIMIT. Matched in English (lc_messages); refused in another language, the task fails as
# for any other refused connection.
REFUSALS = ("too many clients already", "remaining connection slots are reserved",
            "too many connections for role", "too many connections for database")


def refused_for_slots(exc: BaseException) -> bool:
    """Whether a failed connect is the server refusing it for want of a connection slot."""
    text = str(exc)
    return any(words in text for words in REFUSALS)


def derived_cap(usable: int, connected: int, own: int) -> int:
    """The sessions a pool may have open: the ``usable`` slots (max_connections less the reserved
    ones) less the headroom left to other clients and less what others hold (``connected`` client
    backends, ``own`` of them the pool's). At least one: a pool with none open still tries, and
    waits when refused."""
    headroom = max(HEADROOM_MIN, usable // HEADROOM_SHARE)
    return max(1, usable - headroom - (connected - own))


class Slots:
    """A pool's sessions against its cap, and the pause after the server refused one.

    A derived cap is derived again, before a session is opened, once it is EVERY seconds old (what
    others hold changes); a refusal holds every open of the pool for HOLD_FIRST seconds, doubling up
    to HOLD_CAP while refusals go on (with jitter), back to HOLD_FIRST once a session opens.
    """

    EVERY = 1.0
    HOLD_FIRST = 0.05
    HOLD_CAP = 2.0

    def __init__(self, fixed: int = 0, derive: Callable[[], Awaitable[tuple[int, int]]] | None = None):
        self.fixed, self.derive = fixed, derive
        self.cap: int | None = fixed if fixed > 0 else None  # None: none derived (yet)
        self.derived_at = -float("inf")
        self.held_until = 0.0  # loop time before which no session is opened (a refusal)
        self.hold = self.HOLD_FIRST
        self.live: weakref.WeakSet = weakref.WeakSet()  # the pool's sessions (closed ones count no more)

    def opened(self) -> int:
        return sum(1 for session in self.live if not session.conn.closed)

    def stale(self, now: float) -> bool:
        return self.fixed <= 0 and self.derive is not None and now - self.derived_at >= self.EVERY

    async def refresh(self, now: float) -> None:
        """Derive the cap again (the caller handles a failed query: the cap stays)."""
        self.derived_at = now
        usable, connected = await self.derive()
        self.cap = derived_cap(usable, connected, self.opened())

    def room(self, connecting: int, now: float) -> bool:
        """Whether one more session may be opened beside ``connecting`` being opened."""
        return now >= self.held_until and (self.cap is None or self.opened() + connecting < self.cap)

    def refused(self, now: float) -> float:
        """The server refused a session: no open for a while; returns how long."""
        delay = self.hold * (0.5 + random.random() / 2)
        self.held_until = max(self.held_until, now + delay)
        self.hold = min(self.hold * 2, self.HOLD_CAP)
        return delay

    def admitted(self, session: object) -> None:
        """A session opened: it holds a slot until it is closed."""
        self.live.add(session)
        self.hold = self.HOLD_FIRST

    def recheck_in(self, now: float) -> float:
        """When to look again for room for tasks waiting on the cap (no session may end meanwhile)."""
        return self.held_until - now if self.held_until > now else self.EVERY

