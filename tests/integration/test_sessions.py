"""The executor session pool: sessions of a role are reused across bursts larger than the idle
cap, the idle ones beyond it are closed once they have been idle a while, and only a few are
being opened at once (a burst of short tasks runs on the sessions that end meanwhile)."""

import asyncio
import os
import select

import psycopg
import pytest
import uvloop
from psycopg.conninfo import conninfo_to_dict
from support import sessions_reset_and_idle, wait_for, wait_for_async

from pgtask import wire
from pgtask.config import ConfigError, from_dict
from pgtask.connect import group_settings
from pgtask.session_pool import SessionPool


@pytest.mark.quick
def test_a_burst_beyond_the_idle_cap_reuses_its_sessions(db, service):
    """40 tasks at once (the pool keeps 32 idle sessions a role without a time limit): the next
    burst runs on the same 40 backends, none is opened again. (Each task sleeps long enough for
    all 40 sessions to be opened, four at a time, before the first ends.)"""
    def burst() -> set[int]:
        ids = [db.insert("SELECT pg_backend_pid(), pg_sleep(1)", group=f"g{i}", header=False) for i in range(40)]
        return {int(db.wait_state(i)["output"].split("\t")[0]) for i in ids}

    first = burst()
    assert len(first) == 40
    wait_for(lambda: sessions_reset_and_idle(db, "application_name LIKE 'pg_task public task g%%'") == 40,
             message="the 40 sessions to be idle and reset")
    assert burst() == first


