"""The pool planner: exact layouts, CMK compatibility in adopt mode, bad input."""

from __future__ import annotations

import json

import pytest
from cpupools.core.errors import PlanError
from cpupools.hardware.topology import gather_topology
from cpupools.planning.plan import make_request, plan_pools
from sysfs import Spec


def plan_for(root, **raw):
    return plan_pools(gather_topology(str(root)), make_request(raw))


def test_defaults_on_two_sockets(corpus_root):
    plan = plan_for(corpus_root["2s22c-smt2"])
    assert plan["pools"]["exclusive"] == {"0": ["1,45", "2,46", "3,47", "4,48"], "1": []}
    assert plan["pools"]["shared"] == {"0": ["5,49"], "1": []}
    assert plan["counts"] == {"exclusive": 4, "shared": 1, "infra": 39}
    assert plan["isolated_cpus"] == "1-5,45-49"
    assert plan["housekeeping_cpus"] == "0,6-44,50-87"
    assert plan["stranded_cpus"] == ""
    assert "exclusive-non-isolcpus" not in plan["pools"]


def test_spread_alternates_sockets_in_handout_order(corpus_root):
    plan = plan_for(
        corpus_root["2s22c-smt2"],
        num_exclusive_cores=4,
        exclusive_mode="spread",
        num_shared_cores=2,
        shared_mode="spread",
    )
    assert plan["handout_order"]["exclusive"] == ["1,45", "23,67", "2,46", "24,68"]
    assert plan["pools"]["exclusive"] == {"0": ["1,45", "2,46"], "1": ["23,67", "24,68"]}
    assert plan["pools"]["shared"] == {"0": ["3,47"], "1": ["25,69"]}


def test_shared_spread_balances_against_what_exclusive_left(corpus_root):
    # 5 exclusive packed cores fill socket 0 (6 cores, 1 infra); shared spread
    # then balances over the sockets that still have free cores.
    plan = plan_for(corpus_root["4s6c-smt2"], num_exclusive_cores=5, num_shared_cores=4, shared_mode="spread")
    assert plan["pools"]["exclusive"]["0"] == ["1,25", "2,26", "3,27", "4,28", "5,29"]
    assert plan["pools"]["shared"] == {"0": [], "1": ["7,8,31,32"], "2": ["13,37"], "3": ["19,43"]}


def test_adjacent_siblings_stay_together(corpus_root):
    plan = plan_for(corpus_root["1s8c-adjacent"], num_exclusive_cores=2, num_shared_cores=1)
    assert plan["pools"]["exclusive"]["0"] == ["2,3", "4,5"]
    assert plan["pools"]["shared"]["0"] == ["6,7"]
    assert plan["pools"]["infra"]["0"] == ["0,1,8,9,10,11,12,13,14,15"]


def test_minus_one_takes_the_rest(corpus_root):
    plan = plan_for(corpus_root["2s8c-nosmt"], num_exclusive_cores=-1, num_shared_cores=2)
    assert plan["counts"] == {"exclusive": 12, "shared": 2, "infra": 2}
    assert plan["pools"]["shared"] == {"0": ["1,2"], "1": []}
    assert plan["pool_cpus"]["infra"] == "0,8"


def test_explicit_infra_and_eni(corpus_root):
    plan = plan_for(
        corpus_root["2s8c-nosmt"],
        infra_cores="0-1,8",
        excl_non_isolcpus="14-15",
        num_exclusive_cores=3,
        num_shared_cores=1,
    )
    assert plan["pools"]["infra"] == {"0": ["0,1,6,7"], "1": ["8,9,10,11,12,13"]}
    assert plan["pools"]["exclusive-non-isolcpus"] == {"0": [], "1": ["14", "15"]}
    assert plan["handout_order"]["exclusive-non-isolcpus"] == ["14", "15"]
    assert plan["isolated_cpus"] == "2-5"
    assert plan["housekeeping_cpus"] == "0-1,6-13"


def test_isolated_pools_exclusive_only(corpus_root):
    plan = plan_for(corpus_root["1s8c-smt2"], isolated_pools=["exclusive"])
    assert plan["isolated_cpus"] == "1-4,9-12"


