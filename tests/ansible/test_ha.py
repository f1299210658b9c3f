"""High availability for real: three database hosts running PostgreSQL under Patroni with etcd, two
scheduler hosts, all booted with systemd-nspawn and rolled out by the playbook (docs/ha.md).

The hosts share one network namespace made for this module (nothing but its loopback): each binds
its own 127.0.39.x, so they reach one another and nothing else. The test process joins it in a few
threads of its own (setns(2)) to query the cluster.

In order: the rollout (a leader, its synchronous standby, both schedulers claiming), then a rolling
upgrade of the schedulers (one host at a time, drained) and faults under a steady load -- ≥ 2,000 tasks over 20 groups, each writing its id to a ledger in its own transaction:
etcd lost on the leader's host (nothing changes), a scheduler host powered off (the other resets its
rows and runs them), a planned switchover, and last the leader's host powered off (Patroni promotes
the synchronous standby; the etcd member on that host goes with it). Each prints the time until tasks
finish again (the longest pause between two ledger commits), tasks lost (asserted 0) and tasks run
twice (asserted: only runs that straddle the fault, at most one extra run each).

Run alone: ``pytest --pg 15 tests/ansible/test_ha.py -m ha`` (root; the HA root filesystem is built
and cached on first use, ≈3 min).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pgtask_nspawn as nspawn
import psycopg
import pytest
import yaml
from pgtask_playbook import REPO, Run, run_playbook, wait_for

pytestmark = [pytest.mark.ha, pytest.mark.timeout(1500)]

DB_HOSTS = ["db1", "db2", "db3"]
SCHEDULER_HOSTS = ["sched1", "sched2"]
ADDRESS = {"db1": "127.0.39.11", "db2": "127.0.39.12", "db3": "127.0.39.13",
           "sched1": "127.0.39.21", "sched2": "127.0.39.22"}
PASSWORD = "pgtask-ha-test-password"
REPLICATION_PASSWORD = "pgtask-ha-test-replication"
CLUSTER_DSN = (f"host={','.join(ADDRESS[h] for h in DB_HOSTS)} port=5432 dbname=postgres user=postgres "
               "target_session_attrs=read-write connect_timeout=2")

TASKS, GROUPS, SLEEP = 2000, 20, 0.2
BODY = "INSERT INTO ledger (id) VALUES (current_setting('pg_task.id')::bigint); SELECT pg_sleep({sleep})"
CLONE_NEWNET = 0x40000000


class InNetns:
    """Calls run in threads that live in the hosts' network namespace (setns(2) moves one thread)."""

    def __init__(self, path: str):
        self.pool = ThreadPoolExecutor(max_workers=3, initializer=self._enter, initargs=(path,),
                                       thread_name_prefix="netns")

    @staticmethod
    def _enter(path: str) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(path, os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns {path}")
        finally:
            os.close(fd)

    def __call__(self, fn, *args, **kwargs):
        return self.pool.submit(fn, *args, **kwargs).result()


def _query(sql: str, params=None, dsn: str = CLUSTER_DSN) -> list[tuple]:
    with psycopg.connect(dsn, password=PASSWORD, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def _http(url: str) -> str:
    with urllib.request.urlopen(url, timeout=3) as res:
        return res.read().decode()


@pytest.fixture(scope="module")
def ha_rootfs():
    reason = nspawn.cannot_boot_reason()
    if reason:
        pytest.skip(reason)
    if shutil.which("ip") is None:
        pytest.skip("the hosts' network namespace needs ip (iproute2)")
    return nspawn.build_rootfs(log=print, extra=tuple(nspawn.HA_PACKAGES))


@pytest.fixture(scope="module")
def netns():
    name = f"pgtask-ha-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield f"/run/netns/{name}"
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.fixture(scope="module")
def net(netns):
    runner = InNetns(netns)
    yield runner
    runner.pool.shutdown(wait=False, cancel_futures=True)


@pytest.fixture(scope="module")
def hosts(ha_rootfs, netns):
    """The five hosts, booted; the scheduler hosts run no database of their own."""
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        booted = {}
        for alias in DB_HOSTS + SCHEDULER_HOSTS:
            booted[alias] = stack.enter_context(
                nspawn.Container(ha_rootfs, f"pgtask-ha-{alias}-{os.getpid()}", netns=netns))
        for alias in SCHEDULER_HOSTS:
            booted[alias].sh("systemctl disable --now -q postgresql etcd")
        print(f"5 hosts booted in {time.monotonic() - started:.1f} s")
        yield booted


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    return tmp_path_factory.mktemp("wheelhouse")


def inventory(hosts, wheelhouse, **extra_vars) -> dict:
    def host_vars(alias):
        c = hosts[alias]
        return {"ansible_host": c.name, "ansible_user": "root",
                "ansible_python_interpreter": "/usr/bin/python3",
                "ansible_ssh_private_key_file": str(nspawn.ssh_key_path()),
                "ansible_ssh_args": c.ssh_args()}

    return {"all": {
        "hosts": {alias: host_vars(alias) for alias in hosts},
        "vars": {
            "pgtask_manage_postgresql": True,
            "pgtask_patroni": True,
            # the hosts reach no mirror: their packages came with the root filesystem
            "pgtask_apt_update_cache": False,
            "pgtask_wheelhouse_dir": str(wheelhouse),
            # at most 20 tasks at a time on each scheduler host: the load needs both
            "pgtask_entries": [{"data": "postgres", "run": 20}],
            "pgtask_grace": 10,
            **extra_vars,
        },
        "children": {
            "pgtask_db": {
                "hosts": {alias: {"pgtask_patroni_address": ADDRESS[alias]} for alias in DB_HOSTS},
                "vars": {
                    "pgtask_patroni_superuser_password": PASSWORD,
                    "pgtask_patroni_replication_password": REPLICATION_PASSWORD,
                    # two schedulers with up to 40 executor sessions each, and their own connections
                    "pgtask_patroni_dcs": {"postgresql": {"parameters": {"max_connections": 200}}},
                },
            },
            "pgtask_scheduler": {
                "hosts": {alias: {"pgtask_metrics_listen": f"{ADDRESS[alias]}:9464"}
                          for alias in SCHEDULER_HOSTS},
                "vars": {
                    # as inventories/ha has it, the addresses from the db hosts' own variables
                    "pgtask_dsn": "host={{ groups['pgtask_db'] | map('extract', hostvars, "
                                  "'pgtask_patroni_address') | join(',') }} port=5432 dbname=postgres "
                                  "user=postgres target_session_attrs=read-write connect_timeout=3",
                    "pgtask_environment": {"PGPASSWORD": PASSWORD},
                    "pgtask_service_after": ["network-online.target"],
                    "pgtask_sleep": 500,
                },
            },
        },
    }}


@pytest.fixture(scope="module")
def deploy(hosts, wheelhouse, tmp_path_factory):
    inv_dir = tmp_path_factory.mktemp("inventory")

    def run(*args: str, **extra_vars) -> Run:
        path = inv_dir / "hosts.yml"
        path.write_text(yaml.safe_dump(inventory(hosts, wheelhouse, **extra_vars)))
        return run_playbook(path, *args, timeout=900)

    return run


def assert_ok(run: Run) -> None:
    assert run.rc == 0, run.output[-8000:]
    for alias in DB_HOSTS + SCHEDULER_HOSTS:
        recap = run.recap(alias)
        assert recap["failed"] == 0 and recap["unreachable"] == 0, run.output[-8000:]


def cluster_state(net, alive: list[str]) -> dict | None:
    """Patroni's view of the cluster, asked of the first db host in ``alive`` that answers."""
    for alias in alive:
        with contextlib.suppress(OSError, ValueError):
            return json.loads(net(_http, f"http://{ADDRESS[alias]}:8008/cluster"))
    return None


def leader(net, alive: list[str]) -> str | None:
    state = cluster_state(net, alive) or {}
    names = [m["name"] for m in state.get("members", []) if m["role"] == "leader" and m["state"] == "running"]
    return names[0] if names else None


def journal(host, unit: str = "pgtask", lines: int = 60) -> str:
    return host.sh(f"journalctl -u {unit} --no-pager -n {lines}", check=False).stdout


# -- the rollout ---------------------------------------------------------------------------------

def test_rollout_makes_a_cluster_and_both_schedulers_claim(hosts, deploy, net):
    started = time.monotonic()
    run = deploy()
    assert_ok(run)
    print(f"first run of the playbook: {time.monotonic() - started:.0f} s")
    state = cluster_state(net, DB_HOSTS)
    roles = sorted(m["role"] for m in state["members"])
    assert roles == ["leader", "replica", "sync_standby"], state
    for alias in SCHEDULER_HOSTS:
        wait_for(lambda a=alias: hosts[a].sh("systemctl is-active pgtask", check=False).stdout.strip() == "active",
                 30, f"pgtask on {alias}")
    # provisioned on the leader, replicated to the standbys
    assert net(_query, "SELECT to_regclass('public.task') IS NOT NULL") == [(True,)]
    net(_query, "CREATE TABLE ledger (id bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())")
    net(_query, """INSERT INTO task (input, "group", max) SELECT 'SELECT pg_sleep(0.05)', 'g' || (i % 20), 2
                   FROM generate_series(1, 400) i""")
    wait_for(lambda: net(_query, "SELECT count(*) FROM task WHERE state <> 'DONE'") == [(0,)], 120,
             "400 tasks to be done; journals:\n" + "\n".join(journal(hosts[a]) for a in SCHEDULER_HOSTS))
    for alias in SCHEDULER_HOSTS:
        assert counter(net, alias, "pgtask_finished_total") > 0, (alias, journal(hosts[alias]))


def new_release(tmp_path) -> tuple[str, Path]:
    """This checkout as a newer release (its version with a .post1): the version and the tree."""
    tree = tmp_path / "release"
    shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".cache", "__pycache__", "notebooks", "bench", "tests", "docs"))
    pyproject = tree / "pyproject.toml"
    text = pyproject.read_text()
    version = re.search(r'^version = "([^"]+)"', text, re.MULTILINE).group(1) + ".post1"
    pyproject.write_text(re.sub(r'^version = "[^"]+"', f'version = "{version}"', text, count=1, flags=re.MULTILINE))
    return version, tree


