"""CPU-Pooler and nri-plugins from the plan: rendered configurations held to the projects' own rules,
refusals, and the cpupools_k8s_runtime module run by real ansible-playbook against the fake server."""

from __future__ import annotations

import pytest
from cpupools.core.errors import PlanError
from cpupools.hardware.topology import gather_topology
from cpupools.planning.plan import make_request, plan_pools
from cpupools.planning.runtimes import (
    NRI_GROUP_LABEL,
    POOLER_CONFIGMAP,
    POOLER_LABEL,
    check_runtime,
    core_numbers,
    render,
)
from k8s_real import PRODUCT_USER
from runtime_rules import (
    lscpu_cores,
    nri_errors,
    pooler_exclusive_grant,
    read_poolconfig,
    select_poolconfig,
)

CM = ("v1", "configmaps", "kube-system", POOLER_CONFIGMAP)
SHAPES = ["2s22c-smt2", "1s8c-smt2", "2s8c-nosmt", "4s6c-smt2", "1s4c-smt4", "2s8c-offline", "2s96c-smt2"]


def plan_and_topology(corpus_root, shape, **raw):
    topo = gather_topology(str(corpus_root[shape]))
    request = {"num_exclusive_cores": 2, "num_shared_cores": 1, "exclusive_mode": "spread", **raw}
    return plan_pools(topo, make_request(request)), topo


def cores_of(topo):
    return [list(core.cpus) for core in topo.cores]


# Rendered configurations, held to the projects' rules -----------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("policy", ["multiThreaded", "singleThreaded"])
def test_pooler_file_gives_each_container_exactly_the_plans_cores(corpus_root, shape, policy):
    """Pooler's own reading of the file (parser, device list, sibling lookup) gives the plan's cores, or we refuse."""
    plan, topo = plan_and_topology(corpus_root, shape)
    want = render(plan, "cpu-pooler", policy)
    doc = read_poolconfig(want["file"])
    assert want["key"] == f"poolconfig-{want['group']}.yaml"
    assert doc["nodeSelector"] == {POOLER_LABEL: want["group"]}
    types = {name: p["type"] for name, p in doc["pools"].items()}
    assert sorted(types.values()) == ["default", "exclusive", "shared"]
    cpu_to_core = lscpu_cores(cores_of(topo))
    exclusive = next(p for p in doc["pools"].values() if p["type"] == "exclusive")
    assert exclusive["ht"] == policy
    # Pooler advertises one device per listed CPU and grants it (with its siblings when multiThreaded).
    grants = sorted(sorted(pooler_exclusive_grant(cpu, policy, cpu_to_core)) for cpu in exclusive["cpus"])
    plan_cores = sorted(sorted(map(int, c.split(","))) for c in plan["handout_order"]["exclusive"])
    try:
        check_runtime(plan, core_numbers(cores_of(topo)), "cpu-pooler", policy)
    except PlanError as exc:  # refused exactly where Pooler would grant something else
        assert exc.field == "pooler_ht_policy" and grants != plan_cores
        return
    if policy == "multiThreaded":
        assert grants == plan_cores
    else:
        assert len(grants) == len(plan_cores)
        assert all(len(g) == 1 and any(g[0] in core for core in plan_cores) for g in grants)
    shared = next(p for p in doc["pools"].values() if p["type"] == "shared")["cpus"]
    default = doc["pools"]["default"]["cpus"]
    assert shared == set(topo_cpus(plan, "shared")) and default == set(topo_cpus(plan, "infra"))
    granted = {cpu for g in grants for cpu in g}
    assert not (granted & shared) and not (granted & default) and not (shared & default)


def topo_cpus(plan, pool):
    from cpupools.core.cpulist import parse_cpulist

    if pool == "reserved":
        return parse_cpulist(plan["reserved_cpus"])
    return parse_cpulist(plan["pool_cpus"][pool], pool)


