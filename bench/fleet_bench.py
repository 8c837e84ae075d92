#!/usr/bin/env python3
"""Benchmark: site.yml against a simulated fleet.

N hosts (default 50), each with the local connection and its own fixture root
(a 2-socket 88-CPU topology, with a sandbox to write into). Runs site.yml
twice and prints, for each run: wall time, tasks per host, and changed tasks.
The re-run must report zero changed; the script exits 1 when it does not.

    .venv/bin/python bench/fleet_bench.py [--hosts 50] [--forks 10] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "plugins" / "module_utils"), str(REPO / "tests" / "fixtures")]

from sysfs import Spec, write_tree  # noqa: E402


def make_fleet(base: Path, hosts: int) -> Path:
    topology = base / "topology"
    write_tree(str(topology), Spec(sockets=2, cores_per_socket=22, threads=2))
    lines = ["all:", "  children:", "    cpupools_nodes:", "      hosts:"]
    for i in range(hosts):
        name = f"node{i:03d}"
        lines += [
            f"        {name}:",
            "          ansible_connection: local",
            f"          ansible_python_interpreter: {sys.executable}",
            f"          cpupools_facts_root: {topology}",
            f"          cpupools_root: {base / 'roots' / name}",
        ]
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
    return inventory


def run(inventory: Path, forks: int) -> tuple[float, dict]:
    env = dict(os.environ)
    env.update(
        {
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
            "ANSIBLE_FORKS": str(forks),
        }
    )
    start = time.perf_counter()
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(REPO / "site.yml")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"site.yml failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall, json.loads(proc.stdout[proc.stdout.index("{") :])


def summarise(label: str, wall: float, data: dict, hosts: int) -> int:
    stats = data["stats"]
    changed = sum(s["changed"] for s in stats.values())
    per_host = Counter()
    executed = Counter()
    for play in data["plays"]:
        for task in play["tasks"]:
            for host, res in task["hosts"].items():
                per_host[host] += 1
                if not res.get("skipped"):
                    executed[host] += 1
    tasks = sum(per_host.values()) / max(len(per_host), 1)
    ran = sum(executed.values()) / max(len(executed), 1)
    changed_tasks = Counter()
    for play in data["plays"]:
        for task in play["tasks"]:
            if any(r.get("changed") for r in task["hosts"].values()):
                changed_tasks[task["task"]["name"]] += 1
    print(
        f"{label}: wall {wall:.1f} s for {hosts} hosts ({wall / hosts * 1000:.0f} ms/host); "
        f"{tasks:.1f} tasks per host ({ran:.1f} not skipped); {changed} changed"
    )
    for name, n in sorted(changed_tasks.items()):
        print(f"    changed: {name} ({n} hosts)")
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--forks", type=int, default=10)
    parser.add_argument("--keep", type=Path, help="build the fleet in DIR and keep it")
    args = parser.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="cpupools-fleet-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        inventory = make_fleet(base, args.hosts)
        print(f"fleet: {args.hosts} hosts, forks {args.forks}, 2 sockets x 22 cores SMT2 each; {os.cpu_count()} CPUs")
        wall, data = run(inventory, args.forks)
        summarise("first run", wall, data, args.hosts)
        wall, data = run(inventory, args.forks)
        changed = summarise("re-run   ", wall, data, args.hosts)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    if changed:
        print("re-run changed something: not idempotent")
        sys.exit(1)


if __name__ == "__main__":
    main()
