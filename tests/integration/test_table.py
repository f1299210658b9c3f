"""The SQL surface without the service: provisioning, defaults and their settings cascade, triggers."""

import psycopg
import pytest
from support import provision_again

COLUMNS = ["id", "parent", "plan", "start", "stop", "active", "live", "repeat", "timeout", "count", "max",
           "pid", "state", "delete", "drift", "header", "save", "string", "delimiter", "escape", "quote",
           "data", "error", "group", "input", "null", "output", "remote", "user", "attempt", "lease", "after", "wait", "waited",
           "retried"]


def test_every_column_and_label(db):
    cols = [r[0] for r in db.execute("SELECT attname FROM pg_attribute WHERE attrelid = 'task'::regclass "
                                     "AND attnum > 0 AND NOT attisdropped ORDER BY attnum")]
    assert cols == COLUMNS
    labels = [r[0] for r in db.execute("SELECT unnest(enum_range(NULL::state))::text")]
    assert labels == ["PLAN", "GONE", "TAKE", "WORK", "DONE", "FAIL", "STOP", "WAIT"]


def test_a_table_of_an_earlier_version_gets_dependencies(db):
    """A table whose state type lacks WAIT: provisioning adds the label, the columns, indexes and
    triggers in one transaction (nothing it creates reads the new label then), and tasks wait."""
    db.execute("""CREATE SCHEMA old; CREATE TYPE old.state AS ENUM ('PLAN', 'GONE', 'TAKE', 'WORK', 'DONE', 'FAIL', 'STOP')""")
    actions = provision_again(db, "old", "task").actions
    assert "added label WAIT to old.state" in actions, actions
    a = db.value("INSERT INTO old.task (input) VALUES ('SELECT 1') RETURNING id")
    b = db.value("INSERT INTO old.task (input, after) VALUES ('SELECT 1', ARRAY[%s]) RETURNING id", (a,))
    assert db.value("SELECT state::text FROM old.task WHERE id = %s", (b,)) == "WAIT"


@pytest.mark.quick
def test_defaults_are_the_manuals(db):
    task_id = db.insert("SELECT 1")
    row = db.task(task_id)
    assert row["state"] == "PLAN" and row["parent"] is None and row["attempt"] == 0
    assert str(row["active"]) == "1:00:00" and str(row["live"]) == "0:00:00"
    assert str(row["repeat"]) == "0:00:00" and str(row["timeout"]) == "0:00:00"
    assert (row["count"], row["max"]) == (0, 0)
    assert (row["delete"], row["drift"], row["header"], row["save"], row["string"]) == (True, False, True, False, True)
    assert (row["group"], row["null"], row["user"]) == ("group", "\\N", "postgres")
    assert db.value("SELECT delimiter = E'\\t' AND escape = '' AND quote = '' FROM task WHERE id = %s", (task_id,))
    assert db.value("SELECT plan = statement_timestamp() OR plan <= now() FROM task WHERE id = %s", (task_id,))


def test_provision_is_idempotent_and_keeps_user_objects(db):
    db.execute("ALTER TABLE task ADD COLUMN meta jsonb")
    db.execute("CREATE INDEX task_meta ON task (meta)")
    db.execute("CREATE FUNCTION mine() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$")
    db.execute("CREATE TRIGGER mine BEFORE INSERT ON task FOR EACH ROW EXECUTE FUNCTION mine()")
    assert provision_again(db).actions == []
    assert db.value("SELECT count(*) FROM pg_trigger WHERE tgname = 'mine'") == 1
    assert db.value("SELECT count(*) FROM pg_attribute WHERE attrelid = 'task'::regclass AND attname = 'meta'") == 1
    # something missing is put back, and only that is reported
    db.execute("DROP INDEX task_parent_idx")
    db.execute("ALTER TABLE task ALTER COLUMN max DROP DEFAULT")
    assert sorted(provision_again(db).actions) == ["created index task_parent_idx", "set default of public.task.max"]


