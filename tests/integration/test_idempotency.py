"""Idempotent enqueue: task_enqueue(input, key, columns, ttl) -> (id, created), reservations in
task_key that outlive the task's history and expire on their own."""

from __future__ import annotations

import psycopg
import pytest
from support import provision_again, race


def enqueue(db, input_text, key=None, columns=None, ttl=None):
    return db.execute("SELECT id, created FROM task_enqueue(%s, %s, coalesce(%s::jsonb, '{}'), %s)",
                      (input_text, key, psycopg.types.json.Jsonb(columns) if columns else None, ttl))[0]


def test_provisioning_is_idempotent(db):
    assert provision_again(db).actions == []
    names = {r[0] for r in db.execute("SELECT relname FROM pg_class WHERE relname LIKE 'task%'")}
    assert {"task_schedule", "task_occurrence", "task_key", "task_group"} <= names


def test_provision_other_schema_and_table(cluster, db):
    actions = provision_again(db, "jobs", "queue").actions
    assert "created table jobs.queue_schedule" in actions and "created trigger queue_capacity" in actions
    row = db.execute("SELECT * FROM jobs.queue_enqueue('SELECT 1', 'k')")[0]
    assert row[1] is True and db.value("SELECT count(*) FROM jobs.queue") == 1
    assert provision_again(db, "jobs", "queue").actions == []


@pytest.mark.quick
def test_key_returns_original_id(db):
    first = enqueue(db, "SELECT 1", "order-42")
    assert first[1] is True
    again = enqueue(db, "SELECT 2", "order-42")
    assert again == (first[0], False)
    assert db.value("SELECT count(*) FROM task") == 1
    assert db.value("SELECT input FROM task WHERE id = %s", (first[0],)) == "SELECT 1"
    # no key: always a new task; columns are applied
    a = enqueue(db, "SELECT 3", None, {"group": "mail", "timeout": "5 min", "max": 2})
    row = db.task(a[0])
    assert a[1] is True and row["group"] == "mail" and str(row["timeout"]) == "0:05:00" and row["max"] == 2


def test_bad_columns_are_refused(db):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="state"):
        enqueue(db, "SELECT 1", None, {"state": "DONE"})
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="nosuch"):
        enqueue(db, "SELECT 1", "k", {"nosuch": 1})
    assert db.value("SELECT count(*) FROM task_key") == 0


def test_plain_insert_on_conflict_does_not_deduplicate(db):
    """Documented: the task table has no key column, so a plain INSERT ... ON CONFLICT DO NOTHING
    inserts every time; the reservation table is what deduplicates."""
    for _ in range(2):
        db.execute("INSERT INTO task (input) VALUES ('SELECT 1') ON CONFLICT DO NOTHING")
    assert db.value("SELECT count(*) FROM task") == 2


def test_concurrent_same_key_creates_one(db):
    def work(start):
        with db.connect() as conn:
            start()
            return conn.execute("SELECT id, created FROM task_enqueue('SELECT 1', 'same')").fetchone()

    results, errors = race(10, work)
    assert not errors
    assert sum(1 for _, created in results if created) == 1
    assert len({i for i, _ in results}) == 1
    assert db.value("SELECT count(*) FROM task") == 1


def test_failed_insert_leaves_no_reservation(db):
    """Failure before commit: reservation and task both remain absent."""
    with db.connect() as conn, pytest.raises(psycopg.errors.DivisionByZero), conn.transaction():
        conn.execute("SELECT * FROM task_enqueue('SELECT 1', 'k1')")
        conn.execute("SELECT 1/0")
    assert db.value("SELECT count(*) FROM task_key") == 0 and db.value("SELECT count(*) FROM task") == 0
    assert enqueue(db, "SELECT 1", "k1")[1] is True


def test_expired_reservation_is_reused_only_when_task_finished(db):
    first = enqueue(db, "SELECT 1", "k", ttl="0 sec")
    # expired, but the task is still queued: the key holds
    assert enqueue(db, "SELECT 1", "k") == (first[0], False)
    db.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (first[0],))
    second = enqueue(db, "SELECT 1", "k")
    assert second[1] is True and second[0] != first[0]
    assert db.value("SELECT task FROM task_key WHERE key = 'k'") == second[0]


