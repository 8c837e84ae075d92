"""The one spec of every public cpupools_* variable: in step with the roles, and never a traceback."""

from __future__ import annotations

import math
import os
import re
import sys
import time
from pathlib import Path

import pytest
import yaml
from cpupools.core.cpulist import MAX_CPUS, parse_cpulist
from cpupools.core.errors import CpulistError, CpupoolsError, PlanError
from cpupools.hardware.topology import gather_topology
from cpupools.planning.inputs import (
    INTERNAL,
    PREFIX,
    SPEC,
    check_root,
    closest_name,
    to_infra,
    unknown_variables,
    validate_inputs,
)
from cpupools.planning.plan import make_request, plan_pools
from helpers import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(REPO / "collections"))
from ansible_collections.cpupools.cpupools.plugins.plugin_utils.inputs import EXPORT_DEFAULTS

ROLES = sorted(p for p in (REPO / "roles").iterdir() if (p / "meta" / "argument_specs.yml").exists())
MODULES = {p.stem for p in (REPO / "plugins" / "modules").glob("*.py")}


def argument_specs(role: Path) -> dict[str, dict]:
    """Option name -> spec, over every entry point of the role."""
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    options: dict[str, dict] = {}
    for entry in specs.values():
        options.update(entry.get("options") or {})
    return options


def templated(value: object) -> bool:
    return isinstance(value, str) and "{{" in value


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_role_argument_specs_follow_the_one_spec(role):
    short = role.name.removeprefix("cpupools_")
    for name, option in argument_specs(role).items():
        key = name.removeprefix(PREFIX)
        assert key in SPEC or key in INTERNAL, f"{role.name}: {name} is not in module_utils/cpupools/planning/inputs.py"
        if key in INTERNAL:
            continue
        var = SPEC[key]
        assert short in var.roles, f"{name}: inputs.py does not list role {short}"
        if short == "plan":
            # Ansible's own check must never run before ours (two lines, no host).
            assert option["type"] == "raw", f"{name}: the plan role declares it {option['type']}, not raw"
        else:
            expected = {var.spec_type, "str"} if var.spec_type == "path" else {var.spec_type}
            assert option.get("type", "str") in expected, f"{role.name}: {name} is {option.get('type')}, not {expected}"
            assert tuple(option.get("choices") or ()) == var.choices, f"{role.name}: {name} choices differ"
        if "default" in option and not templated(option["default"]) and not var.derived:
            assert option["default"] == var.default, f"{role.name}: {name} default {option['default']!r}"


def role_defaults(role: Path) -> dict[str, object]:
    path = role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


@pytest.mark.parametrize(("key", "var"), sorted(SPEC.items()), ids=lambda v: str(v)[:30])
def test_every_public_variable_is_declared_by_its_roles_with_the_same_default(key, var):
    name = PREFIX + key
    for short in var.roles:
        role = REPO / "roles" / f"cpupools_{short}"
        assert name in argument_specs(role), f"role {role.name} does not declare {name}"
    for role in [REPO / "roles" / "cpupools", *(REPO / "roles" / f"cpupools_{short}" for short in var.roles)]:
        defaults = role_defaults(role)
        if name in defaults and not templated(defaults[name]):
            assert not var.derived, f"{name}: inputs.py says the default is derived, {role.name} gives a value"
            assert defaults[name] == var.default, f"{name}: {role.name} defaults to {defaults[name]!r}"


def test_every_public_variable_has_one_default_in_the_declared_interface():
    """One default per variable: in the cpupools role, or in the one role it is named after and alone reads.

    The cpupools role (roles/cpupools) is the roles' declared interface: a
    variable two roles read, or one no role is named for, has its default
    there, and every stage role depends on it (meta/main.yml).
    """
    homes: dict[str, list[str]] = {}
    for role in sorted((REPO / "roles").iterdir()):
        for name in role_defaults(role):
            homes.setdefault(name, []).append(role.name)
    assert not {n: r for n, r in homes.items() if len(r) > 1}, "a default given by more than one role"
    # The facts the plan play exports: outputs, each read lazily from the plan result (the next test).
    assert {n: r for n, r in homes.items() if n in EXPORT_DEFAULTS} == {n: ["cpupools"] for n in EXPORT_DEFAULTS}
    for name, (role,) in homes.items():
        if name in EXPORT_DEFAULTS:
            continue
        assert role == "cpupools" or name.startswith(role + "_"), f"{name}: its default is in {role}, not cpupools"
        # The plan module reads every variable; the kernel stage imports the kubelet and reboot roles' tasks.
        readers = {f"cpupools_{short}" for short in SPEC[name.removeprefix(PREFIX)].roles}
        assert role == "cpupools" or readers <= {role, "cpupools_plan", "cpupools_kernel"}, (
            f"{name}: read by {sorted(readers)}, its default in {role} only"
        )
    # cpupools_reboot_serial is read by the play's serial:, before any role's defaults exist.
    missing = sorted(
        PREFIX + k for k, v in SPEC.items() if PREFIX + k not in homes and not v.derived and k != "reboot_serial"
    )
    assert not missing, f"public variables without a default in any role: {missing}"
    for role in sorted((REPO / "roles").iterdir()):
        if role.name == "cpupools" or not (role / "meta" / "main.yml").exists():
            continue
        deps = yaml.safe_load((role / "meta" / "main.yml").read_text()).get("dependencies") or []
        assert {"role": "cpupools"} in deps, f"{role.name} does not depend on the cpupools role"


