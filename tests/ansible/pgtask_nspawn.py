"""A real Debian host with systemd as PID 1, booted with systemd-nspawn, for the Ansible tests.

How and why: ../../shared/notes/systemd-host-for-ansible-tests.md (measured on this kind of machine).

- ``build_rootfs()`` debootstraps a bookworm tree once and caches it (``PGTASK_TEST_ROOTFS`` or
  ``/var/cache/pgtask-test/bookworm-<recipe hash>``); PostgreSQL and python3-venv are in it already so a
  container with ``--private-network`` (no network but ``lo``) can run the whole playbook.
- ``Container`` boots the tree with ``--volatile=overlay`` (the cached tree is never written) and gives
  Ansible an SSH connection through ``nsenter … sshd -i`` (no port, no veth).

Run as a script to build the cache ahead of the tests: ``python tests/ansible/pgtask_nspawn.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

SUITE = "bookworm"
PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "python3", "python3-venv", "openssh-server", "sudo", "acl",
    # what the role installs with apt (the container has no network): python3-packaging for
    # ansible.builtin.pip, python3-apt for ansible.builtin.apt, PostgreSQL for pgtask_manage_postgresql
    "python3-apt", "python3-packaging", "postgresql",
]
# Bump when the recipe below changes in a way the package list does not show.
RECIPE_VERSION = "1"
# What the HA hosts add (tests/ansible/test_ha.py): etcd. Patroni comes from the role's wheelhouse.
HA_PACKAGES = ["etcd-server", "etcd-client"]


def recipe_hash(extra: tuple[str, ...] = ()) -> str:
    return hashlib.sha256(f"{SUITE}|{','.join(PACKAGES + list(extra))}|{RECIPE_VERSION}".encode()).hexdigest()[:12]


RECIPE_HASH = recipe_hash()
CACHE_ROOT = Path(os.environ.get("PGTASK_TEST_CACHE", "/var/cache/pgtask-test"))
HOSTNAME = "pgtask-e2e"


def rootfs_path(extra: tuple[str, ...] = ()) -> Path:
    """The cached tree; ``extra`` packages make a tree of their own (``bookworm-<hash>``)."""
    env = os.environ.get("PGTASK_TEST_ROOTFS")
    return Path(env) if env and not extra else CACHE_ROOT / f"{SUITE}-{recipe_hash(extra)}"


def ssh_key_path() -> Path:
    return CACHE_ROOT / "id_ed25519"


@contextlib.contextmanager
def setup_lock():
    """One test process at a time installs tools and builds trees (./test runs the modules of
    tests/ansible in processes side by side): apt and the cache's key are not for two at once."""
    with open("/run/lock/pgtask-test-setup.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def cannot_boot_reason() -> str | None:
    """Why this host cannot boot containers, or None if it can (installing what is missing first)."""
    if os.geteuid() != 0:
        return "booting a systemd-nspawn container needs root"
    with setup_lock():
        return _cannot_boot_reason()


def _cannot_boot_reason() -> str | None:
    if sys.platform != "linux":
        return "systemd-nspawn needs Linux"
    tools = ("debootstrap", "systemd-nspawn", "nsenter", "ssh", "ssh-keygen")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing and shutil.which("apt-get"):  # CI installs them (scripts/bootstrap); a bare host too
        for step in (["apt-get", "install", "-y", "-q"], ["apt-get", "update", "-q"],
                     ["apt-get", "install", "-y", "-q"]):
            pkgs = ["debootstrap", "systemd-container", "openssh-client", "util-linux"]
            subprocess.run(step + (pkgs if "install" in step else []), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
            missing = [t for t in tools if shutil.which(t) is None]
            if not missing:
                break
    if missing:
        return f"cannot boot containers here: {', '.join(missing)} missing and not installable"
    if not Path("/sys/fs/cgroup").is_dir():
        return "cannot boot containers here: no /sys/fs/cgroup"
    return None


def _apt_mirror() -> str:
    """The Debian mirror apt already uses on this host (debootstrap needs one)."""
    candidates = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in candidates:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for line in text.splitlines():
            words = line.split()
            # one-line format: deb URL SUITE …   /  deb822: URIs: URL  (with Suites: bookworm)
            if len(words) >= 3 and words[0] == "deb" and words[2] == SUITE:
                return words[1]
            if words[:1] == ["URIs:"] and "debian" in line and "security" not in line and (
                    f"Suites: {SUITE}" in text):
                return words[1]
    return "http://deb.debian.org/debian"


def build_rootfs(log=print, extra: tuple[str, ...] = ()) -> Path:
    """Build the cached bookworm tree (with the ``extra`` packages) once (≈2.5 min); later calls
    return at once."""
    with setup_lock():
        return _build_rootfs(log, extra)


def _build_rootfs(log, extra: tuple[str, ...]) -> Path:
    root = rootfs_path(extra)
    recipe = recipe_hash(extra)
    if (root / ".pgtask-rootfs-ok").exists():
        return root
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    key = ssh_key_path()
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "pgtask-test",
                        "-f", str(key)], check=True)
    tmp = root.with_name(root.name + ".tmp")
    if tmp.exists():
        _umount_below(tmp)  # an interrupted debootstrap leaves proc/sys mounted in it
        shutil.rmtree(tmp)
    mirror = _apt_mirror()
    log(f"debootstrap {SUITE} into {tmp} from {mirror} (once; ≈2.5 min)")
    subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES + list(extra))}",
                    SUITE, str(tmp), mirror], check=True, stdout=subprocess.DEVNULL)
    # minbase has no /etc/hosts: PostgreSQL then fails to resolve "localhost".
    (tmp / "etc/hostname").write_text(HOSTNAME + "\n")
    (tmp / "etc/hosts").write_text(
        f"127.0.0.1 localhost\n::1 localhost\n127.0.1.1 {HOSTNAME}\n")
    ssh_dir = tmp / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    os.chmod(ssh_dir / "authorized_keys", 0o600)
    # sshd runs per connection (inetd mode through nsenter); it needs /run/sshd, not the daemon.
    (tmp / "etc/tmpfiles.d/sshd.conf").write_text("d /run/sshd 0755 root root -\n")
    unit_dir = tmp / "etc/systemd/system"
    for masked in ("ssh.service", "systemd-networkd-wait-online.service"):
        link = unit_dir / masked
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to("/dev/null")
    subprocess.run(["chroot", str(tmp), "apt-get", "clean"], check=True)
    (tmp / ".pgtask-rootfs-ok").write_text(recipe + "\n")
    tmp.rename(root)
    if not os.environ.get("PGTASK_TEST_ROOTFS"):  # older recipes' trees are of no further use
        current = {rootfs_path(), rootfs_path(tuple(HA_PACKAGES))}
        for old in CACHE_ROOT.glob(f"{SUITE}-*"):
            if old not in current and not old.name.endswith(".tmp") and old.is_dir():
                _umount_below(old)
                shutil.rmtree(old, ignore_errors=True)
    return root


