#!/usr/bin/env python3
"""Benchmark: site.yml against a simulated fleet, compared with the floor of any Ansible run.

N hosts (default 20), each with the local connection, the embedded default
inventory's 2-socket 88-CPU topology as its facts root and its own sandbox
root. Each round builds a fresh fleet and times, with the same hosts and forks:

- the first run of site.yml (everything to do),
- the converged re-run (nothing to do; it must report zero changed),
- a playbook of one ``ansible.builtin.ping`` per host (the floor),

and prints the times, the re-run / ping ratio, and per host the tasks and the
module executions (results of tasks that ran a module on the node or the
controller, not set_fact / assert / debug / group_by / meta). Then it times
the converged re-run of the same fleet with one host replaced by a 1,024-CPU
host (fixture 8s64c-smt2) and by a 16-CPU host (1s8c-smt2): the big host must
cost no more than the small one.

``--repo DIR`` runs another checkout's site.yml (for example a ``git worktree``
of main, to measure "today") with the same fleet. Exits 1 when a re-run
changed something.

``--mitogen DIR`` runs every playbook under mitogen's ``mitogen_linear``
strategy (DIR holds the ``ansible_mitogen`` package, for example an unpacked
wheel; nothing is installed).

    .venv/bin/python bench/fleet_bench.py [--hosts 20] [--forks 10] [--rounds 3] [--repo DIR] [--mitogen DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(HERE / "plugins" / "module_utils"), str(HERE / "tests" / "fixtures")]

from sysfs import CORPUS, write_tree  # noqa: E402

#: Actions that run on the controller without executing a module.
CONTROLLER_ACTIONS = {
    "set_fact",
    "assert",
    "debug",
    "group_by",
    "meta",
    "include_tasks",
    "import_tasks",
    "include_role",
    "validate_argument_spec",
    "add_host",
}

PING = """---
- name: Ping every host
  hosts: cpupools_nodes
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
"""


def make_fleet(base: Path, hosts: int, odd: tuple[str, Path] | None = None) -> Path:
    """The inventory of ``hosts`` hosts; ``odd`` = (fixture name, its tree) replaces the first host's topology."""
    base.mkdir(parents=True, exist_ok=True)
    topology = HERE / "inventories" / "local" / "topology"
    lines = ["all:", "  children:", "    cpupools_nodes:", "      hosts:"]
    for i in range(hosts):
        name = f"node{i:03d}"
        lines += [
            f"        {name}:",
            "          ansible_connection: local",
            f"          ansible_python_interpreter: {sys.executable}",
            f"          cpupools_facts_root: {odd[1] if odd and i == 0 else topology}",
            f"          cpupools_root: {base / 'roots' / name}",
        ]
        if odd and i == 0 and odd[0] == "1s8c-smt2":
            lines += ["          cpupools_num_exclusive_cores: 4", "          cpupools_num_shared_cores: 1"]
    lines += [
        "  vars:",
        "    cpupools_num_exclusive_cores: 8",
        "    cpupools_exclusive_mode: spread",
        "    cpupools_num_shared_cores: 2",
        f"    cpupools_report_html: {base / 'report.html'}",
        "    cpupools_report_print: false",
        "    cpupools_kernel_args_backend: grub",
    ]
    inventory = base / "hosts.yml"
    inventory.write_text("\n".join(lines) + "\n")
    (base / "ping.yml").write_text(PING)
    return inventory


#: Extra environment of every run (--mitogen sets its strategy).
EXTRA_ENV: dict[str, str] = {}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(repo: Path, inventory: Path, playbook: Path, forks: int) -> tuple[float, dict]:
    """Wall time and the JSON callback's output; the CPU seconds of the run (controller and the
    local "nodes" together) are in ``data["cpu"]``."""
    env = dict(os.environ)
    env.update(
        {
            "ANSIBLE_CONFIG": str(repo / "ansible.cfg"),
            "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
            "ANSIBLE_FORKS": str(forks),
            **EXTRA_ENV,
        }
    )
    cpu = children_cpu()
    start = time.perf_counter()
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(playbook)],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{playbook} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    data = json.loads(proc.stdout[proc.stdout.index("{") :])
    data["cpu"] = children_cpu() - cpu
    return wall, data


def counts(data: dict, hosts: int) -> tuple[float, float, int, float]:
    """Tasks per host (every result, skipped included), module executions per host, changed results, CPU s/host."""
    tasks = modules = 0
    for play in data["plays"]:
        for task in play["tasks"]:
            for res in task["hosts"].values():
                tasks += 1
                action = str(res.get("action", "")).rpartition(".")[2]
                if not res.get("skipped") and action not in CONTROLLER_ACTIONS:
                    modules += 1
    changed = sum(s["changed"] for s in data["stats"].values())
    return tasks / hosts, modules / hosts, changed, data["cpu"] / hosts


