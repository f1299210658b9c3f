"""Settings: the manual's GUC table as data, the TOML config file, and pg_task.json entries.

Where a value comes from, most specific first (the manual's cascade):
  an entry of pg_task.json  >  ALTER ROLE ... SET  >  ALTER DATABASE ... SET  >  the config file
  >  postgresql.conf / ALTER SYSTEM (read from the server)  >  the manual's default.
Task columns read their settings in the inserting session (column defaults), so SET in a session
and the value on the row are two more levels on top for those.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INT_MAX = 2147483647


@dataclass(frozen=True)
class Setting:
    name: str          # GUC name, e.g. pg_task.sleep
    type: str          # bool, int, interval, text, char, json, timestamptz
    default: Any       # the manual's default (Python value)
    column: str | None = None   # the task column that defaults to it
    minimum: int | None = None  # for ints


SETTINGS: tuple[Setting, ...] = (
    Setting("pg_task.delete", "bool", True, "delete"),
    Setting("pg_task.drift", "bool", False, "drift"),
    Setting("pg_task.header", "bool", True, "header"),
    Setting("pg_task.save", "bool", False, "save"),
    Setting("pg_task.spi", "bool", False),
    Setting("pg_task.string", "bool", True, "string"),
    Setting("pg_conf.fetch", "int", 10, minimum=1),
    Setting("pg_conf.restart", "int", 60, minimum=1),
    Setting("pg_task.count", "int", 0, "count", minimum=0),
    Setting("pg_task.fetch", "int", 100, minimum=1),
    Setting("pg_task.limit", "int", 1000, minimum=0),
    Setting("pg_task.max", "int", 0, "max"),
    Setting("pg_task.run", "int", INT_MAX, minimum=1),
    Setting("pg_task.sleep", "int", 1000, minimum=1),
    Setting("pg_work.fetch", "int", 100, minimum=1),
    Setting("pg_work.idle", "int", 60, minimum=1),
    Setting("pg_work.restart", "int", 60, minimum=1),
    Setting("pg_task.active", "interval", "1 hour", "active"),
    Setting("pg_task.data", "text", "postgres"),
    Setting("pg_task.delimiter", "char", "\t", "delimiter"),
    Setting("pg_task.escape", "char", "", "escape"),
    Setting("pg_task.group", "text", "group", "group"),
    Setting("pg_task.json", "json", [{"data": "postgres"}]),
    Setting("pg_task.live", "interval", "0 sec", "live"),
    Setting("pg_task.null", "text", "\\N", "null"),
    Setting("pg_task.plan", "timestamptz", None, "plan"),
    Setting("pg_task.quote", "char", "", "quote"),
    Setting("pg_task.repeat", "interval", "0 sec", "repeat"),
    Setting("pg_task.reset", "interval", "1 hour"),
    Setting("pg_task.schema", "text", "public"),
    Setting("pg_task.table", "text", "task"),
    Setting("pg_task.timeout", "interval", "0 sec", "timeout"),
    Setting("pg_task.user", "text", "postgres"),
)
BY_NAME = {s.name: s for s in SETTINGS}

# Keys of the [pgtask] table: the service's own settings (no GUC in the manual).
SERVICE_KEYS: dict[str, tuple[type, Any]] = {
    "grace": (float, 30.0),          # seconds SIGTERM waits for running tasks before cancelling them
    "log_level": (str, "info"),
    "embedded_dir": (str, ""),       # where the embedded cluster lives ("" = ./.pgtask)
    "embedded_port": (int, 5432),
    "output_limit": (int, 8 * 1024 * 1024),  # characters of output kept per task; the rest is cut
    "execute_as": (str, "auto"),     # auto | login | set_role: how a local task takes its author's role
    "reset_check": (float, 2.0),     # seconds between orphan checks (executor gone)
    "connecting": (int, 4),          # executor sessions being opened at once per scheduler, at most
    "max_sessions": (int, 0),        # executor sessions open at once per scheduler; 0 = derived (slots.py)
    "remote_attempts": (int, 6),     # connections a remote task tries while each fails before its input is sent
    "remote_backoff": (float, 1.0),  # s before the second of them; doubling, at most 60 s (runner.RemoteTarget.again)
    "processes": (int, 1),           # service processes claiming and running tasks (supervisor.Workers)
    "input_budget": (int, 64 * 1024 * 1024),  # bytes of large task input held at once per process (inputs.py)
    # maintenance (pgtask/maintenance.py; docs/schedules.md)
    "schedule_interval": (float, 1.0),   # seconds between schedule passes at most (a change wakes it)
    "schedule_batch": (int, 100),        # schedules per pass
    "retention": (str, ""),              # delete finished tasks older than this interval; "" = keep
    "retention_interval": (float, 60.0),  # seconds between retention passes
    "retention_batch": (int, 1000),      # rows per DELETE (10 DELETEs per pass at most)
    "key_interval": (float, 60.0),       # seconds between idempotency-key expiry passes
    "key_batch": (int, 1000),            # reservations per DELETE
    # metrics (pgtask/metrics.py; docs/observability.md)
    "metrics_listen": (str, ""),         # HOST:PORT of /metrics and /healthz; "" = off
    "metrics_groups": (int, 50),         # groups labelled by name (the busiest); the rest are "~other"
    "metrics_refresh": (float, 10.0),    # seconds between readings of the tables' figures
}
# [pgtask] numbers' bounds after their type: key -> (lowest, highest, whether the lowest itself
# is allowed); floats must also be finite.
SERVICE_BOUNDS: dict[str, tuple[float, float | None, bool]] = {
    "grace": (0, None, True), "embedded_port": (1, 65535, True), "output_limit": (0, None, True),
    "reset_check": (0, None, False), "connecting": (1, None, True), "processes": (1, None, True),
    "max_sessions": (0, None, True), "remote_attempts": (1, None, True), "remote_backoff": (0, 3600, False),
    "input_budget": (0, None, True),
    "schedule_interval": (0, None, False), "schedule_batch": (1, None, True),
    "retention_interval": (0, None, False), "retention_batch": (1, None, True),
    "key_interval": (0, None, False), "key_batch": (1, None, True),
    "metrics_groups": (1, None, True), "metrics_refresh": (0, None, False),
}
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
MAINTENANCE_KEYS = ("schedule_interval", "schedule_batch", "retention", "retention_interval",
                    "retention_batch", "key_interval", "key_batch")

def parse_listen(value: str) -> tuple[str, int]:
    """``metrics_listen``'s "HOST:PORT" (IPv6 as "[::1]:9464"; no host: 127.0.0.1) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ConfigError(f"pgtask.metrics_listen: expected HOST:PORT (e.g. 127.0.0.1:9464), got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def parse_bool(value: str) -> bool | None:
    """A boolean setting as PostgreSQL spells one (parse_bool, src/backend/utils/adt/bool.c): on/off,
    true/false, yes/no, 1/0 in any case, and any prefix of true, false, yes, no -- of off only "of"
    ("o" could be either). Surrounding whitespace is ignored, as by 'x'::bool. None: not a boolean."""
    word = value.strip().lower()
    if not word:
        return None
    for spelling, flag in (("true", True), ("false", False), ("yes", True), ("no", False)):
        if spelling.startswith(word):
            return flag
    return {"on": True, "of": False, "off": False, "1": True, "0": False}.get(word)