def test_pooler_picks_our_file_for_the_node_among_foreign_ones(corpus_root):
    plan, _ = plan_and_topology(corpus_root, "2s22c-smt2")
    want = render(plan, "cpu-pooler")
    foreign = "pools:\n  exclusive_a:\n    cpus: '2'\n  default:\n    cpus: '0'\nnodeSelector:\n  nodeType: dpdk\n"
    files = {"poolconfig-dpdk.yaml": foreign, want["key"]: want["file"]}
    assert select_poolconfig(files, {"nodeType": "ctrl", POOLER_LABEL: want["group"]}) == want["key"]
    assert select_poolconfig(files, {"nodeType": "dpdk"}) == "poolconfig-dpdk.yaml"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("runtime", ["nri-topology-aware", "nri-balloons"])
def test_nri_objects_pass_the_crd_schema_and_the_policy_rules(corpus_root, shape, runtime):
    plan, topo = plan_and_topology(corpus_root, shape, isolated_pools=["exclusive"])
    check_runtime(plan, core_numbers(cores_of(topo)), runtime, "multiThreaded")
    want = render(plan, runtime)
    obj = want["object"]
    assert nri_errors(obj) == []
    assert obj["metadata"]["name"] == f"group.{want['group']}" and want["label"] == NRI_GROUP_LABEL
    spec = obj["spec"]
    # Reserved is the housekeeping cores of every NUMA node, not the cores no pool took: those stay the
    # policy's to share.
    assert spec["reservedResources"]["cpu"] == "cpuset:" + plan["reserved_cpus"]
    assert {topo.cpus[c].node for c in topo_cpus(plan, "reserved")} == set(topo.numa_nodes)
    assert set(topo_cpus(plan, "reserved")) <= set(topo_cpus(plan, "infra"))
    assert spec["availableResources"]["cpu"] == "cpuset:" + topo_online(topo)
    if runtime == "nri-balloons":
        types = {t["name"]: t for t in spec["balloonTypes"]}
        leftovers = len(topo_cpus(plan, "infra")) - len(topo_cpus(plan, "reserved"))
        assert set(types) == {"exclusive", "reserved", "shared"} | ({"default"} if leftovers else set())
        assert types["exclusive"]["maxCPUs"] == plan["cpu_counts"]["exclusive"]
        # at most one balloon per exclusive core: the type cannot grow past the pool in balloons either
        assert types["exclusive"]["maxBalloons"] == plan["counts"]["exclusive"]
        assert types["exclusive"]["preferIsolCpus"] is True and types["exclusive"]["preferNewBalloons"] is True
        assert types["shared"]["minCPUs"] == types["shared"]["maxCPUs"] == plan["cpu_counts"]["shared"]
        # The fence: balloons of a fixed size, made at the policy's start, hold every CPU but the
        # exclusive pool's, which is all that is left for the exclusive type's balloons.
        fixed = [t for t in spec["balloonTypes"] if t["name"] != "exclusive"]
        assert all(t["minBalloons"] == t["maxBalloons"] and t["minCPUs"] == t["maxCPUs"] for t in fixed)
        held = sum(t["minBalloons"] * t["minCPUs"] for t in fixed)
        assert held == len(topo.cpus) - plan["cpu_counts"]["exclusive"]
        assert types["reserved"]["minCPUs"] == len(topo_cpus(plan, "reserved"))
    else:
        assert spec["preferIsolatedCPUs"] is True


def test_balloons_on_a_hybrid_prefer_each_pools_core_type(corpus_root):
    # 1s6p8e-hybrid: P cores 0-11 (siblings adjacent), E cores 12-19 in two 4-core L2 modules, one L3.
    # Housekeeping: the core of CPU 0 (CPUs 0-1). Shared takes E cores, from one module: 12, 13.
    # Exclusive takes P cores only, the first free ones: CPUs 2-5.
    plan, _ = plan_and_topology(corpus_root, "1s6p8e-hybrid", num_exclusive_cores=2, num_shared_cores=2)
    assert (plan["pool_cpus"]["exclusive"], plan["pool_cpus"]["shared"]) == ("2-5", "12-13")
    spec = render(plan, "nri-balloons")["object"]["spec"]
    assert spec["reservedResources"] == {"cpu": "cpuset:0-1"}
    types = {t["name"]: t for t in spec["balloonTypes"]}
    assert types["exclusive"] == {
        "name": "exclusive",
        "maxBalloons": 2,
        "maxCPUs": 4,
        "preferNewBalloons": True,
        "preferIsolCpus": True,
        "allocatorPriority": "high",
        "preferCoreType": "performance",
    }
    assert types["shared"]["preferCoreType"] == "efficient"
    assert (types["shared"]["minCPUs"], types["shared"]["maxCPUs"]) == (2, 2)


