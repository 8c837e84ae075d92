"""Report inputs built the way the roles build them: real fixture sysfs -> facts -> plan."""

from __future__ import annotations

import dataclasses

import pytest
from cpupools.core.cpulist import format_cpulist
from cpupools.hardware.topology import gather_topology
from cpupools.planning.plan import make_request, plan_pools
from sysfs import CORPUS, Spec, write_tree


@pytest.fixture
def host_input(tmp_path):
    """``host_input(corpus_name, request=None, host=None, spec=..., **parts)`` -> one report input.

    ``spec`` overrides fields of the corpus ``Spec`` (for example ``isolated``
    or ``cmdline``); ``parts`` adds ``kernel``, ``state`` or ``k8s``.
    """
    counter = iter(range(10**6))

    def make(
        name: str,
        request: dict | None = None,
        host: str | None = None,
        spec: dict | None = None,
        numa_facts: bool = False,
        **parts,
    ):
        tree = dataclasses.replace(CORPUS[name], **(spec or {}))
        root = write_tree(str(tmp_path / f"{name}-{next(counter)}"), tree)
        topo = gather_topology(root)
        entry = {
            "host": host or name,
            "topology": topo.to_facts(),
            "plan": plan_pools(topo, make_request(request or {})),
        }
        if numa_facts:
            add_numa_facts(entry["topology"], tree)
        entry.update(parts)
        return entry

    return make


def add_numa_facts(facts: dict, spec: Spec) -> dict:
    """Add the facts the NUMA/L3 work adds, built by hand from the fixture's ``Spec``.

    Per CPU ``l3`` (``None`` when the fixture writes no cache directories),
    top-level ``l3_domains`` and ``numa_distances`` (10 local, 12 same socket,
    32 other socket: the shape of a real SLIT table).
    """
    online = {cpu["id"] for cpu in facts["cpus"]}
    by_id = {c["id"]: c for c in spec.cpus()}
    domains: dict[int, list[int]] = {}
    for cpu in facts["cpus"]:
        l3 = by_id[cpu["id"]]["l3"]
        cpu["l3"] = None if l3 < 0 else l3
        if l3 >= 0:
            domains.setdefault(l3, []).append(cpu["id"])
    facts["l3_domains"] = {str(k): format_cpulist(v) for k, v in sorted(domains.items())}
    socket_of = {by_id[c]["node"]: by_id[c]["socket"] for c in online}
    nodes = sorted(socket_of)
    facts["numa_distances"] = {
        str(a): [10 if a == b else 12 if socket_of[a] == socket_of[b] else 32 for b in nodes] for a in nodes
    }
    return facts
