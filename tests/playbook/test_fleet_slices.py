"""A fleet run in slices adds up to one fleet (issue 30).

Three local hosts, each with its own root. One ``ansible-playbook site.yml``
over all of them leaves its report data in one store; the same fleet run
again as two ``--limit`` shards through ``ansible-runner`` (the engine AWX and
AAP run jobs with) leaves its data in another, and ``playbooks/fleet_report.yml``
renders the whole fleet from that store alone. The two reports are the same,
text and HTML, but for when each host's data was taken and by which run.
Then a bad value on a host of the second shard refuses the first shard's
run before anything is written, on any host.

One fleet, five runs, shared by every test here.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import ansible_runner
import pytest
import yaml
from helpers import REPO, ansible_env, run_playbook, tree_snapshot

pytestmark = pytest.mark.slow

TOPOLOGY = REPO / "inventories" / "local" / "topology"
HOSTS = {"node-1": 2, "node-2": 3, "node-3": 4}  # host -> exclusive cores: three different reports
SHARDS = ("node-1", "node-2:node-3")
REPORT_TASK = "Render the fleet report"


def write_inventory(base: Path, bad: dict | None = None) -> Path:
    hosts = {
        name: {
            "ansible_connection": "local",
            "ansible_python_interpreter": "{{ ansible_playbook_python }}",
            "cpupools_facts_root": str(TOPOLOGY),
            "cpupools_root": str(base / "roots" / name),
            "cpupools_kernel_args_backend": "grub",
            "cpupools_num_exclusive_cores": cores,
        }
        for name, cores in HOSTS.items()
    }
    for name, values in (bad or {}).items():
        hosts[name].update(values)
    path = base / ("bad.yml" if bad else "fleet.yml")
    path.write_text(yaml.safe_dump({"all": {"children": {"cpupools_nodes": {"hosts": hosts}}}}))
    return path


def runner(base: Path, name: str, playbook: str, inventory: Path, limit: str | None, extravars: dict):
    """``ansible-runner`` as AWX runs a job: a private data directory, the project, an inventory, a limit."""
    private = base / "runner" / name
    private.mkdir(parents=True)
    # The runner's own stdout callback gives the events; the project's settings and the venv's PATH go in.
    env = {k: v for k, v in ansible_env().items() if k.startswith("ANSIBLE_") or k == "PATH"}
    del env["ANSIBLE_STDOUT_CALLBACK"]
    run = ansible_runner.run(
        private_data_dir=str(private),
        project_dir=str(REPO),
        playbook=str(REPO / playbook),
        inventory=str(inventory),
        limit=limit,
        extravars=extravars,
        envvars=env,
        quiet=True,
        timeout=600,
    )
    return run


def runner_result(run, task: str) -> dict | None:
    """The result of the last task called ``task`` in a runner's events (``runner_on_ok`` or ``_failed``)."""
    found = None
    for event in run.events:
        data = event.get("event_data", {})
        if event.get("event") in ("runner_on_ok", "runner_on_failed") and data.get("task", "").endswith(task):
            found = dict(data["res"], event=event["event"])  # the runner leaves "failed" out of res
    return found


def single_result(res) -> dict:
    for play in res.data["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"].endswith(REPORT_TASK):
                return next(iter(task["hosts"].values()))
    raise AssertionError(f"no report task ran: {res.stdout[-2000:]}")


#: In the report data section: when a host's data was taken, its age, and which run it came from.
TIMES = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ|\b\d+[smhd]( \d+[mh])?\b")


def mask(lines: list[str]) -> list[str]:
    """The report with the report data section's times, ages, runs and store path masked (two stores here)."""
    out = []
    data = False
    for line in lines:
        data = data or line.startswith("report data: ")
        if data:
            line = TIMES.sub("<time>", line)
            line = re.sub(r"by \d+ run\(s\) \(store [^)]*\)", "by <n> run(s) (store <store>)", line)
            line = re.sub(r"<time>\s+<time>\s+\S.*$", "<time> <time> <run>", line)  # a row: host, taken, age, run
            line = re.sub(r"\s+", " ", line)  # column widths follow the ages
        out.append(line.rstrip())
    return out