def restarts(host) -> tuple[float, float]:
    """When the service on ``host`` last began to stop and when it was next ready (s since the epoch)."""
    lines = host.sh("journalctl -u pgtask -o short-unix --no-pager | grep -E 'Stopping pgtask|Started pgtask'",
                    check=False).stdout.splitlines()
    stopping = [float(line.split()[0]) for line in lines if "Stopping" in line]
    started = [float(line.split()[0]) for line in lines if "Started" in line]
    assert stopping and started, lines
    return stopping[-1], started[-1]


def test_rolling_upgrade_drains_one_host_at_a_time(hosts, deploy, net, tmp_path):
    """A new release under load: one scheduler host at a time (serial 1) is upgraded and restarted;
    its running tasks finish first (SIGTERM drains them), the other host goes on claiming."""
    version, tree = new_release(tmp_path)
    runs = []

    def upgrade():
        runs.append(deploy(pgtask_version=version, pgtask_source_dir=str(tree)))

    under_load(net, "rolling-upgrade", upgrade, sleep=2.0, watch=[hosts[a] for a in SCHEDULER_HOSTS])
    assert_ok(runs[0])
    # the play's batches: sched1's host whole, then sched2's
    assert runs[0].output.count("PLAY [Roll out the pgtask scheduler]") == len(SCHEDULER_HOSTS), runs[0].output[-4000:]
    (stop1, ready1), (stop2, ready2) = (restarts(hosts[a]) for a in SCHEDULER_HOSTS)
    print(f"sched1 restarted in {ready1 - stop1:.1f} s (drain included), sched2 {ready2 - stop2:.1f} s, "
          f"{stop2 - ready1:.1f} s after sched1 was back")
    assert ready1 < stop2
    for alias in SCHEDULER_HOSTS:
        installed = hosts[alias].sh("/opt/pgtask/venv/bin/python -c 'import importlib.metadata as m; "
                                    "print(m.version(\"pgtask\"))'").stdout.strip()
        assert installed == version, alias


