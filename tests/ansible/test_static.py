"""The role's static checks: syntax per inventory, ansible-lint, argument_specs agree with defaults."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from pgtask_playbook import REPO, Run, run_tool

ROLE = REPO / "roles" / "pgtask"


@pytest.mark.parametrize("inventory", ["local", "example", "ha"])
def test_syntax_check(inventory):
    res = run_tool("ansible-playbook", "-i", str(REPO / "inventories" / inventory),
                   str(REPO / "playbook.yml"), "--syntax-check")
    assert res.returncode == 0, res.stdout + res.stderr


def test_inventories_list_the_groups():
    for inventory, dbs, schedulers in (("local", 1, 1), ("example", 1, 2), ("ha", 3, 2)):
        res = run_tool("ansible-inventory", "-i", str(REPO / "inventories" / inventory), "--list")
        assert res.returncode == 0, res.stderr
        groups = yaml.safe_load(res.stdout)
        assert len(groups["pgtask_db"]["hosts"]) == dbs
        assert len(groups["pgtask_scheduler"]["hosts"]) == schedulers


@pytest.mark.timeout(600)
def test_ansible_lint_clean():
    res = run_tool("ansible-lint", "--offline", "--strict", "-q", "playbook.yml", "roles/pgtask",
                   "inventories", timeout=540)
    assert res.returncode == 0, res.stdout + res.stderr


def _spec_options():
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    return spec


def test_argument_specs_defaults_match_defaults_file():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    spec = _spec_options()
    main = spec["main"]["options"]
    # every public variable is validated by some entry point, with the very same default
    covered = {}
    for entry in spec.values():
        for name, option in entry["options"].items():
            assert "default" in option, f"{name} has no default in argument_specs"
            assert option["default"] == defaults[name], (
                f"{name}: argument_specs default {option['default']!r} != defaults {defaults[name]!r}")
            covered[name] = option
    assert set(defaults) == set(covered), set(defaults) ^ set(covered)
    assert all(name.startswith("pgtask_") for name in defaults)
    assert "pgtask_entries" in main and "pgtask_version" in main


def test_pinned_version_is_the_repository_version():
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["pgtask_version"] == version
    for inventory in ("example", "ha"):
        pinned = yaml.safe_load((REPO / f"inventories/{inventory}/group_vars/all/main.yml").read_text())
        assert pinned["pgtask_version"] == version, inventory


def test_unit_template_is_managed_and_hardened():
    text = (ROLE / "templates" / "pgtask.service.j2").read_text()
    assert text.startswith("{{ ansible_managed | comment }}")
    for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                 "Restart=on-failure", "ExecReload=/bin/kill -HUP $MAINPID"):
        assert line in text


# --- the role's checks and templates, run for real on this machine ---------------------------------
# A play on localhost imports one of the role's check files (its role vars and defaults come with
# it) and renders templates into a directory; the variables are extra vars (-e), as from a command
# line. Nothing outside that directory is written.

HOST_FACTS = {"os_family": "Debian", "service_mgr": "systemd"}


def role_play(out: Path, tasks_from: str | None = "preflight", render: tuple[str, ...] = (),
              args: tuple[str, ...] = (), **extra) -> Run:
    out.mkdir(parents=True, exist_ok=True)
    tasks = []
    if tasks_from:
        tasks.append({"name": "The role's tasks", "ansible.builtin.import_role": {
            "name": "pgtask", "tasks_from": tasks_from}})
    if render:
        tasks.append({"name": "Render", "ansible.builtin.template": {
            "src": str(ROLE / "templates" / "{{ item }}.j2"), "dest": str(out / "{{ item }}"),
            "mode": "0644"}, "loop": list(render)})
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": tasks}]
    (out / "play.yml").write_text(yaml.safe_dump(play))
    (out / "vars.json").write_text(json.dumps({
        "ansible_facts": HOST_FACTS, "ansible_python_interpreter": sys.executable, **extra}))
    res = run_tool("ansible-playbook", "-i", "localhost,", str(out / "play.yml"),
                   "-e", f"@{out / 'vars.json'}", *args)
    return Run(res.returncode, res.stdout + res.stderr)


def preflight_refuses(run: Run, *words: str) -> None:
    assert run.rc != 0, run.output[-3000:]
    failed = run.output.split("fatal:", 1)[-1]
    for word in words:
        assert word in failed, (word, run.output[-3000:])


def load_config(path: Path):
    from pgtask.config import load

    return load(path)


@contextlib.contextmanager
def cluster(conf: str = ""):
    """A throwaway PostgreSQL cluster (Debian's server binaries, run as postgres) whose
    postgresql.conf includes <dir>/postgresql-pgtask.conf, holding ``conf`` at startup."""
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    if os.geteuid() != 0 or not bins or shutil.which("runuser") is None:
        pytest.skip("needs root, runuser and Debian's PostgreSQL server binaries")
    bindir = bins[-1].parent
    base = Path(tempfile.mkdtemp(prefix="pgtask-static-pg-"))
    shutil.chown(base, "postgres")
    as_pg = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*as_pg, str(bindir / "initdb"), "-D", str(base / "data"), "-A", "trust", "-U",
                    "postgres", "--no-sync"], check=True, capture_output=True)
    (base / "pg_hba.conf").write_text("local all all trust\n")
    (base / "pg_ident.conf").write_text("")
    (base / "postgresql-pgtask.conf").write_text(conf)
    with open(base / "data" / "postgresql.conf", "a") as main:
        main.write(f"hba_file = '{base}/pg_hba.conf'\nident_file = '{base}/pg_ident.conf'\n"
                   f"include_if_exists = '{base}/postgresql-pgtask.conf'\n")
    subprocess.run([*as_pg, str(bindir / "pg_ctl"), "-D", str(base / "data"), "-l", str(base / "log"),
                    "-o", f"-c listen_addresses='' -c unix_socket_directories={base}", "-w", "start"],
                   check=True, capture_output=True)

    class Cluster:
        dir = base

        @staticmethod
        def rows(sql: str) -> list[list[str]]:
            res = subprocess.run(["psql", "-h", str(base), "-U", "postgres", "-XAtq", "-F", "\x1f", "-R",
                                  "\x1e", "-c", sql], check=True, capture_output=True, text=True)
            return [row.split("\x1f") for row in res.stdout.rstrip("\n").split("\x1e") if row]

    try:
        yield Cluster
    finally:
        subprocess.run([*as_pg, str(bindir / "pg_ctl"), "-D", str(base / "data"), "-m", "immediate",
                        "stop"], check=False, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def pg():
    """A cluster that parses rendered files as the server does: pg_hba.conf and pg_ident.conf through
    pg_hba_file_rules / pg_ident_file_mappings (hba_file and ident_file point at them; the server's
    own rules stay the ones it started with), conf.d/pgtask.conf through pg_file_settings."""
    with cluster() as c:
        yield c


def ident_mappings(pg) -> list[tuple[str, str]]:
    rows = pg.rows("SELECT sys_name, pg_username, coalesce(error, '') FROM pg_ident_file_mappings "
                   "WHERE map_name = 'pgtask' ORDER BY line_number")
    assert all(not error for *_, error in rows), rows
    return [(sys_name, role) for sys_name, role, _ in rows]


def test_entries_fill_data_and_user_from_each_other(tmp_path, pg):
    entries = [{"data": "app1"}, {"user": "rep"}, {"data": "d3", "user": "u3"}, {}]
    run = role_play(pg.dir, "preflight", ("pg_ident.conf",), pgtask_entries=entries)
    assert run.rc == 0, run.output[-3000:]
    # every entry's role as pgtask fills it in (README, Entries): app1, rep, u3, and postgres; for the
    # service's account and JupyterLab's (pgtask_lab), and for the service's alone without the lab
    roles = ["postgres", "app1", "rep", "u3"]
    assert ident_mappings(pg) == [("/^(.*)$", "\\1"), *[("pgtask", r) for r in roles],
                                  *[("pgtask-lab", r) for r in roles]]
    run = role_play(pg.dir, "preflight", ("pg_ident.conf",), pgtask_entries=entries, pgtask_lab=False)
    assert run.rc == 0, run.output[-3000:]
    assert ident_mappings(pg) == [("/^(.*)$", "\\1"), *[("pgtask", r) for r in roles]]


@pytest.mark.parametrize("entries", [
    [{"data": "app1"}, {"data": "app1", "user": "app1"}],
    [{"user": "x"}, {"data": "x"}],
    [{"data": "postgres"}, {}],
    [{"data": "a", "schema": "public"}, {"data": "a", "table": "task"}],
])
def test_preflight_refuses_entries_pgtask_would_merge(tmp_path, entries):
    preflight_refuses(role_play(tmp_path, pgtask_entries=entries), "each data/user/schema/table once")


def test_preflight_refuses_json_in_settings_and_long_names(tmp_path):
    preflight_refuses(role_play(tmp_path / "a", pgtask_settings={"pg_task": {"json": [{"data": "x"}]}}),
                      "pgtask_settings.pg_task.json", "pgtask_entries")
    long = "é" * 32  # 64 bytes, 32 characters
    preflight_refuses(role_play(tmp_path / "b", pgtask_entries=[{"data": "ok"}, {"data": "ok", "schema": long}]),
                      "pgtask_entries[1].schema", "63 bytes")
    assert role_play(tmp_path / "c", pgtask_entries=[{"data": "é" * 31 + "a"}]).rc == 0


def test_preflight_refuses_entry_values_pgtask_refuses(tmp_path):
    entries = [{"data": "x", "sleep": 500, "run": 4, "spi": True, "reset": 60}, {"data": "y", "reset": "1 hour"}]
    run = role_play(tmp_path / "ok", pgtask_entries=entries)
    assert run.rc == 0, run.output[-3000:]
    preflight_refuses(role_play(tmp_path / "a", pgtask_entries=[{"data": "x", "sleep": "fast"}]),
                      "pgtask_entries[0].sleep")
    preflight_refuses(role_play(tmp_path / "b", pgtask_entries=[{"data": "x", "user": ""}]),
                      "pgtask_entries[0].user")
    preflight_refuses(role_play(tmp_path / "c", pgtask_settings={"pg_taks": {"sleep": 1}}), "pg_taks")


def test_example_inventory_lets_every_entry_role_log_in():
    """The example's database host accepts the schedulers' logins as every entry's role (with a
    password), so execute_as = auto logs in as each task author instead of SET ROLE."""
    res = run_tool("ansible-inventory", "-i", str(REPO / "inventories" / "example"), "--host",
                   "db1.example.internal")
    assert res.returncode == 0, res.stderr
    hostvars = json.loads(res.stdout)
    roles = {e.get("user") or e.get("data") or "postgres" for e in hostvars["pgtask_entries"]} | {"postgres"}
    remote = [line for line in hostvars["pgtask_postgresql_hba"] if line["type"].startswith("host")]
    for role in roles:
        assert any(role in line["user"].split(",") or line["user"] == "all" for line in remote
                   if line["method"] == "scram-sha-256"), (role, remote)


def test_provision_gets_the_environment_off_the_command_line(tmp_path):
    """pgtask provision sees pgtask_environment (here PGHOST names a socket directory that is not
    there, and its error says so), and no secret of it is on a command line or in the log, -vvv too."""
    config_dir = tmp_path / "etc"
    config_dir.mkdir()
    (config_dir / "pgtask.toml").write_text("[pg_task]\njson = [{data = \"postgres\"}]\n")
    socket_dir = tmp_path / "no-such-socket-dir"
    run = role_play(tmp_path / "play", "provision", args=("-vvv",),
                    pgtask_venv_dir=str(Path(sys.executable).parent.parent), pgtask_config_dir=str(config_dir),
                    pgtask_user="root", ansible_become_method="su",
                    pgtask_environment={"PGHOST": str(socket_dir), "PGPASSWORD": "pw-marker-71c2e",
                                        "PGCONNECT_TIMEOUT": 3})
    assert run.rc != 0, run.output[-3000:]
    assert str(socket_dir) in run.output.split("fatal:", 1)[-1], run.output[-3000:]
    assert "pw-marker-71c2e" not in run.output


def test_unit_stop_timeout_follows_the_effective_grace(tmp_path):
    run = role_play(tmp_path / "a", "preflight", ("pgtask.toml", "pgtask.service"),
                    pgtask_settings={"pgtask": {"grace": 100}})
    assert run.rc == 0, run.output[-3000:]
    assert "TimeoutStopSec=115\n" in (tmp_path / "a" / "pgtask.service").read_text()
    assert load_config(tmp_path / "a" / "pgtask.toml").svc("grace") == 100
    run = role_play(tmp_path / "b", "preflight", ("pgtask.toml", "pgtask.service"), pgtask_grace=2.5)
    assert run.rc == 0, run.output[-3000:]
    assert "TimeoutStopSec=18\n" in (tmp_path / "b" / "pgtask.service").read_text()
    assert load_config(tmp_path / "b" / "pgtask.toml").svc("grace") == 2.5


def test_unit_has_the_watchdog_and_systemd_accepts_it(tmp_path):
    """The unit waits for pgtask's READY=1 and restarts it when its watchdog pings stop
    (pgtask_watchdog_sec; 0: off), and systemd-analyze verify finds nothing wrong with it."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("needs systemd-analyze")
    venv = str(Path(sys.executable).parent.parent)  # ExecStart must name a program that is there
    for name, extra, watchdog in (("a", {}, "WatchdogSec=10\n"), ("b", {"pgtask_watchdog_sec": "0"}, "WatchdogSec=0\n")):
        out = tmp_path / name
        run = role_play(out, "preflight", ("pgtask.service",), pgtask_venv_dir=venv, **extra)
        assert run.rc == 0, run.output[-3000:]
        unit = (out / "pgtask.service").read_text()
        for line in ("Type=notify\n", "NotifyAccess=main\n", watchdog, "Restart=on-failure\n"):
            assert line in unit, (line, unit)
        # (a value it cannot parse is only a line naming the file: "Failed to parse ..., ignoring")
        res = subprocess.run(["systemd-analyze", "verify", "--man=no", str(out / "pgtask.service")],
                             check=False, capture_output=True, text=True, timeout=60)
        problems = [line for line in (res.stdout + res.stderr).splitlines()
                    if "pgtask.service" in line or "Unknown" in line]
        assert res.returncode == 0 and not problems, res.stdout + res.stderr
    preflight_refuses(role_play(tmp_path / "c", args=("-e", "pgtask_watchdog_sec=-1")), "pgtask_watchdog_sec")


