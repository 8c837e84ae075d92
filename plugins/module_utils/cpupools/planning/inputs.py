"""Every public ``cpupools_*`` variable of every role, and the one check of all of them.

The plan play calls ``validate_inputs`` once per host with every ``cpupools_*``
variable the host has (inventory, ``-e``, role defaults), before any stage
writes anything; the play is ``any_errors_fatal``, so one bad value on one
host stops the whole run. The roles' ``meta/argument_specs.yml`` are kept in
step with ``SPEC`` by a test (tests/planning/test_inputs.py); they stay as a
fallback for a role run on its own.

A value means the same whether it came from YAML or from ``-e`` (a string):
``"2"`` is the integer 2, ``"false"`` is false, ``"exclusive,shared"`` is a
list. An empty value (YAML ``key:`` with nothing, or ``-e key=``) is refused
rather than silently replaced by a default. Every refusal is a
``CpupoolsError`` whose ``field`` names the variable (without ``cpupools_``)
and whose message quotes the value, on one line.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..core import kube_names
from ..core.cpulist import ISOLCPUS_FLAGS, parse_cpulist
from ..core.errors import CpulistError, CpupoolsError, PlanError, StateError, show
from ..core.names import POOL_ORDER, RUNTIMES, VERIFY_CHECKS
from ..hardware.power import to_settings as to_power_settings
from ..node.agent_files import AGENT_PATH
from ..node.cmk15 import CMK_NAMESPACES
from ..node.hugepages import parse_entries as to_hugepages
from ..node.hugepages import parse_size, size_label
from ..node.kubelet import TOPOLOGY_POLICIES, TOPOLOGY_SCOPES, to_kubelet_version, to_policy_options

PREFIX = "cpupools_"
MODES = ("packed", "spread")
SOURCES = ("generate", "adopt")
ISOLATABLE_POOLS = ("exclusive", "shared")
#: ``cpupools_exclusive_core_type``: on a hybrid node, exclusive cores are P cores, or any core.
CORE_TYPE_CHOICES = ("performance", "any")
STATES = ("present", "absent")
HT_POLICIES = ("multiThreaded", "singleThreaded")
#: The default bound of an integer input (seconds, sizes). Counts of cores
#: have none here: the plan refuses a count the host cannot give, saying what
#: it can (``plan.py``).
MAX_COUNT = 1_000_000
#: The longest integer read, in digits: what Python (and so YAML and JSON) reads as one.
MAX_DIGITS = 4300
_INT_RE = re.compile(r"^[+-]?[0-9]+$")
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
# A file name (GRUB drop-in) and Kubernetes names (RFC 1123 subdomain, label
# name, qualified extended resource name).
_FILE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_NAMESPACE_RE = re.compile(r"^(?=.{1,63}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_UNIT_RE = re.compile(r"^[A-Za-z0-9@_.:-]{1,200}$")
_SERIAL_RE = re.compile(r"^[0-9]{1,3}%$")


#: The longest path Linux takes (``PATH_MAX``): a path is shown whole up to it.
PATH_MAX = 4096


#: The one error type of this module: a value no stage can use. The plan's own
#: error type, since the plan play is where every input is refused.
InputError = PlanError


# Converters: raw value -> normalised value, or InputError(message, field) ------------


def to_int(raw: object, field: str, minimum: int | None = None, maximum: int | None = MAX_COUNT, hint: str = "") -> int:
    """An integer from an int or a decimal string (``-e``); floats, bools and ``'²'`` are refused.

    The same digits mean the same number either way, however many (up to ``MAX_DIGITS``);
    ``maximum`` None: no upper bound here (a count of cores: the plan bounds it by the host).
    """
    value: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str) and _INT_RE.match(raw.strip()):
        digits = raw.strip().lstrip("+-")
        if len(digits) <= MAX_DIGITS:
            value = int(raw.strip())
        else:
            raise InputError(f"{show(raw)} is not an integer of at most {MAX_DIGITS} digits{hint}", field)
    if value is None:
        raise InputError(f"{show(raw)} is not an integer{hint}", field)
    if minimum is not None and value < minimum:
        raise InputError(f"{show(value)} is below {minimum}{hint}", field)
    if maximum is not None and value > maximum:
        raise InputError(f"{show(value)} is above {maximum}{hint}", field)
    return value


def to_bool(raw: object, field: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    if isinstance(raw, str) and raw.strip().lower() in _TRUE + _FALSE:
        return raw.strip().lower() in _TRUE
    raise InputError(f"{show(raw)} is not a boolean; give true or false", field)


def to_auto_bool(raw: object, field: str) -> str | bool:
    """``auto`` (decided from the node's plan) or a boolean."""
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return "auto"
    try:
        return to_bool(raw, field)
    except InputError:
        raise InputError(f"{show(raw)} is not auto or a boolean; give auto, true or false", field) from None


def to_choice(raw: object, field: str, choices: tuple[str, ...]) -> str:
    if isinstance(raw, str):
        for choice in choices:
            if raw.strip().lower() == choice.lower():
                return choice
    raise InputError(f"{show(raw)} is not one of {', '.join(choices)}", field)


def to_number(raw: object, field: str, minimum: float = 0.0, maximum: float = 86400.0) -> float:
    """A finite number of seconds above ``minimum``: ``nan``, ``inf`` and ``1e400`` are refused."""
    value: float | None = None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        value = float(raw)
    elif isinstance(raw, str) and len(raw) <= 32:
        try:
            value = float(raw.strip())
        except ValueError:
            value = None
    if value is None or not math.isfinite(value):
        raise InputError(f"{show(raw)} is not a number of seconds", field)
    if not minimum < value <= maximum:
        raise InputError(f"{show(raw)} is not above {minimum:g} and at most {maximum:g} seconds", field)
    return value


def to_str(
    raw: object, field: str, allow_empty: bool = False, pattern: re.Pattern | None = None, what: str = ""
) -> str:
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise InputError(f"{show(raw)} is not a string", field)
    text = str(raw)
    if "\n" in text or "\0" in text:
        raise InputError(f"{show(raw)} holds a newline or NUL byte", field)
    if not text.strip():
        if allow_empty and text == "":
            return ""
        raise InputError(f"{show(raw)} is empty", field)
    if pattern is not None and not pattern.match(text):
        raise InputError(f"{show(raw)} is not {what}", field)
    return text


#: Longest path (bytes) a path variable may be: the stages append file names
#: to it (a root, then a conf dir, then a cpulist of up to 255 bytes), and the
#: whole must stay under the kernel's PATH_MAX (4,096).
MAX_PATH_BYTES = 1024
#: Longest name of one path component (NAME_MAX of Linux file systems).
MAX_NAME_BYTES = 255


def to_path(raw: object, field: str, allow_empty: bool = False) -> str:
    """An absolute path; ``""`` only where it means "none" (and never for a root).

    Refused by name when the node could not use it: longer than
    ``MAX_PATH_BYTES``, or one of its names longer than ``MAX_NAME_BYTES``.
    """
    text = to_str(raw, field, allow_empty=allow_empty)
    if text and not text.startswith("/"):
        raise InputError(f"{show(raw)} is not an absolute path", field)
    size = len(text.encode("utf-8", "surrogateescape"))
    if size > MAX_PATH_BYTES:
        raise InputError(f"{show(raw)} is {size} bytes long; a path may be at most {MAX_PATH_BYTES} bytes", field)
    longest = max((len(name.encode("utf-8", "surrogateescape")) for name in text.split("/")), default=0)
    if longest > MAX_NAME_BYTES:
        raise InputError(
            f"{show(raw)} holds a name of {longest} bytes; a file name may be at most {MAX_NAME_BYTES} bytes", field
        )
    return text


def to_list(raw: object, field: str) -> list[object]:
    """A list from a YAML list or from ``-e`` text (``"a,b"``; ``""`` is the empty list)."""
    if isinstance(raw, str):
        return [item.strip() for item in raw.split(",") if item.strip()]
    if isinstance(raw, (list, tuple)):
        return list(raw)
    raise InputError(f"{show(raw)} is not a list", field)


def to_choices(raw: object, field: str, choices: tuple[str, ...]) -> list[str]:
    """A list of distinct choices, in the order given."""
    out: list[str] = []
    for item in to_list(raw, field):
        value = to_choice(item, field, choices)
        if value not in out:
            out.append(value)
    return out


def to_argv(raw: object, field: str) -> list[str]:
    if not isinstance(raw, (list, tuple)):
        raise InputError(
            f"{show(raw)} is not a list of arguments; give a YAML list "
            f"(with -e, as JSON: '{{\"{PREFIX}{field}\": [...]}}')",
            field,
        )
    return [to_str(item, field) for item in raw]


def to_cpus(raw: object, field: str, limit: int | None = None) -> tuple[int, ...]:
    """CPU ids from cpulist text or a list; ``""`` and ``[]`` are no CPU."""
    try:
        return tuple(parse_cpulist(raw, field, limit=limit))  # type: ignore[arg-type]
    except CpulistError as exc:
        raise InputError(str(exc), field) from None


def to_count(raw: object, field: str) -> int:
    """A number of cores, or -1 for all remaining; as many as typed (the plan says what the host can give)."""
    return to_int(raw, field, minimum=-1, maximum=None, hint="; give a number of cores, or -1 for all remaining")


def _is_int(raw: object) -> bool:
    if isinstance(raw, str):
        return len(raw.lstrip("+-")) <= MAX_DIGITS and bool(_INT_RE.match(raw))
    return isinstance(raw, int) and not isinstance(raw, bool)


def _infra_map(raw: Mapping, field: str) -> dict[int, int | str]:
    """``{NUMA node: cores or "auto"}``; from ``-e``: ``'{"0": 2}'`` or ``"0=2,3=0"``."""
    out: dict[int, int | str] = {}
    for key, value in raw.items():
        node = key.strip() if isinstance(key, str) else key
        if not _is_int(node) or int(node) < 0:  # type: ignore[call-overload]
            raise InputError(
                f"{show(key)} is not a NUMA node number (in the mapping of NUMA node to infra cores)", field
            )
        if isinstance(value, str) and value.strip().lower() == "auto":
            out[int(node)] = "auto"  # type: ignore[call-overload]
            continue
        count = to_int(
            value.strip() if isinstance(value, str) else value, field, minimum=0, maximum=None, hint=" (infra cores)"
        )
        out[int(node)] = count  # type: ignore[call-overload]
    if not out:
        raise InputError("the mapping of NUMA node to infra cores is empty; give auto or a number instead", field)
    return dict(sorted(out.items()))


def to_infra(raw: object, field: str, limit: int | None = None) -> int | tuple[int, ...] | str | dict:
    """``auto``, cores per NUMA node, a mapping NUMA node -> cores, or the infra cores' CPU ids.

    ``2`` and ``"2"`` both mean two cores on every NUMA node; a cpulist needs a
    comma, a range or a YAML list (``[2]``, ``2-2``) to name CPU ids; a
    mapping (``{0: 2, 3: 0}``, from ``-e`` ``"0=2,3=0"``) sets some NUMA
    nodes and leaves the others ``auto``.
    """
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return "auto"
    if _is_int(raw.strip() if isinstance(raw, str) else raw):
        count = to_int(raw, field, maximum=None)
        if count < 1:
            raise InputError(
                f"{count} infra cores per NUMA node; at least 1 is needed for the host and Kubernetes "
                "(a mapping of NUMA node to cores can leave single nodes without)",
                field,
            )
        return count
    if isinstance(raw, str) and ("=" in raw or raw.strip().startswith("{")) and len(raw) <= 4096:
        parsed = _mapping_text(raw)
        if isinstance(parsed, Mapping):
            return _infra_map(parsed, field)
    if isinstance(raw, Mapping):
        return _infra_map(raw, field)
    if isinstance(raw, float):
        raise InputError(f"{show(raw)} is neither auto, a number of cores per NUMA node nor a cpulist", field)
    cpus = to_cpus(raw, field, limit)
    if not cpus:
        raise InputError("the infra cpulist is empty; the host and Kubernetes need at least one core", field)
    return cpus


def to_isolated_pools(raw: object, field: str) -> str | list[str]:
    """``auto`` (what the runtime needs: plan.default_isolated_pools) or a list of pools."""
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return "auto"
    return to_choices(raw, field, ISOLATABLE_POOLS)


def to_isolcpus_flags(raw: object, field: str) -> str | list[str]:
    """``auto`` (the runtime's: kargs.RUNTIME_ISOLCPUS_FLAGS) or a list of isolcpus flags."""
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return "auto"
    return to_choices(raw, field, ISOLCPUS_FLAGS)


def to_sst_bf(raw: object, field: str) -> str:
    if isinstance(raw, bool):
        return "true" if raw else "false"
    return to_choice(raw, field, ("auto", "true", "false"))


def _mapping_text(raw: str) -> object:
    """What Ansible's ``dict`` type makes of ``-e`` text: a JSON object, or ``k=v, k2=v2``."""
    text = raw.strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            return raw
    if not text:
        return {}
    pairs = [item.partition("=") for item in text.split(",")]
    if all(eq and key.strip() for key, eq, _ in pairs):
        return {key.strip(): value.strip() for key, _, value in pairs}
    return raw


def to_labels(raw: object, field: str) -> dict[str, str]:
    if isinstance(raw, str) and len(raw) <= 4096:
        raw = _mapping_text(raw)
    if not isinstance(raw, Mapping):
        raise InputError(f"{show(raw)} is not a mapping of label name to value (e.g. {{team: rt}})", field)
    out = {}
    for key, value in raw.items():
        name = to_str(key, field)
        if kube_names.qualified_name_fault(name):
            raise InputError(f"label name {show(name)} is not a valid Kubernetes label name", field)
        text = "" if value is None else value
        if isinstance(text, bool) or not isinstance(text, (str, int)) or not kube_names.LABEL_VALUE.match(str(text)):
            raise InputError(f"label {name}: value {show(value)} is not a valid Kubernetes label value", field)
        out[name] = str(text)
    return out


def to_resource(raw: object, field: str) -> str:
    text = to_str(raw, field)
    fault = kube_names.extended_resource_fault(text)
    if fault:
        raise InputError(
            f"{show(raw)} is not an extended resource name (<domain>/<name>, outside kubernetes.io): {fault}", field
        )
    return text


def to_label_key(raw: object, field: str) -> str:
    """A label (or annotation) key with a domain prefix: ``example.com/name``."""
    text = to_str(raw, field)
    if kube_names.qualified_name_fault(text, need_prefix=True):
        raise InputError(f"{show(raw)} is not a Kubernetes label name with a domain (like example.com/inject)", field)
    return text


#: Kubernetes spells these exactly so, and the role passes the value on as given.
FAILURE_POLICIES = ("Fail", "Ignore")


def _failure_policy(raw: object, field: str) -> str:
    if isinstance(raw, str) and raw in FAILURE_POLICIES:
        return raw
    raise InputError(f"{show(raw)} is not one of {', '.join(FAILURE_POLICIES)} (spelt exactly so)", field)


def to_serial(raw: object, field: str) -> int | str:
    if isinstance(raw, str) and _SERIAL_RE.match(raw.strip()):
        percent = int(raw.strip()[:-1])
        if 1 <= percent <= 100:
            return raw.strip()
        raise InputError(f"{show(raw)} is not a percentage from 1% to 100%", field)
    return to_int(raw, field, minimum=1, hint="; give a number of nodes per batch or a percentage")


# The spec ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Var:
    """One public variable: its roles, its default, how it is read, and its argument_specs type."""

    roles: tuple[str, ...]
    convert: Callable[[object, str], object]
    default: object = None
    #: The ``type`` its roles' argument_specs give it (``raw`` in cpupools_plan, see there).
    spec_type: str = "str"
    choices: tuple[str, ...] = ()
    #: The default is a template the role computes (documented, not checked here).
    derived: bool = False


def _var(roles: str, convert: Callable[..., object], default: object = None, spec_type: str = "str", **kw) -> Var:
    return Var(tuple(roles.split()), convert, default, spec_type, **kw)


def _choice(choices: tuple[str, ...]) -> Callable[[object, str], str]:
    return lambda raw, field: to_choice(raw, field, choices)


def _int(minimum: int, maximum: int = MAX_COUNT) -> Callable[[object, str], int]:
    return lambda raw, field: to_int(raw, field, minimum, maximum)


def _str(allow_empty: bool, pattern: re.Pattern | None = None, what: str = "") -> Callable[[object, str], str]:
    return lambda raw, field: to_str(raw, field, allow_empty, pattern, what)


def _policy_options(raw: object, field: str) -> str | list[str]:
    """``kubelet.to_policy_options``, its refusal quoting the value shortened (it quotes it whole)."""
    try:
        return to_policy_options(raw, field)
    except CpupoolsError as exc:
        message = str(exc)
        items = raw if isinstance(raw, (list, tuple)) else str(raw).split(",") if isinstance(raw, str) else []
        for value in (raw, *items, *(str(i).strip() for i in items)):
            message = message.replace(repr(value), show(value))
        raise InputError(message, field) from None


def _path(allow_empty: bool = False) -> Callable[[object, str], str]:
    return lambda raw, field: to_path(raw, field, allow_empty)


def _work_dir(raw: object, field: str) -> str:
    """``auto`` or an absolute path (a directory on the controller; plugin_utils/work_dir.py resolves it)."""
    text = to_str(raw, field)
    return text if text == "auto" else to_path(text, field)


def _shebang(raw: object, field: str) -> str:
    text = to_str(raw, field)
    if not text.startswith("/"):
        raise InputError(f"{show(raw)} is not an interpreter line (an absolute path and its arguments)", field)
    return text


def _pythons(raw: object, field: str) -> list[str]:
    """Interpreters on the controller (absolute paths) that compile the agent's bytecode besides its own."""
    return [to_path(item, field) for item in to_list(raw, field)]


def _page_size(raw: object, field: str) -> str:
    """A hugepage size (``1G``, ``2M``) or ``""`` for the kernel's own default."""
    text = to_str(raw, field, allow_empty=True)
    return size_label(parse_size(text, field)) if text else ""


def _namespaces(raw: object, field: str) -> list[str]:
    names = [to_str(item, field) for item in to_list(raw, field)]
    for name in names:
        if not _NAMESPACE_RE.match(name):
            raise InputError(f"{show(name)} is not a Kubernetes namespace name", field)
    return names


def _task_names(raw: object, field: str) -> list[str]:
    """Regular expressions of task names (a YAML list; commas belong to a pattern), each one that compiles."""
    if raw in ("", None):
        return []
    patterns = to_argv(raw, field)
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InputError(f"{show(pattern)} is not a regular expression ({exc})", field) from None
    return patterns


def _power(raw: object, field: str) -> dict:
    """``power.to_settings``: pool (or ``uncore``) -> settings, in their shape (the node's drivers are the plan's)."""
    if isinstance(raw, str) and len(raw) <= 4096:
        raw = _mapping_text(raw)
    try:
        return to_power_settings(raw, POOL_ORDER, "")
    except CpupoolsError as exc:
        raise InputError(str(exc), field) from None


def _auto_or_cpus(raw: object, field: str) -> str | tuple[int, ...]:
    """``auto`` or a non-empty cpulist."""
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return "auto"
    cpus = to_cpus(raw, field)
    if not cpus:
        raise InputError("the cpulist is empty; give CPUs, or auto", field)
    return cpus


def _verify_checks(raw: object, field: str) -> list[str]:
    """A list of verify's checks (possibly empty: verify then reports and fails no node)."""
    if isinstance(raw, (list, tuple)) and not raw:
        return []
    return list(to_choices(raw, field, VERIFY_CHECKS))


def _task_group(raw: object, field: str) -> str:
    text = to_str(raw, field, allow_empty=True)
    if text and (len(text) > 32 or any(c in text for c in " :/,")):
        raise InputError(f"{show(raw)} is not a group name or gid", field)
    return text


#: Every public ``cpupools_*`` variable, without the prefix. Defaults equal the
#: ``defaults/main.yml`` of the cpupools role, or of the one role a variable is
#: named after (a test compares them).
SPEC: dict[str, Var] = {
    # cpupools_plan
    "root": _var("plan agent kernel kubelet verify", _path(), "/", "path"),
    "facts_root": _var("plan kernel verify", _path(), "/", "path", derived=True),
    "work_dir": _var("plan agent report", _work_dir, "auto"),
    "num_exclusive_cores": _var("plan", to_count, 4, "int"),
    "num_shared_cores": _var("plan", to_count, 1, "int"),
    "exclusive_mode": _var("plan", _choice(MODES), "packed", choices=MODES),
    "shared_mode": _var("plan", _choice(MODES), "packed", choices=MODES),
    "excl_non_isolcpus": _var("plan", to_cpus, "", "raw"),
    "infra_cores": _var("plan", to_infra, "auto", "raw"),
    "isolcpus_source": _var("plan", _choice(SOURCES), "generate", choices=SOURCES),
    "sst_bf": _var("plan", to_sst_bf, "auto", "raw"),
    "isolated_pools": _var("plan", to_isolated_pools, "auto", "raw"),
    "exclusive_core_type": _var("plan", _choice(CORE_TYPE_CHOICES), "performance", choices=CORE_TYPE_CHOICES),
    "isolate_cpu0": _var("plan", to_bool, False, "bool"),
    "plan_check_stages": _var("plan", to_bool, True, "bool"),
    "hugepages": _var("plan", to_hugepages, [], "raw"),
    # per-pool power and frequency, checked against the node's drivers by the plan (hardware/power.py)
    "power": _var("plan", _power, {}, "raw"),
    "hugepages_default_size": _var("plan", _page_size, ""),
    "hugepages_keep_free_mb": _var("plan", _int(0, 1 << 30), 1024, "int"),
    "converged_check": _var("plan", to_bool, True, "bool"),
    # shared by the node roles
    "state": _var("agent kernel k8s", _choice(STATES), "present", choices=STATES),
    # cpupools_kernel
    "kernel_args_backend": _var(
        "kernel",
        _choice(("auto", "grub", "grubby", "kernel-install")),
        "auto",
        choices=("auto", "grub", "grubby", "kernel-install"),
    ),
    "grub_dropin_name": _var(
        "kernel", _str(False, _FILE_NAME_RE, "a file name (letters, digits, _ . -)"), "99-cpupools"
    ),
    "isolcpus_flags": _var("kernel", to_isolcpus_flags, "auto", "raw"),
    "keep_adopted": _var("kernel", to_bool, True, "bool"),
    "nohz_full": _var("kernel", to_bool, True, "bool"),
    "rcu_nocbs": _var("kernel", to_bool, True, "bool"),
    "irqaffinity": _var("kernel", to_bool, True, "bool"),
    "command_line_size": _var("kernel", _int(256, 1 << 20), 2048, "int"),
    "kernel_release": _var("kernel", _str(True, re.compile(r"^[A-Za-z0-9._+~-]+$"), "a kernel release"), ""),
    "command_wrapper": _var("kernel", to_argv, [], "list"),
    "reboot_ok": _var("kernel reboot", to_bool, False, "bool"),
    "reboot_timeout": _var("kernel reboot", _int(1, 86400), 1800, "int"),
    "systemd_cpuaffinity": _var("kernel", to_auto_bool, "auto", "raw"),
    "irqbalance_banned": _var("kernel", to_bool, False, "bool"),
    "kubelet_dropin": _var("kernel kubelet", to_bool, False, "bool"),
    "kubelet_reservation": _var(
        "kernel kubelet",
        _choice(("reservedSystemCPUs", "systemReserved")),
        "reservedSystemCPUs",
        choices=("reservedSystemCPUs", "systemReserved"),
    ),
    "kubelet_config_dir": _var("kernel kubelet", _path(), "/etc/kubernetes/kubelet.conf.d"),
    # How exclusive CPUs reach workloads (docs/kubelet.md); the kubelet runtime's knobs
    "runtime": _var("plan agent kernel k8s kubelet", _choice(RUNTIMES), "cmk", choices=RUNTIMES),
    "kubelet_policy_options": _var("kernel kubelet", _policy_options, "auto", "raw"),
    "kubelet_version": _var("plan kernel kubelet", to_kubelet_version, "auto"),
    "kubelet_topology_policy": _var(
        "kernel kubelet", _choice(TOPOLOGY_POLICIES), "best-effort", choices=TOPOLOGY_POLICIES
    ),
    "kubelet_topology_scope": _var("kernel kubelet", _choice(TOPOLOGY_SCOPES), "container", choices=TOPOLOGY_SCOPES),
    "kubelet_state_file": _var("kernel kubelet verify", _path(), "/var/lib/kubelet/cpu_manager_state", "path"),
    "kubelet_service": _var(
        "kubelet", _str(False, re.compile(r"^[A-Za-z0-9@_.:-]{1,200}$"), "a systemd unit name"), "kubelet"
    ),
    "kubelet_restart_timeout": _var("kubelet", _int(1, 3600), 120, "int"),
    "kubelet_simulate_command": _var("kubelet", to_argv, [], "list"),
    # cpupools_agent
    "conf_dir": _var("agent verify", _path(), "/etc/cmk", "path"),
    "agent_path": _var("agent", _path(), AGENT_PATH, "path"),
    "agent_shebang": _var("agent", _shebang, "/bin/sh"),
    "agent_bytecode_pythons": _var("agent", _pythons, [], "list"),
    "reconcile_interval": _var("agent", _int(1, 86400), 60, "int"),
    "task_group": _var("agent", _task_group, ""),
    "metrics_dir": _var("agent verify", _path(allow_empty=True), ""),
    "agent_force": _var("agent", to_bool, False, "bool"),
    "agent_kubeconfig": _var("agent", _path(allow_empty=True), "/etc/kubernetes/kubelet.conf"),
    "agent_node_name": _var("agent", _str(False, kube_names.DNS_SUBDOMAIN, "a Kubernetes node name"), derived=True),
    "lock_timeout": _var("agent", _int(1, 3600), 30, "int"),
    "agent_isolate_shell": _var("agent", to_bool, False, "bool"),
    "manage_services": _var("agent", to_bool, None, "bool", derived=True),
    # the housekeeper (node/housekeep.py): kernel threads and host tasks kept off the isolated CPUs
    "housekeep": _var("agent", to_bool, True, "bool"),
    "housekeep_interval": _var("agent", _int(10, 86400), 60, "int"),
    "housekeep_keep": _var("agent", _task_names, [], "list"),
    # cpupools_k8s
    "k8s_enabled": _var("k8s", to_bool, True, "bool"),
    "k8s_kubeconfig": _var("k8s", _str(True), ""),
    "k8s_context": _var("k8s", _str(True), ""),
    "k8s_in_cluster": _var("k8s", to_bool, False, "bool"),
    "k8s_node_name": _var("k8s", _str(False, kube_names.DNS_SUBDOMAIN, "a Kubernetes node name"), derived=True),
    "k8s_taint": _var("k8s", to_bool, True, "bool"),
    "k8s_labels": _var("k8s", to_labels, {}, "dict"),
    "k8s_label_domain": _var("k8s", _str(False, kube_names.DNS_SUBDOMAIN, "a DNS domain"), "cmk.intel.com"),
    "k8s_exclusive_resource": _var("k8s", to_resource, "cmk.intel.com/exclusive-cores"),
    "k8s_eni_resource": _var("k8s", to_resource, "cmk.intel.com/exclusive-non-isolcpus-cores"),
    "k8s_publish": _var("k8s", to_bool, True, "bool"),
    "k8s_pending_reboot": _var("k8s", to_bool, False, "bool", derived=True),
    "k8s_request_timeout": _var("k8s", _int(1, 3600), 30, "int"),
    "k8s_drain_timeout": _var("k8s", _int(1, 86400), 300, "int"),
    "k8s_drain_poll_interval": _var("k8s", to_number, 2, "float"),
    "k8s_drain_delete_unmanaged": _var("k8s", to_bool, False, "bool"),
    "k8s_admission": _var("k8s", to_bool, True, "bool"),
    "k8s_admission_opt_in": _var("k8s", to_label_key, "cmk.intel.com/mutate"),
    "k8s_admission_failure_policy": _var("k8s", _failure_policy, "Fail", choices=FAILURE_POLICIES),
    # runtimes other than cmk (module_utils/cpupools/planning/runtimes.py, docs/runtimes.md)
    "pooler_ht_policy": _var("k8s", _choice(HT_POLICIES), "multiThreaded", choices=HT_POLICIES),
    "runtime_namespace": _var("k8s", _str(False, _NAMESPACE_RE, "a Kubernetes namespace name"), "kube-system"),
    # where CMK is found: by the agent stage (CMK v1.5's task lists) and by cpupools_cmk_retire
    "cmk_retire_namespaces": _var("agent cmk_retire", _namespaces, list(CMK_NAMESPACES), "list"),
    # cpupools_report
    "report_html": _var("report", _path(allow_empty=True), derived=True),
    "report_print": _var("report", to_bool, True, "bool"),
    "report_title": _var("report", _str(False), "cpupools report"),
    "report_generated": _var("report", _str(True), ""),
    "report_store": _var("report", _path(allow_empty=True), ""),
    "report_store_max_age": _var("report", _int(0, 10 * 365 * 86400), 0, "int"),
    # cpupools_verify (playbooks/verify.yml, and reboot.yml after each reboot; docs/verify.md)
    "verify_latency": _var("verify", to_bool, False, "bool"),
    "verify_latency_duration": _var("verify", _int(1, 3600), 10, "int"),
    "verify_latency_cpus": _var("verify", _auto_or_cpus, "auto", "raw"),
    "verify_max_latency_us": _var("verify", _int(0, 10_000_000), 0, "int"),
    "verify_p99_latency_us": _var("verify", _int(0, 10_000_000), 0, "int"),
    "verify_install_rt_tests": _var("verify", to_bool, False, "bool"),
    "verify_fail_on": _var("verify", _verify_checks, list(VERIFY_CHECKS), "list"),
    "verify_after_reboot": _var("verify", to_bool, True, "bool"),
    # cpupools_reboot (serial is the reboot play's, read before any role)
    "reboot_simulate_command": _var("reboot", to_argv, [], "list"),
    "reboot_serial": _var("", to_serial, 1, "raw"),
}

#: Names the roles set or export for each other (facts, registered results,
#: role vars): known, so never warned about, and never validated as input.
#: The facts the kernel and agent stages export (node/stage_check.py makes them; the cpupools role's
#: defaults read them from the plan result where no stage ran: plugin_utils/inputs.py).
EXPORTS = (
    "cpupools_reboot_required",
    "cpupools_pending_kernel_args",
    "cpupools_kernel_cmdline",
    "cpupools_housekeeping",
    "cpupools_kernel_status",
    "cpupools_agent_status",
)

INTERNAL = frozenset(
    {
        "plan",
        "plan_result",
        "plan_agent_build",
        "plan_kubelet_lines",
        "plan_kubelet_hosts",
        "plan_refresh_hosts",
        "plan_k8s_skipped",
        "plan_k8s_lines",
        "plan_k8s_grouped",
        "plan_k8s_runs",
        "plan_exports",
        "plan_host",
        "kernel_exports",
        "reboot_required",
        "pending_kernel_args",
        "kernel_cmdline",
        "kernel_status",
        "kernel_result",
        "housekeeping",
        "agent_status",
        "agent_state",
        "agent_cmk15",
        "agent_cmk15_read",
        "agent_cmk15_configmap",
        "agent_state_warned",
        "agent_housekeep_unit",
        "agent_housekeep_program_dest",
        "agent_housekeep_program_path",
        "agent_housekeep_conf_path",
        "agent_housekeep_files",
        "agent_housekeep_enabled",
        "agent_housekeep_units",
        "agent_housekeep_predicted",
        "agent_housekeep_timer_file",
        "agent_power_restored",
        "cmk_retire_v15",
        "agent_build",
        "agent_build_script",
        "agent_build_output",
        "agent_build_src",
        "cmk_retire_in_cluster",
        "cmk_retire_kubeconfig",
        "cmk_retire_node",
        "cmk_retire_result",
        "agent_stage",
        "agent_unit",
        "agent_unit_dir",
        "agent_units_dest",
        "agent_units",
        "agent_timer",
        "agent_timer_file",
        "agent_timer_predicted",
        "k8s_drain_result",
        "k8s_uncordon_result",
        "k8s_status",
        "k8s_node_result",
        "k8s_skip_reason",
        "k8s_applied",
        "k8s_admission_result",
        "k8s_admission_publisher",
        "k8s_admission_departing",
        "k8s_runtime_result",
        "report_input",
        "verify_result",
        "verify_module",
        "verify_fail",
        "report_result",
        "kernel_cpuaffinity_path",
        "kernel_irqbalance_path",
        "kubelet_file",
        "kubelet_result",
        "kubelet_restart_required",
        "kubelet_restart_reason",
        "kubelet_start_result",
        "kernel_templates",
        "kernel_hugepages_conf",
        "kernel_hugepages_script",
        "kernel_hugepages_unit",
        "kernel_hugepages_files",
        "kernel_hugepages_service",
        "kernel_hugepages_predicted",
        "kernel_hugepages_runtime",
        "kernel_hugepages_started",
    }
)


@dataclass
class Inputs:
    """The outcome of ``validate_inputs``: normalised values and what to warn about."""

    values: dict[str, object]
    warnings: list[str]

    def request(self) -> dict[str, object]:
        """The planner's inputs (``plan.make_request`` keys)."""
        return {name: self.values[name] for name in PLAN_KEYS}


PLAN_KEYS = (
    "num_exclusive_cores",
    "num_shared_cores",
    "exclusive_mode",
    "shared_mode",
    "excl_non_isolcpus",
    "infra_cores",
    "isolcpus_source",
    "sst_bf",
    "isolated_pools",
    "isolate_cpu0",
    "runtime",
    "exclusive_core_type",
)


def closest_name(name: str) -> str | None:
    """The known variable a misspelt ``cpupools_*`` name most likely meant (compared without the prefix)."""
    import difflib  # here: only a misspelt name needs it, and every module run imports this module

    match = difflib.get_close_matches(name.removeprefix(PREFIX), list(SPEC), n=1, cutoff=0.6)
    return PREFIX + match[0] if match else None


def unknown_variables(raw: Mapping[str, object]) -> list[str]:
    """A warning per ``cpupools_*`` name in ``raw`` that no role reads, with the closest known name."""
    warnings = []
    for full in sorted(name for name in raw if isinstance(name, str) and name.startswith(PREFIX)):
        name = full[len(PREFIX) :]
        if name in SPEC or name in INTERNAL:
            continue
        guess = closest_name(full)
        hint = f" (did you mean {guess}?)" if guess else ""
        warnings.append(f"{full} is not a cpupools variable{hint}; it is ignored")
    return warnings


def validate_inputs(raw: Mapping[str, object], possible_cpus: int | None = None) -> Inputs:
    """Check every ``cpupools_*`` variable in ``raw`` (full names, with the prefix).

    Variables not given take ``SPEC`` defaults; those with a ``derived``
    default stay ``None`` (the role computes them). Unknown ``cpupools_*``
    names become warnings naming the closest known one. The first bad value
    raises ``InputError`` naming it; ``possible_cpus`` (the host's possible
    CPU count) bounds every cpulist.
    """
    values: dict[str, object] = {}
    warnings = unknown_variables(raw)
    for name, var in SPEC.items():
        full = PREFIX + name
        if full not in raw:
            values[name] = None if var.derived else var.default
            continue
        value = raw[full]
        if value is None:
            raise InputError("is empty (null); give a value or remove the line to use the default", name)
        if name in ("excl_non_isolcpus", "infra_cores"):
            values[name] = var.convert(value, name, possible_cpus)  # type: ignore[call-arg]
        else:
            values[name] = var.convert(value, name)
    if values["num_exclusive_cores"] == -1 and values["num_shared_cores"] == -1:
        raise InputError(
            "num_exclusive_cores and num_shared_cores are both -1; only one pool can take all remaining cores",
            "num_exclusive_cores",
        )
    return Inputs(values, warnings)


def nearest_existing(path: str) -> str:
    """``path`` made absolute, or its nearest parent that exists (``/`` at the last): where it would be created."""
    probe = os.path.abspath(path)
    while not os.path.lexists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return probe


def check_root(path: str, field: str = "root") -> None:
    """Refuse a root the node's files cannot be written under (a file, or not writable).

    A root that does not exist yet is fine when its nearest existing parent
    is a directory the caller may write into (the stages create it). The
    message names the path whole and normalised (no ``a/../b``): an operator
    looks for it on the node.
    """
    shown = show(os.path.normpath(path), width=PATH_MAX)
    probe = nearest_existing(path)
    if not os.path.isdir(probe):
        what = "" if probe == os.path.abspath(path) else f" ({probe} is in its way)"
        raise InputError(f"{shown} is not a directory{what}", field)
    if not os.access(probe, os.W_OK | os.X_OK):
        where = "" if probe == os.path.abspath(path) else f" ({probe} is the nearest existing directory)"
        raise InputError(f"{shown} is not writable{where}", field)


def check_group(group: str, field: str = "task_group") -> None:
    """Refuse a task group the node does not have (a gid is taken as it is)."""
    if not group or _INT_RE.match(group):
        return
    from ..node.state_writer import group_id  # the pool state's writer, which the plan does not otherwise import

    try:
        group_id(group)
    except StateError as exc:
        raise InputError(str(exc), field) from None


#: How many refused hosts a whole-inventory check names before it counts the rest.
SHOWN_REFUSALS = 20


def check_inventory(
    hosts: Iterable[tuple[str, Mapping[str, object]]],
    controller: Callable[[str, dict[str, object]], str | None] | None = None,
) -> tuple[int, list[str], list[str]]:
    """Check the ``cpupools_*`` variables of every host, on the controller: ``(hosts checked, refusals, warnings)``.

    ``hosts`` gives each host's name and its ``cpupools_*`` variables (full
    names). Each goes through ``validate_inputs`` without the node's CPU
    count: everything but what needs the node (a cpulist beyond its possible
    CPUs, the pools fitting its cores, a root or group on the node), which
    the plan play still checks. ``controller(host, values)`` adds what only
    the controller can check (the caller's; a refusal or None). One refusal
    per bad host, in the host's order, as the plan play words it
    (``host X: cpupools_Y: ...``). The warnings are the plan play's about
    unknown names, one per name with the hosts that have it (the first few).
    """
    count = 0
    refusals = []
    unknown: dict[str, list[str]] = {}
    for host, raw in hosts:
        count += 1
        for warning in unknown_variables(raw):
            unknown.setdefault(warning, []).append(host)
        try:
            values = validate_inputs(raw).values
        except InputError as exc:
            refusals.append(exc.describe(host))
            continue
        refusal = controller(host, values) if controller else None
        if refusal:
            refusals.append(refusal)
    warnings = []
    for warning, names in unknown.items():
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        warnings.append(f"host{'s' if len(names) > 1 else ''} {', '.join(names[:3])}{more}: {warning}")
    return count, refusals, warnings


def inventory_refusal(count: int, refusals: Sequence[str]) -> str | None:
    """One line for the refusals of ``check_inventory`` (the first ``SHOWN_REFUSALS``); None when there is none.

    Each refusal reads as the plan play's (``host X: cpupools_Y: ...``); past
    the ones shown, a count of the others and of the hosts checked.
    """
    if not refusals:
        return None
    shown = "; ".join(refusals[:SHOWN_REFUSALS])
    more = len(refusals) - SHOWN_REFUSALS
    return shown + (f"; and {more} more of the {count} hosts" if more > 0 else "")
