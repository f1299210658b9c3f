"""Every notebook executed with papermill against a throwaway database with `pgtask run` serving
it, then assertions on the database. Each notebook runs twice: the second run succeeds and its
install step changes nothing (the catalog is identical)."""

from datetime import timedelta

from .catalog import snapshot


def outputs(nb) -> str:
    """All text a notebook printed."""
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def test_retry_backoff(db, service, run_notebook):
    params = {"retry_max": 3, "retry_interval": "0.2 seconds"}
    run_notebook("retry_backoff", **params)
    first = snapshot(db.conn, "public", "task")
    nb = run_notebook("retry_backoff", **params)
    assert "nothing to change" in outputs(nb)
    assert snapshot(db.conn, "public", "task") == first
    rows = db.execute("""SELECT id, parent, retry, state::text, plan - lag(stop) OVER (ORDER BY id)
        FROM task WHERE data = 'notebook demo: retry_backoff' ORDER BY id""")
    assert [r[2] for r in rows] == [0, 1, 2, 3]
    assert all(r[3] == "FAIL" for r in rows)
    assert [r[4] for r in rows[1:]] == [timedelta(seconds=0.2), timedelta(seconds=0.4), timedelta(seconds=0.8)]
    assert [r[1] for r in rows[1:]] == [r[0] for r in rows[:-1]]