def test_numbers_from_the_command_line_render_as_numbers(tmp_path):
    out = tmp_path / "a"
    run = role_play(out, "preflight", ("pgtask.toml", "pgtask.service"),
                    args=("-e", "pgtask_grace=60", "-e", "pgtask_sleep=700", "-e", "pgtask_conf_restart=30",
                          "-e", "pgtask_work_restart=20", "-e", "pgtask_restart_sec=7"))
    assert run.rc == 0, run.output[-3000:]
    cfg = load_config(out / "pgtask.toml")
    assert (cfg.svc("grace"), cfg.get("pg_task.sleep"), cfg.get("pg_conf.restart"),
            cfg.get("pg_work.restart")) == (60, 700, 30, 20)
    unit = (out / "pgtask.service").read_text()
    assert "TimeoutStopSec=75\n" in unit and "RestartSec=7\n" in unit
    for name, value in (("pgtask_grace", "soon"), ("pgtask_sleep", "1.5"), ("pgtask_work_restart", "x")):
        preflight_refuses(role_play(tmp_path / name, args=("-e", f"{name}={value}")), name)
    preflight_refuses(role_play(tmp_path / "g", pgtask_settings={"pgtask": {"grace": "60"}}),
                      "pgtask_settings.pgtask.grace")


def test_non_bmp_characters_render_as_toml(tmp_path):
    schema = "jobs_\U0001F600"
    run = role_play(tmp_path, "preflight", ("pgtask.toml",), pgtask_dsn="application_name=\U0001F680 dbname=x\x7f",
                    pgtask_entries=[{"data": "d", "schema": schema}],
                    pgtask_settings={"pgtask": {"retention": "7 days"}, "pg_task": {"reset": "1 hour"}})
    assert run.rc == 0, run.output[-3000:]
    cfg = load_config(tmp_path / "pgtask.toml")
    assert cfg.get("pg_task.json") == [{"data": "d", "schema": schema}]
    assert cfg.dsn == "application_name=\U0001F680 dbname=x\x7f"


