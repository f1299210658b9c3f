"""SPI mode (pg_task.spi = on) and the manual's restriction table, local and SPI columns."""

from __future__ import annotations

import pytest
from support import sessions_reset_and_idle, spi_on, wait_for

# One input per row of the manual's restriction table (and then some), run in both modes.
TABLE = {
    "multi": "SELECT 1 AS a; SELECT 2 AS a, 3 AS b; CREATE TABLE m (x int); INSERT INTO m VALUES (1), (2); "
             "UPDATE m SET x = x + 1; INSERT INTO m VALUES (9) RETURNING x",
    "copy_out": "INSERT INTO t VALUES (100); COPY (SELECT 1) TO STDOUT",
    "copy_in": "COPY t FROM STDIN",
    "program": "COPY t FROM PROGRAM 'echo 7'",
    "file": "COPY (SELECT 1) TO '{path}'",
    "tx": "BEGIN; INSERT INTO t VALUES (1); COMMIT; BEGIN; INSERT INTO t VALUES (2)",
    "savepoint": "INSERT INTO t VALUES (3); SAVEPOINT s",
    "ddl": "CREATE TABLE d (x int); ALTER TABLE d ADD y text; DROP TABLE d",
    "atomic": "INSERT INTO t VALUES (4); SELECT 1/0",
}

MULTI_OUTPUT = "1\na\tb\n2\t3\nCREATE TABLE\nINSERT 0 2\nUPDATE 2\n9\nINSERT 0 1"


def run_table(db) -> dict[str, dict]:
    db.execute("CREATE TABLE t (x int)")
    target = db.cluster.base / f"copy-{db.name}.txt"  # where the server may write
    ids = {k: db.insert(v.replace("{path}", str(target))) for k, v in TABLE.items()}
    rows = {k: db.wait_state(i) for k, i in ids.items()}
    rows["_t"] = sorted(r[0] for r in db.execute("SELECT x FROM t"))
    rows["_file"] = target.exists()
    return rows


def test_restriction_table_local(db, service):
    rows = run_table(db)
    assert (rows["multi"]["output"], rows["multi"]["error"]) == (MULTI_OUTPUT, None)
    assert rows["copy_out"]["error"] == ("ERROR:  COPY TO STDOUT is not supported\n"
                                         "STATEMENT:  INSERT INTO t VALUES (100); COPY (SELECT 1) TO STDOUT")
    assert rows["copy_in"]["error"] == ("ERROR:  COPY FROM STDIN is not supported\n"
                                        "STATEMENT:  COPY t FROM STDIN")
    assert (rows["program"]["output"], rows["program"]["error"]) == ("COPY 1", None)
    assert (rows["file"]["output"], rows["file"]["error"], rows["_file"]) == ("COPY 1", None, True)
    assert (rows["tx"]["output"], rows["tx"]["error"]) == (
        "BEGIN\nINSERT 0 1\nCOMMIT\nBEGIN\nINSERT 0 1", None)
    assert rows["savepoint"]["state"] == "FAIL"  # a SAVEPOINT outside a block is the server's error
    assert (rows["ddl"]["output"], rows["ddl"]["error"]) == ("CREATE TABLE\nALTER TABLE\nDROP TABLE", None)
    assert rows["atomic"]["error"] == ("ERROR:  division by zero\n"
                                       "STATEMENT:  INSERT INTO t VALUES (4); SELECT 1/0")
    # the dangling BEGIN was committed; the failed implicit transaction rolled back
    assert rows["_t"] == [1, 2, 7]


def test_restriction_table_spi(db, service_factory):
    spi_on(db)
    service_factory(db.name)
    rows = run_table(db)
    # several statements: every result appended, as locally (PostgreSQL 10+)
    assert (rows["multi"]["state"], rows["multi"]["output"], rows["multi"]["error"]) == (
        "DONE", MULTI_OUTPUT, None)
    # any COPY: SPI_ERROR_COPY; the statements before it ran and were rolled back
    statement = TABLE["copy_out"]
    assert (rows["copy_out"]["state"], rows["copy_out"]["output"], rows["copy_out"]["error"]) == (
        "FAIL", "INSERT 0 1", f"ERROR:  SPI_ERROR_COPY\nSTATEMENT:  {statement}")
    for key in ("copy_in", "program", "file"):
        assert rows[key]["state"] == "FAIL", key
        assert rows[key]["output"] == ""
        assert rows[key]["error"].startswith("ERROR:  SPI_ERROR_COPY\nSTATEMENT:  COPY "), rows[key]["error"]
    assert rows["_file"] is False  # nothing was written
    # transaction control: SPI_ERROR_TRANSACTION, at the first such statement
    assert (rows["tx"]["output"], rows["tx"]["error"]) == (
        "", f"ERROR:  SPI_ERROR_TRANSACTION\nSTATEMENT:  {TABLE['tx']}")
    assert (rows["savepoint"]["output"], rows["savepoint"]["error"]) == (
        "INSERT 0 1", f"ERROR:  SPI_ERROR_TRANSACTION\nSTATEMENT:  {TABLE['savepoint']}")
    # DDL is fine
    assert (rows["ddl"]["output"], rows["ddl"]["error"]) == ("CREATE TABLE\nALTER TABLE\nDROP TABLE", None)
    # a server error gets SPI's context line; the whole input is undone
    assert rows["atomic"]["error"] == ('ERROR:  division by zero\n'
                                       'CONTEXT:  SQL statement "INSERT INTO t VALUES (4); SELECT 1/0"\n'
                                       'STATEMENT:  INSERT INTO t VALUES (4); SELECT 1/0')
    assert rows["atomic"]["output"] == "INSERT 0 1"
    # one atomic unit each: nothing of any failed input stayed
    assert rows["_t"] == []


