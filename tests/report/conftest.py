"""Report inputs built the way the roles build them: real fixture sysfs -> facts -> plan."""

from __future__ import annotations

import dataclasses

import pytest
from cpupools.plan import make_request, plan_pools
from cpupools.topology import gather_topology
from sysfs import CORPUS, write_tree


@pytest.fixture
def host_input(tmp_path):
    """``host_input(corpus_name, request=None, host=None, spec=..., **parts)`` -> one report input.

    ``spec`` overrides fields of the corpus ``Spec`` (for example ``isolated``
    or ``cmdline``); ``parts`` adds ``kernel``, ``state`` or ``k8s``.
    """
    counter = iter(range(10**6))

    def make(name: str, request: dict | None = None, host: str | None = None, spec: dict | None = None, **parts):
        tree = dataclasses.replace(CORPUS[name], **(spec or {}))
        root = write_tree(str(tmp_path / f"{name}-{next(counter)}"), tree)
        topo = gather_topology(root)
        entry = {
            "host": host or name,
            "topology": topo.to_facts(),
            "plan": plan_pools(topo, make_request(request or {})),
        }
        entry.update(parts)
        return entry

    return make