def _umount_below(path: Path) -> None:
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith(str(path) + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", m], check=False)


def _cgroup_dirs(name: str) -> list[Path]:
    base = Path("/sys/fs/cgroup")
    dirs = [base / h / f"nspawn-{name}" for h in ("unified", "systemd") if (base / h).is_dir()]
    if not dirs and (base / "cgroup.controllers").exists():  # a pure cgroup2 host
        dirs = [base / f"nspawn-{name}"]
    return dirs


class Container:
    """One booted container; use as a context manager (teardown is reliable even on errors)."""

    def __init__(self, root: Path, name: str, private_network: bool = True, netns: str | None = None):
        """``netns``: a network namespace (a path such as /run/netns/NAME) the container joins
        instead: containers joining the same one reach each other's services on its loopback."""
        self.root = root
        self.name = name
        self.private_network = private_network
        self.netns = netns
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None  # the container's PID 1 (systemd) in the host's namespace
        self.log_path = CACHE_ROOT / f"{name}.console.log"

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> Container:
        cg = " ".join(str(d) for d in _cgroup_dirs(self.name))
        args = ["systemd-nspawn", "-q", "-D", str(self.root), "-M", self.name, "--boot",
                "--register=no", "--keep-unit", "--console=passive", "--volatile=overlay"]
        if self.netns:
            args.append(f"--network-namespace-path={self.netns}")
        elif self.private_network:
            args.append("--private-network")
        # nspawn with --keep-unit makes its cgroups next to its own: give it one of its own first.
        script = (f'for d in {cg}; do mkdir -p "$d" && echo $$ > "$d/cgroup.procs"; done; '
                  f'exec {" ".join(args)}')
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(["sh", "-c", script], stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited {self.proc.returncode}: {self.console()}")
            if self.pid is None:
                out = subprocess.run(["pgrep", "-P", str(self.proc.pid), "-x", "systemd"],
                                     check=False, capture_output=True, text=True).stdout.split()
                self.pid = int(out[0]) if out else None
            if self.pid is not None:
                state = self.sh("systemctl is-system-running", check=False).stdout.strip()
                if state in ("running", "degraded"):
                    return self
            time.sleep(0.2)
        raise TimeoutError(f"container {self.name} not up after {timeout}s (state {state!r}): "
                           f"{self.console()}")

    def console(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        if self.pid is not None:
            # leftover `nsenter -t PID …` (e.g. an sshd -i) would keep the container from stopping
            out = subprocess.run(["pgrep", "-f", f"nsenter -t {self.pid} "], check=False, capture_output=True,
                                 text=True).stdout.split()
            for p in out:
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if getattr(self, "_log", None):
            self._log.close()
            self.log_path.unlink(missing_ok=True)
        # deepest cgroup dirs first
        for top in _cgroup_dirs(self.name):
            if top.is_dir():
                for d in sorted((p for p in top.rglob("*") if p.is_dir()),
                                key=lambda p: len(p.parts), reverse=True):
                    try:
                        d.rmdir()
                    except OSError:
                        pass
                try:
                    top.rmdir()
                except OSError:
                    pass
        shutil.rmtree(f"/run/systemd/nspawn/propagate/{self.name}", ignore_errors=True)

    def power_off(self, timeout: float = 30.0) -> None:
        """Pull the plug: SIGKILL to the container's PID 1 ends every process in it at once (no
        shutdown: its services close nothing and tell nobody)."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout)

    def __enter__(self) -> Container:  # noqa: PYI034
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- use -------------------------------------------------------------------------------------
    def sh(self, command: str, check: bool = True, timeout: float = 120,
           user: str | None = None) -> subprocess.CompletedProcess:
        """Run a shell command inside the container (all its namespaces), as root or ``user``."""
        argv = ["nsenter", "-t", str(self.pid), "-a"]
        if user:
            argv += ["runuser", "-u", user, "--"]
        argv += ["sh", "-c", command]
        res = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"{command!r} in {self.name} exited {res.returncode}:\n"
                                 f"{res.stdout}\n{res.stderr}")
        return res

    def ssh_args(self) -> str:
        proxy = f"nsenter -t {self.pid} -a /usr/sbin/sshd -i"
        # one sshd per host for a whole play, not one per task: the master ends with the container's
        # sshd; the path names the container's PID, so a host booted again gets a master of its own
        return (f"-o ControlMaster=auto -o ControlPersist=60s -o ControlPath=/tmp/pgtask-ssh-{self.pid}-%C "
                "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                f"-o LogLevel=ERROR -o ProxyCommand=\"{proxy}\"")

    def inventory_line(self, alias: str) -> str:
        return (f"{alias} ansible_host={self.name} ansible_user=root "
                f"ansible_python_interpreter=/usr/bin/python3 "
                f"ansible_ssh_private_key_file={ssh_key_path()} "
                f"ansible_ssh_args='{self.ssh_args()}'")


if __name__ == "__main__":
    reason = cannot_boot_reason()
    if reason:
        sys.exit(reason)
    t0 = time.monotonic()
    print(build_rootfs(), f"{time.monotonic() - t0:.0f}s")
    print(build_rootfs(extra=tuple(HA_PACKAGES)), f"{time.monotonic() - t0:.0f}s")
