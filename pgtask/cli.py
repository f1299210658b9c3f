"""Command line: argument parsing -> commands."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

import psycopg

try:  # libuv's event loop: the service's per-task Python overhead is mostly event-loop work
    import uvloop
except ImportError:  # not on this platform (Windows): the standard loop does the same, slower
    uvloop = None

from . import __version__
from . import config as cfgmod
from .supervisor import Supervisor, base_conninfo, provision_entries, resolve, worker_from_env

STATUS_SQL = """
SELECT "group", count(*) FILTER (WHERE state = 'PLAN' AND plan <= now()) AS due,
       count(*) FILTER (WHERE state = 'PLAN' AND plan > now()) AS planned,
       count(*) FILTER (WHERE state = 'TAKE') AS take, count(*) FILTER (WHERE state = 'WORK') AS work,
       count(*) FILTER (WHERE state = 'DONE') AS done, count(*) FILTER (WHERE state = 'FAIL') AS fail,
       count(*) FILTER (WHERE state = 'GONE') AS gone, count(*) FILTER (WHERE state = 'STOP') AS stop,
       max(now() - plan) FILTER (WHERE state = 'PLAN' AND plan <= now()) AS oldest_due
FROM {table} GROUP BY ROLLUP ("group") ORDER BY "group" NULLS LAST
"""


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
        conninfo, _ = await asyncio.to_thread(base_conninfo, cfg)
        return await resolve(cfg, conninfo)

    resolved = asyncio.run(go())
    print(f"# config file: {cfg.path or '(none)'}")
    print(f"# server: {cfg.dsn or ('libpq environment' if cfg.server_configured else 'embedded cluster')}")
    for name, value in sorted(resolved.values.items()):
        print(f"{name} = {json.dumps(value)}    # {resolved.sources[name]}")
    for key in cfgmod.SERVICE_KEYS:
        src = f"config file {cfg.path}" if key in cfg.service else "default"
        print(f"pgtask.{key} = {json.dumps(cfg.svc(key))}    # {src}")
    for i, e in enumerate(resolved.entries):
        print(f"entry {i}: data={e.data} user={e.user} schema={e.schema} table={e.table} sleep={e.sleep} "
              f"reset={e.reset!r} run={e.run} spi={e.spi}")
    return 0


def cmd_status(args: argparse.Namespace, cfg: cfgmod.Config) -> int:
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    async def go():
        conninfo, _ = await asyncio.to_thread(base_conninfo, cfg)
        resolved = await resolve(cfg, conninfo)
        for e in resolved.entries:
            print(f"== {e.label()}")
            try:
                async with await psycopg.AsyncConnection.connect(
                        make_conninfo(conninfo, dbname=e.data, user=e.user)) as conn:
                    cur = await conn.execute(sql.SQL(STATUS_SQL).format(table=sql.Identifier(e.schema, e.table)))
                    rows = await cur.fetchall()
                    names = [d.name for d in cur.description]
            except psycopg.Error as exc:
                print(f"   unavailable: {str(exc).strip()}")
                continue
            print("  " + " ".join(f"{n:>10}" for n in names))
            for row in rows:
                cells = ["(all)" if row[0] is None else row[0]] + list(row[1:])
                print("  " + " ".join(f"{'' if c is None else c!s:>10}" for c in cells))

    asyncio.run(go())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pgtask", description="The pg_task job scheduler as a service.")
    parser.add_argument("--version", action="version", version=f"pgtask {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("run", "run the service (foreground)"),
                            ("provision", "create roles, databases, schemas and tables (idempotent)"),
                            ("status", "summary of the queue"),
                            ("config", "print the effective configuration and where each value came from")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--config", "-c", help="TOML config file (default: $PGTASK_CONFIG)")
        if name == "provision":
            p.add_argument("--json", action="store_true", help="print {changed, actions} as JSON")
    args = parser.parse_args(argv)
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