def test_sst_bf_auto_prefers_fast_cores(corpus_root):
    # The fixture's fast cores are the first 3 of each socket; core 0 is infra.
    plan = plan_for(corpus_root["2s8c-sstbf"], num_exclusive_cores=4)
    assert plan["handout_order"]["exclusive"] == ["1,17", "2,18", "9,25", "10,26"]
    assert plan["sst_bf_cores"] == "0-2,8-10,16-18,24-26"
    off = plan_for(corpus_root["2s8c-sstbf"], num_exclusive_cores=4, sst_bf=False)
    assert off["handout_order"]["exclusive"] == ["1,17", "2,18", "3,19", "4,20"]
    with pytest.raises(PlanError, match="no core of this host has a higher base frequency"):
        plan_for(corpus_root["2s22c-smt2"], sst_bf="true")


def test_plan_is_deterministic(corpus_root):
    a = json.dumps(plan_for(corpus_root["4s6c-smt2"], exclusive_mode="spread", num_shared_cores=-1))
    b = json.dumps(plan_for(corpus_root["4s6c-smt2"], exclusive_mode="spread", num_shared_cores=-1))
    assert a == b


# adopt: what cmk init computes ------------------------------------------------


def test_adopt_matches_cmk_reference_example(make_root):
    # CMK's worked example: 2s8c no HT, spread, isolcpus=1-3,9-11, 4 exclusive / 2 shared.
    root = make_root(Spec(sockets=2, cores_per_socket=8, threads=1, cmdline="ro isolcpus=1-3,9-11"))
    plan = plan_for(
        root,
        isolcpus_source="adopt",
        num_exclusive_cores=4,
        num_shared_cores=2,
        exclusive_mode="spread",
        shared_mode="spread",
    )
    assert plan["pools"]["exclusive"] == {"0": ["1", "2"], "1": ["9", "10"]}
    assert plan["pools"]["shared"] == {"0": ["3"], "1": ["11"]}
    assert plan["pools"]["infra"] == {"0": ["0,4,5,6,7"], "1": ["8,12,13,14,15"]}
    assert plan["isolated_cpus"] == "1-3,9-11"
    assert plan["warnings"] == []
    assert plan["adopted"] == {"isolcpus": "1-3,9-11", "isolcpus_flags": []}


def test_adopt_understands_flags_and_reports_stranded_and_partial(make_root):
    root = make_root(
        Spec(sockets=1, cores_per_socket=8, threads=2, cmdline="isolcpus=managed_irq,domain,1-5,9-12 quiet")
    )
    plan = plan_for(root, isolcpus_source="adopt", num_exclusive_cores=2, num_shared_cores=1)
    # fully isolated cores: (1,9) (2,10) (3,11) (4,12); core (5,13) is half isolated.
    assert plan["pools"]["exclusive"]["0"] == ["1,9", "2,10"]
    assert plan["pools"]["shared"]["0"] == ["3,11"]
    assert plan["stranded_cpus"] == "4,12"
    assert plan["pools"]["infra"]["0"] == ["0,5,6,7,8,13,14,15"]
    text = "\n".join(plan["warnings"])
    assert "core 5,13 is partially isolated" in text
    assert "1 isolated core (4,12) are in no pool" in text
    assert "infra pool holds isolated CPU(s) 5" in text
    assert plan["adopted"]["isolcpus_flags"] == ["managed_irq", "domain"]


def test_adopt_eni_rules(make_root):
    root = make_root(Spec(sockets=1, cores_per_socket=8, threads=1, cmdline="isolcpus=1-4"))
    plan = plan_for(root, isolcpus_source="adopt", num_exclusive_cores=3, num_shared_cores=1, excl_non_isolcpus="6")
    assert plan["pools"]["exclusive-non-isolcpus"]["0"] == ["6"]
    assert plan["pools"]["infra"]["0"] == ["0,5,7"]
    with pytest.raises(PlanError, match=r"core\(s\) 4 are isolated"):
        plan_for(root, isolcpus_source="adopt", num_exclusive_cores=1, num_shared_cores=1, excl_non_isolcpus="4")
    with pytest.raises(PlanError, match=r"core\(s\) 1 are already in the exclusive pool"):
        plan_for(root, isolcpus_source="adopt", num_exclusive_cores=3, num_shared_cores=1, excl_non_isolcpus="1")


def test_adopt_refuses_too_few_isolated_cores(make_root):
    root = make_root(Spec(sockets=1, cores_per_socket=8, threads=1, cmdline="isolcpus=1-3"))
    with pytest.raises(PlanError) as err:
        plan_for(root, isolcpus_source="adopt")
    assert str(err.value) == (
        "4 exclusive cores + 1 shared core requested, 3 fit: isolcpus (1-3) fully isolates 3 cores; "
        "lower the sizes or isolate more cores"
    )


