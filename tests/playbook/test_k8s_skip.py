"""The k8s stage's skip decision, made once in the plan play (issue 14).

The plan play's module says why the k8s stage would do nothing on a host (no
kubeconfig and not in-cluster, or cpupools_k8s_enabled false), puts the others
in the group cpupools_todo_k8s, which the k8s play runs on, and sets the
cpupools_k8s_status the stage would have exported. The role keeps its own
cpupools_k8s_skip_reason for the playbooks that run it without the plan play
(uninstall, reboot): the two must never disagree.
"""

from __future__ import annotations

from pathlib import Path

from helpers import REPO, ansible_env, local_nodes, run_playbook

NO_KUBECONFIG = (
    "no kubeconfig is configured: set cpupools_k8s_kubeconfig (a path on the controller)"
    " or cpupools_k8s_in_cluster: true"
)
DISABLED = "cpupools_k8s_enabled is false"
#: Stands for a kubeconfig file that exists on the controller (the plan play refuses one that does not).
KUBECONFIG = "@kubeconfig@"

#: host -> (its variables, the reason the stage is skipped, "" = it runs). Values as -e gives them: strings.
CASES = {
    "plain": ({}, NO_KUBECONFIG),
    "disabled": ({"cpupools_k8s_enabled": "false"}, DISABLED),
    "disabled-with-kubeconfig": ({"cpupools_k8s_enabled": "no", "cpupools_k8s_kubeconfig": KUBECONFIG}, DISABLED),
    "kubeconfig": ({"cpupools_k8s_kubeconfig": KUBECONFIG}, ""),
    "empty-kubeconfig": ({"cpupools_k8s_kubeconfig": "", "cpupools_k8s_in_cluster": "False"}, NO_KUBECONFIG),
    "in-cluster": ({"cpupools_k8s_in_cluster": "true"}, ""),
}


def inventory(tmp_path: Path, cases: dict) -> str:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    cases = {
        name: ({k: str(kubeconfig) if v == KUBECONFIG else v for k, v in variables.items()}, reason)
        for name, (variables, reason) in cases.items()
    }
    hosts = {
        name: {
            "cpupools_facts_root": str(REPO / "inventories" / "local" / "topology"),
            "cpupools_root": str(tmp_path / "roots" / name),
            **variables,
        }
        for name, (variables, _) in cases.items()
    }
    common = {
        "cpupools_num_exclusive_cores": 2,
        "cpupools_num_shared_cores": 1,
        "cpupools_kernel_args_backend": "grub",
        "cpupools_report_html": str(tmp_path / "report.html"),
        "cpupools_report_print": False,
    }
    return local_nodes(tmp_path / "hosts.yml", hosts, common)  # the hosts in the order of CASES


#: The plan play, then the role's own variable evaluated for every host beside the module's answer.
COMPARE = f"""
- name: Plan
  ansible.builtin.import_playbook: {REPO}/playbooks/plan.yml

- name: The role's reason beside the plan's
  hosts: cpupools_nodes
  gather_facts: false
  tasks:
    - name: The role's defaults and variables, none of its tasks
      ansible.builtin.import_role:
        name: cpupools_k8s
      when: false
    - name: Both reasons and the group
      ansible.builtin.debug:
        msg:
          role: "{{{{ cpupools_k8s_skip_reason }}}}"
          plan: "{{{{ cpupools_plan_result.k8s_skip_reason }}}}"
          runs: "{{{{ inventory_hostname in groups['cpupools_todo_k8s'] | default([]) }}}}"
          disabled: "{{{{ inventory_hostname in groups['cpupools_k8s_skipped_disabled'] | default([]) }}}}"
          status: "{{{{ cpupools_k8s_status }}}}"
"""


