"""What a role without any privilege can reach -- NOTIFY on the table's channel, advisory-lock keys,
parse locks on the service's own tables -- cancels, stalls and pins nothing."""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest
from support import killed_mid_task, provision_again, wait_for, wait_for_async

from pgtask import listener
from pgtask.listener import StopHints, parse
from pgtask.scheduler import Scheduler

LOCKED = "SELECT pg_advisory_xact_lock_shared(4250)"  # runs until the test lets go of key 4250


def hostile(db) -> str:
    """A LOGIN role without any privilege on anything of pgtask's."""
    return db.role("mallory", grant=False)


def notify(db, payload: str) -> None:
    """``payload`` on the task table's channel, sent by the role without privileges."""
    with db.connect(user=hostile(db)) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (f"pg_task_{oid(db)}", payload))


def oid(db) -> int:
    return db.value("SELECT 'task'::regclass::oid::bigint")


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
def test_a_forged_stop_notification_cancels_nothing(db, service, remote):
    """'stop <id>' from a role with no privilege, for another role's running task: a hint the row
    contradicts (it is WORK), so nothing is cancelled. A real STOP sent after it (of a remote task,
    which only the service cancels) shows the forged one was handled before."""
    with db.connect() as locker:
        locker.execute("SELECT pg_advisory_lock(4250)")
        target = db.insert(LOCKED, remote=db.dsn if remote else None)
        witness = db.insert(LOCKED, remote=db.dsn, group="witness")
        for task_id in (target, witness):
            db.wait_state(task_id, states=("WORK",))
        notify(db, f"stop {target}")
        db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (witness,))
        row = wait_for(lambda: (r := db.task(witness))["stop"] is not None and r, message="the real STOP's cancel")
        assert row["error"].startswith("ERROR:  canceling statement due to user request"), row["error"]
        assert db.task(target)["state"] == "WORK"
        locker.execute("SELECT pg_advisory_unlock(4250)")
    row = db.wait_state(target)
    assert (row["state"], row["error"]) == ("DONE", None), row


@pytest.mark.quick
def test_malformed_notifications_leave_the_listener_listening(db, service_factory):
    """Payloads no trigger sends are ignored: the listener still wakes the claims (the poll floor here
    is 300 s) and still cancels a stopped remote task."""
    service_factory(db.name, "[pg_task]\nsleep = 300\n")
    for payload in ("stop x", "stop ", "stop", "stop -1", "stop 0", "stop 1e3", "stop 9223372036854775808",
                    "stop 99999999999999999999999", "stop 1 2", "stop ١", "wake\n", "", "x" * 7999):
        notify(db, payload)
    assert db.wait_state(db.insert("SELECT 1"), timeout=10)["state"] == "DONE"
    with db.connect() as locker:
        locker.execute("SELECT pg_advisory_lock(4250)")
        stopped = db.insert(LOCKED, remote=db.dsn)
        db.wait_state(stopped, states=("WORK",))
        db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (stopped,))
        row = wait_for(lambda: (r := db.task(stopped))["stop"] is not None and r, 10, message="the STOP's cancel")
    assert row["error"].startswith("ERROR:  canceling statement due to user request"), row["error"]


@pytest.mark.quick
@pytest.mark.parametrize(("payload", "hint"), [
    ("wake", ("wake", None)), ("schedule", ("schedule", None)), ("stop 42", ("stop", 42)),
    ("stop 9223372036854775807", ("stop", 9223372036854775807)), ("stop 9223372036854775808", None),
    ("stop 042", None), ("stop ٤٢", None), ("stop 42\n", None), ("Stop 42", None), ("", None)])
def test_a_payload_is_parsed_strictly(payload, hint):
    assert parse(payload) == hint


def test_a_listener_that_fails_is_logged_and_started_again(db, monkeypatch, caplog):
    """Anything going wrong in the listener besides a lost connection (a bug: injected here) is
    logged with its reason and the listener starts again -- it is never left dead."""
    real = listener.parse

    def failing(payload: str):
        if payload == "boom":
            raise RuntimeError("injected")
        return real(payload)

    monkeypatch.setattr(listener, "parse", failing)

    def listeners() -> list[int]:
        """The listener backends whose LISTEN has run and committed (a notification before it is not theirs)."""
        return [r[0] for r in db.execute("SELECT pid FROM pg_stat_activity WHERE application_name LIKE "
                                          "'pgtask listen%%' AND datname = current_database() "
                                          "AND query LIKE 'LISTEN %%' AND state = 'idle'")]

    async def during(sched: Scheduler) -> None:
        await wait_for_async(lambda: len(listeners()) == 1, message="the listener")
        [first] = listeners()
        notify(db, "boom")
        await wait_for_async(lambda: "the listener failed" in caplog.text, message="the failure logged")
        await wait_for_async(lambda: listeners() not in ([], [first]), message="a new listener")
        notify(db, "wake")

    with caplog.at_level(logging.ERROR, logger="pgtask.scheduler"):
        db.insert("SELECT 1")
        db.run_scheduler(1, during=during)
    assert "RuntimeError: injected" in caplog.text