def test_balloons_refuse_an_isolated_shared_pool_and_hold_every_other_cpu(corpus_root):
    """Balloons only prefer isolated CPUs: with the shared pool isolated too, an exclusive balloon could
    take a shared CPU. The exclusive pool is isolated alone, and fixed balloons hold everything else."""
    plan, topo = plan_and_topology(corpus_root, "2s22c-smt2", isolated_pools=["exclusive", "shared"])
    msg = refusal(plan, topo, "nri-balloons")
    assert msg == (
        "host node-1: cpupools_isolated_pools: nri-balloons finds the exclusive pool by the CPUs the kernel "
        "isolates, so with the shared pool (2,46) isolated too an exclusive balloon could get a shared CPU; "
        "set cpupools_isolated_pools: [exclusive]"
    )
    auto, _ = plan_and_topology(corpus_root, "2s22c-smt2", runtime="nri-balloons")
    assert auto["isolated_cpus"] == auto["pool_cpus"]["exclusive"]  # auto: the exclusive pool alone
    # No shared pool and no core left over: pods without an annotation go to the reserved CPUs, never to a
    # balloon made of free (exclusive) CPUs.
    bare, _ = plan_and_topology(
        corpus_root, "1s8c-smt2", runtime="nri-balloons", num_shared_cores=0, num_exclusive_cores=-1
    )
    spec = render(bare, "nri-balloons")["object"]["spec"]
    assert [t["name"] for t in spec["balloonTypes"]] == ["exclusive", "reserved"]
    assert spec["reservedPoolNamespaces"] == ["*"]


def test_topology_aware_reserves_housekeeping_not_the_leftovers(corpus_root):
    # The node: 2 x EPYC 96 cores in NPS4, 16 exclusive + 4 shared cores. Reserved is the first
    # core of each of the 8 NUMA nodes (16 CPUs); the 348 cores' CPUs no pool took stay the policy's.
    plan, _ = plan_and_topology(
        corpus_root, "2s96c-smt2-nps4", num_exclusive_cores=16, num_shared_cores=4, isolated_pools=["exclusive"]
    )
    spec = render(plan, "nri-topology-aware")["object"]["spec"]
    firsts = [0, 24, 48, 72, 96, 120, 144, 168]
    assert spec["reservedResources"]["cpu"] == "cpuset:" + ",".join(map(str, firsts + [c + 192 for c in firsts]))
    assert len(topo_cpus(plan, "infra")) == 384 - 32 - 8


def topo_online(topo):
    from cpupools.core.cpulist import format_cpulist

    return format_cpulist(topo.cpus)


def test_an_unknown_field_or_a_bad_cpuset_is_caught_by_the_rules(corpus_root):
    """The rules can fail: a field the CRD lacks, a cpuset Pooler's parser refuses, two shared pools."""
    plan, _ = plan_and_topology(corpus_root, "2s22c-smt2")
    obj = render(plan, "nri-balloons")["object"]
    obj["spec"]["balloonTypes"][0]["preferIsolatedCpus"] = True
    obj["spec"]["reservedResources"]["cpu"] = "cpuset:0-100"
    errors = nri_errors(obj)
    assert any("preferIsolatedCpus: unknown field" in e for e in errors)
    assert "reservedResources.cpu is not a subset of availableResources.cpu" in errors
    with pytest.raises(ValueError, match="invalid range"):
        read_poolconfig("pools:\n  default:\n    cpus: '5-3'\n")
    with pytest.raises(ValueError, match="Only one shared pool"):
        read_poolconfig("pools:\n  shared_a:\n    cpus: '1'\n  shared_b:\n    cpus: '2'\n")


