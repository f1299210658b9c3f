"""The manual's Quick start statements, exactly as written, against the running service; and the
README's quick start, `./run` beside `./test`, from a fresh clone."""

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
from support import wait_for

from pgtask.cluster import SERVER_HOME, Cluster, find_bindir

ROOT = Path(__file__).resolve().parents[2]
NEWCOMER = "pgtask-newcomer"  # the ordinary user the quick start is tried as (made and removed by the test)

QUICK_START = [
    "INSERT INTO task (input) VALUES ('SELECT now()')",
    "INSERT INTO task (plan, input) VALUES (now() + '5 min':INTERVAL, 'SELECT now()')",
    "INSERT INTO task (plan, input) VALUES ('2029-07-01 12:51:00', 'SELECT now()')",
    "INSERT INTO task (repeat, input) VALUES ('5 min', 'SELECT now()')",
    "INSERT INTO task (input) VALUES ('SELECT 1/0')",
    "INSERT INTO task (group, max, input) VALUES ('group', 1, 'SELECT now()')",
    "INSERT INTO task (group, max, input) VALUES ('group', 2, 'SELECT now()')",
]


def test_quick_start_as_written(db):
    """Three Quick start lines are not valid PostgreSQL as printed: `'5 min':INTERVAL` (one colon)
    and the unquoted reserved word `group`. PostgreSQL's parser rejects them before pgtask sees
    anything; the README prints the corrected lines. Everything else inserts as written."""
    errors = {}
    for statement in QUICK_START:
        try:
            db.execute(statement)
        except Exception as exc:  # noqa: BLE001
            errors[statement] = str(exc).strip().splitlines()[0]
    assert sorted(errors) == sorted([QUICK_START[1], QUICK_START[5], QUICK_START[6]]), errors
    assert all("syntax error" in e for e in errors.values())
    assert db.value("SELECT count(*) FROM task") == len(QUICK_START) - 3
    # the corrected lines work
    db.execute("""INSERT INTO task (plan, input) VALUES (now() + '5 min'::INTERVAL, 'SELECT now()')""")
    db.execute("""INSERT INTO task ("group", max, input) VALUES ('group', 1, 'SELECT now()')""")
    assert db.value("SELECT count(*) FROM task") == len(QUICK_START) - 1


def test_quick_start_runs(db, service):
    now_id = db.insert("SELECT now()")
    later_id = db.value("INSERT INTO task (plan, input) VALUES (now() + '5 min'::INTERVAL, 'SELECT now()') RETURNING id")
    fixed_id = db.value("INSERT INTO task (plan, input) VALUES ('2029-07-01 12:51:00', 'SELECT now()') RETURNING id")
    repeat_id = db.value("INSERT INTO task (repeat, input) VALUES ('5 min', 'SELECT now()') RETURNING id")
    fail_id = db.value("INSERT INTO task (input) VALUES ('SELECT 1/0') RETURNING id")

    done = db.wait_state(now_id)
    assert done["state"] == "DONE" and done["output"] and done["error"] is None
    assert done["start"] is not None and done["stop"] >= done["start"] and done["pid"]

    failed = db.wait_state(fail_id)
    assert failed["state"] == "FAIL"
    assert failed["error"] == "ERROR:  division by zero\nSTATEMENT:  SELECT 1/0"
    assert failed["output"] == ""

    first = db.wait_state(repeat_id)
    assert first["state"] == "DONE"
    nxt = db.execute("SELECT plan - %s::timestamptz, state FROM task WHERE parent = %s", (first["plan"], repeat_id))
    assert len(nxt) == 1 and str(nxt[0][0]) == "0:05:00" and nxt[0][1] == "PLAN"

    assert db.task(later_id)["state"] == "PLAN"
    assert db.task(fixed_id)["state"] == "PLAN"


@pytest.mark.parametrize("max_", [1, 2])
def test_group_max_concurrency(db, service, max_):
    """max = N lets N + 1 tasks of a group run at once."""
    db.execute("CREATE TABLE seen (id bigint, at timestamptz, until timestamptz)")
    ids = [db.insert("INSERT INTO seen SELECT current_setting('pg_task.id')::bigint, clock_timestamp(), "
                     "clock_timestamp() + '0.4 s'; SELECT pg_sleep(0.4)", group="g", max=max_)
           for _ in range(6)]
    for i in ids:
        assert db.wait_state(i, timeout=30)["state"] == "DONE"
    # the largest number of runs overlapping at any start
    overlap = db.value("SELECT max((SELECT count(*) FROM seen b WHERE b.at <= a.at AND b.until > a.at)) FROM seen a")
    assert overlap == max_ + 1