# -- faults under load ---------------------------------------------------------------------------

class Load:
    """A batch of TASKS tasks over GROUPS groups, each writing its id to the ledger as it runs."""

    def __init__(self, net, name: str, sleep: float = SLEEP):
        self.net, self.name, self.sleep = net, name, sleep
        self.ids = [r[0] for r in net(_query, f"""
            INSERT INTO task (input, "group", max)
            SELECT %s, '{name}-' || (i %% {GROUPS}), 2 FROM generate_series(1, {TASKS}) i RETURNING id""",
                                      (BODY.format(sleep=sleep),))]
        self.low, self.high = min(self.ids), max(self.ids)

    def ran(self) -> int:
        with contextlib.suppress(psycopg.Error):
            return self.net(_query, "SELECT count(*) FROM ledger WHERE id BETWEEN %s AND %s",
                            (self.low, self.high))[0][0]
        return -1

    def in_flight(self) -> int:
        return self.net(_query, "SELECT count(*) FROM task WHERE state IN ('TAKE', 'WORK') AND id BETWEEN %s AND %s",
                        (self.low, self.high))[0][0]

    def left(self) -> int:
        with contextlib.suppress(psycopg.Error):
            return self.net(_query, "SELECT count(*) FROM task WHERE state <> 'DONE' AND id BETWEEN %s AND %s",
                            (self.low, self.high))[0][0]
        return -1

    def figures(self, fault_began: float, fault_ended: float) -> dict:
        """Lost (no ledger row), run twice (and whether each straddles the fault), the longest pause."""
        runs = self.net(_query, """SELECT id, array_agg(extract(epoch FROM at)::float8 ORDER BY at)
                                   FROM ledger WHERE id BETWEEN %s AND %s GROUP BY id""", (self.low, self.high))
        by_id = dict(runs)
        lost = [i for i in self.ids if i not in by_id]
        twice = {i: at for i, at in by_id.items() if len(at) > 1}
        # a task runs again only if its first run may have been cut off by the fault: it began before
        # the fault was over, its second run came after the fault began, and there is no third
        unexplained = {i: at for i, at in twice.items()
                       if len(at) > 2 or at[0] > fault_ended + self.sleep + 1 or at[1] < fault_began}
        commits = sorted(t for at in by_id.values() for t in at)
        around = [t for t in commits if t >= fault_began - 5]
        pause = max((b - a for a, b in itertools.pairwise(around)), default=float("nan"))
        return {"lost": lost, "twice": twice, "unexplained": unexplained, "pause": pause,
                "span": commits[-1] - commits[0] if commits else 0.0}


