"""What the console reads and calls (pgtask/console_data.py), without a browser: the snapshot's
rows and counts follow the filters, a preview changes nothing, an action acts as the console's role
and a refusal reaches the page as PostgreSQL's message; its connections carry a statement timeout."""

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgtask import console_data as data
from pgtask import console_view as view

AUTHOR, ADMIN = "console_author", "console_admin"


@pytest.fixture
def roles(db):
    for name in (AUTHOR, ADMIN):
        db.role(name, grant=False)
    db.execute(f'GRANT task_user TO "{AUTHOR}"; GRANT task_admin TO "{ADMIN}"')
    return db


def target(db, user):
    return data.Target(make_conninfo(db.dsn, user=user))


def stopped(db, user, group, n):
    """``n`` STOP tasks of ``group`` whose author is ``user`` (ended: never claimed)."""
    return [db.value("""INSERT INTO task ("user", input, "group", state) VALUES (%s, 'SELECT 1', %s, 'STOP')
                        RETURNING id""", (user, group)) for _ in range(n)]


def test_the_filters_select_and_the_preview_changes_nothing(roles):
    db = roles
    mine, theirs = stopped(db, AUTHOR, "a", 3), stopped(db, ADMIN, "b", 2)
    admin = target(db, ADMIN)
    snap = data.snapshot(admin, data.Filters(state="STOP", group="a"))
    assert (snap.matching, sorted(t["id"] for t in snap.tasks)) == (3, mine)
    assert not snap.problems  # task_admin reads the instance and group tables: provisioning grants them
    shut_out = data.snapshot(target(db, AUTHOR), data.Filters())  # an author may read none of them
    assert "verdict" in shut_out.problems and "permission denied for table" in view.verdict(shut_out)
    full = data.snapshot(data.Target(db.dsn), data.Filters(state="STOP", group="a"))  # the owner reads all
    assert full.verdict.headline.startswith("NOT OK: no `pgtask run` is connected") and not full.problems
    assert [(g["group"], g["stop"]) for g in full.groups] == [("a", 3), ("b", 2)]
    assert data.snapshot(admin, data.Filters(author=ADMIN)).matching == 2
    assert data.snapshot(admin, data.Filters(ids=(mine[0], theirs[0]), group="b")).matching == 1
    before = db.execute("SELECT * FROM task ORDER BY id")
    preview = data.task_verb(admin, "retry", data.Filters(state="STOP"), preview=True)
    assert (preview.tasks, preview.sample) == (5, mine + theirs)
    assert db.execute("SELECT * FROM task ORDER BY id") == before
    # the author's retry over every STOP task acts on its own only
    done = data.task_verb(target(db, AUTHOR), "retry", data.Filters(state="STOP"), preview=False)
    assert (done.tasks, done.sample, done.remaining) == (3, mine, 0)
    assert db.execute("SELECT parent, id FROM task WHERE parent IS NOT NULL ORDER BY parent") == \
        list(zip(mine, done.new_sample))


def test_a_refusal_is_shown_and_changes_nothing(roles):
    db = roles
    stopped(db, AUTHOR, "a", 1)
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
        data.group_verb(target(db, AUTHOR), "pause", "a", preview=False)
    shown = view.error(refused.value)
    assert "permission denied for function task_pause" in shown
    assert "(SQLSTATE 42501)" in shown and "Traceback" not in shown
    assert db.value('SELECT count(*) FROM "task_group"') == 0
    with pytest.raises(ValueError, match="choose a group"):
        data.group_verb(target(db, ADMIN), "pause", None, preview=True)
    hostile = "<script>alert(1)</script>"
    assert "<script>" not in view.error(ValueError(hostile))


def test_the_console_connections_carry_a_statement_timeout(db):
    for timeout in (data.READ_TIMEOUT, data.ACT_TIMEOUT):
        with data.connect(data.Target(db.dsn), timeout) as conn:
            assert conn.execute("SHOW statement_timeout").fetchone()[0] == timeout
            assert conn.autocommit
