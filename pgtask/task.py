"""A claimed task, what the service writes of it (typed pending writes), and the registry of the
tasks in flight."""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass, field
from typing import ClassVar

from .output import Format


@dataclass
class Task:
    """A claimed row: what the executor needs, read once at claim time (frozen after PLAN)."""

    id: int
    attempt: int
    lease: object
    group: str
    remote: str | None
    max: int
    user: str
    input: str
    timeout_ms: int
    header: bool
    string: bool
    null: str
    delimiter: str
    quote: str
    escape: str
    save: bool
    count: int
    live_s: float
    delete: bool
    repeats: bool = False  # repeat > 0: its finish inserts the next occurrence
    input_bytes: int | None = None  # the input's size; input is None when it is larger than inputs.INLINE
    now: object = None
    session_pid: int | None = None  # the claim started it on this idle session (claim.Claimer.claim_pass)
    by_pass: bool = False  # a claim pass wrote its finish, and claimed after it (completer.Completer.finish)
    waited: float | None = None  # seconds from its plan to its claim (the database's clock)
    claimed_at: float = field(default_factory=time.monotonic)  # the service's clock, for its run time
    stopped: bool = False  # a STOP cancelled it while it ran
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_rows(cls, names: list[str], rows) -> list[Task]:
        """Tasks from result rows (sequences) whose columns are ``names`` (a claim's: it returns more)."""
        keep = [(i, name) for i, name in enumerate(names) if name in cls.__dataclass_fields__ and name != "extra"]
        return [cls(**{name: row[i] for i, name in keep}) for row in rows]

    @classmethod
    def from_row(cls, row: dict) -> Task:
        """A Task from one result row as a dict (see from_rows)."""
        return cls.from_rows(list(row), [list(row.values())])[0]

    @property
    def fence(self) -> dict:
        return {"id": self.id, "attempt": self.attempt, "lease": self.lease}

    def deleted_by(self, output: str | None, error: str | None) -> bool:
        """Whether the finish of (output, error) deletes the row: the manual's delete, for a task
        that ended with neither."""
        return self.delete and output is None and error is None

    def hold_input(self, text: str) -> None:
        """Its input, left out of its claim (larger than inputs.INLINE), read just before it runs."""
        self.input = text

    def drop_input(self) -> None:
        """Its run is over: the input read for it is let go (its row still has it)."""
        self.input = None

    @property
    def keeps_session(self) -> bool:
        """Whether the task's session may run the group's next task after it (count/live)."""
        return self.max >= 0 and (self.count > 0 or self.live_s > 0)

    def format(self) -> Format:
        return output_format(self.delimiter, self.quote, self.escape, self.null, self.header, self.string)


@functools.lru_cache(maxsize=256)
def output_format(delimiter: str, quote: str, escape: str, null: str, header: bool, string: bool) -> Format:
    """A task's output format (immutable: one for all tasks formatting alike)."""
    return Format(delimiter=delimiter, quote=quote, escape=escape, null=null, header=header, string=string)


class NotStarted(Exception):
    """The task's start was not confirmed (its lease was lost): its input was not sent."""


@dataclass(eq=False)
class Write:
    """One task's write waiting for its group commit (completer.py): ``done`` resolves to whether
    its row was written (its lease still held). ``KIND``: how the flush statement names its rows
    (see "flush" in queries.sql)."""

    KIND: ClassVar[str] = ""
    task: Task
    done: asyncio.Future


@dataclass(eq=False)
class StartWrite(Write):
    """TAKE -> WORK on the backend ``pid``."""

    KIND: ClassVar[str] = "w"
    pid: int = 0


@dataclass(eq=False)
class FinishWrite(Write):
    """DONE/FAIL with ``output`` and ``error`` (a STOP row stays STOP)."""

    KIND: ClassVar[str] = "f"
    output: str | None = None
    error: str | None = None

    @property
    def deletes(self) -> bool:
        return self.task.deleted_by(self.output, self.error)


class InFlight(dict):
    """The tasks running here: task id -> (task, the connection its input runs on, or None while
    nothing of it can be cancelled there). The runner adds and detaches them; the completer ends
    them, once their finish is written (or lost)."""

    def add(self, task: Task, conn=None) -> None:
        """``task`` runs here: claimed, or its input about to run on ``conn``."""
        self[task.id] = (task, conn)

    def detach(self, task_id: int) -> None:
        """Nothing of the task runs on its connection any more (its input is over)."""
        if (entry := self.get(task_id)) is not None:
            self[task_id] = (entry[0], None)

    def end(self, task_id: int) -> None:
        """The task ended here: its group has room for another."""
        self.pop(task_id, None)


@dataclass
class Lifecycle:
    """Where one scheduler is in its life, read by all its parts: ``draining`` (SIGTERM: no more
    claims, running tasks finish within the grace period), ``stopping`` (closing); ``wake`` wakes
    its claim loop (a notification, a slot freed, finishes for a claim pass to write)."""

    draining: bool = False
    stopping: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def drain(self) -> None:
        """SIGTERM: no more claims; the claim loop is woken to see it."""
        self.draining = True
        self.wake.set()

    def stop(self) -> None:
        """Closing: every loop of the scheduler ends."""
        self.stopping = True

    async def sleep(self, timeout: float) -> None:
        """The claim loop's wait: ``timeout`` seconds at most, or until woken."""
        if timeout > 0:
            try:
                await asyncio.wait_for(self.wake.wait(), timeout)
            except TimeoutError:
                pass
        self.wake.clear()