def test_provision_drops_the_index_it_no_longer_uses(db):
    """Earlier versions counted a group's live rows through an index of their own; its successor
    drops it (only that one: a user's index of the same shape under another name stays)."""
    db.execute("""CREATE INDEX task_live_group_idx ON task ("group") WHERE state IN ('PLAN', 'TAKE', 'WORK')""")
    db.execute("""CREATE INDEX my_live_group ON task ("group") WHERE state IN ('PLAN', 'TAKE', 'WORK')""")
    assert provision_again(db).actions == ["dropped index public.task_live_group_idx (no longer used)"]
    assert db.value("SELECT to_regclass('task_live_group_idx')") is None
    assert db.value("SELECT to_regclass('my_live_group')") is not None
    assert provision_again(db).actions == []


def test_provision_replaces_the_running_index_of_earlier_versions(db):
    """Earlier versions' running index counted TAKE/WORK rows only; a table they provisioned gets the
    slot index (which counts a stopped task until it has ended too) and loses the old one."""
    db.execute("DROP INDEX task_slot_idx")
    db.execute("""CREATE INDEX task_running_idx ON task ("group", "remote") WHERE state IN ('TAKE', 'WORK')""")
    assert provision_again(db).actions == ["created index task_slot_idx",
                                           "dropped index public.task_running_idx (no longer used)"]
    assert "stop IS NULL" in db.value("SELECT pg_get_indexdef('task_slot_idx'::regclass)")
    assert db.value("SELECT to_regclass('task_running_idx')") is None
    assert provision_again(db).actions == []


@pytest.mark.quick
@pytest.mark.parametrize("schema,table", [("it's a schema", "my table;"), ("ünï", "tâsk \"x\"")])
def test_hostile_names(db, schema, table):
    report = provision_again(db, schema, table)
    assert report.changed
    qualified = psycopg.sql.Identifier(schema, table).as_string(db.conn)
    db.execute(f"INSERT INTO {qualified} (input) VALUES ('SELECT 1')")
    assert db.value(f"SELECT count(*) FROM {qualified}") == 1
    assert provision_again(db, schema, table).actions == []


@pytest.mark.quick
def test_settings_cascade(db, cluster):
    """config (ALTER SYSTEM) < ALTER DATABASE < ALTER ROLE < SET < the row."""
    db.role("cascade_user")
    try:
        # ALTER SYSTEM accepts a custom setting only once the session knows its placeholder
        db.execute("""SET "pg_task.group" = 'x'""")
        db.execute("""ALTER SYSTEM SET "pg_task.group" = 'from_system'""")
        db.execute('RESET "pg_task.group"')
        db.execute("SELECT pg_reload_conf()")

        def group_of(**kw):
            with db.connect("cascade_user") as c:
                for k, v in kw.items():
                    c.execute(f"SET \"pg_task.{k}\" = '{v}'")
                return c.execute("INSERT INTO task (input) VALUES ('x') RETURNING \"group\"").fetchone()[0]

        from support import wait_for
        wait_for(lambda: group_of() == "from_system", 10, message="ALTER SYSTEM to be reloaded")
        db.execute(f'ALTER DATABASE "{db.name}" SET "pg_task.group" = \'from_database\'')
        assert group_of() == "from_database"
        db.execute('ALTER ROLE cascade_user SET "pg_task.group" = \'from_role\'')
        assert group_of() == "from_role"
        assert group_of(group="from_session") == "from_session"
        with db.connect("cascade_user") as c:
            c.execute("SET \"pg_task.group\" = 'from_session'")
            assert c.execute("INSERT INTO task (input, \"group\") VALUES ('x', 'from_row') RETURNING \"group\"").fetchone()[0] == "from_row"
        # '' in the session means unset: the manual's default, whatever the outer levels say
        assert group_of(group="") == "group"
    finally:
        db.execute("""SET "pg_task.group" = 'x'""")
        db.execute('ALTER SYSTEM RESET "pg_task.group"')
        db.execute('RESET "pg_task.group"')
        db.execute("SELECT pg_reload_conf()")
        db.execute("ALTER ROLE cascade_user RESET ALL")


