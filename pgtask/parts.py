"""What one scheduler's claim loop, runner and completer share (scheduler.Scheduler builds it once):
its task table, its settings, its statements, the tasks in flight, its lifecycle, its metrics, the
task authors' sessions and the writers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

    from .config import Entry
    from .session_pool import SessionPool
    from .metrics import Sink
    from .queries import Queries
    from .scheduler import Options
    from .task import InFlight, Lifecycle


@dataclass(frozen=True, slots=True)
class Parts:
    """``conninfo``: the scheduler's own connections' (control, writers, large inputs); ``writers``:
    the pool of the writes (opened by Scheduler.start); ``label``: the entry's, for the log."""

    entry: Entry
    conninfo: str
    options: Options
    queries: Queries
    inflight: InFlight
    life: Lifecycle
    metrics: Sink
    sessions: SessionPool
    writers: AsyncConnectionPool
    label: str
