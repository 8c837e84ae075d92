"""The sample inventory shows every role knob with its default; role READMEs and argument specs agree."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from cpupools.planning.inputs import INTERNAL
from helpers import REPO, VENV_BIN, ansible_env

SAMPLE = REPO / "inventories" / "sample" / "group_vars" / "all" / "cpupools.yml"
ROLES = sorted(p for p in (REPO / "roles").iterdir() if (p / "defaults" / "main.yml").exists())


def knobs(role):
    """The role's defaults an inventory may set: not the outputs the cpupools role reads from the plan result."""
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    return {name: value for name, value in defaults.items() if name.removeprefix("cpupools_") not in INTERNAL}


def role_defaults():
    for role in ROLES:
        for name, value in knobs(role).items():
            yield role.name, name, value


@pytest.mark.parametrize(("role", "name", "value"), list(role_defaults()), ids=lambda v: str(v)[:40])
def test_sample_inventory_lists_every_knob_with_its_default(role, name, value):
    sample = yaml.safe_load(SAMPLE.read_text())
    text = SAMPLE.read_text()
    if name not in sample:
        # Knobs whose default is computed from another one appear commented out.
        assert f"# {name}:" in text, f"{name} (role {role}) is missing from {SAMPLE.relative_to(REPO)}"
        return
    if isinstance(value, str) and "{{" in value:
        return  # a computed default: documented, not comparable
    assert sample[name] == value, f"{name}: sample says {sample[name]!r}, role {role} defaults to {value!r}"


def spec_options(role):
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    options = set()
    for entry in specs.values():
        options |= set(entry.get("options") or {})
    return options


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_argument_specs_and_readme_cover_every_default(role):
    # The cpupools role declares the shared defaults; the stage roles that read one declare its spec.
    if role.name == "cpupools":
        options = set().union(*(spec_options(r) for r in (REPO / "roles").glob("cpupools_*")))
    else:
        options = spec_options(role)
    readme = (role / "README.md").read_text()
    for name in knobs(role):
        assert name in options, f"{role.name}: {name} has no argument spec"
        assert name in readme, f"{role.name}: {name} is not in the role README"


@pytest.mark.parametrize("inventory", ["sample", "local"])
def test_inventories_parse(inventory):
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-inventory"), "-i", str(REPO / "inventories" / inventory / "hosts.yml"), "--list"],
        cwd=REPO,
        env=ansible_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "cpupools_nodes" in proc.stdout
