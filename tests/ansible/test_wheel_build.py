"""The role's wheel build on the controller, run as the role renders it: rollouts started at once from
one checkout (the suite's modules, or two operators) must each get their wheel. pip builds in the
source tree, so without the role's lock they collide there ("File exists: build/bdist...")."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jinja2
import yaml

ROOT = Path(__file__).resolve().parents[2]
BUILD_TASK = "Build the wheelhouse on the controller"


def build_argv(source: Path, wheelhouse: Path) -> list[str]:
    tasks = yaml.safe_load((ROOT / "roles/pgtask/tasks/install.yml").read_text())
    block = next(t["block"] for t in tasks if "block" in t and any(b["name"] == BUILD_TASK for b in t["block"]))
    task = next(b for b in block if b["name"] == BUILD_TASK)
    values = {"ansible_playbook_python": sys.executable, "pgtask_source_dir": str(source),
              "pgtask_wheelhouse_dir": str(wheelhouse)}
    # --no-deps: the race is in building pgtask itself; its dependencies would only add minutes
    argv = [jinja2.Template(arg).render(values) for arg in task["ansible.builtin.command"]["argv"]]
    return argv[:-1] + ["--no-deps", argv[-1]]


def test_rollouts_at_once_from_one_checkout_each_get_the_wheel(tmp_path):
    source = tmp_path / "checkout"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(source)], check=True)
    houses = [tmp_path / f"wheelhouse{i}" for i in range(3)]

    def build(house: Path) -> subprocess.CompletedProcess:
        return subprocess.run(build_argv(source, house), capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(len(houses)) as pool:
        runs = list(pool.map(build, houses))
    for house, run in zip(houses, runs):
        assert run.returncode == 0, run.stderr[-3000:]
        assert [p.name for p in house.glob("pgtask-*.whl")], f"no wheel in {house}"
