"""The service's SQL: the named statements of sql/queries.sql rendered for one task table, prepared
on the connections that run them, and the text of the statements sent as text (the claim pass, the
count/live claim, the statistics). The other modules of the scheduler load their SQL by name from
sql/*.sql and write none themselves, but for the short list of exceptions docs/architecture.md
names (a statement built from a task's values, such as remote.preamble)."""

from __future__ import annotations

import weakref
from typing import NamedTuple

import psycopg
from psycopg import errors, pq, sql
from psycopg.adapt import PyFormat, Transformer

from . import wire
from . import sql as named
from .inputs import INLINE
from .sql import placeholders
from .task import FinishWrite, Task

# An input larger than inputs.INLINE is left out (octet_length reads a TOASTed value's size without
# detoasting it): it is read when its budget allows (inputs.Held, runner.Runner.read_input).
TASK_COLUMNS = f"""t."id", t."attempt", t."lease", t."group", t."remote", t."max", t."user",
    CASE WHEN octet_length(t."input") <= {INLINE} THEN t."input" END AS input,
    octet_length(t."input") AS input_bytes, t."repeat" > '0 sec' AS repeats,
    least(round(extract(epoch FROM t."timeout")) * 1000, 2147483647)::int4 AS timeout_ms, t."header", t."string", t."null",
    t."delimiter"::text AS delimiter, t."quote"::text AS quote, t."escape"::text AS escape, t."save",
    t."count", extract(epoch FROM t."live")::float8 AS live_s, t."delete", statement_timestamp() AS now,
    extract(epoch FROM statement_timestamp() - t."plan")::float8 AS waited"""


# How the service's own statements on the task table are planned, and the settings of the control
# connection and of the writers, which include it (why each: sql/connections.sql).
PLANNER_SETTINGS = named.query("connections.sql", "planner")
CONTROL_SETTINGS = named.query("connections.sql", "control")
WRITER_SETTINGS = named.query("connections.sql", "writers")

# The claim pass's statements, PREPAREd on the control connection ($n: the parameters in this order);
# its claim lock (a LOCK TABLE) is sent as text.
CLAIM_PARAMS = ("token", "oid", "limit", "offer_pid", "offer_id")
PASS_STATEMENTS = {"expire": (), "claim": CLAIM_PARAMS, "next": (), "claim_plain": CLAIM_PARAMS, "next_plain": ()}


def pass_claim(limited: bool) -> tuple[str, str]:
    """The claim pass's claim and next: "claim" and "next" while some group is paused or
    rate-limited (``limited``: the last pass found one), else their plain variants (see "claim_plain")."""
    return ("claim", "next") if limited else ("claim_plain", "next_plain")


class NextInfo(NamedTuple):
    """The row of "next" (queries.sql), its columns in the order of that SELECT: what the claim
    pass learns of the queue and the server besides its claim."""

    next_in: float | None  # seconds until the next planned row or token (None: none)
    due: bool | None  # due rows wait (blocked by max, a pause or a rate)
    settings_mark: int  # the database and role settings' fingerprint (see "settings_mark")
    table_oid: int | None  # the table's oid now (see "same_table")
    limited: bool  # some group is paused or rate-limited
    conf_loaded: object  # pg_conf_load_time()
    error_verbosity: str  # the error style in force (output.ErrorStyle)
    min_error_statement: str

    @property
    def style(self) -> tuple[str, str]:
        return self.error_verbosity, self.min_error_statement


class PassResult(NamedTuple):
    """What one claim pass's query string returned (see Queries.claim_pass_text, read_pass):
    ``written``, the (kind, id) rows its finishes wrote (None: it carried none); ``expired``, the
    rows expire made GONE (None: it did not expire); ``tasks``, the tasks it claimed; ``next``."""

    written: set[tuple[str, int]] | None
    expired: int | None
    tasks: list[Task]
    next: NextInfo


def read_pass(results: list[pq.abc.PGresult], loader: Transformer, finishes: bool, expiring: bool,
              claim: bool) -> PassResult:
    """The results with rows of a claim pass's query string, in the order claim_pass_text sends its
    statements: the finishes' flush, expire, the claim, next (the SETs and the lock return none)."""
    at = 0
    written = expired = None
    if finishes:
        written, at = matched(results[at:at + 1]), at + 1
    if expiring:
        expired, at = results[at].ntuples, at + 1
    tasks: list[Task] = []
    if claim:
        res = results[at]
        loader.set_pgresult(res)
        names = [res.fname(i).decode() for i in range(res.nfields)]
        tasks = Task.from_rows(names, loader.load_rows(0, res.ntuples, tuple))
        at += 1
    loader.set_pgresult(results[at])
    return PassResult(written, expired, tasks, loader.load_row(0, NextInfo._make))