def logged(host, since: float, until: float) -> list[str]:
    """The service's log lines on ``host`` between two moments (s since the epoch)."""
    return host.sh(f"journalctl -u pgtask -q --no-pager -o cat --since @{int(since)} --until @{int(until) + 1}",
                   check=False).stdout.splitlines()


def under_load(net, name: str, fault, timeout: float = 300, sleep: float = SLEEP, watch=()) -> dict:
    """Start a load (tasks of ``sleep`` s), wait for it to get going, apply ``fault`` (it returns
    when the fault is over: e.g. the switchover is done), wait for every task, and report and check
    the figures; the services on the ``watch`` hosts log no traceback meanwhile (their line count
    is printed)."""
    load = Load(net, name, sleep)
    wait_for(lambda: load.ran() >= 300, 120, f"{name}: the load to get going")
    flying = load.in_flight()
    began = time.time()
    fault()
    ended = time.time()
    wait_for(lambda: load.left() == 0, timeout, f"{name}: every task to be done")
    done_at = time.time()
    f = load.figures(began, ended)
    print(f"\n[{name}] {TASKS} tasks over {GROUPS} groups; in flight at the fault: {flying}; "
          f"longest pause between two finished tasks around the fault: {f['pause']:.1f} s; "
          f"fault to all done: {done_at - began:.1f} s; lost: {len(f['lost'])}; "
          f"run twice: {len(f['twice'])}")
    for host in watch:
        lines = logged(host, began, done_at)
        print(f"[{name}] {host.name}: {len(lines)} log lines from the fault to all done, "
              f"{sum(' WARNING ' in line for line in lines)} warnings, {sum(' ERROR ' in line for line in lines)} errors")
        assert not any("Traceback" in line for line in lines), "\n".join(lines[-80:])
    assert not f["lost"], f"{name}: {len(f['lost'])} tasks never ran: {f['lost'][:20]}"
    assert not f["unexplained"], f"{name}: ran twice without a run cut off by the fault: {f['unexplained']}"
    return f


