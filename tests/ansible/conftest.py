"""Fixtures for the Ansible tests: the cached bookworm tree and a booted host."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# No __init__.py here (a package named "ansible" would shadow ansible itself), and the helpers live in
# modules with names of their own (tests/conftest.py is "conftest" too).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import pgtask_nspawn as nspawn
from pgtask_host import deployer


@pytest.fixture(scope="session")
def rootfs() -> Path:
    reason = nspawn.cannot_boot_reason()
    if reason:
        pytest.skip(reason)
    return nspawn.build_rootfs(log=lambda msg: print(msg, file=sys.stderr))


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory):
    """Empty at the start of the session: the role builds the wheels from this checkout on the first
    run that needs them, and the modules share them (a build and a download per module cost minutes)."""
    return tmp_path_factory.mktemp("wheelhouse")


@pytest.fixture(scope="module")
def host(rootfs):
    """One booted bookworm host, systemd as PID 1, no network but lo; gone after the module."""
    name = f"pgtask-e2e-{os.getpid()}"
    with nspawn.Container(rootfs, name, private_network=True) as c:
        # apt lists as old as a long-offline host's: the deploys set pgtask_apt_update_cache false
        # (no network here), and the role must then not refresh them however old they are
        c.sh("touch -c -d '30 days ago' /var/lib/apt/lists /var/lib/apt/periodic/update-success-stamp")
        yield c


@pytest.fixture(scope="module")
def deploy(host, wheelhouse, tmp_path_factory):
    """deploy(entries, *args, **extra_vars): the playbook run on the module's host (see pgtask_host)."""
    return deployer(host, wheelhouse, tmp_path_factory.mktemp("inventory"))