# the statistics looked at before claiming starts (see planning.Planning.check_statistics)
STATISTICS_PARAMS = ("oid", "bound")
# claim_next's, for a session reusing its executor (count/live): see control.Control.next_of_group
CLAIM_NEXT_PARAMS = ("token", "oid", "group", "remote", "user", "max", "done", "born")


# The flushes' parameters, in the order of their prepared statements' $n: "flush", and
# "flush_finish" for a batch of finishes none of which repeats (see queries.sql).
FINISH_PARAMS = ("f_id", "f_attempt", "f_lease", "f_output", "f_error")
FLUSH_PARAMS = ("w_id", "w_attempt", "w_lease", "w_pid", *FINISH_PARAMS, "sync")

# Every statement the service PREPAREs (as pgtask_<name>), with its parameters in $n order.
PREPARED: dict[str, tuple[str, ...]] = {**PASS_STATEMENTS, "statistics": STATISTICS_PARAMS,
                                        "claim_next": CLAIM_NEXT_PARAMS, "flush": FLUSH_PARAMS,
                                        "flush_finish": FINISH_PARAMS}


def dump(tx: Transformer, names: tuple[str, ...], params: dict) -> list[bytes]:
    """The flush parameters ``names`` of ``params`` in text, as psycopg writes them for the
    connection of ``tx`` (in its client encoding: a database need not be UTF8)."""
    return [v.encode() if isinstance(v, str) else bytes(tx.get_dumper(v, PyFormat.TEXT).dump(v))
            for v in (params[n] for n in names)]


def matched(results: list[pq.abc.PGresult]) -> set[tuple[str, int]]:
    """The (kind, id) rows a flush statement returned: what it wrote (see "flush" in queries.sql)."""
    return {(res.get_value(i, 0).decode(), int(res.get_value(i, 1))) for res in results for i in range(res.ntuples)}



def render_query(name: str, schema: str, table: str, copy_columns: str = "") -> str:
    """The named query of queries.sql for the task table ``schema``.``table``; ``copy_columns``: the
    columns a repeat copies (see "columns")."""
    cols_t = ", ".join(f"t.{c.strip()}" for c in copy_columns.split(",")) if copy_columns else ""
    return placeholders.render(named.query("queries.sql", name), schema, table, extra={
        "task_columns": sql.SQL(TASK_COLUMNS), "copy_columns": sql.SQL(copy_columns),
        "copy_columns_t": sql.SQL(cols_t)}).as_string(None)


def numbered(text: str, params: tuple[str, ...]) -> str:
    """A named query's text with its %(param)s as $1, $2, ... in the order of ``params``: the text of
    a statement to PREPARE."""
    for i, param in enumerate(params, 1):
        text = text.replace(f"%({param})s", f"${i}")
    return text


def _int_array(values) -> str:
    """An array literal of integers, for a statement's text (the claim pass's EXECUTEs)."""
    return "'{" + ",".join(str(int(v)) for v in values) + "}'"


def finish_arrays(finishes: list) -> dict[str, list]:
    """FINISH_PARAMS of pending finishes (task.FinishWrite)."""
    return {"f_id": [w.task.id for w in finishes], "f_attempt": [w.task.attempt for w in finishes],
            "f_lease": [w.task.lease for w in finishes], "f_output": [w.output for w in finishes],
            "f_error": [w.error for w in finishes]}


def flush_params(works: list, finishes: list) -> dict:
    """The parameters of "flush"/"flush_finish": pending starts (task.StartWrite) and finishes."""
    return {
        "w_id": [w.task.id for w in works], "w_attempt": [w.task.attempt for w in works],
        "w_lease": [w.task.lease for w in works], "w_pid": [w.pid for w in works],
        **finish_arrays(finishes),
        # Only TAKE -> WORK: no need to wait for the WAL flush. Lost in a server crash, the rows
        # are TAKE again (reset, run again -- as for a crash mid-run); nothing of the input is
        # durable before this (its own commits flush the WAL up to it).
        "sync": "on" if finishes else "off"}


# About a remote task's author, asked in the local database before connecting (remote.py's password rule).
LOCAL_FACTS = named.query("session.sql", "remote_author")


