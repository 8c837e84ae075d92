"""One host's plan with the refusals of the runtime and of the hugepages it asks for.

One function for both modules that plan (``cpupools_plan`` and the plan play's
``cpupools_converged``), so that neither can plan what the other refuses.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..core.cpulist import parse_cpulist
from ..hardware.power import plan_power, read_power
from ..hardware.topology import Topology
from ..node.bootloader import Host, Runner, kernel_release
from ..node.hugepages import plan_hugepages
from ..node.kubelet import ASSUMED_KUBELET, resolve_version
from ..node.kubelet import check_plan as check_kubelet
from .plan import plan_pools
from .runtimes import check_runtime, core_numbers


def plan_host(topology: Topology, facts: Mapping, values: Mapping, request: Mapping, run: Runner) -> dict:
    """``plan_pools`` for the checked inputs ``values``, then what the runtime and the hugepages refuse.

    ``facts`` are the host's ``ansible_facts.cpupools`` (with the hugepage
    facts of ``hugepages.read_hugepages``). The plan gains ``hugepages``,
    planned for the kernel the kernel stage writes the arguments for
    (``boot_release``), and, with the kubelet runtime, ``kubelet``: the
    version its options are for (``cpupools_kubelet_version``, asked of the
    node's kubelet for ``auto``, through ``run``: the module's
    ``run_command``) and the drop-in's fields, so the kernel stage writes what
    was checked here.
    """
    plan = plan_pools(topology, request)
    cores = core_numbers([list(core.cpus) for core in topology.cores])
    check_runtime(plan, cores, values["runtime"], values["pooler_ht_policy"])
    plan["hugepages"] = plan_hugepages(
        values["hugepages"],
        facts,
        values["hugepages_keep_free_mb"],
        values["hugepages_default_size"],
        boot_release(values),
    )
    plan["warnings"] = [*plan["warnings"], *plan["hugepages"]["warnings"]]
    plan["power"] = plan_node_power(values, plan, topology, facts)
    if values.get("runtime") == "kubelet":
        values = {**values, "kubelet_version": resolve_version(values.get("kubelet_version"), run)}
    config = check_kubelet(plan, topology, values)
    if config is not None:
        version, known = values["kubelet_version"], True
        if version is None:
            version, known = f"1.{ASSUMED_KUBELET[1]}", False
            plan["notes"].append(
                f"no kubelet found on the node to ask its version: its options are those of kubelet {version}, "
                "the oldest cpupools derives them for (set cpupools_kubelet_version)"
            )
        plan["kubelet"] = {"version": version, "version_known": known, "config": config}
    return plan


def plan_node_power(values: Mapping, plan: Mapping, topology: Topology, facts: Mapping) -> dict:
    """``cpupools_power`` on this node (``power.plan_power``): refused here, in the plan, when the node's
    drivers do not offer it. The power facts are read only when there are settings (``facts["power"]``
    when the facts module read them, else from the facts root)."""
    settings = values.get("power") or {}
    if not settings:
        return {}
    known = facts.get("power") if isinstance(facts, Mapping) else None
    power_facts = known or read_power(values["facts_root"] or values["root"], topology.online)
    pools = {pool: parse_cpulist(cpus) for pool, cpus in (plan.get("pool_cpus") or {}).items()}
    return plan_power(settings, power_facts, pools, "this node")


def boot_release(values: Mapping) -> str | None:
    """The kernel release the kernel stage derives the arguments for, as that stage finds it.

    ``cpupools_kernel_release`` when set (the kernel that boots next, when it
    is not the running one), else the running kernel's, read under the facts
    root (``None`` when a fixture root has no ``proc/sys/kernel/osrelease``).
    """
    root = values["root"]
    host = Host(root, _no_commands, facts_root=values["facts_root"] or root, wrapper=[])
    return kernel_release(host, values["kernel_release"] or None)


def _no_commands(*_args: object, **_kw: object) -> tuple[int, str, str]:
    raise AssertionError("reading the kernel release runs no command")
