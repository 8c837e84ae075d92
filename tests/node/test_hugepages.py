"""Hugepages: the variable, the facts read from sysfs, the plan's checks, and the kernel arguments."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cpupools.core.errors import KernelArgsError, PlanError
from cpupools.hardware.topology import gather_topology
from cpupools.node import bootfiles, kargs
from cpupools.node.hugepages import parse_entries, parse_size, plan_hugepages, read_hugepages, size_label
from cpupools.planning.host_plan import boot_release
from cpupools.planning.inputs import validate_inputs
from cpupools.planning.plan import make_request, plan_pools
from sysfs import Spec, write_tree

GIB = 1024 * 1024  # kB


def facts(nodes: int = 2, mem_mb: int = 16384, sizes=("2M", "1G")) -> dict:
    return {
        "hugepage_sizes": list(sizes),
        "memory": {str(n): mem_mb * 1024 for n in range(nodes)},
        "hugepages": {str(n): {s: {"total": 0, "free": 0} for s in sizes} for n in range(nodes)},
    }


# Sizes and the variable --------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "kb"),
    [("1G", GIB), ("1g", GIB), ("1GB", GIB), ("1GiB", GIB), ("2M", 2048), ("2mb", 2048), ("2048kB", 2048)],
)
def test_sizes_in_every_spelling_mean_the_same(raw, kb):
    assert parse_size(raw) == kb
    assert size_label(kb) in ("1G", "2M")


def test_size_labels():
    assert [size_label(kb) for kb in (64, 2048, 32768, 524288, GIB, 16 * GIB)] == [
        "64K",
        "2M",
        "32M",
        "512M",
        "1G",
        "16G",
    ]


@pytest.mark.parametrize("raw", ["", "1T", "0G", "G", "1.5G", 2, None, "-2M"])
def test_bad_sizes_are_refused_naming_the_value(raw):
    with pytest.raises(PlanError, match=r"is not a page size") as exc:
        parse_size(raw)
    assert exc.value.field == "hugepages"


def test_e_text_means_what_the_yaml_list_means():
    yaml_value = [
        {"size": "2M", "count": 1024},
        {"size": "1G", "count": 8, "numa_node": 1},
        {"size": "1G", "count": 16, "numa_node": 0},
    ]
    expected = [
        {"size": "2M", "size_kb": 2048, "count": 1024, "numa_node": None},
        {"size": "1G", "size_kb": GIB, "count": 16, "numa_node": 0},
        {"size": "1G", "size_kb": GIB, "count": 8, "numa_node": 1},
    ]
    assert parse_entries(yaml_value) == expected
    assert parse_entries("2M:1024, 1G:8:1,1G:16:0") == expected
    assert parse_entries([{"size": "2MB", "count": "1024"}, {"size": "1g", "count": "8", "numa_node": "1"},
                          {"size": "1024M", "count": 16, "numa_node": 0}]) == expected  # fmt: skip
    assert parse_entries("") == parse_entries([]) == []


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            [{"size": "1G", "count": 2}, {"size": "1024M", "count": 4}],
            "entry 2: size 1G without a numa_node is given twice",
        ),
        ([{"size": "2M", "count": 2}, {"size": "2M", "count": 4, "numa_node": 0}], "size 2M is given both without"),
        ([{"size": "2M", "count": 2, "node": 0}], "entry 1: unknown key node (known: size, count, numa_node)"),
        # found by test_inputs' random values: a key with a line break must not break the one-line message
        ([{"size\r": "2M", "count": 2}], "entry 1: unknown key 'size\\r' (known: size, count, numa_node)"),
        ([{"size": "2M"}], "entry 1: count is missing"),
        ([{"size": "2M", "count": -1}], "entry 1: count -1 is not between 0 and 1099511627776"),
        ([{"size": "2M", "count": True}], "entry 1: count True is not a number of pages"),
        ([{"size": "2M", "count": 1, "numa_node": "zero"}], "entry 1: numa_node 'zero' is not a NUMA node number"),
        (["2M"], "entry 1: '2M' is not a mapping with size and count"),
        ("2M", "'2M' is not size:count or size:count:numa_node"),
        ({"size": "2M"}, "is not a list of {size, count, numa_node} entries"),
    ],
)
def test_bad_entries_are_refused_on_one_line(raw, message):
    with pytest.raises(PlanError) as exc:
        validate_inputs({"cpupools_hugepages": raw})
    text = exc.value.describe("n1")
    assert text.startswith("host n1: cpupools_hugepages: "), text
    assert message in text
    assert "\n" not in text


def test_default_size_is_checked_as_a_size():
    assert validate_inputs({"cpupools_hugepages_default_size": "1GB"}).values["hugepages_default_size"] == "1G"
    with pytest.raises(PlanError, match=r"^size 'huge' is not a page size") as exc:
        validate_inputs({"cpupools_hugepages_default_size": "huge"})
    assert exc.value.field == "hugepages_default_size"


# Facts ----------------------------------------------------------------------------------


def test_facts_per_node_and_size_from_sysfs(tmp_path):
    root = write_tree(str(tmp_path), Spec(sockets=2, cores_per_socket=2, node_memory_mb=8192))
    node1 = Path(root, "sys/devices/system/node/node1/hugepages/hugepages-2048kB")
    (node1 / "nr_hugepages").write_text("512\n")
    (node1 / "free_hugepages").write_text("500\n")
    Path(root, "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages").write_text("512\n")
    got = read_hugepages(root)
    assert got["hugepage_sizes"] == ["2M", "1G"]
    assert got["memory"] == {"0": 8192 * 1024, "1": 8192 * 1024}
    assert got["hugepages"] == {
        "0": {"2M": {"total": 0, "free": 0}, "1G": {"total": 0, "free": 0}},
        "1": {"2M": {"total": 512, "free": 500}, "1G": {"total": 0, "free": 0}},
    }
    assert got["hugepages_global"]["2M"] == {"total": 512, "free": 0}


def test_facts_of_a_kernel_without_numa_or_without_hugetlbfs(tmp_path):
    root = write_tree(str(tmp_path / "a"), Spec(node_memory_mb=4096))
    for path in sorted(Path(root, "sys/devices/system/node").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    got = read_hugepages(root)
    assert got["memory"] == {"0": 4096 * 1024}  # from /proc/meminfo
    assert got["hugepages"] == {"0": {"2M": {"total": 0, "free": 0}, "1G": {"total": 0, "free": 0}}}
    bare = write_tree(str(tmp_path / "b"), Spec(hugepage_sizes_kb=()))
    assert read_hugepages(bare)["hugepage_sizes"] == []
    with pytest.raises(
        PlanError, match=r"size 2M is not a page size this node offers \(none: the kernel has no hugetlbfs\)"
    ):
        plan_hugepages(parse_entries("2M:1"), read_hugepages(bare))


# The plan ---------------------------------------------------------------------------------


def test_node_less_1g_goes_on_the_command_line_the_rest_to_the_unit():
    plan = plan_hugepages(parse_entries("1G:8,2M:1024:0,2M:512:1"), facts(), default_size="1G")
    assert plan["boot"] == {"default_size": "1G", "size": "1G", "count": 8}
    assert [(r["count"], r["path"]) for r in plan["runtime"]] == [
        (1024, "/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages"),
        (512, "/sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages"),
    ]
    assert plan["planned"] == {"any": {"1G": 8}, "0": {"2M": 1024}, "1": {"2M": 512}}
    # 8 x 1G spread over two nodes: 4 GiB each, plus node 0's 2 GiB and node 1's 1 GiB of 2M pages.
    assert plan["memory"] == {
        "0": {"asked_kb": 6 * GIB, "available_kb": 15 * GIB},
        "1": {"asked_kb": 5 * GIB, "available_kb": 15 * GIB},
    }
    assert kargs.hugepage_args({"hugepages": plan}) == {
        "default_hugepagesz": "1G",
        "hugepagesz": "1G",
        "hugepages": "8",
    }


def test_per_node_1g_and_node_less_2m_are_the_units():
    plan = plan_hugepages(parse_entries("1G:4:1,2M:100"), facts())
    assert plan["boot"] == {"default_size": None, "size": None, "count": 0}
    assert [r["path"] for r in plan["runtime"]] == [
        "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
        "/sys/devices/system/node/node1/hugepages/hugepages-1048576kB/nr_hugepages",
    ]
    assert kargs.hugepage_args({"hugepages": plan}) == {}


# Per-node 1G pages on the kernel command line (issue 25) ------------------------------------

NODE_1G = "/sys/devices/system/node/node{}/hugepages/hugepages-1048576kB/nr_hugepages"


def test_per_node_1g_goes_on_the_command_line_of_a_kernel_that_reads_it():
    plan = plan_hugepages(parse_entries("1G:4:0,1G:2:1,2M:100"), facts(), default_size="1G", kernel_release="6.1.0-18")
    assert plan["boot"] == {"default_size": "1G", "size": "1G", "count": 6, "nodes": {"0": 4, "1": 2}}
    assert [r["path"] for r in plan["runtime"]] == ["/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"]
    assert (plan["notes"], plan["warnings"]) == ([], [])
    assert plan["planned"] == {"any": {"2M": 100}, "0": {"1G": 4}, "1": {"1G": 2}}
    args = kargs.hugepage_args({"hugepages": plan})
    assert args == {"default_hugepagesz": "1G", "hugepagesz": "1G", "hugepages": "0:4,1:2"}
    # 5.16 is the first such kernel; a node given 0 pages is left out (it gets none at boot anyway).
    plan = plan_hugepages(parse_entries("1G:0:0,1G:3:1"), facts(), kernel_release="5.16.0")
    assert plan["boot"]["nodes"] == {"1": 3} and plan["runtime"] == []
    assert kargs.hugepage_args({"hugepages": plan}) == {"hugepagesz": "1G", "hugepages": "1:3"}


@pytest.mark.parametrize(
    ("release", "note", "warned"),
    [
        ("5.15.0-91-generic", "1G pages per NUMA node are reserved by cpupools-hugepages.service: kernel "
         "5.15.0-91-generic reads no per-node hugepages= (5.16 and later do)", False),
        (None, "1G pages per NUMA node are reserved by cpupools-hugepages.service, not on the kernel command line: "
         "the kernel release is unknown (no proc/sys/kernel/osrelease under cpupools_facts_root; set "
         "cpupools_kernel_release to the kernel that boots)", True),
        ("linux", "the kernel release is unknown", True),
    ],
)  # fmt: skip
def test_per_node_1g_goes_to_the_unit_on_an_older_or_unknown_kernel(release, note, warned):
    plan = plan_hugepages(parse_entries("1G:4:0,1G:2:1"), facts(), kernel_release=release)
    assert plan["boot"] == {"default_size": None, "size": None, "count": 0}
    assert [(r["count"], r["path"]) for r in plan["runtime"]] == [(4, NODE_1G.format(0)), (2, NODE_1G.format(1))]
    assert kargs.hugepage_args({"hugepages": plan}) == {}
    assert len(plan["notes"]) == 1 and note in plan["notes"][0]
    assert plan["warnings"] == (plan["notes"] if warned else [])


def test_one_gigantic_size_on_the_command_line():
    sizes = ("2M", "1G", "16G")
    # A node-less size keeps the command line; another gigantic size per node goes to the unit.
    plan = plan_hugepages(parse_entries("1G:4,16G:1:1"), facts(sizes=sizes, mem_mb=65536), kernel_release="6.8.0")
    assert plan["boot"] == {"default_size": None, "size": "1G", "count": 4}
    assert [r["path"] for r in plan["runtime"]] == [
        "/sys/devices/system/node/node1/hugepages/hugepages-16777216kB/nr_hugepages"
    ]
    assert plan["notes"] == [
        "16G pages per NUMA node are reserved by cpupools-hugepages.service: the kernel command line holds one "
        "gigantic size, 1G"
    ]
    # Two sizes per node only: the larger (the harder to find after boot) on the command line.
    plan = plan_hugepages(parse_entries("1G:4:0,16G:1:1"), facts(sizes=sizes, mem_mb=65536), kernel_release="6.8.0")
    assert plan["boot"] == {"default_size": None, "size": "16G", "count": 1, "nodes": {"1": 1}}
    assert [r["path"] for r in plan["runtime"]] == [NODE_1G.format(0)]
    assert kargs.hugepage_args({"hugepages": plan}) == {"hugepagesz": "16G", "hugepages": "1:1"}
    # No page of a size asked anywhere: the unit writes the zeros, as before (pages it reserved are freed now).
    plan = plan_hugepages(parse_entries("1G:0:0,1G:0:1"), facts(), kernel_release="6.8.0")
    assert plan["boot"]["size"] is None and [r["count"] for r in plan["runtime"]] == [0, 0]


def test_a_size_both_with_and_without_nodes_is_refused():
    # The kernel reads one hugepages= per hugepagesz=, node-less or per node, never both.
    with pytest.raises(PlanError) as exc:
        validate_inputs({"cpupools_hugepages": "1G:4,1G:2:0"})
    assert exc.value.describe("n1") == (
        "host n1: cpupools_hugepages: size 1G is given both without a numa_node and per NUMA node; "
        "give one or the other"
    )


def test_the_kernel_stage_refuses_per_node_counts_for_an_older_kernel():
    args = {"hugepagesz": "1G", "hugepages": "0:4,1:2"}
    with pytest.raises(KernelArgsError) as exc:
        kargs.validate_kernel_args(args, "5.15.0")
    assert exc.value.field == "hugepages"
    assert str(exc.value) == (
        "hugepages=0:4,1:2 gives pages per NUMA node, which kernel 5.15.0 does not read (before 5.16 it takes "
        "the first node number for the count); set cpupools_kernel_release to the kernel that boots"
    )
    assert kargs.validate_kernel_args(args, "5.16.0") == kargs.validate_kernel_args({"hugepages": "8"}, "5.4.0") == []


def test_the_plan_is_for_the_kernel_the_kernel_stage_derives_for(tmp_path):
    # host_plan.boot_release reads the release the way the kernel stage does
    # (bootloader.kernel_release): cpupools_kernel_release, else the running
    # kernel's under the facts root.
    facts_root = tmp_path / "facts"
    (facts_root / "proc/sys/kernel").mkdir(parents=True)
    values = {"root": str(tmp_path / "node"), "facts_root": str(facts_root), "kernel_release": ""}
    assert boot_release(values) is None
    (facts_root / "proc/sys/kernel/osrelease").write_text("6.1.0-18-amd64\n")
    assert boot_release(values) == "6.1.0-18-amd64"
    assert boot_release({**values, "kernel_release": "5.15.0-91-generic"}) == "5.15.0-91-generic"
    assert boot_release({**values, "facts_root": ""}) is None  # the facts root defaults to the root
    assert boot_release({**values, "root": "/", "facts_root": ""}) == os.uname().release


def test_memory_short_is_refused_with_the_numbers():
    # Node 1: 14 x 1G + 1024 x 2M = 16 GiB asked; 16 GiB MemTotal less the 1 GiB kept free = 15 GiB.
    with pytest.raises(PlanError) as exc:
        plan_hugepages(parse_entries("1G:14:1,2M:1024:1"), facts())
    assert exc.value.describe("n1") == (
        "host n1: cpupools_hugepages: NUMA node 1 cannot hold the hugepages asked: 1024 x 2M + 14 x 1G = "
        "16384 MiB asked, 15360 MiB available (MemTotal 16384 MiB less cpupools_hugepages_keep_free_mb 1024 MiB)"
    )
    # The same pages fit when less is kept free.
    plan_hugepages(parse_entries("1G:14:1,2M:1024:1"), facts(), keep_free_mb=0)
    # Node-less pages count on every node with memory: 31 x 1G -> 16 per node > 15.
    with pytest.raises(PlanError, match=r"NUMA node 0 cannot hold the hugepages asked: 16 x 1G = 16384 MiB asked"):
        plan_hugepages(parse_entries("1G:31"), facts())
    plan_hugepages(parse_entries("1G:30"), facts())


@pytest.mark.parametrize(
    ("text", "kw", "message"),
    [
        ("16M:4", {}, "size 16M is not a page size this node offers (2M, 1G)"),
        ("2M:4:2", {}, "size 2M: NUMA node 2 does not exist on this node (it has 0, 1)"),
        ("2M:4:1", {"memoryless": True}, "size 2M: NUMA node 1 has no memory of its own"),
        ("1G:2,16G:1", {"sizes": ("2M", "1G", "16G")}, "sizes 1G, 16G without a numa_node would all be reserved"),
    ],
)
def test_what_the_node_cannot_offer_is_refused(text, kw, message):
    node_facts = facts(sizes=kw.get("sizes", ("2M", "1G")))
    if kw.get("memoryless"):
        node_facts["memory"]["1"] = 0
    with pytest.raises(PlanError) as exc:
        plan_hugepages(parse_entries(text), node_facts)
    assert message in str(exc.value)
    assert exc.value.field == "hugepages"


def test_default_size_must_be_offered():
    with pytest.raises(PlanError, match=r"^16G is not a page size this node offers \(2M, 1G\)$") as exc:
        plan_hugepages([], facts(), default_size="16G")
    assert exc.value.field == "hugepages_default_size"


# Kernel arguments -------------------------------------------------------------------------


def plan_with(hugepages_text: str, tmp_path: Path, default_size: str = "") -> dict:
    root = write_tree(str(tmp_path / "t"), Spec(sockets=2, cores_per_socket=4, threads=2))
    topo = gather_topology(root)
    plan = plan_pools(topo, make_request({"num_exclusive_cores": 2, "num_shared_cores": 1}))
    plan["hugepages"] = plan_hugepages(parse_entries(hugepages_text), read_hugepages(root), default_size=default_size)
    return plan


def test_kernel_arguments_are_derived_with_the_others_in_order(tmp_path):
    plan = plan_with("1G:4,2M:64:0", tmp_path, default_size="1G")
    args, _ = kargs.derive_kernel_args(plan, kargs.KargsOptions())
    assert list(args) == list(kargs.OWNED)
    line = kargs.render_args(args)
    assert line.endswith(" default_hugepagesz=1G hugepagesz=1G hugepages=4")
    assert kargs.validate_kernel_args(args, "6.1.0", "CONFIG_NO_HZ_FULL=y\nCONFIG_RCU_NOCB_CPU=y\n") == []
    # A running kernel booted with them has nothing pending; another count is pending.
    assert kargs.pending_args(args, "ro " + line)[0] == []
    pending = kargs.pending_args({**args, "hugepages": "8"}, "ro " + line)[0]
    assert pending == [{"arg": "hugepages", "configured": "8", "running": "4", "now": None}]
    # No hugepage asked: no hugepage argument, so none of the operator's is touched.
    plain, _ = kargs.derive_kernel_args(plan_with("2M:64:0", tmp_path / "b"), kargs.KargsOptions())
    assert not set(plain) & set(kargs.HUGEPAGE_ARGS)


def test_kernel_arguments_in_adopt_mode_keep_the_running_cpu_lists(tmp_path):
    plan = plan_with("1G:2", tmp_path)
    plan.update(mode="adopt", adopted={"isolcpus": "1-3", "isolcpus_flags": []})
    args, _ = kargs.derive_kernel_args(plan, kargs.KargsOptions(), "ro isolcpus=1-3")
    assert args["isolcpus"] == "1-3"
    assert (args["hugepagesz"], args["hugepages"]) == ("1G", "2")


def test_kernel_cmdline_edit_keeps_the_order_and_restores_exactly():
    text = "root=/dev/sda1 ro quiet\n"
    added = bootfiles.edit_cmdline(text, {"hugepagesz": "1G", "hugepages": "4"})
    assert added == "root=/dev/sda1 ro quiet hugepagesz=1G hugepages=4\n"
    changed = bootfiles.edit_cmdline(added, {"hugepagesz": "1G", "hugepages": "8"})
    assert changed == "root=/dev/sda1 ro quiet hugepagesz=1G hugepages=8\n"
    assert bootfiles.edit_cmdline(changed, {"hugepagesz": None, "hugepages": None}) == text