def mask_html(page: str) -> str:
    page = re.sub(r'(<section class="store" id="store">).*?(</section>)', r"\1\2", page, flags=re.S)
    return page


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    base = tmp_path_factory.mktemp("slices")
    inventory = write_inventory(base)
    one, sliced = base / "store-one", base / "store-sliced"
    single = run_playbook(
        REPO / "site.yml",
        base,
        {"cpupools_report_store": str(one), "cpupools_report_html": str(base / "one.html")},
        inventory=str(inventory),
    )
    assert single.rc == 0, single.stdout[-3000:] + single.stderr[-3000:]
    shards = []
    for number, limit in enumerate(SHARDS, 1):
        extravars = {"cpupools_report_store": str(sliced), "cpupools_report_html": str(base / f"shard-{number}.html")}
        run = runner(base, f"shard-{number}", "site.yml", inventory, limit, extravars)
        assert run.rc == 0, run.stdout.read()[-3000:]
        shards.append(run)
    merged = runner(
        base,
        "fleet-report",
        "playbooks/fleet_report.yml",
        inventory,
        None,
        {"cpupools_report_store": str(sliced), "cpupools_report_html": str(base / "merged.html")},
    )
    assert merged.rc == 0, merged.stdout.read()[-3000:]
    return {
        "base": base,
        "inventory": inventory,
        "one": one,
        "sliced": sliced,
        "single": single_result(single),
        "shards": shards,
        "merged": runner_result(merged, REPORT_TASK),
    }


def test_the_merged_report_of_the_slices_equals_the_report_of_one_run(fleet):
    single, merged = fleet["single"], fleet["merged"]
    assert merged is not None
    # The hosts' blocks and the fleet line are the same, byte for byte; the report data section
    # differs only in when each host's data was taken and by which run.
    assert mask(merged["lines"]) == mask(single["lines"])
    assert merged["store"]["reported"] == list(HOSTS)
    assert merged["store"]["missing"] == [] and merged["store"]["unreadable"] == []
    assert "report data: 3 of 3 host(s) in the inventory reported, by 2 run(s)" in merged["text"]
    assert "report data: 3 of 3 host(s) in the inventory reported, by 1 run(s)" in single["text"]
    assert merged["hosts"] == single["hosts"]
    # The page model: the HTML page, but for its report data section.
    one_page = (fleet["base"] / "one.html").read_text()
    merged_page = (fleet["base"] / "merged.html").read_text()
    assert mask_html(merged_page) == mask_html(one_page)
    assert 'id="store"' in merged_page and "node-3" in merged_page
    # The store's report data, host by host, is the same data.
    for host in HOSTS:
        a = json.loads((fleet["one"] / f"{host}.json").read_text())
        b = json.loads((fleet["sliced"] / f"{host}.json").read_text())
        assert a["report"] == b["report"], host
        assert a["taken"] != "" and b["taken_epoch"] >= a["taken_epoch"]


def test_each_shard_reports_the_hosts_so_far_and_names_the_others(fleet):
    first = runner_result(fleet["shards"][0], REPORT_TASK)
    assert first["store"]["reported"] == ["node-1"], first["store"]
    assert first["store"]["missing"] == ["node-2", "node-3"]
    assert "2 not reported by any run (node-2, node-3)" in first["text"]
    second = runner_result(fleet["shards"][1], REPORT_TASK)
    assert second["store"]["reported"] == list(HOSTS) and second["store"]["missing"] == []
    # Each host's file says which run it came from: the shard's --limit.
    runs = {h: json.loads((fleet["sliced"] / f"{h}.json").read_text())["run"] for h in HOSTS}
    assert runs["node-1"].endswith("--limit node-1"), runs
    assert runs["node-2"].endswith("--limit node-2:node-3") and runs["node-3"] == runs["node-2"], runs


def test_a_bad_value_on_a_host_of_another_slice_refuses_before_anything_is_written(fleet):
    base = fleet["base"]
    bad = write_inventory(base, {"node-3": {"cpupools_num_shared_cores": "many"}})
    before = {host: tree_snapshot(base / "roots" / host) for host in HOSTS}
    store_before = tree_snapshot(fleet["sliced"])
    # The first shard's run (node-1 only) under ansible-runner, with a bad value on node-3 of the second.
    run = runner(base, "bad-shard-1", "site.yml", bad, "node-1", {"cpupools_report_store": str(fleet["sliced"])})
    assert run.rc != 0
    refusal = runner_result(run, "Check the cpupools values of every host of the inventory")
    assert refusal is not None and refusal["event"] == "runner_on_failed", refusal
    assert "host node-3: cpupools_num_shared_cores: 'many' is not an integer" in refusal["msg"], refusal["msg"]
    assert refusal["checked"] == 3
    planned = [e for e in run.events if e.get("event_data", {}).get("task", "").endswith("Plan the CPU pools")]
    assert not [e for e in planned if e["event"].startswith("runner_on_")], "the plan play ran"
    for host in HOSTS:
        assert tree_snapshot(base / "roots" / host) == before[host], host
    assert tree_snapshot(fleet["sliced"]) == store_before
    # playbooks/check.yml, as a workflow's first node runs it: the same refusal, on the controller alone.
    check = run_playbook(REPO / "playbooks" / "check.yml", base, None, inventory=str(bad))
    assert check.rc != 0
    assert "host node-3: cpupools_num_shared_cores" in check.messages(), check.messages()
    assert list(check.stats) == ["localhost"], check.stats
    shutil.rmtree(base / "runner" / "bad-shard-1")