def test_key_retention_setting(db):
    db.execute("SET pg_task.key_retention = '2 days'")
    enqueue(db, "SELECT 1", "a")
    assert str(db.value("SELECT expires - created FROM task_key WHERE key = 'a'")) == "2 days, 0:00:00"
    enqueue(db, "SELECT 1", "b", ttl="1 hour")
    assert str(db.value("SELECT expires - created FROM task_key WHERE key = 'b'")) == "1:00:00"
    db.execute("RESET pg_task.key_retention")
    enqueue(db, "SELECT 1", "c")
    assert str(db.value("SELECT expires - created FROM task_key WHERE key = 'c'")) == "7 days, 0:00:00"


def test_task_user_is_the_caller(db):
    db.execute("CREATE ROLE idem_alice LOGIN IN ROLE task_user")
    with db.connect(user="idem_alice") as conn:
        tid, created = conn.execute("SELECT * FROM task_enqueue('SELECT 1', 'x', '{\"user\": \"postgres\"}')").fetchone()
    assert created and db.task(tid)["user"] == "idem_alice"


def _roles(db, *names):
    """LOGIN roles that may enqueue with keys (db.role, and the table's authors' role)."""
    for name in names:
        db.execute(f'GRANT task_user TO "{db.role(name)}"')


def test_each_role_has_its_own_keys(db):
    """The same key of two roles is two reservations: neither is handed the other's task, and
    neither can see, repoint, release or forge the other's reservation (row-level security)."""
    _roles(db, "idem_bob", "idem_carol")
    with db.connect(user="idem_bob") as bob:
        held, created = bob.execute("SELECT * FROM task_enqueue('SELECT 1', 'charge-42')").fetchone()
        assert created
    with db.connect(user="idem_carol") as carol:
        mine, created = carol.execute("SELECT * FROM task_enqueue('SELECT 2', 'charge-42')").fetchone()
        assert created and mine != held
        assert carol.execute("SELECT * FROM task_enqueue('SELECT 2', 'charge-42')").fetchone() == (mine, False)
        assert carol.execute("SELECT count(*) FROM task_key").fetchone()[0] == 1
        assert carol.execute("UPDATE task_key SET task = %s, expires = now() WHERE \"user\" = 'idem_bob'",
                             (mine,)).rowcount == 0
        assert carol.execute("DELETE FROM task_key WHERE key = 'charge-42' AND \"user\" = 'idem_bob'").rowcount == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            carol.execute("INSERT INTO task_key (\"user\", key, task, expires) VALUES ('idem_bob', 'mail-7', 1, now())")
        carol.rollback()
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            carol.execute("UPDATE task_key SET \"user\" = 'idem_bob' WHERE key = 'charge-42'")
    with db.connect(user="idem_bob") as bob:
        assert bob.execute("SELECT * FROM task_enqueue('SELECT 1', 'charge-42')").fetchone() == (held, False)
    assert db.task(held)["user"] == "idem_bob" and db.task(mine)["user"] == "idem_carol"
    assert db.execute("SELECT \"user\", task FROM task_key ORDER BY 1") == [("idem_bob", held), ("idem_carol", mine)]


def test_shared_keys_of_an_older_table_become_their_tasks_roles(db):
    """A table provisioned when keys were one namespace is converted in place: each reservation
    keeps holding for its task's role, one whose task is gone is the owner's, nothing is lost."""
    _roles(db, "idem_bob")
    with db.connect(user="idem_bob") as bob:
        held = bob.execute("SELECT id FROM task_enqueue('SELECT 1', 'charge-42')").fetchone()[0]
    db.execute("SELECT * FROM task_enqueue('SELECT 2', 'gone-7')")
    db.execute("DELETE FROM task WHERE input = 'SELECT 2'")
    db.execute("""ALTER TABLE task_key DISABLE ROW LEVEL SECURITY; DROP POLICY task_key_role ON task_key;
                  ALTER TABLE task_key DROP CONSTRAINT task_key_pkey; ALTER TABLE task_key DROP COLUMN "user";
                  ALTER TABLE task_key ADD PRIMARY KEY (key)""")
    actions = provision_again(db).actions
    assert "made the keys of public.task_key per role (1 whose task is gone now the owner's)" in actions, actions
    assert "created policy task_key_role on public.task_key" in actions, actions
    owner = db.value("SELECT relowner::regrole::text FROM pg_class WHERE oid = 'task_key'::regclass")
    assert db.execute('SELECT "user", key FROM task_key ORDER BY 2') == [("idem_bob", "charge-42"), (owner, "gone-7")]
    with db.connect(user="idem_bob") as bob:
        assert bob.execute("SELECT * FROM task_enqueue('SELECT 1', 'charge-42')").fetchone() == (held, False)
    assert provision_again(db).actions == []