# the postgresql entry point's checks refuse what would inject lines or break the files
@pytest.mark.parametrize(("var", "value", "named"), [
    ("pgtask_postgresql_hba", [{"type": "host", "database": "all", "user": "all", "address": "10.0.0.0/8",
                                "method": "scram-sha-256\nhost all all 0.0.0.0/0 trust"}],
     "pgtask_postgresql_hba[0].method"),
    ("pgtask_postgresql_hba", [{"type": "host", "database": "all", "user": "a b", "address": "10.0.0.0/8",
                                "method": "md5"}], "pgtask_postgresql_hba[0].user"),
    ("pgtask_postgresql_hba", [{"type": "host", "database": "all", "user": "all", "method": "md5"}],
     "pgtask_postgresql_hba[0].address"),
    ("pgtask_postgresql_hba", [{"type": "local", "database": "all", "user": "all", "method": "peer",
                                "options": "map=x\nlocal all all trust"}], "pgtask_postgresql_hba[0].options"),
    ("pgtask_postgresql_settings", {"work_mem = '1MB'\nlisten_addresses": "*"}, "pgtask_postgresql_settings"),
    ("pgtask_postgresql_settings", {"pg_task.timeout": ["1 min"]}, "pgtask_postgresql_settings"),
    ("pgtask_postgresql_ident_roles", ["postgres", "x\npgtask /^(.*)$ postgres"],
     "pgtask_postgresql_ident_roles"),
    ("pgtask_entries", [{"data": "x\ny"}], "pgtask_entries[0]"),
    ("pgtask_user", "pg task", "pgtask_user"),
])
def test_postgresql_checks_refuse(tmp_path, var, value, named):
    run = role_play(tmp_path, "postgresql_preflight", pgtask_manage_postgresql=True, **{var: value})
    preflight_refuses(run, named)