class Queries:
    """The statements of one task table. ``oid``: the table's; ``copy_columns``: the columns a
    repeat copies (see "columns"); ``plans``: the claim pass's planning round, which the prepared
    statements of the pass and the flushes are prepared for (see claim.Claimer.claim_pass)."""

    def __init__(self, schema: str, table: str):
        self.schema, self.table = schema, table
        self.ident = sql.Identifier(schema, table)
        self.oid = 0
        self.copy_columns = ""
        self.plans = 0
        self._texts: dict[str, str] = {}
        # connection -> {statement name: what it was prepared for}: see prepare
        self.prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def next_planning_round(self) -> None:
        """Have the pass's and the flushes' statements prepared again (see planning.Planning)."""
        self.plans += 1

    def take_up(self, oid: int) -> None:
        """The task table is ``oid`` (provisioned: see Scheduler.provision)."""
        self.oid = oid

    def text(self, name: str) -> str:
        """A named query of queries.sql for this table, rendered once (psycopg then caches its parse)."""
        if name not in self._texts:
            self._texts[name] = render_query(name, self.schema, self.table, self.copy_columns)
        return self._texts[name]

    def forget(self) -> None:
        """Render every statement again (the table was created again: see Scheduler.adopt_table)."""
        self._texts.clear()

    async def refresh_columns(self, conn: psycopg.AsyncConnection) -> None:
        cur = conn.cursor(row_factory=psycopg.rows.tuple_row)
        await cur.execute(self.text("columns"), {"oid": self.oid})
        cols = (await cur.fetchone())[0] or ""
        if cols != self.copy_columns:
            self.copy_columns = cols
            self._texts.clear()

    async def prepare(self, conn: psycopg.AsyncConnection, name: str, version: object) -> None:
        """Have the named query ``name`` prepared on ``conn`` as pgtask_<name> (its %(param)s as $n, in
        the order PREPARED gives), for ``version``: prepared again when that changed (a new column
        set for the flush, a new planning round: see claim.Claimer.claim_pass), once per connection otherwise.
        The connections they live on (control, writers) have psycopg's own automatic preparation
        off (prepare_threshold=None): once psycopg has prepared a statement on a connection, it
        sends DEALLOCATE ALL there after any rolled-back transaction, which dropped these too."""
        have = self.prepared.setdefault(conn, {})
        if name in have and have[name] == version:
            return
        ident = sql.Identifier(f"pgtask_{name}")
        if name in have:
            await conn.execute(sql.SQL("DEALLOCATE {}").format(ident))
            del have[name]
        await conn.execute(sql.SQL("PREPARE {} AS ").format(ident) + sql.SQL(numbered(self.text(name), PREPARED[name])))
        have[name] = version

    def flush_version(self) -> tuple[str, int]:
        """What a flush statement is prepared for (see prepare): the columns a repeat copies, and
        the claim pass's planning round (planned on a small table, a flush's generic plan went bad)."""
        return self.copy_columns, self.plans

    async def run_flush(self, conn: psycopg.AsyncConnection, name: str, params: dict) -> set[tuple[str, int]]:
        """A flush statement (``name``: "flush" or "flush_finish") on a writer, prepared once per
        connection (and per column set), its parameters sent as text and its rows read from libpq:
        half the service's CPU of psycopg's execute. Returns the (kind, id) rows; a failure raises
        the psycopg error."""
        await self.prepare(conn, name, self.flush_version())
        await wire.send_prepared(conn.pgconn, f"pgtask_{name}".encode(),
                                 dump(Transformer(conn), PREPARED[name], params))
        results, error = await wire.results(conn.pgconn)
        if error is not None:
            raise errors.error_from_result(error, encoding=conn.info.encoding)
        return matched(results)

    async def register(self, conn: psycopg.AsyncConnection, token: str) -> None:
        """The control backend ``conn`` under ``token``, in the instance table (see "register")."""
        await conn.execute(self.text("register"), {"token": token})

    async def unregister(self, conn: psycopg.AsyncConnection, token: str) -> None:
        await conn.execute(self.text("unregister"), {"token": token})

    async def reset(self, conn: psycopg.AsyncConnection) -> list:
        """The orphans reset (see "reset"; of the table the service knows, see "same_table"): their rows."""
        cur = await conn.execute(self.text("reset"), {"oid": self.oid})
        return await cur.fetchall()

    async def own(self, conn: psycopg.AsyncConnection, token: str) -> set[tuple[int, int, str]]:
        """The (id, attempt, lease) of the rows holding a slot under the claims of ``token`` (see "own")."""
        cur = await conn.execute(self.text("own"), {"token": token, "oid": self.oid})
        return {(r["id"], r["attempt"], r["lease"]) for r in await cur.fetchall()}

    async def reset_own(self, conn: psycopg.AsyncConnection, rows: set[tuple[int, int, str]]) -> list:
        """Rows (id, attempt, lease) of this instance's claims it does not run, reset (see "reset_own")."""
        ids, attempts, leases = zip(*sorted(rows)) if rows else ((), (), ())
        cur = await conn.execute(self.text("reset_own"), {"id": list(ids), "attempt": list(attempts),
                                                          "lease": list(leases)})
        return await cur.fetchall()

    async def read_input(self, conn: psycopg.AsyncConnection, fence: dict) -> str | None:
        """A claimed task's input (see "input"); None once its lease is lost."""
        cur = await conn.execute(self.text("input"), fence)
        row = await cur.fetchone()
        return None if row is None else row[0]

    async def statistics(self, conn: psycopg.AsyncConnection, bound: int):
        """The PLAN rows the statistics count and the rows due now, counted up to ``bound``
        (see "statistics"), prepared like the pass's statements."""
        await self.prepare(conn, "statistics", self.plans)
        cur = await conn.execute(f"EXECUTE pgtask_statistics({int(self.oid)}, {int(bound)})")
        return await cur.fetchone()

    async def analyze(self, conn: psycopg.AsyncConnection) -> None:
        await conn.execute(sql.SQL("ANALYZE (SKIP_LOCKED) {}").format(self.ident))

    async def prepare_pass(self, conn: psycopg.AsyncConnection, limited: bool) -> None:
        """The statements of a claim pass (see claim_pass_text), prepared for this planning round."""
        for name in ("expire", *pass_claim(limited)):
            await self.prepare(conn, name, self.plans)

    async def pass_finishes(self, conn: psycopg.AsyncConnection, loader: Transformer,
                            finishes: list[FinishWrite], slow: float) -> list[bytes]:
        """The claim pass's statements writing ``finishes``: the lean flush with its arrays as
        literals, after a lock_timeout of ``slow`` seconds for the pass's transaction, and a
        statement_timeout of ``slow`` for the flush alone (see claim.Claimer.claim_pass). Its
        generic plan, as on the writers (see WRITER_SETTINGS); the claim's statements keep the
        session's plan_cache_mode."""
        if not finishes:
            return []
        await self.prepare(conn, "flush_finish", self.flush_version())
        escape = pq.Escaping(conn.pgconn)
        values = dump(loader, FINISH_PARAMS, finish_arrays(finishes))
        args = b", ".join(escape.escape_literal(v) for v in values)
        slow_ms = b"%d" % int(slow * 1000)
        return [b"SET LOCAL lock_timeout = " + slow_ms, b"SET LOCAL plan_cache_mode = force_generic_plan",
                b"SET LOCAL statement_timeout = " + slow_ms, b"EXECUTE pgtask_flush_finish(" + args + b")",
                b"SET LOCAL statement_timeout = DEFAULT", b"SET LOCAL plan_cache_mode = DEFAULT"]

    def claim_pass_text(self, finishes: list[bytes], expiring: bool, claim: tuple | None,
                        limited: bool) -> bytes:
        """The claim pass's query string: BEGIN, [finishes,] [expire,] [claim lock, claim,] next,
        COMMIT. ``claim``: (token, limit, offered pids, offered task ids), or None for no claim; the
        claim is of the table ``oid`` names (see "same_table"). ``limited``: the last pass found a
        group paused or rate-limited (its claim and next, else the plain ones: see "claim_plain")."""
        claim_name, next_name = pass_claim(limited)
        text = [b"BEGIN", *finishes]
        if expiring:
            text.append(b"EXECUTE pgtask_expire")
        if claim is not None:
            token, limit, offer_pids, offer_ids = claim
            text.append(self.text("claim_lock").encode())
            text.append(f"EXECUTE pgtask_{claim_name}('{token}', {int(self.oid)}, {int(limit)}, "
                        f"{_int_array(offer_pids)}, {_int_array(offer_ids)})".encode())
        text.append(f"EXECUTE pgtask_{next_name}; COMMIT".encode())
        return b"; ".join(text)

    async def claim_next(self, conn: psycopg.AsyncConnection, values: dict):
        """The claim lock (as a claim pass takes it) and the claim of a group's next task for a
        session within count/live, in one round trip (see "claim_next"): its row, or None."""
        await self.prepare(conn, "claim_next", self.plans)
        values = {**values, "oid": self.oid}
        cur = await conn.execute(sql.Composed([
            sql.SQL(self.text("claim_lock") + "; EXECUTE pgtask_claim_next("),
            sql.SQL(", ").join(sql.Literal(values[name]) for name in CLAIM_NEXT_PARAMS), sql.SQL(")")]))
        cur.nextset()  # the lock's result first
        return await cur.fetchone()


async def connection_slots(conn: psycopg.AsyncConnection) -> tuple[int, int]:
    """(usable connection slots, client backends connected now): see "slots" in slots.sql."""
    cur = await conn.execute(named.query("slots.sql", "slots"))
    usable, connected = await cur.fetchone()
    return usable, connected


async def ping(conn: psycopg.AsyncConnection) -> None:
    await conn.execute("SELECT 1")


async def local_facts(conn: psycopg.AsyncConnection, user: str) -> tuple[bool, str]:
    """(is ``user`` a superuser, the database's encoding): see LOCAL_FACTS."""
    cur = await conn.execute(LOCAL_FACTS, (user,))
    superuser, encoding = await cur.fetchone()
    return bool(superuser), encoding
