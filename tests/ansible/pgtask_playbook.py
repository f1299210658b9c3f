"""Helpers of the Ansible tests: the tools, their environment, playbook runs and their recap, polling."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def tool(name: str) -> str:
    """An Ansible tool from the interpreter's environment (the project's venv), else from PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found: install the test extra (ansible-core, ansible-lint)")
    return found


def ansible_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_HOST_KEY_CHECKING": "False",
        "ANSIBLE_LOCAL_TEMP": str(Path(os.environ.get("TMPDIR", "/tmp")) / "pgtask-ansible-tmp"),
        # the tools' venv on PATH: the controller-side `pip wheel` runs with ansible's own Python
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    })
    env.update(extra)
    return env


@dataclass
class Run:
    rc: int
    output: str

    def recap(self, host: str) -> dict[str, int]:
        m = re.search(rf"^{re.escape(host)}\s*:\s*(.*)$", self.output.split("PLAY RECAP")[-1], re.MULTILINE)
        assert m, f"no PLAY RECAP line for {host}:\n{self.output[-3000:]}"
        return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}

    def changed_tasks(self) -> list[str]:
        """Names of the tasks and handlers that reported "changed"."""
        names, current = [], None
        for line in self.output.splitlines():
            m = re.match(r"^(?:TASK|RUNNING HANDLER) \[(.*)\]", line)
            if m:
                current = m.group(1)
            elif line.startswith("changed:") and current:
                names.append(current)
        return names


def run_tool(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run an Ansible tool in the repository with the tests' environment; output captured."""
    return subprocess.run([tool(name), *args], cwd=REPO, env=ansible_env(), check=False,
                          capture_output=True, text=True, timeout=timeout)


def run_playbook(inventory: Path, *args: str, timeout: float = 480) -> Run:
    cmd = [tool("ansible-playbook"), "-i", str(inventory), str(REPO / "playbook.yml"), *args]
    res = subprocess.run(cmd, cwd=REPO, env=ansible_env(), check=False, capture_output=True, text=True,
                         timeout=timeout)
    return Run(res.returncode, res.stdout + res.stderr)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.25):
    """Poll until predicate() returns a true value or the deadline passes."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
