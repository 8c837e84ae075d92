"""One host's plan with the refusals of the runtime and of the hugepages it asks for.

One function for both modules that plan (``cpupools_plan`` and the plan play's
``cpupools_converged``), so that neither can plan what the other refuses.
"""

from __future__ import annotations

from collections.abc import Mapping

from .hugepages import plan_hugepages
from .kubelet import ASSUMED_KUBELET, resolve_version
from .kubelet import check_plan as check_kubelet
from .plan import plan_pools
from .runtimes import check_runtime, core_numbers
from .topology import Topology


def plan_host(topology: Topology, facts: Mapping, values: Mapping, request: Mapping) -> dict:
    """``plan_pools`` for the checked inputs ``values``, then what the runtime and the hugepages refuse.

    ``facts`` are the host's ``ansible_facts.cpupools`` (with the hugepage
    facts of ``hugepages.read_hugepages``). The plan gains ``hugepages`` and,
    with the kubelet runtime, ``kubelet``: the version its options are for
    (``cpupools_kubelet_version``, asked of the node's kubelet for ``auto``)
    and the drop-in's fields, so the kernel stage writes what was checked here.
    """
    plan = plan_pools(topology, request)
    cores = core_numbers([list(core.cpus) for core in topology.cores])
    check_runtime(plan, cores, values["runtime"], values["pooler_ht_policy"])
    plan["hugepages"] = plan_hugepages(
        values["hugepages"], facts, values["hugepages_keep_free_mb"], values["hugepages_default_size"]
    )
    if values.get("runtime") == "kubelet":
        values = {**values, "kubelet_version": resolve_version(values.get("kubelet_version"))}
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