@pytest.mark.slow
@pytest.mark.any_pg  # its own clusters: ./run's embedded one, and ./test's of both versions
@pytest.mark.timeout(600)
@pytest.mark.parametrize("newcomer", [None, NEWCOMER], ids=["as-we-are", "ordinary-user"])
def test_readme_commands_side_by_side_from_a_0700_checkout(tmp_path, newcomer):
    """The README's quick start as a newcomer follows it: this repository's committed HEAD cloned
    under a directory only its owner may enter (like /root or a 0700 home), on a path with a space; `./run` in one shell,
    a task through its embedded cluster, and `./test` (two of this file's tests, both versions)
    in another while `./run` goes on; the directories above the checkout keep their modes. Run by
    whoever runs the suite (root in CI: the servers run as the OS user postgres), and by an
    ordinary user in a 0700 home of their own (the servers run as that user)."""
    if newcomer is not None and os.geteuid() != 0:
        pytest.skip("making an ordinary user needs root")
    outer = Path(tempfile.mkdtemp(prefix="pgtask-quickstart-"))  # 0700
    checkout = outer / "with space" / "project"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "VIRTUAL_ENV"))}
    as_user: dict = {}  # subprocess's arguments to run a command as the newcomer
    if newcomer is not None:  # the 0700 directory is their home
        if subprocess.run(["id", "-u", newcomer], capture_output=True, check=False).returncode != 0:
            subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/bash", newcomer], check=True)
        entry = pwd.getpwnam(newcomer)
        as_user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        env = {**env, "HOME": str(outer), "USER": newcomer, "LOGNAME": newcomer}
    run = None
    copies = set(SERVER_HOME.glob("pginstall-*"))
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(checkout)], check=True)
        subprocess.run(["git", "-C", str(checkout), "checkout", "-q", head], check=True)
        if newcomer is not None:
            subprocess.run(["chown", "-R", f"{newcomer}:", str(outer)], check=True)
        modes = [oct(p.stat().st_mode & 0o777) for p in (outer, checkout.parent)]
        assert modes[0] == "0o700"
        with open(tmp_path / "run.log", "wb") as log:
            run = subprocess.Popen(["./run"], cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, **as_user)
        wait_for(lambda: "pgtask running" in (out := (tmp_path / "run.log").read_text(errors="replace")) or
                 run.poll() is not None and pytest.fail(f"./run exited:\n{out}"), 300, message="./run")
        # what the server user could not reach was put where it can: nothing above the checkout chmod-ed
        assert [oct(p.stat().st_mode & 0o777) for p in (outer, checkout.parent)] == modes
        readme_psql = ["psql", "-h", f"{checkout}/.pgtask/run", "-p", "5432", "-U", "postgres", "-d", "postgres", "-XAtq"]
        task_id = subprocess.run([*readme_psql, "-c", "INSERT INTO task (input) VALUES ('SELECT 1') RETURNING id"],
                                 capture_output=True, text=True, check=True, env=env, **as_user).stdout.split()[0]
        wait_for(lambda: subprocess.run([*readme_psql, "-c", f"SELECT state FROM task WHERE id = {int(task_id)}"],
                                        capture_output=True, text=True, env=env, check=False, **as_user).stdout.strip()
                 == "DONE",
                 30, message="the task in ./run's embedded cluster")
        tests = subprocess.run(["./test", "tests/integration/test_quickstart.py", "-q", "-p", "no:cacheprovider",
                                "-k", "quick_start_as_written or quick_start_runs"],
                               cwd=checkout, env=env, capture_output=True, text=True, timeout=400, check=False,
                               **as_user)
        assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
        assert tests.stdout.count("2 passed") == 2, tests.stdout[-4000:]
        assert run.poll() is None, (tmp_path / "run.log").read_text(errors="replace")
        run.terminate()
        assert run.wait(60) == 0, (tmp_path / "run.log").read_text(errors="replace")
    finally:
        if run is not None and run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        if newcomer is None:
            Cluster(checkout / ".pgtask", find_bindir("auto")).destroy()
        else:  # their cluster runs as them: whatever of theirs is left goes
            subprocess.run(["pkill", "-KILL", "-u", newcomer], check=False)
            wait_for(lambda: subprocess.run(["pgrep", "-u", newcomer], capture_output=True, check=False).returncode
                     != 0, 30, message="the newcomer's processes gone")
            subprocess.run(["userdel", newcomer], check=False)
        shutil.rmtree(outer, ignore_errors=True)
        for made in set(SERVER_HOME.glob("pginstall-*")) - copies:  # the clone's server binaries, copied
            shutil.rmtree(made, ignore_errors=True)
