"""The console's screenshots in docs/ (docs/console.png: the live view filtered to a group's failed
tasks; docs/console-confirm.png: a retry's preview awaiting its confirmation), taken by the browser
test that drives it (tests/notebooks/test_console.py) on Debian's PostgreSQL 15.

    .venv/bin/python -m bench.console_figure               # about half a minute
    .venv/bin/python -m bench.console_figure --out /tmp/shots
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    env = {**os.environ, "PGTASK_CONSOLE_SCREENSHOTS": str(args.out.absolute())}
    done = subprocess.run([sys.executable, "-m", "pytest", "--pg", "15", "tests/notebooks/test_console.py",
                           "-p", "no:cacheprovider", "-q"], cwd=ROOT, env=env)
    if done.returncode:
        sys.exit(done.returncode)
    print(f"wrote {args.out / 'console.png'} and {args.out / 'console-confirm.png'}")


if __name__ == "__main__":
    main()
