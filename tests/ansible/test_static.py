"""The role's static checks: syntax per inventory, ansible-lint, argument_specs agree with defaults."""

from __future__ import annotations

import pytest
import yaml
from pgtask_playbook import REPO, run_tool

ROLE = REPO / "roles" / "pgtask"


@pytest.mark.parametrize("inventory", ["local", "example"])
def test_syntax_check(inventory):
    res = run_tool("ansible-playbook", "-i", str(REPO / "inventories" / inventory),
                   str(REPO / "playbook.yml"), "--syntax-check")
    assert res.returncode == 0, res.stdout + res.stderr


def test_inventories_list_the_groups():
    for inventory, schedulers in (("local", 1), ("example", 2)):
        res = run_tool("ansible-inventory", "-i", str(REPO / "inventories" / inventory), "--list")
        assert res.returncode == 0, res.stderr
        groups = yaml.safe_load(res.stdout)
        assert len(groups["pgtask_db"]["hosts"]) == 1
        assert len(groups["pgtask_scheduler"]["hosts"]) == schedulers


@pytest.mark.timeout(600)
def test_ansible_lint_clean():
    res = run_tool("ansible-lint", "--offline", "--strict", "-q", "playbook.yml", "roles/pgtask",
                   "inventories", timeout=540)
    assert res.returncode == 0, res.stdout + res.stderr


def _spec_options():
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    return spec


def test_argument_specs_defaults_match_defaults_file():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    spec = _spec_options()
    main = spec["main"]["options"]
    # every public variable is validated by some entry point, with the very same default
    covered = {}
    for entry in spec.values():
        for name, option in entry["options"].items():
            assert "default" in option, f"{name} has no default in argument_specs"
            assert option["default"] == defaults[name], (
                f"{name}: argument_specs default {option['default']!r} != defaults {defaults[name]!r}")
            covered[name] = option
    assert set(defaults) == set(covered), set(defaults) ^ set(covered)
    assert all(name.startswith("pgtask_") for name in defaults)
    assert "pgtask_entries" in main and "pgtask_version" in main


def test_pinned_version_is_the_repository_version():
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["pgtask_version"] == version
    example = yaml.safe_load((REPO / "inventories/example/group_vars/all/main.yml").read_text())
    assert example["pgtask_version"] == version


def test_unit_template_is_managed_and_hardened():
    text = (ROLE / "templates" / "pgtask.service.j2").read_text()
    assert text.startswith("{{ ansible_managed | comment }}")
    for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                 "Restart=on-failure", "ExecReload=/bin/kill -HUP $MAINPID"):
        assert line in text