@pytest.mark.parametrize("name,value", [("delete", "maybe"), ("max", "many"), ("active", "soon"),
                                        ("delimiter", "ab")])
def test_bad_setting_fails_insert_naming_it(db, name, value):
    db.execute(f"SET \"pg_task.{name}\" = '{value}'")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=f'pg_task.{name}'):
        db.execute("INSERT INTO task (input) VALUES ('SELECT 1')")
    db.execute(f'RESET "pg_task.{name}"')
    db.insert("SELECT 1")


def test_every_column_setting_is_read(db):
    for name, value, column, expected in [
        ("active", "5 min", "active::text", "00:05:00"), ("live", "1 min", "live::text", "00:01:00"),
        ("repeat", "1 hour", "repeat::text", "01:00:00"), ("timeout", "3 sec", "timeout::text", "00:00:03"),
        ("count", "4", "count", 4), ("max", "-200", "max", -200), ("delete", "off", "delete", False),
        ("drift", "on", "drift", True), ("header", "off", "header", False), ("save", "on", "save", True),
        ("string", "off", "string", False), ("delimiter", ",", "delimiter::text", ","),
        ("escape", "\\", "escape::text", "\\"), ("quote", '"', "quote::text", '"'),
        ("group", "g1", "\"group\"", "g1"), ("null", "NULL", "\"null\"", "NULL"),
        ("plan", "2030-01-01 00:00:00+00", "plan = '2030-01-01 00:00:00+00'", True),
        ("id", "42", "parent", 42),
    ]:
        db.execute(
            psycopg.sql.SQL("SELECT set_config({}, {}, false)").format(
                psycopg.sql.Literal(f"pg_task.{name}"), psycopg.sql.Literal(value)))
        got = db.value(f"INSERT INTO task (input) VALUES ('x') RETURNING {column}")
        assert got == expected, name
        db.execute(f'RESET "pg_task.{name}"')


def test_user_is_forced_and_immutable(db):
    db.role("alice")
    db.role("bob")
    with db.connect("alice") as alice:
        forged = alice.execute("INSERT INTO task (input, \"user\") VALUES ('x', 'postgres') RETURNING \"user\"").fetchone()[0]
        assert forged == "alice"
    # a superuser (member of every role) may insert on behalf of another role
    assert db.value("INSERT INTO task (input, \"user\") VALUES ('x', 'bob') RETURNING \"user\"") == "bob"
    task_id = db.insert("SELECT 1")
    with pytest.raises(psycopg.errors.CheckViolation, match="immutable"):
        db.execute("UPDATE task SET \"user\" = 'alice' WHERE id = %s", (task_id,))


def test_other_role_cannot_rewrite_a_planned_task(db):
    db.role("carol")
    db.role("mallory")
    with db.connect("carol") as carol:
        task_id = carol.execute("INSERT INTO task (input) VALUES ('SELECT 1') RETURNING id").fetchone()[0]
        carol.execute("UPDATE task SET input = 'SELECT 2' WHERE id = %s", (task_id,))  # own task: fine
    with db.connect("mallory") as mallory:
        for change in ("input = 'DROP TABLE x'", "plan = now() + '1 day'", "timeout = '1 hour'"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="of role carol"):
                mallory.execute(f"UPDATE task SET {change} WHERE id = %s", (task_id,))
    assert db.task(task_id)["input"] == "SELECT 2"