ENTRY_KEYS = {"data": str, "user": str, "schema": str, "table": str, "sleep": int, "reset": str,
              "run": int, "spi": bool}


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key."""


def _check_type(key: str, value: Any, kind: str) -> Any:
    ok = {
        "bool": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "interval": lambda v: isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)),
        "text": lambda v: isinstance(v, str),
        "char": lambda v: isinstance(v, str) and len(v.encode()) <= 1,
        "timestamptz": lambda v: isinstance(v, str),
        "json": lambda v: isinstance(v, (list, str)),
    }[kind]
    if not ok(value):
        raise ConfigError(f"{key}: expected {kind}, got {type(value).__name__} {value!r}")
    if kind == "interval" and isinstance(value, int):
        return f"{value} sec"
    if kind == "int":
        check_minimum(key, value)
    return value


def _check_bounds(key: str, value: float, lowest: float, highest: float | None, inclusive: bool) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: must be a finite number, got {value!r}")
    if value < lowest or (value == lowest and not inclusive):
        raise ConfigError(f"{key}: must be {'>=' if inclusive else '>'} {lowest}, got {value!r}")
    if highest is not None and value > highest:
        raise ConfigError(f"{key}: must be <= {highest}, got {value!r}")


def check_minimum(name: str, value: int, source: str = "") -> int:
    """An int setting's value against its Setting.minimum (wherever the value came from)."""
    setting = BY_NAME.get(name)
    if setting is not None and setting.minimum is not None and value < setting.minimum:
        raise ConfigError(f"{name}: must be >= {setting.minimum}, got {value}{f' ({source})' if source else ''}")
    return value


@dataclass(frozen=True)
class Entry:
    """One scheduler: the manual's pg_task.json object after the precedence rules."""

    data: str
    user: str
    schema: str
    table: str
    sleep: int
    reset: str
    run: int
    spi: bool

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.data, self.user, self.schema, self.table)

    def label(self) -> str:
        return f"{self.user}@{self.data} {self.schema}.{self.table}"


