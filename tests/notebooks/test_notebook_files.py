"""The committed notebooks follow the conventions: no outputs or execution counts, one cell tagged
`parameters` holding plain literals (dsn, schema, table among them), a first markdown cell that
says what it changes and how to undo it, and a test that executes each one."""

import ast
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.any_pg  # no server: the first pass of ./test runs it

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def test_every_notebook_is_tested():
    tests = (Path(__file__).parent / "test_notebooks.py").read_text()
    assert len(NOTEBOOKS) == 14
    for path in NOTEBOOKS:
        assert f'"{path.stem}"' in tests, f"{path.name} is not executed by a test"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_conventions(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "commit notebooks without outputs"
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ")
    for heading in ("**What it does.**", "**What it changes.**", "**How to undo it.**", "**Parameters.**"):
        assert heading in first.source, heading
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and code[0] is params[0], "one parameters cell, the first code cell"
    names = {}
    for stmt in ast.parse(params[0].source).body:
        assert isinstance(stmt, ast.Assign) and len(stmt.targets) == 1, ast.dump(stmt)
        names[stmt.targets[0].id] = ast.literal_eval(stmt.value)  # plain literals only
    assert {"dsn", "schema", "table"} <= set(names)
    assert names["dsn"] == "" and names["schema"] == "public" and names["table"] == "task"
    if "dry_run" in names:
        assert names["dry_run"] is True, "changes default to a dry run"
    assert nb.metadata.kernelspec.name == "python3"