def test_the_exported_facts_default_to_what_the_plan_action_compares_them_with():
    """roles/cpupools/defaults/main.yml reads each exported fact from the plan result, in the very text the
    plan's action compares the host's value with (a host whose value differs gets them as facts)."""
    defaults = yaml.safe_load((REPO / "roles" / "cpupools" / "defaults" / "main.yml").read_text())
    assert {name: defaults[name] for name in EXPORT_DEFAULTS} == EXPORT_DEFAULTS
    assert all(name.removeprefix(PREFIX) in INTERNAL for name in EXPORT_DEFAULTS)


def test_every_name_the_roles_set_is_known():
    """A name set in defaults, vars, register or set_fact is public or internal, so it is never warned about."""
    found = set()
    for path in [*REPO.glob("roles/*/*/*.yml"), *REPO.glob("playbooks/*.yml")]:
        text = path.read_text()
        found |= set(re.findall(r"^\s*(cpupools_\w+):", text, re.M))
        found |= set(re.findall(r"register:\s*(cpupools_\w+)", text))
    roles = {p.name for p in (REPO / "roles").iterdir()}
    unknown = sorted(
        n
        for n in found - MODULES - roles
        if n.removeprefix(PREFIX) not in SPEC and n.removeprefix(PREFIX) not in INTERNAL
    )
    assert not unknown, f"add these to SPEC or INTERNAL in inputs.py: {unknown}"


# The meaning of a value does not depend on how it was passed ------------------------------


def as_cli_text(value: object) -> str:
    """What ``-e name=value`` gives for a YAML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


@pytest.mark.parametrize(
    "key",
    sorted(
        k
        for k, v in SPEC.items()
        if not v.derived
        and not isinstance(v.default, dict)
        and k != "command_wrapper"
        and k != "reboot_simulate_command"
        and k != "kubelet_simulate_command"
    ),
)
def test_a_default_given_as_text_means_the_same(key):
    var = SPEC[key]
    assert var.convert(as_cli_text(var.default), key) == var.convert(var.default, key)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(2, 2), ("2", 2), (" 3 ", 3), ([2], (2,)), ("2-3,46-47", (2, 3, 46, 47)), ("0-0", (0,)), ([0, "44"], (0, 44))],
)
def test_infra_cores_integer_text_is_a_count(raw, expected):
    assert to_infra(raw, "infra_cores") == expected


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("cpupools_num_exclusive_cores", "--4", "'--4' is not an integer"),
        ("cpupools_num_exclusive_cores", "²", "'²' is not an integer"),
        ("cpupools_num_exclusive_cores", 1.5, "1.5 is not an integer"),
        ("cpupools_num_exclusive_cores", None, "is empty (null)"),
        ("cpupools_root", "", "'' is empty"),
        ("cpupools_root", "sandbox", "'sandbox' is not an absolute path"),
        ("cpupools_reconcile_interval", "1e400", "'1e400' is not an integer"),
        ("cpupools_k8s_drain_poll_interval", "inf", "'inf' is not a number of seconds"),
        ("cpupools_k8s_drain_poll_interval", 1e400, "inf is not a number of seconds"),
        ("cpupools_k8s_labels", ["a"], "['a'] is not a mapping"),
        ("cpupools_k8s_admission_opt_in", "inject", "'inject' is not a Kubernetes label name with a domain"),
        ("cpupools_k8s_admission_failure_policy", "fail", "'fail' is not one of Fail, Ignore"),
        ("cpupools_excl_non_isolcpus", "0-4000000000", "CPU 4000000000 is beyond the last possible CPU 87"),
        ("cpupools_report_title", "a\nb", "holds a newline"),
    ],
)
def test_refusals_name_the_variable_and_the_value(name, raw, message):
    with pytest.raises(PlanError) as exc:
        validate_inputs({name: raw}, possible_cpus=88)
    text = exc.value.describe("node1")
    assert text.startswith(f"host node1: {name}: "), text
    assert message in text
    assert "\n" not in text


@pytest.mark.parametrize(
    "raw", [{"team": "rt", "tier": "1"}, '{"team": "rt", "tier": "1"}', "team=rt, tier=1", "team=rt,tier=1"]
)
def test_labels_from_e_text_mean_what_the_yaml_mapping_means(raw):
    checked = validate_inputs({"cpupools_k8s_labels": raw})
    assert checked.values["k8s_labels"] == {"team": "rt", "tier": "1"}


def test_unknown_names_are_warned_with_the_closest_known_one():
    assert closest_name("cpupools_num_exclusive_core") == "cpupools_num_exclusive_cores"
    assert closest_name("cpupools_isolated_pool") == "cpupools_isolated_pools"
    assert unknown_variables({"cpupools_isolated_pool": 1, "cpupools_plan": {}, "other": 1}) == [
        "cpupools_isolated_pool is not a cpupools variable (did you mean cpupools_isolated_pools?); it is ignored"
    ]
    assert unknown_variables({"cpupools_zzzzzz": 1}) == ["cpupools_zzzzzz is not a cpupools variable; it is ignored"]


def test_parsing_is_bounded():
    start = time.monotonic()
    with pytest.raises(CpulistError, match="beyond the last possible CPU"):
        parse_cpulist("0-4000000000")
    with pytest.raises(CpulistError, match="beyond the last possible CPU 87"):
        parse_cpulist("0-87,88", limit=88)
    with pytest.raises(CpulistError, match="beyond the last possible CPU"):
        parse_cpulist([MAX_CPUS])
    assert time.monotonic() - start < 1


#: Values an operator pastes by mistake or an attacker plants: huge, or full of control characters.
HOSTILE = [
    "x" * 5000,
    "9" * 5000,
    "/" + "a" * 5000,
    ["y" * 5000],
    {"k" * 3000: "v" * 3000},
    "1," + "z" * 4000,
    ["auto", "q" * 999],
    "\x1b[31mred\n" * 50,
]


@pytest.mark.parametrize("name", sorted(SPEC))
def test_a_huge_or_hostile_value_is_quoted_shortened(name):
    for raw in HOSTILE:
        try:
            validate_inputs({f"cpupools_{name}": raw}, possible_cpus=88)
        except CpupoolsError as exc:
            text = exc.describe("node1")
            assert len(text) < 300 and text.isprintable(), (raw if len(repr(raw)) < 40 else type(raw), text[:400])


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("/" + "a" * 300, "holds a name of 300 bytes; a file name may be at most 255 bytes"),
        ("/tmp/" + "/".join(["b" * 200] * 25), "is 5029 bytes long; a path may be at most 1024 bytes"),
    ],
)
def test_a_path_the_node_cannot_use_names_its_variable(raw, message):
    """Refused in the plan play by name, not later as the boot loader's error (cpupools_kernel_args_backend)."""
    for name in ("cpupools_root", "cpupools_conf_dir", "cpupools_facts_root"):
        with pytest.raises(PlanError) as exc:
            validate_inputs({name: raw}, possible_cpus=88)
        assert exc.value.describe("node1").startswith(f"host node1: {name}: '/")
        assert message in str(exc.value)