def test_the_plan_and_the_role_give_the_same_reason(tmp_path):
    res = run_playbook(COMPARE, tmp_path, None, inventory=inventory(tmp_path, CASES))
    assert res.rc == 0, res.stdout[-3000:]
    for host, (_, reason) in CASES.items():
        got = res.result("Both reasons and the group", host)["msg"]
        assert got["role"] == reason, host
        assert got["plan"] == reason, host
        # the k8s play runs on cpupools_todo_k8s; only the rarer reason has a group of its own
        assert got["runs"] is not bool(reason), host
        assert got["disabled"] is (reason == DISABLED), host
        expected = {"enabled": False, "skipped_reason": reason, "advertised": {}, "expected": {}} if reason else None
        assert got["status"] == expected, host


#: site.yml, then each host's groups.
SITE_THEN_GROUPS = f"""
- name: Site
  ansible.builtin.import_playbook: {REPO}/site.yml

- name: The groups
  hosts: cpupools_nodes
  gather_facts: false
  tasks:
    - name: The host's groups
      ansible.builtin.debug:
        var: group_names
"""


def test_site_leaves_skipped_hosts_out_of_the_k8s_play(tmp_path):
    cases = {name: CASES[name] for name in ("plain", "disabled")}
    inv = inventory(tmp_path, cases)
    for attempt in ("first", "converged"):
        res = run_playbook(SITE_THEN_GROUPS, tmp_path, None, inventory=inv, env=ansible_env())
        assert res.rc == 0, res.stdout[-3000:]
        # No host pattern names a group that does not exist (on the converged run no host has
        # work: no cpupools_todo_* group at all).
        assert "Could not match supplied host pattern" not in res.stderr, (attempt, res.stderr)
        plays = {play["play"]["name"]: play for play in res.data["plays"]}
        assert plays["Configure the Kubernetes nodes"]["tasks"] == [], attempt
        said = res.result("Say why the Kubernetes nodes are not configured", "plain")["msg"]
        assert said == [f"Kubernetes skipped on plain: {NO_KUBECONFIG}", f"Kubernetes skipped on disabled: {DISABLED}"]
        # The report sees the status the stage would have exported (the exact
        # status is held by the test above): each host's resources say why.
        lines = res.result("Render the fleet report", "plain")["lines"]
        blocks = {}
        for line in lines:
            if line.startswith("== "):
                host = line.split()[1]
            elif line.startswith("  resources"):
                blocks.setdefault(host, []).append(line)
        assert sorted(blocks) == sorted(cases), lines
        for name, (_, reason) in cases.items():
            assert all(line.endswith(f"(skipped: {reason})") for line in blocks[name]), (name, blocks[name])
    assert res.stats["plain"]["changed"] == 0 and res.stats["disabled"]["changed"] == 0
    # Converged and without a cluster, a host joins no group (on ansible-core 2.21 each is an RPC to the
    # main process): the first one only marks that the plan ran; the disabled one joins its reason's.
    groups = {host: res.result("The host's groups", host)["group_names"] for host in cases}
    assert groups == {
        "plain": ["cpupools_nodes", "cpupools_plan_ran", "cpupools_set_plan_ran"],
        "disabled": ["cpupools_k8s_skipped_disabled", "cpupools_nodes", "cpupools_set_k8s_skipped_disabled"],
    }


def test_k8s_tag_alone_still_says_why(tmp_path):
    cases = {name: case for name, case in CASES.items() if case[1]}
    res = run_playbook(REPO / "site.yml", tmp_path, None, "--tags", "k8s", inventory=inventory(tmp_path, cases))
    assert res.rc == 0, res.stdout[-3000:]
    said = res.result("Say why the Kubernetes nodes are not configured", "plain")["msg"]
    # one line per host, the hosts of one reason together (no kubeconfig first), each in the play's order
    by_reason = sorted(cases.items(), key=lambda case: case[1][1] != NO_KUBECONFIG)
    assert said == [f"Kubernetes skipped on {name}: {reason}" for name, (_, reason) in by_reason]
    assert [name for name, _ in by_reason] != list(cases)  # the case order is not already that
    assert all(res.stats[name]["changed"] == 0 for name in cases)
    assert not (tmp_path / "roots").exists()  # only the plan play and this message ran