@pytest.mark.quick
def test_spi_is_atomic_where_local_is_not(db, service_factory):
    """A statement that commits on its own locally (after an explicit COMMIT) cannot in SPI mode;
    and VACUUM, which cannot run in a transaction block, fails in SPI mode with the server's error."""
    spi_on(db)
    service_factory(db.name)
    db.execute("CREATE TABLE t (x int)")
    row = db.wait_state(db.insert("INSERT INTO t VALUES (1); INSERT INTO t VALUES (2); "
                                  "SELECT count(*) FROM t"))
    assert (row["state"], row["output"]) == ("DONE", "INSERT 0 1\nINSERT 0 1\n2")
    row = db.wait_state(db.insert("INSERT INTO t VALUES (3); VACUUM t"))
    assert row["state"] == "FAIL"
    assert row["error"].startswith("ERROR:  VACUUM cannot run inside a transaction block\n"
                                   "CONTEXT:  SQL statement"), row["error"]
    assert db.value("SELECT count(*) FROM t") == 2
    # a syntax error anywhere: nothing runs
    row = db.wait_state(db.insert("INSERT INTO t VALUES (4); SELEC 1"))
    assert row["error"].startswith('ERROR:  syntax error at or near "SELEC" at character 27\n'), row["error"]
    assert db.value("SELECT count(*) FROM t") == 2
    # a pglast-splittable input with a COPY after a failing statement: the earlier error wins
    row = db.wait_state(db.insert("SELECT 1/0; COPY t TO STDOUT"))
    assert row["error"].startswith("ERROR:  division by zero\n"), row["error"]


@pytest.mark.parametrize("execute_as", ["login", "set_role"])
def test_role_setting_and_bad_value(db, service_factory, execute_as):
    """ALTER ROLE ... IN DATABASE SET pg_task.spi = on for one author only; a bad value fails
    that author's tasks saying why."""
    carol, dave, erin = (f"{name}_{db.name}" for name in ("carol", "dave", "erin"))  # roles are cluster-wide
    for role in (carol, dave, erin):
        db.execute(f"CREATE ROLE {role} LOGIN")
        db.execute(f"GRANT INSERT, SELECT ON task TO {role}")
        db.execute(f"GRANT USAGE ON SEQUENCE task_id_seq TO {role}")
    db.execute(f'ALTER ROLE {carol} IN DATABASE "{db.name}" SET pg_task.spi = on')
    db.execute(f"ALTER ROLE {erin} SET pg_task.spi = 'maybe'")
    try:
        service_factory(db.name, f'[pgtask]\nreset_check = 0.5\nexecute_as = "{execute_as}"\n')
        copy = "COPY (SELECT 1) TO STDOUT"
        ids = {}
        for name, role in (("carol", carol), ("dave", dave), ("erin", erin)):
            with db.connect(role) as conn:
                ids[name] = conn.execute("INSERT INTO task (input) VALUES (%s) RETURNING id",
                                         (copy,)).fetchone()[0]
        rows = {name: db.wait_state(i) for name, i in ids.items()}
        assert rows["carol"]["error"] == f"ERROR:  SPI_ERROR_COPY\nSTATEMENT:  {copy}"
        assert rows["dave"]["error"] == f"ERROR:  COPY TO STDOUT is not supported\nSTATEMENT:  {copy}"
        assert rows["erin"]["error"] == ('ERROR:  invalid value for parameter "pg_task.spi": "maybe"\n'
                                         'HINT:  "pg_task.spi" requires a Boolean value')
    finally:
        db.execute(f"ALTER ROLE {erin} RESET pg_task.spi")


def test_spi_switched_on_while_running_writes_pg_tasks_errors(db, service):
    """ALTER DATABASE ... SET pg_task.spi = on while the service runs: the next tasks run in SPI mode
    -- also on a session pooled before -- and their errors are pg_task's SPI text: the statement's
    CONTEXT line (a timeout too), SPI_ERROR_COPY for COPY to the client or from it."""
    before = db.wait_state(db.insert("SELECT 1/0 AS a"))
    assert before["error"] == "ERROR:  division by zero\nSTATEMENT:  SELECT 1/0 AS a"
    wait_for(lambda: sessions_reset_and_idle(db, "pid = %s", (before["pid"],)) == 1,
             message="the task's session back in the pool")
    spi_on(db)
    cases = [("SELECT 1/0 AS a", {}, 'ERROR:  division by zero\nCONTEXT:  SQL statement "SELECT 1/0 AS a"'),
             ("SELECT pg_sleep(2) AS a", {"timeout": "1 sec"},
              ('ERROR:  canceling statement due to statement timeout\n'
               'CONTEXT:  SQL statement "SELECT pg_sleep(2) AS a"')),
             ("COPY (SELECT 1) TO STDOUT", {}, "ERROR:  SPI_ERROR_COPY"),
             ("COPY task FROM STDIN", {}, "ERROR:  SPI_ERROR_COPY")]
    for text, columns, error in cases:  # one at a time: each may take the session pooled before
        row = db.wait_state(db.insert(text, **columns))
        assert (row["state"], row["output"], row["error"]) == ("FAIL", "", f"{error}\nSTATEMENT:  {text}"), row