def test_adopt_refuses_all_isolated(make_root):
    root = make_root(Spec(sockets=1, cores_per_socket=4, threads=1, cmdline="isolcpus=0-3"))
    with pytest.raises(PlanError, match="infra pool would be empty"):
        plan_for(root, isolcpus_source="adopt", num_exclusive_cores=2, num_shared_cores=1)


def test_adopt_needs_isolcpus(corpus_root):
    with pytest.raises(PlanError, match="adopt needs isolcpus= on the running kernel's command line") as exc:
        plan_for(corpus_root["1s8c-smt2"], isolcpus_source="adopt")
    assert exc.value.describe("node3").startswith("host node3: cpupools_isolcpus_source: adopt needs")


# bad input ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field", "message"),
    [
        ({"num_exclusive_cores": "four"}, "num_exclusive_cores", "'four' is not an integer"),
        ({"num_exclusive_cores": 2.5}, "num_exclusive_cores", "2.5 is not an integer"),
        ({"num_shared_cores": True}, "num_shared_cores", "True is not an integer"),
        ({"num_shared_cores": -2}, "num_shared_cores", "-2 is below -1"),
        ({"num_exclusive_cores": -1, "num_shared_cores": -1}, "num_exclusive_cores", "both -1"),
        ({"exclusive_mode": "vertical"}, "exclusive_mode", "'vertical' is not one of packed, spread"),
        ({"isolcpus_source": "guess"}, "isolcpus_source", "'guess' is not one of generate, adopt"),
        ({"infra_cores": 0}, "infra_cores", "0 infra cores per NUMA node"),
        ({"infra_cores": {"x": 1}}, "infra_cores", "'x' is not a NUMA node number"),
        ({"infra_cores": "0=-1"}, "infra_cores", "-1 is below 0"),
        ({"infra_cores": {}}, "infra_cores", "the mapping of NUMA node to infra cores is empty"),
        ({"exclusive_core_type": "efficient"}, "exclusive_core_type", "'efficient' is not one of performance, any"),
        ({"runtime": "docker"}, "runtime", "'docker' is not one of cmk, kubelet"),
        ({"excl_non_isolcpus": "1-"}, "excl_non_isolcpus", "malformed excl_non_isolcpus"),
        ({"isolated_pools": ["infra"]}, "isolated_pools", "'infra' is not one of exclusive, shared"),
        ({"sst_bf": "maybe"}, "sst_bf", "'maybe' is not one of auto, true, false"),
    ],
)
def test_bad_request_values(raw, field, message):
    with pytest.raises(PlanError, match=message) as exc:
        make_request(raw)
    assert exc.value.field == field


def test_too_many_cores_names_the_numbers(corpus_root):
    with pytest.raises(PlanError) as exc:
        plan_for(corpus_root["2s22c-smt2"], num_exclusive_cores=41, num_shared_cores=2)
    assert exc.value.describe("node3") == (
        "host node3: cpupools_num_exclusive_cores: 41 exclusive cores + 2 shared cores requested, "
        "42 available after 1 infra core per NUMA node (auto)"
    )


def test_minus_one_with_nothing_left(corpus_root):
    with pytest.raises(PlanError, match=r"all remaining exclusive cores \+ 14 shared cores requested, 14 available"):
        plan_for(corpus_root["2s8c-nosmt"], num_exclusive_cores=-1, num_shared_cores=14)


@pytest.mark.parametrize(
    ("eni", "message"),
    [
        ("200", r"CPU\(s\) 200 do not exist on this host \(online: 0-87\)"),
        ("6", r"6 splits core 6,50: add its sibling\(s\) 50"),
        ("0,44", r"CPU\(s\) 0,44 are infra cores"),
    ],
)
def test_eni_errors(corpus_root, eni, message):
    with pytest.raises(PlanError, match=message) as exc:
        plan_for(corpus_root["2s22c-smt2"], excl_non_isolcpus=eni)
    assert exc.value.field == "excl_non_isolcpus"


def test_eni_offline_cpu(corpus_root):
    with pytest.raises(PlanError, match=r"CPU\(s\) 5 are offline"):
        plan_for(corpus_root["2s8c-offline"], excl_non_isolcpus="5")


def test_infra_split_core(corpus_root):
    # A bare "0" is a count of cores per socket (as from -e); a list names CPU ids.
    with pytest.raises(PlanError, match=r"0 splits core 0,44") as exc:
        plan_for(corpus_root["2s22c-smt2"], infra_cores=[0])
    assert exc.value.field == "infra_cores"
