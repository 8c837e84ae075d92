"""The kubelet's CPU manager from the plan: the drop-in, its refusals, and when the kubelet must restart.

With ``cpupools_runtime: kubelet`` exclusive CPUs reach workloads through the
kubelet's static CPU manager (Guaranteed pods with integer CPU requests)
instead of ``cmk isolate``. Everything the kubelet needs is derived here from
the one plan and the topology facts:

- ``reservedSystemCPUs``: the infra pool (the CPUs of the host and of
  Kubernetes' own daemons); every other CPU is the kubelet's to hand out;
- ``cpuManagerPolicy: static`` and its options: ``full-pcpus-only`` where the
  cores have more than one thread, ``strict-cpu-reservation`` (Burstable and
  BestEffort pods stay off the reserved CPUs too), and
  ``distribute-cpus-across-numa`` where the node has more than one NUMA node;
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
import time
from collections.abc import Callable, Mapping, Sequence

from .bootloader import Host
from .cpulist import format_cpulist, parse_cpulist
from .errors import CpulistError, CpupoolsError, PlanError
from .kargs import housekeeping_outputs
from .nodecode import under
from .topology import Topology

RUNTIMES = ("cmk", "kubelet", "cpu-pooler", "nri-topology-aware", "nri-balloons")
TOPOLOGY_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
TOPOLOGY_SCOPES = ("container", "pod")
#: The static policy's options cpupools derives (all beta or GA from Kubernetes 1.33).
POLICY_OPTIONS = ("full-pcpus-only", "strict-cpu-reservation", "distribute-cpus-across-numa")
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
)
#: The isolcpus flag that takes CPUs out of the scheduler's load balancing.
_DOMAIN = "domain"

KubeletError = PlanError


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
    for item in items:
        if not isinstance(item, str) or item.strip() not in POLICY_OPTIONS:
            raise KubeletError(f"{item!r} is not auto or one of {', '.join(POLICY_OPTIONS)}", field)
        if item.strip() not in out:
            out.append(item.strip())
    return sorted(out, key=POLICY_OPTIONS.index)


def _cpus(text: object, what: str) -> set[int]:
    try:
        return set(parse_cpulist(text or "", what))  # type: ignore[arg-type]
    except CpulistError as exc:
        raise KubeletError(f"the plan's {what} is not a cpulist: {exc}", "plan") from None


def _pool(plan: Mapping, name: str) -> set[int]:
    return _cpus((plan.get("pool_cpus") or {}).get(name, ""), f"pool_cpus.{name}")


def derive_options(threads_per_core: int, numa_nodes: int, requested: str | Sequence[str]) -> dict[str, str]:
    """The ``cpuManagerPolicyOptions`` map: derived for ``auto``, else the operator's list."""
    if requested != "auto":
        names = list(requested)
    else:
        names = []
        if threads_per_core > 1:
            names.append("full-pcpus-only")
        names.append("strict-cpu-reservation")
        if numa_nodes > 1:
            names.append("distribute-cpus-across-numa")
    return {name: "true" for name in sorted(names, key=POLICY_OPTIONS.index)}