def test_check_root(tmp_path, monkeypatch):
    check_root(str(tmp_path / "new" / "sandbox"))  # created later by the stages
    (tmp_path / "file").write_text("x")
    with pytest.raises(PlanError, match=r"is not a directory$"):
        check_root(str(tmp_path / "file"))
    with pytest.raises(PlanError, match=r"is not a directory \(.*/file is in its way\)"):
        check_root(str(tmp_path / "file" / "sandbox"))
    # A long root is named whole, normalised: an operator looks for it on the node.
    deep = tmp_path / ("a-long-directory-name-" * 4) / "sandbox" / "localhost"
    with pytest.raises(PlanError) as exc:
        check_root(str(tmp_path / "file" / ".." / "file" / deep.relative_to(tmp_path)))
    assert (
        str(exc.value)
        == f"'{tmp_path / 'file' / deep.relative_to(tmp_path)}' is not a directory ({tmp_path / 'file'} is in its way)"
    )
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(PlanError, match=r"is not writable \(.* is the nearest existing directory\)") as exc:
        check_root(str(tmp_path / "sandbox"))
    assert exc.value.field == "root"


# Property: no value of any knob gives a traceback ---------------------------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | st.sampled_from(["", "-1", "--4", "²", "0-4000000000", "1-", "N", "0-7:2/4", "true", "spread", "/", "a,b"])
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@pytest.fixture(scope="module")
def topology(corpus_root):
    return gather_topology(corpus_root["2s8c-offline"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(sorted(PREFIX + k for k in SPEC)), VALUES, max_size=6))
def test_random_values_never_give_a_traceback(topology, raw):
    try:
        checked = validate_inputs(raw, possible_cpus=32)
        plan = plan_pools(topology, make_request(checked.request()))
    except CpupoolsError as exc:
        text = exc.describe("h")
        assert "\n" not in text and "\r" not in text
        assert len(text) < 600
        if exc.field:
            assert PREFIX + exc.field in {PREFIX + k for k in SPEC} | {"cpupools_isolcpus_source"}
        return
    assert set(plan["pools"]) >= {"exclusive", "shared", "infra"}
    for name, value in checked.values.items():
        if isinstance(value, float):
            assert math.isfinite(value), name


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted(SPEC)), VALUES)
def test_one_knob_at_a_time(topology, key, value):
    raw = {PREFIX + key: value}
    try:
        checked = validate_inputs(raw, possible_cpus=32)
        plan_pools(topology, make_request(checked.request()))
    except CpupoolsError as exc:
        assert "\n" not in exc.describe("h")