def test_idle_sessions_beyond_the_cap_are_closed_after_a_while(db, monkeypatch):
    monkeypatch.setattr(SessionPool, "IDLE_TRIM", 0.3)
    user = db.value("SELECT current_user")

    async def go() -> tuple[list[int], list[int]]:
        pool = SessionPool(db.dsn, user, "login", idle_per_user=2)
        try:
            sessions = [await pool.get(user) for _ in range(5)]
            for s in sessions:
                await pool.put(s)
            assert len(pool.idle[user]) == 5  # all kept for now
            await wait_for_async(lambda: len(pool.idle[user]) <= 2, interval=0.05,
                                 message="the idle sessions beyond the cap to be closed")
            return [s.pid for s in sessions], [s.pid for s in pool.idle[user]]
        finally:
            await pool.close()

    opened, kept = asyncio.run(go())
    assert kept == opened[-2:]  # the two used last stay
    wait_for(lambda: db.value("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (opened[:3],)) == 0,
             message="the trimmed sessions' backends to end")


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_a_query_whose_backend_ends_with_input_unread_fails_as_lost(db, run):
    """A backend that ends with bytes of ours it never read leaves the socket in error: the query
    waiting on it, whose loop sees the backend's last message, the error and the hang-up at once
    (POLLIN | POLLERR | POLLHUP), fails as a lost connection instead of waiting for ever, on
    either event loop. (A uvloop reader kept registered across round trips never woke here.)"""
    user = db.value("SELECT current_user")

    async def go() -> None:
        pool = SessionPool(db.dsn, user, "login")
        session = await pool.get(user)
        try:
            running = asyncio.ensure_future(wire.simple(session.pgconn, "SELECT pg_sleep(60)"))
            await wait_for_async(lambda: db.value("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                                                  (session.pid,)) == "PgSleep", message="the sleep")
            os.write(session.pgconn.socket, b"Q")  # left unread: the backend is sleeping
            db.execute("SELECT pg_terminate_backend(%s)", (session.pid,))
            # the loop looks at the socket again only once it is in error: the backend's last
            # message, the error and the hang-up come to it as one event
            sock = select.poll()
            sock.register(session.pgconn.socket, select.POLLIN)
            wait_for(lambda: any(ev & select.POLLERR for _, ev in sock.poll(0)), message="the socket in error")
            with pytest.raises(psycopg.OperationalError):  # raised, or an error result of a lost connection
                wire.raise_if_lost(await asyncio.wait_for(running, 10), session.pgconn)
        finally:
            await pool.retire(session)
            await pool.close()

    run(go())


def test_a_session_opens_with_its_settings_after_the_services_own_options():
    pool = SessionPool("host=/run/x dbname=d options='-c work_mem=7MB'", "svc", "login")
    info = conninfo_to_dict(pool.session_conninfo(group_settings("it's a \\ g", "public", "task", 5), "alice"))
    assert (info["user"], info["dbname"]) == ("alice", "d")
    assert info["application_name"] == "pg_task public task it's a \\ g"
    assert info["options"] == ("-c work_mem=7MB -c pg_task.group=it's\\ a\\ \\\\\\ g "
                               "-c pg_task.schema=public -c pg_task.table=task -c pg_task.oid=5")


def test_a_burst_of_short_tasks_in_many_groups_runs_on_few_backends(db, service):
    """200 trivial tasks in 200 groups, claimed at once: they run on the sessions that end while
    the first few are being opened, not on a backend each."""
    db.execute("INSERT INTO task (\"group\", input) SELECT 'g' || i, 'SELECT 1' FROM generate_series(1, 200) i")
    wait_for(lambda: db.value("SELECT count(*) FROM task WHERE state IN ('DONE', 'FAIL')") == 200,
             message="the 200 tasks to finish")
    assert db.value("SELECT count(*) FROM task WHERE state <> 'DONE'") == 0
    backends = db.value("SELECT count(DISTINCT pid) FROM task")
    assert backends <= 100, f"{backends} backends for 200 short tasks"


@pytest.mark.quick
def test_tasks_that_wait_for_each_other_each_get_a_session(db, service):
    """Opening few sessions at a time never caps how many run at once: 12 tasks in 12 groups that
    only end once all 12 are running (each holds a shared advisory lock and waits for the other
    11's) all end DONE, on 12 backends."""
    barrier = """DO $$ BEGIN
        PERFORM pg_advisory_lock_shared(4242);
        WHILE (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND granted) < 12 LOOP
            PERFORM pg_sleep(0.01);
        END LOOP;
    END $$; SELECT pg_backend_pid()"""
    db.execute("INSERT INTO task (\"group\", input, timeout, header) "
               "SELECT 'g' || i, %s, '30 s', false FROM generate_series(1, 12) i", (barrier,))
    wait_for(lambda: db.value("SELECT count(*) FROM task WHERE state IN ('DONE', 'FAIL')") == 12,
             timeout=40, message="the 12 tasks to finish")
    assert db.execute("SELECT state, error FROM task WHERE state <> 'DONE'") == []
    assert db.value("SELECT count(DISTINCT output) FROM task") == 12


def test_sessions_are_opened_a_few_at_a_time_and_the_waiting_take_those_put_back(db, monkeypatch):
    """connecting = 2: six sessions wanted at once are opened two at a time; with connecting = 1,
    a task waiting behind a slow connect takes a session put back meanwhile, a waiter that is
    cancelled leaves no trace, and the slot is free again after the slow connect."""
    user = db.value("SELECT current_user")
    real = psycopg.AsyncConnection.connect
    opening = peak = 0
    gate = asyncio.Event()

    async def connect(*args, **kwargs):
        nonlocal opening, peak
        opening += 1
        peak = max(peak, opening)
        try:
            await gate.wait()
            return await real(*args, **kwargs)
        finally:
            opening -= 1

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", connect)

    async def few_at_a_time() -> None:
        gate.set()
        pool = SessionPool(db.dsn, user, "login", connecting=2)
        sessions = []
        try:
            sessions = await asyncio.gather(*(pool.get(user) for _ in range(6)))
            assert len({s.pid for s in sessions}) == 6
            assert peak == 2
            assert (pool.connecting, len(pool.waiting)) == (0, 0)
        finally:
            for s in sessions:
                await s.conn.close()
            await pool.close()

    async def handed_over() -> None:
        pool = SessionPool(db.dsn, user, "login", connecting=1)
        try:
            first = await pool.get(user)
            gate.clear()
            slow = asyncio.create_task(pool.get(user))  # takes the one slot; its connect is held
            await wait_for_async(lambda: opening == 1, message="the slow connect to start")
            waiting = asyncio.create_task(pool.get(user))
            await wait_for_async(lambda: len(pool.waiting) == 1, message="the second get to wait")
            await pool.put(first)
            assert (await waiting) is first  # handed over, while the slow connect still runs
            assert not slow.done()
            cancelled = asyncio.create_task(pool.get(user))
            await wait_for_async(lambda: len(pool.waiting) == 1, message="the third get to wait")
            cancelled.cancel()
            await asyncio.gather(cancelled, return_exceptions=True)
            assert len(pool.waiting) == 0
            gate.set()
            second = await slow
            assert second.pid != first.pid
            assert pool.connecting == 0
            third = await asyncio.wait_for(pool.get(user), 10)  # the slot is free: opened at once
            assert third.pid not in (first.pid, second.pid)
            for s in (first, second, third):
                await s.conn.close()
        finally:
            await pool.close()

    asyncio.run(few_at_a_time())
    asyncio.run(handed_over())


@pytest.mark.parametrize(("value", "message"), [(0, "must be >= 1, got 0"), ("4", "expected int, got '4'")])
def test_a_wrong_connecting_is_refused_naming_the_key(value, message):
    with pytest.raises(ConfigError, match=f"^pgtask.connecting: {message}$"):
        from_dict({"pgtask": {"connecting": value}})
    assert from_dict({"pgtask": {"connecting": 2}}).svc("connecting") == 2
    assert from_dict({}).svc("connecting") == 4
