"""The kubelet's CPU manager from the plan: the drop-in, its refusals, and when the kubelet must restart.

With ``cpupools_runtime: kubelet`` exclusive CPUs reach workloads through the
kubelet's static CPU manager (Guaranteed pods with integer CPU requests)
instead of ``cmk isolate``. Everything the kubelet needs is derived here from
the one plan and the topology facts:

- ``reservedSystemCPUs``: the plan's housekeeping cores (``reserved_cpus``:
  kept on every NUMA node for the host, the kubelet and the container
  runtime), nothing more; every other CPU is the kubelet's to share and
  hand out, and the plan isolates all of them (``nohz_full``, ``rcu_nocbs``,
  ``isolcpus=managed_irq``), as OpenShift's PerformanceProfile isolates
  every CPU it does not reserve;
- ``cpuManagerPolicy: static`` and its options, for the kubelet's version
  (``POLICY_OPTIONS``: when each appeared, went beta and GA; ``INCOMPATIBLE``:
  the pairs the kubelet refuses together). ``auto`` takes ``full-pcpus-only``
  where cores have more than one thread, ``strict-cpu-reservation`` (pods
  stay off the reserved CPUs), and ``prefer-align-cpus-by-uncorecache``
  where a NUMA node holds several L3 domains (a pod's CPUs in one CCD), else
  ``distribute-cpus-across-numa`` where there are several NUMA nodes; only
  options the kubelet has on by default (beta or GA). An alpha option the
  operator lists turns ``CPUManagerPolicyAlphaOptions`` on in the drop-in;
- the Topology Manager policy and scope (inventory knobs).

They are written as a KubeletConfiguration drop-in in the kubelet's
``--config-dir``. The kubelet reads its configuration only when it starts,
and a change of policy or reserved set only takes with an empty CPU manager
state (``/var/lib/kubelet/cpu_manager_state``): otherwise it refuses to start.
So a change of those settings on a node whose kubelet has a state file is not
written in place: it is *pending* until the rolling restart
(playbooks/reboot.yml) drains the node, stops the kubelet, writes the
drop-in, removes the state file, starts and verifies it. What the kubelet
last ran with is remembered in ``/var/lib/cpupools/kubelet-cpu-manager.json``
(the "applied" record), because the kubelet's state file does not say which
CPUs are reserved.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..core.cpulist import format_cpulist, parse_cpulist
from ..core.errors import CpulistError, CpupoolsError, PlanError, show
from ..hardware.topology import Topology
from .agent_files import under
from .bootloader import Host, Runner
from .kargs import housekeeping_outputs, resolve_isolcpus_flags

TOPOLOGY_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
TOPOLOGY_SCOPES = ("container", "pod")
FULL_PCPUS = "full-pcpus-only"
STRICT = "strict-cpu-reservation"
UNCORE = "prefer-align-cpus-by-uncorecache"
ACROSS_NUMA = "distribute-cpus-across-numa"
BY_SOCKET = "align-by-socket"
ACROSS_CORES = "distribute-cpus-across-cores"
#: The static policy's options: Kubernetes 1.x minor of their alpha, beta and GA
#: (None: not yet), from the kubelet's policy_options.go and the KEPs
#: (2625, 2902, 3327, 4540, 4800; docs/kubelet.md). Alpha needs the feature gate
#: CPUManagerPolicyAlphaOptions (off by default); beta and GA need nothing.
POLICY_OPTIONS: dict[str, tuple[int, int | None, int | None]] = {
    FULL_PCPUS: (22, 23, 33),
    STRICT: (32, 33, 35),
    UNCORE: (32, 34, 36),
    ACROSS_NUMA: (23, 33, None),
    BY_SOCKET: (25, None, None),
    ACROSS_CORES: (31, None, None),
}
#: Pairs the kubelet refuses to start with ("static policy options %s and %s can not be used at the same time").
INCOMPATIBLE = (
    (FULL_PCPUS, ACROSS_CORES),
    (ACROSS_NUMA, ACROSS_CORES),
    (UNCORE, ACROSS_CORES),
    (UNCORE, ACROSS_NUMA),
)
ALPHA_GATE = "CPUManagerPolicyAlphaOptions"
#: The kubelet this version of cpupools is tested against; ``auto`` without a
#: kubelet on the node assumes the oldest whose derived options it knows.
NEWEST_KUBELET = (1, 36)
ASSUMED_KUBELET = (1, 33)
RESERVATIONS = ("reservedSystemCPUs", "systemReserved")
STATE_FILE = "/var/lib/kubelet/cpu_manager_state"
RECORD_FILE = "/var/lib/cpupools/kubelet-cpu-manager.json"
DROPIN_FILE = "50-cpupools.conf"
HEADER = "# Ansible managed by cpupools: edits here are overwritten (docs/kubelet.md)."
#: The fields whose change needs the drain / stop / remove state / start sequence.
RESTART_FIELDS = (
    "cpuManagerPolicy",
    "cpuManagerPolicyOptions",
    "reservedSystemCPUs",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "featureGates",
)
#: The isolcpus flag that takes CPUs out of the scheduler's load balancing.
_DOMAIN = "domain"

KubeletError = PlanError


def to_kubelet_version(raw: object, field: str) -> str:
    """``auto`` (ask the node's kubelet) or a Kubernetes version: ``1.34``, ``v1.34.2``."""
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return "auto"
    text = str(raw).strip() if isinstance(raw, (str, int, float)) and not isinstance(raw, bool) else ""
    match = re.match(r"^v?1\.([0-9]{1,3})(\.[0-9]{1,4})?([-+][0-9A-Za-z.+-]{0,60})?$", text)
    if not match:
        raise KubeletError(f"{show(raw)} is neither auto nor a Kubernetes version like 1.34", field)
    return f"1.{int(match.group(1))}"


def resolve_version(raw: object, run: Runner) -> str | None:
    """``cpupools_kubelet_version`` resolved: ``auto`` asks the node's kubelet (``None``: no kubelet found)."""
    if raw is None or raw == "auto":
        return detect_version(run)
    return str(raw)


def version_tuple(text: str | None) -> tuple[int, int] | None:
    match = re.match(r"^v?(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


#: How long ``kubelet --version`` may take. A Go binary of 100 MB answers in well under a second on a
#: server; the emulated guest of tests/guest, under load, took over 10 s.
VERSION_TIMEOUT = 60


#: Where a kubelet outside PATH is looked for (kubeadm's packages install /usr/bin/kubelet).
KUBELET_PATHS = ("/usr/bin/kubelet", "/usr/local/bin/kubelet")


def detect_version(run: Runner) -> str | None:
    """The node's kubelet version (``kubelet --version``: ``Kubernetes v1.36.2``); ``None`` without one.

    ``run(argv)`` runs a command and returns ``(status, stdout, stderr)`` (the
    module's ``run_command``). The kubelet runs under coreutils' ``timeout``:
    a kubelet that is on the node but does not say its version (it fails,
    hangs past ``VERSION_TIMEOUT`` or prints no version) is refused
    (``KubeletError``): taking it for no kubelet would derive the options of
    the oldest version, which a newer kubelet may be configured to refuse.
    """
    path = shutil.which("kubelet") or next((p for p in KUBELET_PATHS if os.access(p, os.X_OK)), None)
    if path is None:
        return None
    field = "cpupools_kubelet_version"
    unknown = "set cpupools_kubelet_version to the version of the node's kubelet"
    status, out, err = run(["timeout", "--kill-after=5", str(VERSION_TIMEOUT), path, "--version"])
    said = (err.strip() or out.strip()).splitlines()[-1:] or ["nothing"]
    if status in (124, 137):  # timeout(1): the kubelet ran past VERSION_TIMEOUT (137: it ignored the TERM too)
        raise KubeletError(f"auto: {path} --version did not answer in {VERSION_TIMEOUT} s; {unknown}", field)
    if status in (126, 127):  # timeout(1): the kubelet could not be run
        raise KubeletError(f"auto: {path} --version could not run ({said[0][:200]}); {unknown}", field)
    if status != 0:
        raise KubeletError(f"auto: {path} --version exited {status} ({said[0][:200]}); {unknown}", field)
    match = _VERSION.search(out)
    if not match:
        raise KubeletError(f"auto: {path} --version printed no version ({said[0][:200]}); {unknown}", field)
    return match.group(1)


_VERSION = re.compile(r"v?(1\.\d+)(\.\d+)?")


def to_policy_options(raw: object, field: str) -> str | list[str]:
    """``auto`` (derived from the topology) or a list of static-policy options (``-e``: ``"a,b"``)."""
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return "auto"
    if isinstance(raw, str):
        items: list[object] = [item.strip() for item in raw.split(",") if item.strip()]
    elif isinstance(raw, (list, tuple)):
        items = list(raw)
    else:
        raise KubeletError(f"{raw!r} is neither auto nor a list of {', '.join(POLICY_OPTIONS)}", field)
    out: list[str] = []
    names = list(POLICY_OPTIONS)
    for item in items:
        if not isinstance(item, str) or item.strip() not in POLICY_OPTIONS:
            raise KubeletError(f"{show(item)} is not auto or one of {', '.join(names)}", field)
        if item.strip() not in out:
            out.append(item.strip())
    for first, second in INCOMPATIBLE:
        if first in out and second in out:
            raise KubeletError(
                f"{first} and {second} cannot be used together (the kubelet refuses to start with both)", field
            )
    return sorted(out, key=names.index)


def _cpus(text: object, what: str) -> set[int]:
    try:
        return set(parse_cpulist(text or "", what))  # type: ignore[arg-type]
    except CpulistError as exc:
        raise KubeletError(f"the plan's {what} is not a cpulist: {exc}", "plan") from None


def _pool(plan: Mapping, name: str) -> set[int]:
    return _cpus((plan.get("pool_cpus") or {}).get(name, ""), f"pool_cpus.{name}")


@dataclass(frozen=True)
class NodeShape:
    """What of a node's topology the kubelet's options depend on."""

    threads_per_core: int = 1
    numa_nodes: int = 1
    sockets: int = 1
    #: The most L3 domains one NUMA node holds (AMD CCDs: several; Intel, SNC: one).
    l3_per_node: int = 1
    #: P and E cores, with the E cores reserved (the kubelet cannot keep pods off them).
    hybrid_reserved: bool = False
    siblings: Mapping[int, Sequence[int]] | None = None


def node_shape(topology: Topology, plan: Mapping | None = None) -> NodeShape:
    per_node: dict[int, set] = {}
    for core in topology.cores:
        per_node.setdefault(core.node, set()).add(core.l3)
    efficiency = set(topology.core_types.get("efficiency", ()))
    reserved = _cpus((plan or {}).get("reserved_cpus") or "", "reserved_cpus") if plan else set()
    return NodeShape(
        threads_per_core=topology.threads_per_core,
        numa_nodes=len(topology.numa_nodes),
        sockets=len(topology.sockets),
        l3_per_node=max((len(v - {None}) for v in per_node.values()), default=1) or 1,
        hybrid_reserved=bool(efficiency) and efficiency <= reserved,
        siblings={cpu: topology.cpus[cpu].siblings for cpu in topology.cpus},
    )


def _version(settings: Mapping[str, object], plan: Mapping) -> tuple[tuple[int, int], bool]:
    """The kubelet version the options are for, and whether it is known (not assumed).

    The plan play resolved ``auto`` once (``plan["kubelet"]["version"]``); the
    kernel stage takes that, so both derive the same options.
    """
    given = settings.get("kubelet_version")
    if given in (None, "auto"):
        given = ((plan.get("kubelet") or {}) if isinstance(plan.get("kubelet"), Mapping) else {}).get("version")
    found = version_tuple(str(given or ""))
    return (found, True) if found else (ASSUMED_KUBELET, False)


def derive_options(shape: NodeShape, requested: str | Sequence[str], version: tuple[int, int]) -> dict[str, str]:
    """The ``cpuManagerPolicyOptions`` map: derived for ``auto``, else the operator's list.

    ``auto`` takes only options the kubelet of ``version`` has on by default (beta or GA).
    """
    if requested != "auto":
        names = list(requested)
    else:
        minor = version[1]

        def usable(name: str) -> bool:
            beta = POLICY_OPTIONS[name][1]
            return beta is not None and minor >= beta

        names = []
        if shape.threads_per_core > 1 and usable(FULL_PCPUS):
            names.append(FULL_PCPUS)
        if usable(STRICT) and not shape.hybrid_reserved:
            names.append(STRICT)
        if shape.l3_per_node > 1 and usable(UNCORE):
            names.append(UNCORE)
        elif shape.numa_nodes > 1 and usable(ACROSS_NUMA):
            names.append(ACROSS_NUMA)
    order = list(POLICY_OPTIONS)
    return {name: "true" for name in sorted(names, key=order.index)}


def check_options(
    options: Mapping[str, str], version: tuple[int, int], known: bool, shape: NodeShape, topology_policy: str
) -> dict[str, bool]:
    """Refuse options this kubelet would refuse to start with; return the feature gates they need."""
    gates: dict[str, bool] = {}
    shown = f"1.{version[1]}" + ("" if known else " (assumed: set cpupools_kubelet_version)")
    for name in options:
        alpha, beta = POLICY_OPTIONS[name][:2]
        if version[1] < alpha:
            raise KubeletError(
                f"{name} needs kubelet 1.{alpha} or later, and this node's kubelet is {shown}",
                "kubelet_policy_options",
            )
        if beta is None or version[1] < beta:
            gates[ALPHA_GATE] = True
    for first, second in INCOMPATIBLE:
        if first in options and second in options:
            raise KubeletError(
                f"{first} and {second} cannot be used together (the kubelet refuses to start with both)",
                "kubelet_policy_options",
            )
    if BY_SOCKET in options:
        if topology_policy == "single-numa-node":
            raise KubeletError(
                f"{BY_SOCKET} cannot be used with the Topology Manager policy single-numa-node "
                "(the kubelet refuses to start with both)",
                "kubelet_policy_options",
            )
        if shape.sockets > shape.numa_nodes:
            raise KubeletError(
                f"{BY_SOCKET} needs at least one NUMA node per socket, and this node has {shape.sockets} sockets "
                f"and {shape.numa_nodes} NUMA node(s) (the kubelet refuses to start)",
                "kubelet_policy_options",
            )
    return gates


def derive_config(plan: Mapping, shape: NodeShape, settings: Mapping[str, object]) -> dict[str, object]:
    """The KubeletConfiguration fields for ``cpupools_runtime: kubelet``, or ``KubeletError``.

    ``settings``: the normalised inputs (``inputs.validate_inputs``) without
    the ``cpupools_`` prefix (``kubelet_version`` resolved from ``auto`` by the
    module). Refuses, with the numbers, what the kubelet cannot run with or
    what would fight the pools:

    - no CPU left for the kubelet to hand out (no exclusive pool);
    - the exclusive-non-isolcpus pool, which only ``cmk isolate`` hands out;
    - reserved CPUs that are isolated (the kubelet and system daemons would
      sit on CPUs the scheduler does not balance);
    - ``isolcpus`` with the ``domain`` flag on CPUs the kubelet manages: the
      kubelet runs every Burstable and BestEffort pod on the CPUs not handed
      out, and on an isolated CPU nothing spreads them;
    - ``full-pcpus-only`` with a reserved set that splits a core;
    - options the kubelet's version does not have, or refuses together.
    """
    reserved = (
        _cpus(plan["reserved_cpus"], "reserved_cpus") if plan.get("reserved_cpus") is not None else _pool(plan, "infra")
    )
    siblings = shape.siblings or {}
    every = set()
    for name in plan.get("pool_cpus") or {}:
        every |= _pool(plan, name)
    managed = every - reserved
    excl = sorted(_pool(plan, "exclusive"))
    if not excl:
        raise KubeletError(
            "the static CPU manager would have no exclusive CPU to hand out (the exclusive pool is empty); "
            "give cpupools_num_exclusive_cores 1 or more, or use cpupools_runtime: cmk",
            "num_exclusive_cores",
        )
    eni = _pool(plan, "exclusive-non-isolcpus")
    if eni:
        raise KubeletError(
            f"CPUs {format_cpulist(eni)} are an exclusive-non-isolcpus pool, which only cmk isolate hands out; "
            "with cpupools_runtime: kubelet the kubelet would hand them out as well; remove the pool or use "
            "cpupools_runtime: cmk",
            "excl_non_isolcpus",
        )
    if not reserved:
        raise KubeletError("the infra pool is empty, so reservedSystemCPUs would be empty", "infra_cores")
    isolated = _cpus(plan.get("isolated_cpus", ""), "isolated_cpus")
    if reserved & isolated:
        raise KubeletError(
            f"reservedSystemCPUs {format_cpulist(reserved)} would include isolated CPUs "
            f"{format_cpulist(reserved & isolated)}; the kubelet and the system daemons need CPUs the scheduler "
            "balances",
            "infra_cores",
        )
    flags = resolve_isolcpus_flags(settings.get("isolcpus_flags"), "kubelet")
    if (isolated & managed) and (_DOMAIN in flags or not flags):
        raise KubeletError(
            f"isolcpus with the domain flag would take CPUs {format_cpulist(isolated & managed)} out of the "
            "scheduler's load balancing, but the kubelet also runs every Burstable and BestEffort pod on the "
            "CPUs it has not handed out; set cpupools_isolcpus_flags: [managed_irq] (the CPUs stay free of "
            "interrupts; nohz_full and rcu_nocbs still apply)",
            "isolcpus_flags",
        )
    requested = settings.get("kubelet_policy_options")
    version, known = _version(settings, plan)
    options = derive_options(shape, "auto" if requested is None else requested, version)  # type: ignore[arg-type]
    topology_policy = str(settings.get("kubelet_topology_policy") or "best-effort")
    gates = check_options(options, version, known, shape, topology_policy)
    if FULL_PCPUS in options:
        split = sorted(cpu for cpu in reserved if not set(siblings.get(cpu, (cpu,))) <= reserved)
        if split:
            raise KubeletError(
                f"full-pcpus-only needs whole cores in reservedSystemCPUs {format_cpulist(reserved)}, but CPU "
                f"{split[0]} shares its core with CPUs outside it",
                "kubelet_policy_options",
            )
    config: dict[str, object] = {
        "cpuManagerPolicy": "static",
        "cpuManagerPolicyOptions": options,
        "reservedSystemCPUs": format_cpulist(reserved),
        "topologyManagerPolicy": topology_policy,
        "topologyManagerScope": settings.get("kubelet_topology_scope") or "container",
    }
    if gates:
        config["featureGates"] = gates
    return config


def cmk_config(plan: Mapping, reservation: str) -> dict[str, object]:
    """The ``cpupools_runtime: cmk`` drop-in: keep the pools' CPUs from the kubelet (policy untouched)."""
    outputs = housekeeping_outputs(plan)
    if reservation == "systemReserved":
        return {"systemReserved": {"cpu": outputs["kubelet_system_reserved_cpu"]}}
    return {"reservedSystemCPUs": outputs["kubelet_reserved_system_cpus"]}


def _quote(value: str) -> str:
    return json.dumps(value)


def render_dropin(config: Mapping[str, object], runtime: str, header: str = HEADER) -> str:
    """The drop-in text: YAML with a fixed key order and quoted strings; the same bytes for the same config."""
    lines = [header.rstrip("\n")] if header else []
    if runtime == "kubelet":
        lines += [
            "# kubelet configuration drop-in (--config-dir) written by cpupools from the node's plan:",
            "# the kubelet's static CPU manager hands out every CPU except reservedSystemCPUs (the infra",
            "# pool). A change here is applied by playbooks/reboot.yml: drain, stop the kubelet, remove",
            "# its cpu_manager_state, start, verify, uncordon.",
        ]
    else:
        lines += [
            "# kubelet configuration drop-in (--config-dir, Kubernetes 1.28+): the CPUs of",
            "# the cpupools pools are reserved, so the kubelet never hands them to pods.",
        ]
    lines += ["apiVersion: kubelet.config.k8s.io/v1beta1", "kind: KubeletConfiguration"]
    for key, value in config.items():
        if isinstance(value, Mapping):
            lines.append(f"{key}:")
            lines += [
                f"  {name}: {str(item).lower() if isinstance(item, bool) else _quote(str(item))}"
                for name, item in value.items()
            ]
        else:
            lines.append(f"{key}: {_quote(str(value))}")
    return "\n".join(lines) + "\n"


def restart_subset(config: Mapping[str, object] | None) -> dict[str, object] | None:
    """What of a drop-in the kubelet only takes with a fresh CPU manager state; ``None`` when cpupools owns none."""
    if not config or "cpuManagerPolicy" not in config:
        return None
    return {key: config[key] for key in RESTART_FIELDS if key in config}


# The kubelet's CPU manager state file ------------------------------------------------


def parse_state(text: str) -> dict[str, object]:
    """The kubelet's checkpoint: ``{"policyName", "defaultCpuSet", "entries", "checksum"}``."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise KubeletError(f"{STATE_FILE} is not JSON: {exc}", "runtime") from None
    if not isinstance(data, dict) or not isinstance(data.get("policyName"), str):
        raise KubeletError(f"{STATE_FILE} has no policyName", "runtime")
    return data


def state_cpus(state: Mapping[str, object]) -> tuple[set[int], set[int]]:
    """The state's default CPU set and the CPUs assigned to containers."""
    default = _cpus(state.get("defaultCpuSet") or "", "defaultCpuSet")
    assigned: set[int] = set()
    entries = state.get("entries") or {}
    if isinstance(entries, Mapping):
        for containers in entries.values():
            if isinstance(containers, Mapping):
                for cpus in containers.values():
                    assigned |= _cpus(cpus, "entries")
    return default, assigned


def verify_state(state: Mapping[str, object], subset: Mapping[str, object] | None, online: set[int]) -> list[str]:
    """Why the kubelet's fresh state does not show the wanted policy and reserved set ([] when it does).

    The kubelet's own rules for a state it accepts (its static policy's
    ``validateState``): without ``strict-cpu-reservation`` the default set
    holds every reserved CPU, and the default set with the containers'
    assignments covers every CPU; with it, the reserved CPUs are in neither
    (Burstable and BestEffort pods stay off them) and the two cover every
    other CPU. Seen on the real kubelet v1.36 with strict-cpu-reservation:
    ``defaultCpuSet`` ``2-3,6-7`` on a node of 8 CPUs that reserves ``0-1,4-5``.
    """
    problems = []
    want = "none" if subset is None else str(subset["cpuManagerPolicy"])
    if subset is None:
        # Not ours any more: any policy the operator's own configuration chose is fine.
        return problems
    if state.get("policyName") != want:
        problems.append(f"policyName is {state.get('policyName')!r}, wanted {want!r}")
        return problems
    default, assigned = state_cpus(state)
    reserved = _cpus(subset.get("reservedSystemCPUs", ""), "reservedSystemCPUs")
    options = subset.get("cpuManagerPolicyOptions")
    strict = isinstance(options, Mapping) and str(options.get(STRICT, "")).lower() == "true"
    if strict and reserved & default:
        problems.append(
            f"defaultCpuSet {format_cpulist(default)} holds reserved CPUs {format_cpulist(reserved & default)}, "
            f"which {STRICT} keeps out of it"
        )
    if not strict and not reserved <= default:
        problems.append(
            f"defaultCpuSet {format_cpulist(default) or '(empty)'} lacks reserved CPUs "
            f"{format_cpulist(reserved - default)}"
        )
    covered = default | assigned | (reserved if strict else set())
    if online and covered != online:
        problems.append(
            f"defaultCpuSet and assignments cover {format_cpulist(default | assigned) or 'no CPU'}, "
            f"the node has {format_cpulist(online)} online"
            + (f" of which {format_cpulist(reserved)} are reserved" if strict else "")
        )
    return problems


# Deciding ------------------------------------------------------------------------


def decide(
    desired_subset: Mapping[str, object] | None,
    record: Mapping[str, object] | None,
    state_text: str | None,
) -> tuple[bool, str]:
    """Whether the drop-in's change needs the kubelet restart sequence, and why (one line).

    No state file: the kubelet has not run with a CPU manager here yet, so it
    will start with whatever the drop-in says; no restart. Otherwise the
    applied record is compared with what is wanted; a state file whose
    policy differs from the record (someone changed it by hand) also needs it.
    """
    if state_text is None:
        return False, ""
    state = parse_state(state_text)
    applied = (record or {}).get("applied")
    if applied == desired_subset:
        want = "none" if desired_subset is None else desired_subset["cpuManagerPolicy"]
        if desired_subset is not None and state.get("policyName") != want:
            return True, f"the kubelet's state has policy {state.get('policyName')!r}, the drop-in {want!r}"
        return False, ""
    if desired_subset is None:
        return True, "cpuManagerPolicy static set by cpupools is to be removed"
    if applied is None:
        return True, f"the kubelet runs with policy {state.get('policyName')!r} not set by cpupools"
    changed = [key for key in RESTART_FIELDS if (applied or {}).get(key) != desired_subset.get(key)]  # type: ignore[union-attr]
    return True, "changed: " + ", ".join(changed)


def record_text(subset: Mapping[str, object] | None) -> str | None:
    return None if subset is None else json.dumps({"applied": subset}, sort_keys=True, indent=1) + "\n"


def parse_record(text: str | None) -> dict[str, object] | None:
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None  # unreadable: treated as "not known", so the restart makes it right
    return data if isinstance(data, dict) else None


def wait_for_state(
    path: str,
    timeout: float,
    interval: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    failed: Callable[[], str | None] | None = None,
) -> str | None:
    """The text of the kubelet's state file once it exists and parses, or ``None`` after ``timeout`` seconds.

    ``failed()``, asked between two looks, says why the kubelet will not come
    up (``None`` while it may): the wait ends there with ``KubeletError``.
    """
    deadline = clock() + timeout
    while True:
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            parse_state(text)
            return text
        except (FileNotFoundError, KubeletError):
            pass
        why = failed() if failed is not None else None
        if why:
            raise KubeletError(f"{why}. The node stays cordoned and the rollout stops here.", "runtime")
        if clock() >= deadline:
            return None
        sleep(interval)


#: How many times systemd may restart the kubelet after its start before the rollout calls it failed:
#: one exit can be a container runtime still starting at boot; a refused configuration exits every time.
KUBELET_EXITS = 3
#: The kubelet's last words when it refuses to run (klog: ``run.go:72] "command failed" err="..."``).
_KLOG_ERR = re.compile(r'\berr="((?:[^"\\]|\\.)*)"')


def kubelet_error(journal: str) -> str:
    """The kubelet's own reason from its log: the last ``"command failed" err=...``, else its last error line."""
    lines = [line.strip() for line in journal.splitlines() if line.strip()]
    for want in ("command failed", ""):
        for line in reversed(lines):
            if want in line and (line.startswith("E") or line.startswith("F") or want):
                match = _KLOG_ERR.search(line)
                if match:
                    return match.group(1).replace('\\"', '"')
                if not want:
                    return line
    return lines[-1] if lines else "(nothing in its log)"


def unit_failure(run: Callable[[list[str]], tuple[int, str, str]], service: str) -> str | None:
    """Why the kubelet's systemd unit will not come up, from systemd and the unit's log (``None``: it may).

    systemd counts the unit's automatic restarts since its last start
    (``NRestarts``); a kubelet that refuses its configuration exits at every
    one of them.
    """
    rc, out, _err = run(["systemctl", "show", service, "--property=NRestarts", "--property=ActiveState"])
    if rc != 0:
        return None
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    try:
        exits = int(props.get("NRestarts") or 0)
    except ValueError:
        return None
    if exits < KUBELET_EXITS and props.get("ActiveState") != "failed":
        return None
    _rc, journal, _err = run(["journalctl", "--unit", service, "--boot", "--lines=400", "--output=cat", "--no-pager"])
    return (
        f"the kubelet ({service}) exited {exits} time(s) since its start and systemd keeps restarting it; "
        f"the kubelet says: {kubelet_error(journal)}"
    )


# Applying ------------------------------------------------------------------------


def desired_config(params: Mapping[str, object], topology: Topology | None) -> dict[str, object] | None:
    """The drop-in's fields for the node's runtime and state; ``None``: no drop-in."""
    if params["state"] == "absent":
        return None
    plan = params.get("plan")
    if not isinstance(plan, Mapping) or "pool_cpus" not in plan:
        raise KubeletError("no plan: run the cpupools_plan role first (the variable cpupools_plan is missing)", "plan")
    if params["runtime"] == "kubelet":
        if topology is None:
            raise KubeletError("no topology facts: run the cpupools_plan role first", "plan")
        return derive_config(plan, node_shape(topology, plan), params)
    if params["runtime"] == "cmk" and params.get("dropin"):
        return cmk_config(plan, str(params.get("reservation") or "reservedSystemCPUs"))
    return None


class Node:
    """The files of one node's kubelet that cpupools reads and writes (under ``host.root``)."""

    def __init__(self, host: Host, dropin: str, state_file: str = STATE_FILE, record_file: str = RECORD_FILE):
        self.host = host
        self.dropin = dropin
        self.state_file = state_file
        self.record_file = record_file

    def paths(self) -> dict[str, str]:
        return {"path": "/" + self.dropin.lstrip("/"), "state_file": "/" + self.state_file.lstrip("/")}

    def read(self, rel: str) -> str | None:
        try:
            return self.host.read(rel)
        except CpupoolsError as exc:
            raise KubeletError(str(exc).replace("cannot read", "cannot read the kubelet's"), "runtime") from None


def configure(node: Node, config: Mapping[str, object] | None, runtime: str, header: str) -> dict[str, object]:
    """The kernel stage: write the drop-in now, or leave it pending for the restart (``restart_required``)."""
    text = None if config is None else render_dropin(config, runtime, header)
    current = node.read(node.dropin)
    subset = restart_subset(config)
    record = parse_record(node.read(node.record_file))
    state_text = node.read(node.state_file)
    required, reason = decide(subset, record, state_text)
    result: dict[str, object] = {
        "config": dict(config or {}),
        "content": text,
        "restart_required": required,
        "restart_reason": reason,
        "kubelet_policy": None if state_text is None else parse_state(state_text)["policyName"],
        "diff": {
            "before": current or "",
            "after": text or "",
            "before_header": f"/{node.dropin.lstrip('/')}",
            "after_header": f"/{node.dropin.lstrip('/')}",
        },
    }
    if not required:
        if current != text:
            node.host.write(node.dropin, text)
        if state_text is None and (record or {}).get("applied") != subset:
            # The kubelet has not run with a CPU manager here: it starts with this drop-in.
            node.host.write(node.record_file, record_text(subset))
    result["changed"] = bool(node.host.actions)
    result["actions"] = list(node.host.actions)
    result.update(node.paths())
    return result


def apply_stopped(node: Node, text: str | None) -> dict[str, object]:
    """With the kubelet stopped: write the drop-in and remove the CPU manager state it would refuse."""
    if node.read(node.dropin) != text:
        node.host.write(node.dropin, text)
    node.host.write(node.state_file, None)
    return {"changed": bool(node.host.actions), "actions": list(node.host.actions), **node.paths()}


def verify_started(
    node: Node, config: Mapping[str, object] | None, online: set[int], timeout: float, **wait: object
) -> dict[str, object]:
    """After the start: the kubelet wrote a fresh state with the wanted policy; then the record says so.

    In check mode the kubelet was not restarted (nothing was removed), so
    the state is read as it is and the record is only predicted. ``wait``
    goes to ``wait_for_state`` (``failed``: the unit's failure, with the
    kubelet's own words).
    """
    subset = restart_subset(config)
    if node.host.check:
        if (parse_record(node.read(node.record_file)) or {}).get("applied") != subset:
            node.host.write(node.record_file, record_text(subset))
        return {"changed": bool(node.host.actions), "actions": list(node.host.actions), **node.paths()}
    text = wait_for_state(under(node.host.root, node.state_file), timeout, **wait)  # type: ignore[arg-type]
    if text is None:
        raise KubeletError(
            f"the kubelet did not write /{node.state_file.lstrip('/')} within {timeout:g} seconds of its start. "
            "The node stays cordoned and the rollout stops here.",
            "runtime",
        )
    state = parse_state(text)
    problems = verify_state(state, subset, online)
    if problems:
        raise KubeletError(
            f"the kubelet restarted without the planned CPU manager settings: {'; '.join(problems)}. "
            "The node stays cordoned and the rollout stops here.",
            "runtime",
        )
    if (parse_record(node.read(node.record_file)) or {}).get("applied") != subset:
        node.host.write(node.record_file, record_text(subset))
    return {
        "changed": bool(node.host.actions),
        "actions": list(node.host.actions),
        "kubelet_policy": state["policyName"],
        "default_cpu_set": state.get("defaultCpuSet", ""),
        **node.paths(),
    }


def check_plan(plan: Mapping, topology: Topology, values: Mapping[str, object]) -> dict[str, object] | None:
    """The plan play's check: with ``runtime: kubelet`` (and state present), what ``derive_config`` would refuse.

    Returns the drop-in's fields (``None`` for another runtime or state).
    """
    if values.get("runtime") == "kubelet" and values.get("state", "present") == "present":
        return desired_config({**values, "plan": plan}, topology)
    return None