@pytest.mark.parametrize("version", ["3.0.2", "4.1", "4.1.5; rm -rf /"])
def test_patroni_older_than_the_leader_key_fix_is_refused(tmp_path, version):
    """Patroni before 3.0.3 could write the etcd leader key from a stale view after a partition
    (docs/ha.md): the role refuses it, and anything that is not a release number, before installing."""
    run = role_play(tmp_path, "patroni", pgtask_manage_postgresql=True, pgtask_patroni=True,
                    pgtask_patroni_superuser_password="x", pgtask_patroni_replication_password="y",
                    pgtask_patroni_address="10.0.0.1", pgtask_patroni_version=version)
    preflight_refuses(run, "pgtask_patroni_version", "3.0.3")


def test_postgresql_files_quote_what_postgresql_reads(pg):
    roles = ['my role', 'o"brien', 'all', '+admins', 'x#y']
    hba = [{"type": "host", "database": "all", "user": 'postgres,"my role","o""brien"',
            "address": "10.0.1.0/24", "method": "scram-sha-256"},
           {"type": "local", "database": "sameuser", "user": "+authors", "method": "peer",
            "options": "map=pgtask"}]
    settings = {"pg_task.timeout": "10 min", "pg_task.null": "a\\b'c", "work_mem": 4096,
                "pg_task.delete": False, "pg_task.group": "two\nlines"}
    run = role_play(pg.dir, "postgresql_preflight", ("pg_hba.conf", "pg_ident.conf", "postgresql-pgtask.conf"),
                    pgtask_manage_postgresql=True, pgtask_postgresql_ident_roles=roles,
                    pgtask_entries=[{"data": "d", "user": "app"}], pgtask_postgresql_hba=hba,
                    pgtask_postgresql_settings=settings)
    assert run.rc == 0, run.output[-3000:]
    # the same names for JupyterLab's account too (pgtask_lab)
    assert ident_mappings(pg) == [("/^(.*)$", "\\1"), *[(user, role) for user in ("pgtask", "pgtask-lab")
                                                         for role in [*roles, "app"]]]
    rules = pg.rows("SELECT type, array_to_string(database, '|'), array_to_string(user_name, '|'), "
                    "coalesce(address, ''), auth_method, coalesce(array_to_string(options, '|'), ''), "
                    "coalesce(error, '') FROM pg_hba_file_rules ORDER BY line_number")
    assert rules[:3] == [
        ["host", "all", 'postgres|my role|o"brien', "10.0.1.0", "scram-sha-256", "", ""],
        ["local", "sameuser", "+authors", "", "peer", "map=pgtask", ""],
        ["local", "all", "all", "", "peer", "map=pgtask", ""]], rules
    assert all(not row[-1] for row in rules), rules
    read = pg.rows("SELECT name, setting, coalesce(error, '') FROM pg_file_settings "
                   f"WHERE sourcefile = '{pg.dir}/postgresql-pgtask.conf'")
    assert all(not error for *_, error in read), read
    read = {name: value for name, value, _ in read}
    assert read == {"pg_task.timeout": "10 min", "pg_task.null": "a\\b'c", "work_mem": "4096",
                    "pg_task.delete": "off", "pg_task.group": "two\nlines"}, read


