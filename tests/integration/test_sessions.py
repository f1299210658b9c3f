"""The executor session pool: sessions of a role are reused across bursts larger than the idle
cap, and the idle ones beyond it are closed once they have been idle a while."""

import asyncio

from psycopg.conninfo import conninfo_to_dict
from support import wait_for

from pgtask.executor import RESET_SESSION, SessionPool, group_settings


def test_a_burst_beyond_the_idle_cap_reuses_its_sessions(db, service):
    """40 tasks at once (the pool keeps 32 idle sessions a role without a time limit): the next
    burst runs on the same 40 backends, none is opened again."""
    def burst() -> set[int]:
        ids = [db.insert("SELECT pg_backend_pid(), pg_sleep(0.2)", group=f"g{i}", header=False) for i in range(40)]
        return {int(db.wait_state(i)["output"].split("\t")[0]) for i in ids}

    first = burst()
    assert len(first) == 40
    # idle AND reset (a session is reset 20 ms after its task; while that runs it is out of the pool)
    wait_for(lambda: db.value("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pg_task public task g%%' "
                              "AND state = 'idle' AND query = %s", (RESET_SESSION,)) == 40,
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
            deadline = asyncio.get_running_loop().time() + 10
            while len(pool.idle[user]) > 2:
                assert asyncio.get_running_loop().time() < deadline, "idle sessions beyond the cap not closed"
                await asyncio.sleep(0.05)
            return [s.pid for s in sessions], [s.pid for s in pool.idle[user]]
        finally:
            await pool.close()

    opened, kept = asyncio.run(go())
    assert kept == opened[-2:]  # the two used last stay
    wait_for(lambda: db.value("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (opened[:3],)) == 0,
             message="the trimmed sessions' backends to end")


def test_a_session_opens_with_its_settings_after_the_services_own_options():
    pool = SessionPool("host=/run/x dbname=d options='-c work_mem=7MB'", "svc", "login")
    info = conninfo_to_dict(pool._conninfo(group_settings("it's a \\ g", "public", "task", 5), "alice"))
    assert (info["user"], info["dbname"]) == ("alice", "d")
    assert info["application_name"] == "pg_task public task it's a \\ g"
    assert info["options"] == ("-c work_mem=7MB -c pg_task.group=it's\\ a\\ \\\\\\ g "
                               "-c pg_task.schema=public -c pg_task.table=task -c pg_task.oid=5")
