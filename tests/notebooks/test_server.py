"""With dsn = "" the operations notebooks talk to the server `pgtask run` would use."""

from pgtask.patterns import notebook as nb

LIBPQ = ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGSERVICE", "PGUSER", "PGTASK_CONFIG")


def test_an_empty_dsn_finds_the_quick_starts_embedded_cluster(tmp_path, monkeypatch):
    """JupyterLab runs a notebook in notebooks/; ./run's cluster is in .pgtask/ beside it."""
    for name in LIBPQ:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / ".pgtask" / "run").mkdir(parents=True)
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    dsn, where = nb.server("")
    assert f"host={tmp_path / '.pgtask' / 'run'}" in dsn and "port=5432" in dsn
    assert f"the embedded cluster in {tmp_path / '.pgtask'}" in where


def test_a_dsn_or_the_environment_wins(tmp_path, monkeypatch):
    for name in LIBPQ:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    assert nb.server("host=/x dbname=app")[0] == "host=/x dbname=app"
    monkeypatch.setenv("PGHOST", "/elsewhere")
    dsn, where = nb.server("")
    assert dsn == "" and "host=/elsewhere" in where and "the environment" in where
    monkeypatch.delenv("PGHOST")
    dsn, where = nb.server("")
    assert dsn == "" and "set dsn" in where