def test_stop_hints_are_checked_together_not_one_query_each():
    """A storm of 'stop' hints: none for a task not running here reaches the database, and those for
    running ones that arrive while a check is in flight share the next check."""
    checks: list[list[int]] = []
    cancelled: list[int] = []

    async def go() -> None:
        release = asyncio.Event()

        async def confirm(ids: list[int]) -> list[int]:
            checks.append(ids)
            await release.wait()
            return [i for i in ids if i == 2]

        async def cancel(task_id: int) -> None:
            cancelled.append(task_id)

        hints = StopHints(lambda task_id: task_id in (1, 2), confirm, cancel, "test")
        for _ in range(500):
            for task_id in (1, 2, 3):
                hints.hint(task_id)
            await asyncio.sleep(0)
        release.set()
        await wait_for_async(lambda: hints.checking is None, message="the checks")

    asyncio.run(go())
    # one check in flight, the 499 rounds of hints after it in the next; task 3 never asked about
    assert checks == [[1, 2], [1, 2]], checks
    assert cancelled == [2, 2]


def test_a_role_holding_the_claim_lock_key_of_before_stalls_no_claim(db, service):
    """pg_advisory_lock(table oid) -- the key claims took turns on -- held by a role with no privilege."""
    with db.connect(user=hostile(db)) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (oid(db),))
        assert db.wait_state(db.insert("SELECT 1"), timeout=10)["state"] == "DONE"


def test_a_role_holding_the_key_of_a_planned_task_stalls_no_claim(db, service):
    """The liveness key a task's claim took ((oid << 32) | id) held beforehand by a role with no
    privilege: the task is claimed and runs, and so do the others."""
    soon = db.value("SELECT now() + interval '1 second'")
    planned = db.insert("SELECT 1", plan=soon)
    with db.connect(user=hostile(db)) as conn:
        for task_id in (planned, planned + 1):  # its key, and the next task's
            conn.execute("SELECT pg_advisory_lock((%s::bigint << 32) | %s)", (oid(db), task_id))
        later = db.insert("SELECT 2")
        assert [db.wait_state(i, timeout=10)["state"] for i in (later, planned)] == ["DONE", "DONE"]


def test_a_role_holding_the_key_of_a_dead_services_task_pins_no_orphan(db, service_factory):
    """The service is killed mid-task; a role with no privilege then holds the task's old liveness
    key. The next service still finds the orphan and runs it again."""
    task_id = killed_mid_task(db, service_factory)
    with db.connect(user=hostile(db)) as conn:
        conn.execute("SELECT pg_advisory_lock((%s::bigint << 32) | %s)", (oid(db), task_id))
        service_factory(db.name)
        row = wait_for(lambda: (r := db.task(task_id))["state"] == "DONE" and r, 20, message="the re-run")
    assert row["attempt"] == 2
    assert db.value("SELECT count(*) FROM ran") == 1


def test_the_claim_lock_is_the_services_alone(db, service):
    """The claim lock's table and the instance table: a role with no privilege can lock neither nor
    write the instance table; the parse locks a statement it PREPAREs keeps in an open transaction
    stall no claim."""
    with db.connect(user=hostile(db)) as conn:
        for statement in ("LOCK TABLE task_claim IN SHARE UPDATE EXCLUSIVE MODE",
                          "LOCK TABLE task_instance IN ACCESS SHARE MODE",
                          "INSERT INTO task_instance VALUES ('x', 1, now(), 10)"):
            conn.execute("BEGIN")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
            conn.execute("ROLLBACK")
        conn.execute("BEGIN")
        conn.execute("PREPARE a AS SELECT FROM task_claim FOR UPDATE")
        conn.execute("PREPARE b AS DELETE FROM task_instance")
        assert db.wait_state(db.insert("SELECT 1"), timeout=10)["state"] == "DONE"
        conn.execute("ROLLBACK")


def test_a_table_provisioned_before_gets_its_claim_lock_and_instance_tables(db):
    db.execute("DROP TABLE task_claim, task_instance")
    assert sorted(provision_again(db).actions) == ["created table public.task_claim",
                                                   "created table public.task_instance",
                                                   "granted SELECT on table task_instance to task_admin"]
    assert db.value("SELECT count(*) FROM information_schema.role_table_grants WHERE grantee = 'PUBLIC' "
                    "AND table_name IN ('task_claim', 'task_instance')") == 0
    assert provision_again(db).actions == []
