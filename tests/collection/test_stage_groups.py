"""Which groups the plan play puts a host in, and the host pattern of each later play: plugin_utils/stage_groups.py.

The groups name the hosts with work, so a converged host makes no call to
change the inventory. The playbooks' side (which hosts each play of a mixed
fleet really ran on) is tests/playbook/test_converged.py; these are the rule's
own cases, every combination of a result's fields.
"""

from __future__ import annotations

import itertools
import sys

import pytest
from helpers import REPO

sys.path.insert(0, str(REPO / "collections"))
from ansible_collections.cpupools.cpupools.plugins.module_utils.cpupools.node import stage_check
from ansible_collections.cpupools.cpupools.plugins.plugin_utils import stage_groups as sg


def result(todo=(), k8s_skip="", kubelet_line=""):
    return {
        "todo": list(todo),
        "converged": [stage for stage in stage_check.STAGES if stage not in todo],
        "k8s_skip": k8s_skip,
        "k8s_skip_reason": stage_check.K8S_SKIP_REASONS.get(k8s_skip, ""),
        "kubelet_line": kubelet_line,
    }


def test_a_converged_host_without_a_cluster_joins_no_group():
    assert sg.groups(result(k8s_skip="unconfigured")) is None


@pytest.mark.parametrize(
    ("todo", "skip", "line", "refresh", "first"),
    list(
        itertools.product(
            [(), ("kernel",), ("agent",), ("kernel", "agent")],
            ["", "unconfigured", "disabled"],
            ["", "host a: kubelet 1.36: ..."],
            [False, True],
            [False, True],
        )
    ),
)
def test_every_combination_names_exactly_the_work(todo, skip, line, refresh, first):
    got = sg.groups(result(todo, skip, line), refresh=refresh, first=first)
    expected = [f"cpupools_todo_{stage}" for stage in todo]
    expected += {"": ["cpupools_todo_k8s"], "unconfigured": [], "disabled": ["cpupools_k8s_skipped_disabled"]}[skip]
    expected += ["cpupools_kubelet_lines"] * bool(line) + ["cpupools_plan_refresh"] * refresh
    expected += ["cpupools_plan_ran"] * first
    if not expected:
        assert got is None
        return
    name, parents = got
    assert parents == expected
    # one group per combination, a child of each: the same combination, the same name; another, another
    assert name == "cpupools_set_" + "_".join(p.removeprefix("cpupools_") for p in expected)


def test_every_skip_reason_but_the_common_one_has_a_group():
    # a reason added to stage_check gets a group of its own, so the plan play's message never gives
    # a host another reason's text (it reads one host's reason per group)
    for key in stage_check.K8S_SKIP_REASONS:
        parents = (sg.groups(result(k8s_skip=key)) or (None, []))[1]
        assert parents == ([] if key == sg.K8S_UNGROUPED else [sg.K8S_SKIPPED + key]), key


def test_play_hosts_before_and_after_the_plan():
    # No plan play in this playbook (a stage play on its own, --skip-tags plan): every node, as before.
    for stage in (*sg.STAGES, "plan"):
        assert sg.play_hosts({"all": [], "cpupools_nodes": ["a"]}, stage) == "cpupools_nodes"
    planned = {"all": ["a", "b"], "cpupools_nodes": ["a", "b"], "cpupools_plan_ran": ["a"]}
    # After it: the stage's own group, within the nodes; no group, no host; the report plans nobody.
    with_work = {**planned, "cpupools_todo_kernel": ["b"]}
    assert sg.play_hosts(with_work, "kernel") == "cpupools_nodes:&cpupools_todo_kernel"
    for stage in ("agent", "k8s", "plan"):
        assert sg.play_hosts(with_work, stage) == sg.NO_HOST == "cpupools_plan_ran:!cpupools_plan_ran"
    with pytest.raises(ValueError, match="unknown stage 'kernal'"):
        sg.play_hosts(planned, "kernal")


def test_a_host_left_in_a_group_by_an_earlier_plan_is_named():
    # site.yml twice in one playbook: the first plan put the host in cpupools_todo_kernel, and no call
    # takes it out; the second finds it converged, and the action keeps its result whole for that stage.
    names = ["cpupools_nodes", "cpupools_set_todo_kernel_todo_k8s", "cpupools_todo_kernel", "cpupools_todo_k8s"]
    assert sg.listed_without_work(result(), names) == ["kernel"]
    assert sg.listed_without_work(result(["kernel"]), names) == []  # work again: a stage that runs reads it whole
    assert sg.listed_without_work(result(), ["cpupools_nodes", "cpupools_todo_k8s"]) == []  # k8s reads the slim one