def members(net, alive: list[str]) -> dict[str, str]:
    """Member name -> role (leader, sync_standby, replica), as Patroni reports them."""
    return {m["name"]: m["role"] for m in (cluster_state(net, alive) or {}).get("members", [])}


def counter(net, alias: str, name: str) -> float:
    """A counter of the scheduler on ``alias`` (its metrics endpoint), summed over its labels."""
    text = net(_http, f"http://{ADDRESS[alias]}:9464/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def etcd_healthy(host, alias: str) -> bool:
    url = f"http://{ADDRESS[alias]}:2379"
    return host.sh(f"ETCDCTL_API=3 etcdctl --endpoints {url} --command-timeout=2s endpoint health",
                   check=False).returncode == 0


def test_etcd_member_lost(hosts, net):
    """etcd on the leader's own host is lost: Patroni there reaches the two other members, keeps
    its leader key, and the schedulers see nothing. The member stays away longer than the leader
    key's ttl (30 s), then comes back."""
    leader_before = leader(net, DB_HOSTS)
    assert leader_before, cluster_state(net, DB_HOSTS)
    host = hosts[leader_before]

    def fault():
        host.sh("systemctl kill -q -s SIGKILL etcd; systemctl stop etcd")
        assert not etcd_healthy(host, leader_before)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            assert leader(net, DB_HOSTS) == leader_before, cluster_state(net, DB_HOSTS)
            time.sleep(1)

    try:
        f = under_load(net, "etcd-member-lost", fault, watch=[hosts[a] for a in SCHEDULER_HOSTS])
    finally:
        host.sh("systemctl start etcd")
    wait_for(lambda: etcd_healthy(host, leader_before), 60, "the etcd member back")
    assert leader(net, DB_HOSTS) == leader_before
    assert not f["twice"]
    print(f"etcd on {leader_before} (the leader's host) lost for 40 s: the leader stayed")


def test_scheduler_host_powered_off(hosts, net):
    """One scheduler host is powered off mid-load: the other finishes everything, resetting the
    rows the dead one held (its connections are gone, so its claims are no longer alive)."""
    victim, survivor = SCHEDULER_HOSTS
    reset_before = counter(net, survivor, "pgtask_orphans_reset_total")

    def fault():
        hosts[victim].power_off()

    under_load(net, "scheduler-killed", fault, watch=[hosts[survivor]])
    reset = counter(net, survivor, "pgtask_orphans_reset_total") - reset_before
    print(f"scheduler host {victim} powered off; {survivor} reset {reset:.0f} of its rows and ran them")
    assert reset > 0


def test_switchover(hosts, net):
    """A planned `patronictl switchover` to the synchronous standby, under load."""
    roles = members(net, DB_HOSTS)
    old = next(n for n, r in roles.items() if r == "leader")
    candidate = next(n for n, r in roles.items() if r == "sync_standby")

    def fault():
        hosts[old].sh(f"patronictl -c /etc/patroni/15-main.yml switchover --candidate {candidate} --force",
                      timeout=120)
        wait_for(lambda: leader(net, DB_HOSTS) == candidate, 120, f"{candidate} to lead")

    under_load(net, "switchover", fault, watch=[hosts[SCHEDULER_HOSTS[1]]])
    def old_streams():
        state = cluster_state(net, DB_HOSTS) or {}
        return any(m["name"] == old and m["role"] in ("replica", "sync_standby") and m["state"] in (
            "running", "streaming") for m in state.get("members", []))

    wait_for(old_streams, 120, f"{old} back as a standby")
    print(f"switchover {old} -> {candidate}")


def test_leader_host_powered_off(hosts, net):
    """The leader's host is powered off mid-load: Patroni promotes the synchronous standby once the
    leader key expires (ttl 30 s); the schedulers' reconnects find it (target_session_attrs)."""
    alive = list(DB_HOSTS)
    victim = leader(net, alive)
    assert victim, cluster_state(net, alive)

    def fault():
        hosts[victim].power_off()
        alive.remove(victim)
        wait_for(lambda: leader(net, alive) not in (None, victim), 120, "Patroni to promote a standby")

    under_load(net, "leader-killed", fault, watch=[hosts[SCHEDULER_HOSTS[1]]])
    new = leader(net, alive)
    print(f"leader {victim} powered off; {new} promoted")
