"""One scheduled run of the maintenance notebook (pgtask/notebook_run.py, what the appliance's
pgtask-maintenance@ unit starts): the executed notebook and its HTML copy in a run directory, the
outcome in the entry's run log."""

import json

from pgtask import notebook_run

from .conftest import NOTEBOOKS


def test_a_run_writes_its_notebook_and_its_outcome_to_the_run_log(db, tmp_path):
    spec = tmp_path / "entry.json"
    spec.write_text(json.dumps({"notebook": str(NOTEBOOKS / "maintenance.ipynb"), "runs_dir": str(tmp_path / "runs"),
                                "keep_days": 1, "schedule": "",
                                "parameters": {"dsn": db.dsn, "schema": "public", "table": "task"}}))
    assert notebook_run.main([str(spec)]) == 0  # a dry run (the notebook's default) is OK
    (run,) = (tmp_path / "runs").iterdir()
    assert {p.name for p in run.iterdir()} == {"maintenance.ipynb", "maintenance.html"}
    rows = db.execute('SELECT "ok", "summary", "period", "run_dir", "finished" >= "started" FROM task_maintenance_run')
    assert rows == [(True, "OK: dry run, nothing changed", None, str(run), True)]