def test_same_plan_same_group_other_plan_other_group(corpus_root):
    a, _ = plan_and_topology(corpus_root, "2s22c-smt2")
    b, _ = plan_and_topology(corpus_root, "2s22c-smt2")
    c, _ = plan_and_topology(corpus_root, "2s22c-smt2", num_exclusive_cores=6)
    assert render(a, "cpu-pooler") == render(b, "cpu-pooler")
    assert render(a, "cpu-pooler")["group"] != render(c, "cpu-pooler")["group"]
    assert render(a, "nri-balloons")["group"] != render(a, "nri-topology-aware")["group"]


# Refusals -------------------------------------------------------------------


def refusal(plan, topo, runtime, policy="multiThreaded"):
    with pytest.raises(PlanError) as info:
        check_runtime(plan, core_numbers(cores_of(topo)), runtime, policy)
    return info.value.describe("node-1")


def test_multithreaded_pooler_is_refused_where_sibling_lookup_would_hand_out_another_core(corpus_root):
    plan, topo = plan_and_topology(corpus_root, "1s8c-adjacent", num_exclusive_cores=3, num_shared_cores=1)
    msg = refusal(plan, topo, "cpu-pooler")
    assert msg.startswith("host node-1: cpupools_pooler_ht_policy: CPU-Pooler's multiThreaded policy")
    assert "core 2-3 of pool exclusive is lscpu core 1, not 2" in msg and "\n" not in msg
    check_runtime(plan, core_numbers(cores_of(topo)), "cpu-pooler", "singleThreaded")
    # And the rule is right: Pooler's own lookup on this host would grant CPU 2 with CPUs 4,5 (core 2).
    assert pooler_exclusive_grant(2, "multiThreaded", lscpu_cores(cores_of(topo))) == {2, 4, 5}


def test_topology_aware_refuses_named_and_isolated_shared_pools(corpus_root):
    plan, topo = plan_and_topology(corpus_root, "2s22c-smt2")
    assert "cpupools_isolated_pools: nri-topology-aware hands isolated CPUs out only exclusively" in refusal(
        plan, topo, "nri-topology-aware"
    )
    eni, topo = plan_and_topology(corpus_root, "2s22c-smt2", excl_non_isolcpus="10,54", isolated_pools=["exclusive"])
    assert refusal(eni, topo, "nri-topology-aware").startswith(
        "host node-1: cpupools_excl_non_isolcpus: nri-topology-aware has no named pools"
    )
    check_runtime(eni, core_numbers(cores_of(topo)), "nri-balloons", "multiThreaded")  # balloons can


def test_infra_on_isolated_cpus_is_refused_for_every_config_runtime(corpus_root):
    plan, topo = plan_and_topology(corpus_root, "2s22c-smt2")
    plan = dict(plan, isolated_cpus=plan["isolated_cpus"] + ",0")  # what an adopted isolcpus can leave
    for runtime in ("cpu-pooler", "nri-topology-aware", "nri-balloons"):
        assert "cpupools_runtime: " + runtime + " runs ordinary and kube-system containers" in refusal(
            plan, topo, runtime
        )
    check_runtime(plan, core_numbers(cores_of(topo)), "cmk", "multiThreaded")


# The module against the real server -----------------------------------------

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Runtime
      cpupools_k8s_runtime: "{{ args }}"