def test_restart_check_sees_startup_settings_changed_added_and_removed():
    """The handler's query (run after a reload) counts a startup-only setting the files changed,
    added or dropped; the files are read in the querying session, so no reload is needed here."""
    handlers = yaml.safe_load((ROLE / "handlers" / "main.yml").read_text())
    check = next(h for h in handlers if h["name"] == "Restart PostgreSQL if a setting needs it")
    sql = check["ansible.builtin.command"]["argv"][-1]
    with cluster("max_prepared_transactions = 5\nwork_mem = '8MB'\n") as c:
        conf = c.dir / "postgresql-pgtask.conf"
        assert c.rows(sql) == [["0"]]
        conf.write_text("max_prepared_transactions = 5\nwork_mem = '16MB'\n")  # reloadable only
        assert c.rows(sql) == [["0"]]
        conf.write_text("max_prepared_transactions = 6\n")  # changed
        assert c.rows(sql) == [["1"]]
        conf.write_text("max_prepared_transactions = 5\nmax_locks_per_transaction = 128\n")  # added
        assert c.rows(sql) == [["1"]]
        conf.write_text("work_mem = '8MB'\n")  # removed: back to the default needs a restart
        assert c.rows(sql) == [["1"]]
    # and of the configured cluster, not Debian's default one (test_e2e_restarts has two)
    assert check["environment"]["PGCLUSTER"] == (
        "{{ pgtask_postgresql_version }}/{{ pgtask_postgresql_cluster }}")