def one_round(repo: Path, base: Path, hosts: int, forks: int) -> dict:
    inventory = make_fleet(base, hosts)
    out = {}
    for label in ("first", "rerun"):
        wall, data = run(repo, inventory, repo / "site.yml", forks)
        out[label] = (wall, *counts(data, hosts))
    wall, data = run(repo, inventory, base / "ping.yml", forks)
    out["ping"] = (wall, *counts(data, hosts))
    return out


def big_host(repo: Path, base: Path, hosts: int, forks: int, rounds: int) -> dict[str, list[float]]:
    """Converged re-run times of the fleet with its first host a 16-CPU and a 1,024-CPU node."""
    times: dict[str, list[float]] = {"1s8c-smt2": [], "8s64c-smt2": []}
    trees = {name: Path(write_tree(str(base / "corpus" / name), CORPUS[name])) for name in times}
    for name in times:
        fleet = base / name
        inventory = make_fleet(fleet, hosts, (name, trees[name]))
        run(repo, inventory, repo / "site.yml", forks)
    for _ in range(rounds):
        for name in times:  # interleaved: both see the same load
            wall, data = run(repo, base / name / "hosts.yml", repo / "site.yml", forks)
            if counts(data, hosts)[2]:
                sys.exit(f"re-run with {name} changed something: not idempotent")
            times[name].append(wall)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--forks", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repo", type=Path, default=HERE, help="checkout whose site.yml runs (default: this one)")
    parser.add_argument("--no-big", action="store_true", help="skip the 1,024-CPU host comparison")
    parser.add_argument("--big-hosts", type=int, help="hosts of the fleets of that comparison (default: --hosts)")
    parser.add_argument("--keep", type=Path, help="build the fleets in DIR and keep them")
    parser.add_argument(
        "--mitogen", type=Path, help="run under mitogen_linear from DIR (the directory holding ansible_mitogen)"
    )
    args = parser.parse_args()
    if args.mitogen:
        EXTRA_ENV.update(
            ANSIBLE_STRATEGY_PLUGINS=str(args.mitogen.resolve() / "ansible_mitogen" / "plugins" / "strategy"),
            ANSIBLE_STRATEGY="mitogen_linear",
        )
    repo = args.repo.resolve()
    base = args.keep or Path(tempfile.mkdtemp(prefix="cpupools-fleet-"))
    base.mkdir(parents=True, exist_ok=True)
    print(
        f"fleet: {args.hosts} hosts, forks {args.forks}, {args.rounds} rounds, 2 sockets x 22 cores SMT2 each; "
        f"{os.cpu_count()} CPUs; site.yml of {repo}{'; mitogen_linear' if args.mitogen else ''}"
    )
    failed = False
    try:
        rounds = [one_round(repo, base / f"round{i}", args.hosts, args.forks) for i in range(args.rounds)]
        for label in ("first", "rerun", "ping"):
            walls = [r[label][0] for r in rounds]
            _, tasks, modules, changed, _ = rounds[-1][label]
            cpu = statistics.median(r[label][4] for r in rounds)
            print(
                f"{label:6}: wall {statistics.median(walls):6.1f} s median of {', '.join(f'{w:.1f}' for w in walls)}; "
                f"{tasks:5.1f} tasks/host, {modules:5.1f} module executions/host, {cpu:.2f} CPU s/host, "
                f"{changed} changed"
            )
            failed |= label == "rerun" and any(r["rerun"][3] for r in rounds)
        ratios = [r["rerun"][0] / r["ping"][0] for r in rounds]
        print(f"re-run / ping: {statistics.median(ratios):.2f} (per round: {', '.join(f'{x:.2f}' for x in ratios)})")
        if not args.no_big:
            times = big_host(repo, base / "big", args.big_hosts or args.hosts, args.forks, args.rounds)
            small, big = statistics.median(times["1s8c-smt2"]), statistics.median(times["8s64c-smt2"])
            print(
                f"converged re-run of {args.big_hosts or args.hosts} hosts, the first with 16 CPUs: {small:.1f} s; "
                f"with 1,024 CPUs: {big:.1f} s "
                f"(difference {big - small:+.1f} s, {(big - small) / small * 100:+.0f} %)"
            )
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    if failed:
        print("re-run changed something: not idempotent")
        sys.exit(1)


if __name__ == "__main__":
    main()