def test_a_forged_pg_task_id_edits_no_other_roles_task(db):
    """pg_task.id is a setting anyone can SET: naming a task with it does not make a session that
    task's own (its row's pid, acting as its role), in PLAN or WORK."""
    db.role("carol")
    db.role("mallory")
    with db.connect("carol") as carol:
        task_id = carol.execute("INSERT INTO task (input, plan) VALUES ('SELECT 1', now() + '1 hour') "
                                "RETURNING id").fetchone()[0]
    with db.connect("mallory") as mallory:
        mallory.execute("SELECT set_config('pg_task.id', %s, false)", (str(task_id),))
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="of role carol"):
            mallory.execute("UPDATE task SET input = 'SELECT 2', plan = now() WHERE id = %s", (task_id,))
        db.claim(task_id)
        db.execute("UPDATE task SET state = 'WORK', pid = %s WHERE id = %s", (mallory.info.backend_pid, task_id))
        with pytest.raises(psycopg.errors.CheckViolation, match="can no longer be changed"):
            mallory.execute("UPDATE task SET input = 'SELECT 2', repeat = '1 min' WHERE id = %s", (task_id,))
    assert db.task(task_id)["input"] == "SELECT 1"


PROGRESS = ("pid = pg_backend_pid()", "attempt = attempt + 1", "lease = gen_random_uuid()", "start = now()",
            "stop = now()", "output = 'forged'", "error = 'forged'", "state = 'TAKE'", "state = 'GONE'")


def test_only_the_service_writes_a_tasks_progress(db):
    """state (but STOP), pid, attempt, lease, start, stop, output and error are pgtask's: not even
    the task's own role writes them (a WORK row back to PLAN would run twice, a new lease drops the
    running task's result, a pid aims the STOP trigger's cancel). A role may STOP its own tasks,
    not another role's."""
    db.role("carol")
    db.role("mallory")
    with db.connect("carol") as carol:
        planned = carol.execute("INSERT INTO task (input) VALUES ('SELECT 1') RETURNING id").fetchone()[0]
        running = carol.execute("INSERT INTO task (input) VALUES ('SELECT 1') RETURNING id").fetchone()[0]
    db.claim(running)
    db.execute("UPDATE task SET state = 'WORK', start = now() WHERE id = %s", (running,))
    for who in ("carol", "mallory"):
        with db.connect(who) as conn:
            for change in PROGRESS:
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match="progress of task"):
                    conn.execute(f"UPDATE task SET {change} WHERE id = %s", (planned,))
            for change in ("state = 'PLAN'", "state = 'DONE'", "lease = gen_random_uuid()"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match="progress of task"):
                    conn.execute(f"UPDATE task SET {change} WHERE id = %s", (running,))
    with db.connect("mallory") as mallory, pytest.raises(psycopg.errors.InsufficientPrivilege,
                                                         match="stop task .* of role carol"):
        mallory.execute("UPDATE task SET state = 'STOP' WHERE id = %s", (running,))
    assert db.task(running)["state"] == "WORK"
    with db.connect("carol") as carol:
        carol.execute("UPDATE task SET state = 'STOP' WHERE id = ANY(%s)", ([planned, running],))
    assert [db.task(i)["state"] for i in (planned, running)] == ["STOP", "STOP"]


def test_a_role_inserts_tasks_planned_or_stopped_only(db):
    """A row inserted as WORK with some backend's pid would have the STOP trigger cancel that backend."""
    db.role("mallory")
    with db.connect("mallory") as mallory:
        for columns, values in (("state", "'WORK'"), ("state", "'TAKE'"), ("state", "'DONE'"),
                                ("pid", "pg_backend_pid()")):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="insert task"):
                mallory.execute(f"INSERT INTO task (input, {columns}) VALUES ('SELECT 1', {values})")
        held = mallory.execute("INSERT INTO task (input, state) VALUES ('SELECT 1', 'STOP') "
                               "RETURNING state").fetchone()[0]
    assert held == "STOP"
    assert db.value("INSERT INTO task (input, state) VALUES ('SELECT 1', 'DONE') RETURNING state") == "DONE"


