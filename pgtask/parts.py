"""What one scheduler's claim loop, runner and completer share (scheduler.Scheduler builds it once):
its task table, its settings, its statements, the tasks in flight, its lifecycle, its metrics, the
task authors' sessions and the writers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .config import SERVICE_KEYS
from .inputs import Budget
from .metrics import NO_METRICS, Sink

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

    from .config import Entry
    from .queries import Queries
    from .session_pool import SessionPool
    from .task import InFlight, Lifecycle


@dataclass
class Options:
    sleep: float          # seconds: the poll floor (pg_task.sleep)
    run: int              # tasks in flight at most (pg_task.run)
    limit: int            # rows per claim (pg_task.limit)
    reset_check: float    # seconds between orphan checks
    output_limit: int
    execute_as: str
    grace: float
    connecting: int = 4   # executor sessions being opened at once, at most (SessionPool)
    max_sessions: int = 0  # executor sessions open at once, at most; 0: derived from the server (slots.py)
    remote_attempts: int = 6  # connections a remote task tries while each fails before its input is sent
    remote_backoff: float = 1.0  # seconds before the second of them, doubling (see runner.RemoteTarget.again)
    # the process's budget for large inputs (shared by its schedulers: see inputs.py)
    inputs: Budget = field(default_factory=lambda: Budget(SERVICE_KEYS["input_budget"][1]))
    # config.MAINTENANCE_KEYS; None: no maintenance in this process (a worker: supervisor.Workers)
    maintenance: dict[str, Any] | None = field(default_factory=dict)
    metrics: Sink = NO_METRICS  # what it reports (pgtask/metrics.py)


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