def parse_entries(raw: Any, key: str = "pg_task.json") -> list[dict[str, Any]]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{key}: not valid JSON: {exc}") from None
    if not isinstance(raw, list):
        raise ConfigError(f"{key}: expected a list of objects")
    entries = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ConfigError(f"{key}[{i}]: expected an object, got {item!r}")
        for name, value in item.items():
            if name not in ENTRY_KEYS:
                raise ConfigError(f"{key}[{i}].{name}: unknown key (known: {', '.join(ENTRY_KEYS)})")
            want = ENTRY_KEYS[name]
            if name == "reset" and isinstance(value, int) and not isinstance(value, bool):
                value = f"{value} sec"
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise ConfigError(f"{key}[{i}].{name}: expected {want.__name__}, got {value!r}")
            if name in ("sleep", "run") and value < 1:
                raise ConfigError(f"{key}[{i}].{name}: must be >= 1, got {value}")
            if name in ("data", "user", "schema", "table") and not value:
                raise ConfigError(f"{key}[{i}].{name}: must not be empty")
            item = {**item, name: value}
        entries.append(item)
    return entries


@dataclass
class Config:
    """The config file (TOML) resolved against the manual's defaults."""

    dsn: str = ""
    settings: dict[str, Any] = field(default_factory=dict)   # GUC name -> value set in the file
    service: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def get(self, name: str) -> Any:
        return self.settings.get(name, BY_NAME[name].default)

    def source(self, name: str) -> str:
        return f"config file {self.path}" if name in self.settings else "default"

    def svc(self, name: str) -> Any:
        return self.service.get(name, SERVICE_KEYS[name][1])

    @property
    def server_configured(self) -> bool:
        """True when a server was named: dsn in the file, or libpq environment variables."""
        env = ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGSERVICE", "PGUSER")
        return bool(self.dsn) or any(os.environ.get(v) for v in env)


def load(path: str | os.PathLike | None = None) -> Config:
    """Read and validate the TOML config; ``None`` means PGTASK_CONFIG or nothing."""
    path = path or os.environ.get("PGTASK_CONFIG") or None
    if path is None:
        return Config()
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p}: {exc}") from None
    return from_dict(raw, p)


def from_dict(raw: dict[str, Any], path: Path | None = None) -> Config:
    cfg = Config(path=path)
    for top, value in raw.items():
        if top == "dsn":
            if not isinstance(value, str):
                raise ConfigError(f"dsn: expected a libpq connection string, got {value!r}")
            cfg.dsn = value
        elif top == "pgtask":
            if not isinstance(value, dict):
                raise ConfigError("pgtask: expected a table")
            for key, v in value.items():
                if key not in SERVICE_KEYS:
                    raise ConfigError(f"pgtask.{key}: unknown key (known: {', '.join(SERVICE_KEYS)})")
                want = SERVICE_KEYS[key][0]
                if want is float and isinstance(v, int) and not isinstance(v, bool):
                    v = float(v)
                if not isinstance(v, want) or isinstance(v, bool):
                    raise ConfigError(f"pgtask.{key}: expected {want.__name__}, got {v!r}")
                if key in SERVICE_BOUNDS:
                    _check_bounds(f"pgtask.{key}", v, *SERVICE_BOUNDS[key])
                if key == "log_level" and v.lower() not in LOG_LEVELS:
                    raise ConfigError(f"pgtask.log_level: expected one of {', '.join(LOG_LEVELS)}, got {v!r}")
                if key == "execute_as" and v not in ("auto", "login", "set_role"):
                    raise ConfigError(f"pgtask.execute_as: expected 'auto', 'login' or 'set_role', got {v!r}")
                if key == "metrics_listen" and v:
                    parse_listen(v)
                cfg.service[key] = v
        elif top in ("pg_task", "pg_conf", "pg_work"):
            if not isinstance(value, dict):
                raise ConfigError(f"{top}: expected a table of settings")
            for key, v in value.items():
                name = f"{top}.{key}"
                if name == "pg_task.id":
                    raise ConfigError(f"{name}: read-only, set per task")
                if name not in BY_NAME:
                    raise ConfigError(f"{name}: unknown setting")
                if BY_NAME[name].column is not None:
                    raise ConfigError(
                        f"{name}: the default of task column {BY_NAME[name].column!r} is read by PostgreSQL "
                        "itself; set it there (postgresql.conf, ALTER DATABASE/ROLE ... SET, or SET)")
                v = _check_type(name, v, BY_NAME[name].type)
                if name == "pg_task.json":
                    v = parse_entries(v)
                cfg.settings[name] = v
        else:
            raise ConfigError(f"{top}: unknown key (known: dsn, pgtask, pg_task, pg_conf, pg_work)")
    return cfg
