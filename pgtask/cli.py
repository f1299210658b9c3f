"""Command line: argument parsing -> commands."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

try:  # libuv's event loop: the service's per-task Python overhead is mostly event-loop work
    import uvloop
except ImportError:  # not on this platform (Windows): the standard loop does the same, slower
    uvloop = None

from . import __version__, sql_print, status
from . import config as cfgmod
from .precedence import resolve
from .supervisor import Supervisor, base_conninfo, provision_entries, worker_from_env


def _setup_logging(level: str) -> None:
    worker = worker_from_env()  # a worker process's lines say which it is
    where = f" [worker {worker[0]}/{worker[1]}]" if worker else ""
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s{where} %(name)s: %(message)s")


def cmd_run(args: argparse.Namespace, cfg: cfgmod.Config) -> int:
    _setup_logging(cfg.svc("log_level"))
    run = uvloop.run if uvloop is not None else asyncio.run
    return run(Supervisor(cfg, args.config).run())


def cmd_provision(args: argparse.Namespace, cfg: cfgmod.Config) -> int:
    async def go():
        conninfo, _ = await asyncio.to_thread(base_conninfo, cfg)
        resolved = await resolve(cfg, conninfo)
        return await provision_entries(cfg, conninfo, resolved.entries)

    report = asyncio.run(go())
    if args.json:
        print(json.dumps({"changed": report.changed, "actions": report.actions}))
    else:
        for action in report.actions:
            print(action)
        print("changed" if report.changed else "nothing to change: already provisioned")
    return 0


def cmd_config(args: argparse.Namespace, cfg: cfgmod.Config) -> int:
    async def go():
        conninfo, cluster = await asyncio.to_thread(base_conninfo, cfg)
        return conninfo, cluster, await resolve(cfg, conninfo)

    conninfo, cluster, resolved = asyncio.run(go())
    for line in status.config_lines(cfg, conninfo, cluster, resolved.values, resolved.sources, resolved.entries):
        print(line)
    return 0


def cmd_status(args: argparse.Namespace, cfg: cfgmod.Config) -> int:
    async def go():
        conninfo, _ = await asyncio.to_thread(base_conninfo, cfg)
        return conninfo, await resolve(cfg, conninfo)

    conninfo, resolved = asyncio.run(go())
    ok = True
    for e in resolved.entries:
        print(f"== {e.label()}")
        try:
            with psycopg.connect(make_conninfo(conninfo, dbname=e.data, user=e.user), autocommit=True) as conn:
                lines = status.report(conn, e.schema, e.table, args.since, args.behind_after, args.groups)
        except psycopg.Error as exc:
            lines = [f"NOT OK: unavailable: {str(exc).strip()}"]
        ok = ok and lines[0].startswith("OK")
        for line in lines:
            print(line)
    return 1 if args.check and not ok else 0


def cmd_sql(args: argparse.Namespace) -> int:
    """Print one statement as the service sends it, list their names, or write them all (--write)."""
    names = sql_print.statement_names()
    if args.write:
        for path in sql_print.write(Path(args.write), args.schema, args.table, args.columns):
            print(path)
        return 0
    if args.name is None or args.list:
        print("\n".join(names))
        return 0
    if args.name not in names:
        print(f"pgtask: no statement {args.name!r} (pgtask sql --list names them)", file=sys.stderr)
        return 2
    print(sql_print.render(args.name, args.schema, args.table, args.columns))
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pgtask", description="The pg_task job scheduler as a service.")
    parser.add_argument("--version", action="version", version=f"pgtask {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("run", "run the service (foreground)"),
                            ("provision", "create roles, databases, schemas and tables (idempotent)"),
                            ("status", "is a service looking after the queue; the queue by group"),
                            ("config", "print the effective configuration and where each value came from")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--config", "-c", help="TOML config file (default: $PGTASK_CONFIG)")
        if name == "provision":
            p.add_argument("--json", action="store_true", help="print {changed, actions} as JSON")
        if name == "status":
            p.add_argument("--since", default="1 hour", help="the window of the per-group counts (an interval)")
            p.add_argument("--behind-after", type=float, default=60.0, metavar="SECONDS",
                           help="a due task with a free group slot waiting longer than this is NOT OK")
            p.add_argument("--groups", type=_positive, default=20, metavar="N", help="show the N busiest groups")
            p.add_argument("--check", action="store_true", help="exit 1 when a table is NOT OK")
    p = sub.add_parser("sql", help="print a statement of the service as it sends it (no database needed)")
    p.add_argument("name", nargs="?", help="the statement (none, or --list: list their names)")
    p.add_argument("--list", action="store_true", help="list the statements' names")
    p.add_argument("--schema", default="public", help="the task table's schema (default: public)")
    p.add_argument("--table", default="task", help="the task table (default: task)")
    p.add_argument("--columns", default=sql_print.PROVISIONED_COPY_COLUMNS,
                   help="the columns a repeat copies (default: those of a table pgtask provisioned)")
    p.add_argument("--write", metavar="DIR", help="write every statement to DIR/<name>.sql")
    args = parser.parse_args(argv)
    if args.command == "sql":  # reads no configuration and connects to nothing
        return cmd_sql(args)
    try:
        cfg = cfgmod.load(args.config)
        return {"run": cmd_run, "provision": cmd_provision, "status": cmd_status,
                "config": cmd_config}[args.command](args, cfg)
    except cfgmod.ConfigError as exc:
        print(f"pgtask: configuration error: {exc}", file=sys.stderr)
        return 2
    except psycopg.Error as exc:
        print(f"pgtask: database error: {str(exc).strip()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