def test_switches_from_the_command_line_are_read_as_booleans(tmp_path):
    # -e pgtask_manage_postgresql=false is the string "false": the entry point must still do nothing
    run = role_play(tmp_path / "off", "postgresql", args=("-e", "pgtask_manage_postgresql=false"))
    assert run.rc == 0, run.output[-3000:]
    recap = run.recap("localhost")
    # the argument validation and the switch check alone ran; every other task was skipped
    assert (recap["ok"], recap["changed"]) == (2, 0) and recap["skipped"] > 10, run.output[-3000:]
    for value in ("no", "False", "0", "on"):
        run = role_play(tmp_path / f"ok-{value}", args=("-e", f"pgtask_provision={value}"))
        assert run.rc == 0, (value, run.output[-3000:])
    for value in ("flase", "disabled", "2"):
        preflight_refuses(role_play(tmp_path / value, args=("-e", f"pgtask_service_enabled={value}")),
                          "pgtask_service_enabled", value)


def test_preflight_refuses_environment_names_systemd_would_drop(tmp_path):
    ok = role_play(tmp_path / "ok", "preflight", ("pgtask.env",),
                   pgtask_environment={"PGPASSWORD": 'se"cr\\et', "PGCONNECT_TIMEOUT": 5})
    assert ok.rc == 0, ok.output[-3000:]
    assert 'PGPASSWORD="se\\"cr\\\\et"\n' in (tmp_path / "ok" / "pgtask.env").read_text()
    assert "se\"cr" not in ok.output  # a value is never shown
    for i, (name, value) in enumerate((("A B", "x"), ("1X", "x"), ("X\nPGHOST", "x"), ("PGHOST", "a\nPGUSER=b"))):
        run = role_play(tmp_path / str(i), pgtask_environment={name: value})
        preflight_refuses(run, f"pgtask_environment.{name}")
        assert "PGUSER=b" not in run.output.split("fatal:", 1)[-1]