def derive_config(
    plan: Mapping,
    *,
    threads_per_core: int,
    numa_nodes: int,
    siblings: Mapping[int, Sequence[int]],
    settings: Mapping[str, object],
) -> dict[str, object]:
    """The KubeletConfiguration fields for ``cpupools_runtime: kubelet``, or ``KubeletError``.

    ``settings``: the normalised inputs (``inputs.validate_inputs``) without
    the ``cpupools_`` prefix. ``siblings``: every online CPU to the CPUs of
    its core. Refuses, with the numbers, what the kubelet cannot run with or
    what would fight the pools:

    - no CPU left for the kubelet to hand out (no exclusive pool);
    - the exclusive-non-isolcpus pool, which only ``cmk isolate`` hands out;
    - reserved CPUs that are isolated (the kubelet and system daemons would
      sit on CPUs the scheduler does not balance);
    - ``isolcpus`` with the ``domain`` flag on CPUs the kubelet manages: the
      kubelet runs every Burstable and BestEffort pod on the CPUs not handed
      out, and on an isolated CPU nothing spreads them;
    - ``full-pcpus-only`` with a reserved set that splits a core.
    """
    reserved = _pool(plan, "infra")
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
    flags = list(settings.get("isolcpus_flags") or [])
    if (isolated & managed) and (_DOMAIN in flags or not flags):
        raise KubeletError(
            f"isolcpus with the domain flag would take CPUs {format_cpulist(isolated & managed)} out of the "
            "scheduler's load balancing, but the kubelet also runs every Burstable and BestEffort pod on the "
            "CPUs it has not handed out; set cpupools_isolcpus_flags: [managed_irq] (the CPUs stay free of "
            "interrupts; nohz_full and rcu_nocbs still apply)",
            "isolcpus_flags",
        )
    requested = settings.get("kubelet_policy_options")
    options = derive_options(threads_per_core, numa_nodes, "auto" if requested is None else requested)  # type: ignore[arg-type]
    if "full-pcpus-only" in options:
        split = sorted(cpu for cpu in reserved if not set(siblings.get(cpu, (cpu,))) <= reserved)
        if split:
            raise KubeletError(
                f"full-pcpus-only needs whole cores in reservedSystemCPUs {format_cpulist(reserved)}, but CPU "
                f"{split[0]} shares its core with CPUs outside it",
                "kubelet_policy_options",
            )
    return {
        "cpuManagerPolicy": "static",
        "cpuManagerPolicyOptions": options,
        "reservedSystemCPUs": format_cpulist(reserved),
        "topologyManagerPolicy": settings.get("kubelet_topology_policy") or "best-effort",
        "topologyManagerScope": settings.get("kubelet_topology_scope") or "container",
    }


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
            lines += [f"  {name}: {_quote(str(item))}" for name, item in value.items()]
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
    """Why the kubelet's fresh state does not show the wanted policy and reserved set ([] when it does)."""
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
    if not reserved <= default:
        problems.append(
            f"defaultCpuSet {format_cpulist(default) or '(empty)'} lacks reserved CPUs "
            f"{format_cpulist(reserved - default)}"
        )
    if online and (default | assigned) != online:
        problems.append(
            f"defaultCpuSet and assignments cover {format_cpulist(default | assigned) or 'no CPU'}, "
            f"the node has {format_cpulist(online)} online"
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
) -> str | None:
    """The text of the kubelet's state file once it exists and parses, or ``None`` after ``timeout`` seconds."""
    deadline = clock() + timeout
    while True:
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            parse_state(text)
            return text
        except (FileNotFoundError, KubeletError):
            pass
        if clock() >= deadline:
            return None
        sleep(interval)


# Applying ------------------------------------------------------------------------


def desired_config(params: Mapping[str, object], topology: Topology | None) -> dict[str, object] | None:
    """The drop-in's fields for the node's runtime and state; ``None``: no drop-in."""
    if params["state"] == "absent":
        return None
    plan = params.get("plan")
    if not isinstance(plan, Mapping) or "pool_cpus" not in plan:
        raise KubeletError("no plan: run the cpupools_plan role first (the host fact cpupools_plan is missing)", "plan")
    if params["runtime"] == "kubelet":
        if topology is None:
            raise KubeletError("no topology facts: run the cpupools_plan role first", "plan")
        return derive_config(
            plan,
            threads_per_core=topology.threads_per_core,
            numa_nodes=len(topology.numa_nodes),
            siblings={cpu: topology.cpus[cpu].siblings for cpu in topology.cpus},
            settings=params,
        )
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
    the state is read as it is and the record is only predicted.
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


def check_plan(plan: Mapping, topology: Topology, values: Mapping[str, object]) -> None:
    """The plan play's check: with ``runtime: kubelet`` (and state present), what ``derive_config`` would refuse."""
    if values.get("runtime") == "kubelet" and values.get("state", "present") == "present":
        desired_config({**values, "plan": plan}, topology)
