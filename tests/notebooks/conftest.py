"""Run a notebook with papermill in-process, against the test's database."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"


@pytest.fixture
def run_notebook(db, request) -> Callable[..., dict]:
    """``run_notebook(name, **params)`` executes ``notebooks/<name>.ipynb`` with ``dsn`` = the test
    database and returns the executed notebook; executed copies go to ``notebooks/out/`` (ignored)."""
    import papermill

    out_dir = NOTEBOOKS / "out" / f"pg{request.config.getoption('--pg')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, int] = {}

    def run(name: str, **params):
        runs[name] = runs.get(name, 0) + 1
        return papermill.execute_notebook(
            str(NOTEBOOKS / f"{name}.ipynb"), str(out_dir / f"{name}.run{runs[name]}.ipynb"),
            parameters={"dsn": db.dsn, **params}, kernel_name="python3", cwd=str(NOTEBOOKS),
            progress_bar=False, log_output=False, request_save_on_cell_execute=False)

    return run
