"""meta/runtime.yml's action groups: module_defaults for the group reach its modules in a real run."""

import yaml
from helpers import REPO, run_playbook

PLAYBOOK = """
- name: The k8s group
  hosts: localhost
  gather_facts: false
  module_defaults:
    group/cpupools.cpupools.k8s:
      kubeconfig: /nonexistent/from-the-k8s-group
  tasks:
    - name: A k8s module by its full name
      cpupools.cpupools.cpupools_k8s_node:
        node_name: n1
        state: absent
      ignore_errors: true

- name: The cpupools group, which extends k8s
  hosts: localhost
  gather_facts: false
  module_defaults:
    group/cpupools.cpupools.cpupools:
      kubeconfig: /nonexistent/from-the-cpupools-group
  tasks:
    - name: A k8s module through the larger group
      cpupools.cpupools.cpupools_k8s_drain:
        node_name: n1
        state: uncordoned
      ignore_errors: true
"""


def test_module_defaults_of_each_group_reach_a_module_of_it(tmp_path):
    res = run_playbook(PLAYBOOK, tmp_path)
    assert res.data, res.stdout[-3000:] + res.stderr[-3000:]
    k8s = res.result("A k8s module by its full name")
    assert "/nonexistent/from-the-k8s-group" in k8s["msg"], k8s
    every = res.result("A k8s module through the larger group")
    assert "/nonexistent/from-the-cpupools-group" in every["msg"], every


def test_the_groups_hold_every_module_and_k8s_the_ones_that_talk_to_the_api_server():
    groups = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["action_groups"]
    modules = {p.stem for p in (REPO / "plugins" / "modules").glob("*.py")}
    kube = {p.stem for p in (REPO / "plugins" / "modules").glob("*.py") if "cpupools_kube" in p.read_text()}
    assert set(groups["k8s"]) == kube
    extends = [e["metadata"]["extend_group"] for e in groups["cpupools"] if isinstance(e, dict)]
    assert extends == [["k8s"]]
    assert {m for m in groups["cpupools"] if isinstance(m, str)} | set(groups["k8s"]) == modules
