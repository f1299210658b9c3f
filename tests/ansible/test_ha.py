"""High availability for real: three database hosts running PostgreSQL under Patroni with etcd, two
scheduler hosts, all booted with systemd-nspawn and rolled out by the playbook (docs/ha.md).

Each host has a network namespace of its own, made for this module, whose one link (a veth) goes to
a bridge in another namespace the module makes: a switch with a port per host, on 10.39.0.0/24,
reaching nothing else. The test process joins the switch's namespace in a few threads of its own
(setns(2)) to query the cluster, and cuts a host off by taking its port down (its link goes down,
its processes and sockets stay).

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
import threading
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
# in the module's own namespaces only (see Network)
SUBNET = "10.39.0"
ADDRESS = {"db1": f"{SUBNET}.11", "db2": f"{SUBNET}.12", "db3": f"{SUBNET}.13",
           "sched1": f"{SUBNET}.21", "sched2": f"{SUBNET}.22"}
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
        # two for the background clients (Writer), the rest for the test's own queries
        self.pool = ThreadPoolExecutor(max_workers=5, initializer=self._enter, initargs=(path,),
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

    def start(self, fn, *args, **kwargs):
        return self.pool.submit(fn, *args, **kwargs)


def cluster_dsn(first: list[str]) -> str:
    """The cluster's DSN trying the hosts ``first`` before the others (a cut host costs its
    connect_timeout to every connection that tries it first)."""
    order = first + [h for h in DB_HOSTS if h not in first]
    return CLUSTER_DSN.replace(",".join(ADDRESS[h] for h in DB_HOSTS), ",".join(ADDRESS[h] for h in order))


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
    if shutil.which("ip") is None:  # scripts/bootstrap installs it for root
        pytest.fail("the hosts' network namespaces need ip (iproute2): run scripts/bootstrap test")
    return nspawn.build_rootfs(log=print, extra=tuple(nspawn.HA_PACKAGES))


class Network:
    """The switch (a bridge in a namespace of its own, where the test's threads live) and one
    namespace per host, linked to it by a veth: ``cut`` takes a host's port down, ``heal`` brings it
    back. Packets to and from a cut host are dropped without a word, as on a cable pulled out."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.switch = f"{prefix}-switch"
        self.names: list[str] = []

    def ip(self, *args: str, ns: str | None = None) -> None:
        subprocess.run(["ip", *(["-n", ns] if ns else []), *args], check=True)

    def add(self, name: str) -> str:
        self.ip("netns", "add", name)
        self.names.append(name)
        self.ip("link", "set", "lo", "up", ns=name)
        return f"/run/netns/{name}"

    def make(self, hosts: dict[str, str]) -> None:
        self.add(self.switch)
        self.ip("link", "add", "br0", "type", "bridge", ns=self.switch)
        self.ip("addr", "add", f"{SUBNET}.1/24", "dev", "br0", ns=self.switch)
        self.ip("link", "set", "br0", "up", ns=self.switch)
        for alias, address in hosts.items():
            ns = f"{self.prefix}-{alias}"
            self.add(ns)
            self.ip("link", "add", self.port(alias), "type", "veth", "peer", "name", "eth0", "netns", ns,
                    ns=self.switch)
            self.ip("link", "set", self.port(alias), "master", "br0", "up", ns=self.switch)
            self.ip("addr", "add", f"{address}/24", "dev", "eth0", ns=ns)
            self.ip("link", "set", "eth0", "up", ns=ns)

    def path(self, alias: str | None = None) -> str:
        return f"/run/netns/{self.prefix}-{alias}" if alias else f"/run/netns/{self.switch}"

    @staticmethod
    def port(alias: str) -> str:
        return f"port-{alias}"

    def cut(self, alias: str) -> None:
        self.ip("link", "set", self.port(alias), "down", ns=self.switch)

    def heal(self, alias: str) -> None:
        self.ip("link", "set", self.port(alias), "up", ns=self.switch)

    def remove(self) -> None:
        for name in reversed(self.names):
            subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.fixture(scope="module")
def network():
    network = Network(f"pgtask-ha-{os.getpid()}")
    try:
        network.make(ADDRESS)
        yield network
    finally:
        network.remove()


@pytest.fixture(scope="module")
def net(network):
    runner = InNetns(network.path())
    yield runner
    runner.pool.shutdown(wait=False, cancel_futures=True)


@pytest.fixture(scope="module")
def hosts(ha_rootfs, network):
    """The five hosts, booted; the scheduler hosts run no database of their own."""
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        booted = {}
        for alias in DB_HOSTS + SCHEDULER_HOSTS:
            booted[alias] = stack.enter_context(
                nspawn.Container(ha_rootfs, f"pgtask-ha-{alias}-{os.getpid()}", netns=network.path(alias)))
        for alias in SCHEDULER_HOSTS:
            booted[alias].sh("systemctl disable --now -q postgresql etcd")
        print(f"5 hosts booted in {time.monotonic() - started:.1f} s")
        yield booted


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
            # the notebooks and their timers are test_notebooks_e2e.py's: the HA hosts go without
            "pgtask_notebooks": False,
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
                    # the schedulers and the test's clients, from their own hosts
                    "pgtask_postgresql_hba": [{"type": "host", "database": "all", "user": "postgres",
                                               "address": f"{SUBNET}.0/24", "method": "scram-sha-256"}],
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


def leaders(state: dict | None) -> list[str]:
    """The running leaders in one of Patroni's views of the cluster (more than one: a split brain)."""
    return [m["name"] for m in (state or {}).get("members", [])
            if m["role"] == "leader" and m["state"] == "running"]


def leader(net, alive: list[str]) -> str | None:
    names = leaders(cluster_state(net, alive))
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
        for line in [line for line in lines if " ERROR " in line][:5]:
            print(f"[{name}] {host.name}: {line}")
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


# -- a network partition ------------------------------------------------------------------------

PARTITION = 90      # s the leader's link stays down: longer than the failover takes
RESUME_GOAL = 60    # s from the cut until tasks finish again (docs/ha.md adds up its terms)
REJOIN_BOUND = 120  # s from the heal until the old leader streams as a standby again
PATRONI = "systemctl {} patroni@15-main"


def member_dsn(alias: str) -> str:
    return f"host={ADDRESS[alias]} port=5432 dbname=postgres user=postgres connect_timeout=2"


def write_acknowledged(stop: threading.Event, acked: list[tuple[int, float]], dsn: str) -> None:
    """A client beside the schedulers: one INSERT a second, each on a new connection through the
    cluster's DSN; a number is acknowledged once its commit returned. Nothing cancels a commit
    that waits (a cancelled wait for the synchronous standby would still commit locally)."""
    n = 0
    while not stop.is_set():
        n, began = n + 1, time.time()
        with contextlib.suppress(psycopg.Error):
            with psycopg.connect(dsn + " tcp_user_timeout=5000 keepalives_idle=2 keepalives_interval=1",
                                 password=PASSWORD, autocommit=True) as conn:
                conn.execute("INSERT INTO acked (n) VALUES (%s)", (n,))
            acked.append((n, time.time()))
        stop.wait(max(0.0, 1.0 - (time.time() - began)))


def local_sql(host, sql: str, timeout: float = 10) -> str:
    """``sql`` on the host's own server, over its socket (whatever its network)."""
    return host.sh(f"runuser -u postgres -- psql -XAtq -h /var/run/postgresql -c \"{sql}\"",
                   check=False, timeout=timeout).stdout.strip()


def test_leader_partition(hosts, net, network):
    """The leader's link goes down for longer than the failover takes, its host stays up, then the
    link comes back. Meanwhile tasks finish again on the promoted standby within RESUME_GOAL of
    the cut, a client beside the schedulers keeps writing, and a client on the isolated host writes
    into its own server. After the heal: the promoted leader keeps the lead, the old one rejoins as
    a standby within REJOIN_BOUND, a synchronous standby is back, every completion and every write
    the new leader acknowledged is there, and nothing written on the isolated side is."""
    old = leader(net, DB_HOSTS)
    assert old, cluster_state(net, DB_HOSTS)
    others = [a for a in DB_HOSTS if a != old]
    net(_query, "CREATE TABLE IF NOT EXISTS acked (n int PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp())")
    net(_query, "CREATE TABLE IF NOT EXISTS isolated (n int PRIMARY KEY)")
    net(_query, "TRUNCATE acked, isolated")
    seen: dict = {}

    def fault():
        stop, acked = threading.Event(), []
        writer = net.start(write_acknowledged, stop, acked, cluster_dsn(others))
        cut = seen["cut"] = time.time()
        network.cut(old)
        # the isolated side: a write a second into the old leader's own server, none acknowledged
        hosts[old].sh(f"setsid sh -c 'i=0; while [ $(date +%s) -lt {int(cut + PARTITION - 5)} ]; do i=$((i+1)); "
                      "timeout 3 runuser -u postgres -- psql -XAtq -h /var/run/postgresql "
                      "-c \"INSERT INTO isolated VALUES ($i)\"; sleep 1; done' >/dev/null 2>&1 < /dev/null &")
        new = seen["new"] = wait_for(lambda: (lead := leader(net, others)) not in (None, old) and lead, PARTITION,
                                     "a standby to be promoted while the leader is cut off", interval=0.5)
        seen["promoted"] = time.time() - cut
        resumed = f"SELECT count(*) FROM ledger WHERE at > to_timestamp({cut})"
        wait_for(lambda: net(_query, resumed, dsn=member_dsn(new))[0][0] > 0, cut + PARTITION - time.time(),
                 "tasks to finish on the new leader", interval=0.5)
        seen["resumed"] = time.time() - cut
        # the partition lasts its whole length; what the new leader has then must survive the heal
        wait_for(lambda: time.time() >= cut + PARTITION, PARTITION, "the partition's end", interval=1)
        seen["done"] = {r[0] for r in net(_query, "SELECT id FROM task WHERE state = 'DONE'", dsn=member_dsn(new))}
        seen["ledger"] = net(_query, "SELECT count(*) FROM ledger", dsn=member_dsn(new))[0][0]
        seen["isolated"] = int(wait_for(lambda: local_sql(hosts[old], "SELECT count(*) FROM isolated").isdigit()
                                        and local_sql(hosts[old], "SELECT count(*) FROM isolated"), 30,
                                        "the isolated server to answer on its socket"))
        stop.set()
        seen["acked"] = [n for n, at in acked if at > cut]
        network.heal(old)
        seen["healed"] = time.time()
        writer.result(timeout=30)

    f = under_load(net, "leader-partition", fault, sleep=2.0, timeout=420, watch=[hosts[a] for a in SCHEDULER_HOSTS])
    new = seen["new"]

    def rejoined():  # one look at the cluster per poll
        state = cluster_state(net, DB_HOSTS) or {}
        assert leaders(state) in ([], [new]), state
        back = next((m for m in state.get("members", []) if m["name"] == old), {})
        return back.get("role") in ("replica", "sync_standby") and back.get("state") in ("running", "streaming")
    wait_for(rejoined, max(1.0, seen["healed"] + REJOIN_BOUND - time.time()), f"{old} to rejoin as a standby", interval=1)
    rejoin = time.time() - seen["healed"]
    wait_for(lambda: "sync_standby" in members(net, DB_HOSTS).values(), 60, "a synchronous standby")
    assert leader(net, DB_HOSTS) == new
    done_now = {r[0] for r in net(_query, "SELECT id FROM task WHERE state = 'DONE'")}
    acked_now = {r[0] for r in net(_query, "SELECT n FROM acked")}
    print(f"[leader-partition] {old} cut off for {PARTITION} s: {new} promoted after {seen['promoted']:.1f} s, "
          f"tasks finished again after {seen['resumed']:.1f} s; {len(seen['acked'])} writes acknowledged by the "
          f"new leader during the partition, {seen['isolated']} committed on the isolated side; {old} a standby "
          f"again {rejoin:.1f} s after the heal")
    assert f["pause"] <= RESUME_GOAL and seen["resumed"] <= RESUME_GOAL, (f["pause"], seen["resumed"])
    assert seen["done"] <= done_now, sorted(seen["done"] - done_now)[:20]
    assert net(_query, "SELECT count(*) FROM ledger")[0][0] >= seen["ledger"]
    assert seen["acked"] and set(seen["acked"]) <= acked_now, sorted(set(seen["acked"]) - acked_now)
    assert seen["isolated"] >= 1, "no write reached the isolated server: the test proves nothing of it"
    assert net(_query, "SELECT count(*) FROM isolated") == [(0,)]


def test_remote_tasks_on_a_host_cut_off_fail_within_the_bound(hosts, net, network):
    """Remote tasks run on the asynchronous replica's server (a standby runs pg_sleep); that host's
    link goes down. Each task's connection is found dead within the service's bound (keepalives and
    tcp_user_timeout: about 10 s) and the task FAILs with `PQconsumeInput failed` -- its input was
    sent, so it may have run: pg_task's rule -- instead of hanging for the kernel's 15 minutes."""
    target = next(n for n, r in members(net, DB_HOSTS).items() if r == "replica")
    remote = (f"host={ADDRESS[target]} port=5432 dbname=postgres user=postgres password={PASSWORD} "
              "connect_timeout=2")
    ids = [r[0] for r in net(_query, """INSERT INTO task (input, remote, "group")
                                        SELECT 'SELECT pg_sleep(600)', %s, 'remote-cut-' || i
                                        FROM generate_series(1, 3) i RETURNING id""", (remote,))]
    sleeping = ("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%SELECT pg_sleep(600)' "
                "AND pid <> pg_backend_pid()")
    wait_for(lambda: net(_query, sleeping, dsn=member_dsn(target)) == [(3,)], 60, "the remote tasks to run")
    cut = time.time()
    network.cut(target)
    try:
        ended = wait_for(lambda: (rows := net(_query, "SELECT state, error FROM task WHERE id = ANY(%s) "
                                                      "AND state <> 'WORK'", (ids,))) and len(rows) == 3 and rows,
                         60, "the remote tasks to end", interval=0.5)
        took = time.time() - cut
    finally:
        network.heal(target)
    print(f"[remote-cut] {target} cut off under 3 remote tasks: all ended {took:.1f} s after the cut")
    assert all(state == "FAIL" and "PQconsumeInput failed" in error for state, error in ended), ended
    wait_for(lambda: members(net, DB_HOSTS).get(target) in ("replica", "sync_standby"), 120, f"{target} back")


def commit_waits(net, alias: str, seconds: float) -> tuple[bool, object]:
    """Start a commit on ``alias``'s server; whether it is still waiting after ``seconds``, and the
    future of its end."""
    done = net.start(_query, "INSERT INTO acked (n) SELECT coalesce(max(n), 0) + 1 FROM acked", dsn=member_dsn(alias))
    with contextlib.suppress(TimeoutError):
        done.result(timeout=seconds)
    return not done.done(), done


def stop_standbys(hosts, net, lead: str) -> list[str]:
    standbys = [a for a in DB_HOSTS if a != lead]
    for alias in standbys:
        hosts[alias].sh(PATRONI.format("stop"))  # Patroni stops its PostgreSQL
    wait_for(lambda: net(_query, "SELECT count(*) FROM pg_stat_replication", dsn=member_dsn(lead)) == [(0,)], 60,
             "the standbys to be gone")
    return standbys


def start_standbys(hosts, net, standbys: list[str]) -> None:
    for alias in standbys:
        hosts[alias].sh(PATRONI.format("start"))
    wait_for(lambda: sorted(members(net, DB_HOSTS).values()) == ["leader", "replica", "sync_standby"], 180,
             "both standbys back, one synchronous")


def test_strict_synchronous_mode_never_acknowledges_a_commit_on_one_host(hosts, net):
    """The default (pgtask_patroni_synchronous_mode_strict): with both standbys gone a commit on the
    leader waits -- for longer than Patroni's loop, which in non-strict mode would let it go alone --
    and returns once a standby is back."""
    lead = leader(net, DB_HOSTS)
    standbys = stop_standbys(hosts, net, lead)
    waiting, done = commit_waits(net, lead, 25)
    try:
        assert waiting, "a commit returned with no standby to have it"
        assert net(_query, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' "
                           "AND query LIKE 'INSERT INTO acked%'", dsn=member_dsn(lead)) == [(1,)]
    finally:
        start_standbys(hosts, net, standbys)
    done.result(timeout=60)


def test_non_strict_synchronous_mode_goes_on_alone(hosts, deploy, net):
    """pgtask_patroni_synchronous_mode_strict: false, applied by the playbook to the running cluster:
    with both standbys gone the leader commits alone (after Patroni's next loop); the default comes
    back with the next run."""
    for strict in (False, True):
        run = deploy(pgtask_patroni_synchronous_mode_strict=strict)
        assert_ok(run)
        assert "pgtask : Apply synchronous mode to the running cluster" in run.changed_tasks(), run.changed_tasks()
        config = json.loads(net(_http, f"http://{ADDRESS[leader(net, DB_HOSTS)]}:8008/config"))
        assert config["synchronous_mode_strict"] is strict, config
        if not strict:
            lead = leader(net, DB_HOSTS)
            standbys = stop_standbys(hosts, net, lead)
            try:
                # released by Patroni's next loop (loop_wait 10 s) after the standbys' loss
                waiting, _ = commit_waits(net, lead, 30)
                assert not waiting, "a commit still waits for a standby in non-strict mode"
            finally:
                start_standbys(hosts, net, standbys)


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