"""


@pytest.fixture
def ns(cluster):
    """A namespace of this test's own for the runtime's configuration (the module's ``namespace``)."""
    return cluster.real.namespace(cluster.real.unique("rt"))


def args(cluster, plan, ns, node=None, **extra):
    return {
        "args": {
            "node_name": node or cluster.node,
            "plan": plan,
            "kubeconfig": str(cluster.kubeconfig()),
            "namespace": ns,
            **extra,
        }
    }


def absent(cluster, ns, node=None):
    return {
        "args": {
            "node_name": node or cluster.node,
            "state": "absent",
            "kubeconfig": str(cluster.kubeconfig()),
            "namespace": ns,
        }
    }


def run_ok(playbook, cluster, *a, **kw):
    res = playbook(*a, **kw)
    assert res.rc == 0, res.stdout
    assert cluster.real.product_token not in res.stdout + res.stderr
    return res


def labels(cluster, node=None):
    return cluster.real.node(node or cluster.node)["metadata"].get("labels") or {}


def configmap(cluster, ns):
    return cluster.real.get(f"/api/v1/namespaces/{ns}/configmaps/{POOLER_CONFIGMAP}")


def test_pooler_publish_label_rerun_and_check_mode(playbook, cluster, ns, make_plan):
    plan = make_plan()
    want = render(plan, "cpu-pooler")
    check = run_ok(playbook, cluster, PLAY, args(cluster, plan, ns, runtime="cpu-pooler"), "--check", "--diff")
    assert check.changed() == 1 and cluster.writes() == []
    assert check.result("Runtime")["published"] == "created"
    first = run_ok(playbook, cluster, PLAY, args(cluster, plan, ns, runtime="cpu-pooler"))
    assert first.changed() == 1 and first.result("Runtime")["group"] == want["group"]
    cm = configmap(cluster, ns)
    assert cm["data"] == {want["key"]: want["file"]}
    assert cm["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "cpupools"}
    assert labels(cluster)[POOLER_LABEL] == want["group"]
    writes = len(cluster.writes())
    second = run_ok(playbook, cluster, PLAY, args(cluster, plan, ns, runtime="cpu-pooler"))
    assert second.changed() == 0 and len(cluster.writes()) == writes
    again = run_ok(playbook, cluster, PLAY, args(cluster, plan, ns, runtime="cpu-pooler"), "--check")
    assert again.changed() == 0 and len(cluster.writes()) == writes


def test_pooler_groups_are_shared_moved_and_retired_foreign_files_stay(playbook, cluster, ns, make_plan):
    node_2 = cluster.add_node()
    foreign = {"poolconfig-dpdk.yaml": "x: 1\n"}
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": POOLER_CONFIGMAP}, "data": foreign}
    cluster.real.ok("POST", f"/api/v1/namespaces/{ns}/configmaps", cm)
    plan, other = make_plan(), make_plan(num_exclusive_cores=4)
    run_ok(playbook, cluster, PLAY, args(cluster, plan, ns, runtime="cpu-pooler"))
    run_ok(playbook, cluster, PLAY, args(cluster, plan, ns, node=node_2, runtime="cpu-pooler"))
    group = render(plan, "cpu-pooler")
    assert set(configmap(cluster, ns)["data"]) == {"poolconfig-dpdk.yaml", group["key"]}  # one file for both nodes
    moved = run_ok(playbook, cluster, PLAY, args(cluster, other, ns, runtime="cpu-pooler"))
    assert moved.result("Runtime")["retired"] == []  # node-2 still uses the old group
    new = render(other, "cpu-pooler")
    assert set(configmap(cluster, ns)["data"]) == {"poolconfig-dpdk.yaml", group["key"], new["key"]}
    # node-2 leaves for NRI... which is not installed: one clear line, nothing changed on the node.
    failed = playbook(PLAY, args(cluster, other, ns, node=node_2, runtime="nri-balloons"))
    assert failed.rc != 0
    assert "does not serve balloonspolicies.config.nri (BalloonsPolicy): install the nri-plugins" in failed.messages()
    assert labels(cluster, node_2)[POOLER_LABEL] == group["group"]
    # node-2 goes back to cmk: its label goes, the old group is no longer used by anyone and is retired.
    back = run_ok(playbook, cluster, PLAY, args(cluster, plan, ns, node=node_2, runtime="cmk"))
    assert back.result("Runtime")["retired"] == [f"ConfigMap {ns}/{POOLER_CONFIGMAP} key {group['key']}"]
    assert POOLER_LABEL not in labels(cluster, node_2)
    assert set(configmap(cluster, ns)["data"]) == {"poolconfig-dpdk.yaml", new["key"]}
    # Uninstall the first node: our key goes, the foreign file and the ConfigMap (not ours) stay.
    gone = run_ok(playbook, cluster, PLAY, absent(cluster, ns))
    assert gone.changed() == 1
    assert configmap(cluster, ns)["data"] == foreign
    assert POOLER_LABEL not in labels(cluster)


def test_a_configmap_cpupools_created_is_deleted_with_its_last_file(playbook, cluster, ns, make_plan):
    run_ok(playbook, cluster, PLAY, args(cluster, make_plan(), ns, runtime="cpu-pooler"))
    assert configmap(cluster, ns) is not None
    run_ok(playbook, cluster, PLAY, absent(cluster, ns))
    assert configmap(cluster, ns) is None
    assert run_ok(playbook, cluster, PLAY, absent(cluster, ns)).changed() == 0


def test_a_concurrent_writer_of_the_configmap_is_retried(playbook, fake, kubeconfig, make_plan):
    """Fake: the other writer must write between our read and our PUT, a moment a real server cannot be held at."""
    fake.add_resource("v1", "configmaps", POOLER_CONFIGMAP, "kube-system", data={"poolconfig-a.yaml": "a\n"})

    def racer():
        cm = fake.resources[CM]
        cm["data"]["poolconfig-b.yaml"] = "b\n"
        fake._bump(cm)

    fake.before("PUT", r"/configmaps/cpu-pooler-configmap$", racer)
    node = {"node_name": "node-1", "plan": make_plan(), "kubeconfig": str(kubeconfig), "runtime": "cpu-pooler"}
    res = playbook(PLAY, {"args": node})
    assert res.rc == 0, res.stdout
    data = fake.resources[CM]["data"]
    assert {"poolconfig-a.yaml", "poolconfig-b.yaml"} <= set(data) and len(data) == 3


@pytest.mark.parametrize("runtime", ["nri-balloons", "nri-topology-aware"])
def test_nri_object_and_label_then_no_write_then_removed(playbook, cluster, ns, nri_crds, make_plan, runtime):
    """The CRD's defaults come back on every read; a converged second run still sends no write (the audit log)."""
    from cpupools.cluster.k8s import with_defaults
    from runtime_rules import NRI_KINDS

    plan = make_plan(isolated_pools=["exclusive"])
    want = render(plan, runtime)
    kind = want["object"]["kind"]
    path = f"/apis/config.nri/v1alpha1/namespaces/{ns}/{NRI_KINDS[kind][0]}/group.{want['group']}"
    check = run_ok(playbook, cluster, PLAY, args(cluster, plan, ns, runtime=runtime), "--check")
    assert check.changed() == 1 and cluster.writes() == []
    run_ok(playbook, cluster, PLAY, args(cluster, plan, ns, runtime=runtime))
    stored = cluster.real.get(path)
    assert stored["spec"] != want["object"]["spec"]  # the server added its defaults
    assert stored["spec"] == with_defaults(want["object"]["spec"], NRI_KINDS[kind][1])
    assert stored["spec"]["agent"] == {"nodeResourceTopology": True} and nri_errors(stored) == []
    assert labels(cluster)[NRI_GROUP_LABEL] == want["group"]
    mark = cluster.real.audit_mark()
    second = run_ok(playbook, cluster, PLAY, args(cluster, plan, ns, runtime=runtime))
    assert second.changed() == 0 and second.result("Runtime")["published"] == "unchanged"
    assert cluster.real.audit_writes(mark, PRODUCT_USER) == [], "a converged run wrote"
    # Someone edits our object, or adds to it: the next run puts the plan back.
    edit = {"spec": {"pinCPU": False, "reservedPoolNamespaces": ["mine"]}}
    cluster.real.ok("PATCH", path, edit, content_type="application/merge-patch+json")
    fixed = run_ok(playbook, cluster, PLAY, args(cluster, plan, ns, runtime=runtime))
    assert fixed.result("Runtime")["published"] == "updated"
    assert cluster.real.get(path)["spec"] == stored["spec"]
    run_ok(playbook, cluster, PLAY, absent(cluster, ns))
    assert cluster.real.get(path) is None and NRI_GROUP_LABEL not in labels(cluster)


def test_a_foreign_nri_group_label_is_left_alone_by_cmk_and_absent(playbook, cluster, ns):
    patch = {"metadata": {"labels": {NRI_GROUP_LABEL: "theirs"}}}
    cluster.real.ok("PATCH", f"/api/v1/nodes/{cluster.node}", patch, content_type="application/merge-patch+json")
    res = run_ok(playbook, cluster, PLAY, absent(cluster, ns))
    assert res.changed() == 0 and cluster.writes() == []
    assert labels(cluster)[NRI_GROUP_LABEL] == "theirs"


ROLE_PLAY = """
- hosts: all
  gather_facts: false
  roles:
    - role: cpupools_k8s
"""


def test_role_publishes_for_a_runtime_given_with_e_then_changes_nothing(playbook, cluster, ns, no_admission, make_plan):
    plan = make_plan()
    extra = {
        "cpupools_plan": plan,
        "cpupools_k8s_kubeconfig": str(cluster.kubeconfig()),
        "cpupools_k8s_node_name": cluster.node,
        "cpupools_runtime_namespace": ns,
    }
    cli = ("-e", "cpupools_runtime=cpu-pooler", "-e", "cpupools_pooler_ht_policy=singleThreaded")
    first = run_ok(playbook, cluster, ROLE_PLAY, extra, *cli)
    # The runtime's file and label are published; the Node gets no cmk label, taint or resources.
    assert first.result("Publish the runtime configuration and label the node")["changed"], first.stdout
    assert "cmk.intel.com/cmk-node" not in labels(cluster)
    want = render(plan, "cpu-pooler", "singleThreaded")
    assert configmap(cluster, ns)["data"] == {want["key"]: want["file"]}
    assert run_ok(playbook, cluster, ROLE_PLAY, extra, *cli).changed() == 0
    # Back to cmk: the node gets the cmk label, taint and resources back (a
    # non-cmk runtime removes them), a cmk node now publishes the pod injection
    # policy, and the role removes what the cpu-pooler run left.
    back = run_ok(playbook, cluster, ROLE_PLAY, extra)
    assert back.changed() == 3 and configmap(cluster, ns) is None
    assert back.result("Publish or remove the pod injection policy")["policy"] == "created"
    assert labels(cluster).get("cmk.intel.com/cmk-node") == "true"
    assert POOLER_LABEL not in labels(cluster)


def test_a_failed_publish_leaves_the_node_unlabelled_and_a_rerun_finishes(playbook, cluster, ns, make_plan):
    """The label comes after the file: a runtime never sees a label whose file is missing.

    The server refuses the ConfigMap for real, by an operator's ValidatingAdmissionPolicy.
    """
    policy = cluster.real.unique("no-configmaps")
    cluster.real.deny(policy, "configmaps", ns, "configmaps are frozen in this namespace")
    try:
        failed = playbook(PLAY, args(cluster, make_plan(), ns, runtime="cpu-pooler"))
    finally:
        cluster.real.undeny(policy)
    assert failed.rc != 0 and "Traceback" not in failed.stdout + failed.stderr
    msg = failed.messages()
    assert f"POST /api/v1/namespaces/{ns}/configmaps is forbidden (403): " in msg, msg
    assert "configmaps are frozen in this namespace" in msg
    assert POOLER_LABEL not in labels(cluster) and configmap(cluster, ns) is None
    done = run_ok(playbook, cluster, PLAY, args(cluster, make_plan(), ns, runtime="cpu-pooler"))
    assert done.changed() == 1 and configmap(cluster, ns) is not None
    assert POOLER_LABEL in labels(cluster)