def test_routing_columns_immutable_and_definition_frozen_after_plan(db):
    task_id = db.insert("SELECT 1")
    for change in ("\"group\" = 'other'", "remote = 'host=x'", "parent = 1"):
        with pytest.raises(psycopg.errors.CheckViolation, match="immutable"):
            db.execute(f"UPDATE task SET {change} WHERE id = %s", (task_id,))
    db.execute("UPDATE task SET input = 'SELECT 2', plan = now() WHERE id = %s", (task_id,))  # PLAN: editable
    db.execute("UPDATE task SET state = 'TAKE' WHERE id = %s", (task_id,))
    for change in ("input = 'SELECT 3'", "plan = now()", "max = 5", "data = 'x'", "repeat = '1 min'"):
        with pytest.raises(psycopg.errors.CheckViolation, match="can no longer be changed"):
            db.execute(f"UPDATE task SET {change} WHERE id = %s", (task_id,))
    # output/error/start/stop are the service's to write
    db.execute("UPDATE task SET output = 'o', start = now() WHERE id = %s", (task_id,))


ALLOWED = {("PLAN", "TAKE"), ("PLAN", "WORK"), ("PLAN", "GONE"), ("PLAN", "STOP"), ("TAKE", "WORK"), ("TAKE", "PLAN"),
           ("TAKE", "DONE"), ("TAKE", "FAIL"), ("WORK", "DONE"), ("WORK", "FAIL"), ("WORK", "PLAN"),
           ("WORK", "STOP")}
STATES = ["PLAN", "GONE", "TAKE", "WORK", "DONE", "FAIL", "STOP"]
PATH = {"PLAN": [], "TAKE": ["TAKE"], "WORK": ["TAKE", "WORK"], "DONE": ["TAKE", "DONE"],
        "FAIL": ["TAKE", "FAIL"], "GONE": ["GONE"], "STOP": ["STOP"]}


@pytest.mark.quick
def test_state_machine_exactly(db):
    for old in STATES:
        for new in STATES:
            if old == new:
                continue
            task_id = db.insert("SELECT 1")
            for step in PATH[old]:
                db.execute("UPDATE task SET state = %s WHERE id = %s", (step, task_id))
            if (old, new) in ALLOWED:
                db.execute("UPDATE task SET state = %s WHERE id = %s", (new, task_id))
            else:
                with pytest.raises(psycopg.errors.CheckViolation, match="invalid state transition"):
                    db.execute("UPDATE task SET state = %s WHERE id = %s", (new, task_id))


def test_wake_up_notifies(db):
    oid = db.value("SELECT 'task'::regclass::oid")
    with db.connect() as listener:
        listener.execute(f"LISTEN pg_task_{oid}")
        db.insert("SELECT 1")
        got = list(listener.notifies(timeout=5, stop_after=1))
    assert got and got[0].payload == "wake"


def test_start_function_starts_only_its_own_claimed_task(db):
    """task_start (called by the executor session in its preamble) moves TAKE -> WORK with the
    caller's backend pid, fenced on attempt + lease, and only for a member of the task's role."""
    db.role("carol")
    db.role("mallory")
    with db.connect("carol") as carol:
        task_id = carol.execute("INSERT INTO task (input) VALUES ('SELECT 1') RETURNING id").fetchone()[0]
    planned = db.insert("SELECT 1")
    claimed = db.claim(task_id)
    attempt, lease = claimed["attempt"], claimed["lease"]
    with db.connect("mallory") as mallory:
        assert mallory.execute("SELECT task_start(%s, %s, %s)", (task_id, attempt, lease)).fetchone()[0] is False
    with db.connect("carol") as carol:
        assert carol.execute("SELECT task_start(%s, %s, gen_random_uuid())", (task_id, attempt)).fetchone()[0] is False
        assert carol.execute("SELECT task_start(%s, %s, %s)", (task_id, attempt + 1, lease)).fetchone()[0] is False
        assert db.task(task_id)["state"] == "TAKE"
        assert carol.execute("SELECT task_start(%s, %s, %s)", (task_id, attempt, lease)).fetchone()[0] is True
        row = db.task(task_id)
        assert (row["state"], row["pid"]) == ("WORK", carol.info.backend_pid) and row["start"] is not None
    lease = db.value("SELECT lease FROM task WHERE id = %s", (planned,))
    assert db.value("SELECT task_start(%s, 0, %s)", (planned, lease)) is False  # PLAN is not started
    assert db.task(planned)["state"] == "PLAN"
