"""pgtask.patterns without Jupyter: every pattern installs, a second install changes nothing,
uninstall removes what install added, and the pattern SQL renders for any schema/table."""

import asyncio

import psycopg
import pytest

from pgtask import patterns, provision

from .catalog import snapshot

ALL = list(patterns.PATTERNS)


@pytest.mark.parametrize("name", ALL)
def test_install_is_idempotent(db, name):
    with db.connect() as conn:
        before = snapshot(conn, "public", "task")
        first = patterns.install(conn, name)
        assert (first.changed or name == "retry_until_success"), first.actions
        after_first = snapshot(conn, "public", "task")
        second = patterns.install(conn, name)
        assert second.actions == []
        assert snapshot(conn, "public", "task") == after_first
        assert patterns.installed(conn, name)
        undo = patterns.uninstall(conn, name, drop_columns=True, drop_tables=True)
        if name != "retry_until_success":
            assert undo.changed
        if name == "partition":  # the archive it required stays
            patterns.uninstall(conn, "archive", drop_columns=True, drop_tables=True)
        assert snapshot(conn, "public", "task") == before


def test_all_patterns_together_in_another_schema(db):
    """Every pattern at once, on a table in another schema with another name: nothing collides,
    and a second round of installs changes nothing. (No service here: the partition pattern's
    repeating task would change the catalog between the snapshots.)"""
    async def provision_jobs_queue():
        async with await psycopg.AsyncConnection.connect(db.dsn) as conn:
            await provision.provision_table(conn, "jobs", "queue", provision.Report())

    asyncio.run(provision_jobs_queue())
    with db.connect() as conn:
        for name in ALL:
            patterns.install(conn, name, "jobs", "queue")
        snap = snapshot(conn, "jobs", "queue")
        for name in ALL:
            assert patterns.install(conn, name, "jobs", "queue").actions == [], name
        assert snapshot(conn, "jobs", "queue") == snap
        names = {r[0] for r in conn.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'jobs'::regnamespace")}
        assert {"queue_retry", "queue_cron_next", "queue_archive", "queue_archive_partition",
                "queue_dry_run"} <= names
        assert not conn.execute("SELECT 1 FROM pg_proc WHERE proname LIKE 'task\\_%' "
                                "AND pronamespace = 'jobs'::regnamespace").fetchall()


def test_install_needs_the_table(db):
    with db.connect() as conn, pytest.raises(LookupError, match="no table public.nope"):
        patterns.install(conn, "tags", "public", "nope")


def test_unknown_option(db):
    with db.connect() as conn, pytest.raises(TypeError, match="no option"):
        patterns.install(conn, "tags", bogus=1)


def test_script_renders_every_placeholder():
    for name in ALL:
        text = patterns.script(name, "my schema", "my table")
        assert "{" not in text.replace("'{}'", "") or name == "tags", name
        if name not in ("retry_until_success",):
            assert '"my schema"' in text, name


def test_cron_next(db):
    with db.connect() as conn:
        patterns.install(conn, "cron")
        conn.execute("SET TimeZone = 'UTC'")
        cases = {
            ("* * * * *", "2026-03-07 10:15:30+00"): "2026-03-07 10:16:00+00",
            ("0 9 * * 1-5", "2026-03-07 10:15:00+00"): "2026-03-09 09:00:00+00",  # Saturday -> Monday
            ("*/15 * * * *", "2026-03-07 10:15:00+00"): "2026-03-07 10:30:00+00",
            ("0 0 1 * *", "2026-03-07 10:15:00+00"): "2026-04-01 00:00:00+00",
            ("0 0 29 2 *", "2026-03-07 10:15:00+00"): "2028-02-29 00:00:00+00",
            ("30 8 1 * 0", "2026-03-02 00:00:00+00"): "2026-03-08 08:30:00+00",  # dom OR dow
        }
        for (expr, start), want in cases.items():
            got = conn.execute("SELECT task_cron_next(%s, %s)::text", (expr, start)).fetchone()[0]
            assert got == want, (expr, start, got)
        for bad in ["* * * *", "61 * * * *", "a * * * *"]:
            with pytest.raises(psycopg.Error):
                conn.execute("SELECT task_cron_next(%s)", (bad,))
        # a bad expression fails the INSERT, not the finish later
        with pytest.raises(psycopg.Error, match="5 fields"):
            conn.execute("INSERT INTO task (input, cron) VALUES ('SELECT 1', '* *')")
