#!/usr/bin/env python3
"""Benchmark: site.yml against a simulated fleet, compared with the floor of any Ansible run.

Simulated hosts use the local connection, the embedded default inventory's
2-socket 88-CPU topology as their facts root and each its own sandbox root.
Each fleet's copy of that topology has a running kernel's release
(``proc/sys/kernel/osrelease``) and each root that kernel's config
(``boot/config-<release>``: this machine's from ``/proc/config.gz`` where it
is readable, its size that of a real one, with the two options the plan
needs on; else those two lines): what a real node has. The embedded
inventory's topology has neither, and there every converged host warned
twice (the release unknown, the config not found), warnings a real fleet
does not see and whose handling costs each host's worker and the main
process. Each run's line says how many warnings its results carried.
For each fleet size of ``--hosts`` (default 20; for example ``20,200,1000``)
and each round it times, with the same hosts and forks:

- the converged re-run of site.yml (nothing to do; it must report zero
  changed),
- a playbook of one ``ansible.builtin.ping`` per host (the floor),

and prints the wall times, the re-run / ping ratio, per host the tasks and
the module executions (results of tasks that ran a module on the node or the
controller, not set_fact / assert / debug / group_by / meta), the CPU seconds
of the whole run (controller and local "nodes") and of ansible-playbook's
main process alone, whose work per host is serial (the strategy, the results,
the callbacks, the forking of workers: bench/callback/bench_json.py reads it
in that process at the end of the run), the controller's CPU (that process
and every task's worker, not the modules the workers run: a real fleet's
nodes run those; each worker writes its own time as it ends), and their
ratios to ping's. Between
two fleet sizes it prints the main process's CPU per added host (the slope),
which is what a larger fleet adds.

The fleets are converged without a first run per host: one first run of
site.yml on a seed fleet of ``--first-hosts`` hosts (default 20; its time is
printed), then every host of every fleet gets a copy of the seed's first root
(its one host-specific file, the reconcile service naming the node, is
rewritten; the large files are hard links). The re-run proves the copies
converged: it fails the bench when it changes anything, and its module
executions per host show whether a stage play ran. So 1,000 hosts take
minutes on 2 cores, not the hour a first run of each would. Each copy gets
the seed's record of what its last result named as well (``build/hosts/``
of the checkout, plugin_utils/digest_store.py), as a first run of each
host would have left it: the first round is then the first converged re-run
after a run that changed the fleet, not a controller that never saw it
(where the checkout's digest store is not this one's, for an older
``--repo``, none is written, and the bench says so).

Then, unless ``--no-big``, it times the converged re-run of a fleet of
``--big-hosts`` hosts (default 20; real first runs) with one host replaced by
a 1,024-CPU host (fixture 8s64c-smt2) and by a 16-CPU host (1s8c-smt2): the
big host must cost no more than the small one.

``--sizes`` adds one converged re-run of the smallest fleet that measures the
JSON size of each task's result per host (not timed: measuring costs the
main process CPU).

``--repo DIR`` runs another checkout's site.yml (for example a ``git
worktree`` of main, to measure "before") with the same fleets. Exits 1 when a
re-run changed something. Needs only the run set (requirements-run.txt, the
``.venv`` of ``./scripts/run.sh``).

``--mitogen DIR`` runs every playbook under mitogen's ``mitogen_linear``
strategy (DIR holds the ``ansible_mitogen`` package, for example an unpacked
wheel; nothing is installed).

    .venv/bin/python bench/fleet_bench.py [--hosts 20,200,1000] [--rounds 3] [--forks 10] [--first-hosts 20]
        [--sizes] [--no-big] [--repo DIR] [--mitogen DIR] [--keep DIR] [--ansible-bin DIR ...]

``--ansible-bin DIR`` (repeatable) runs every round of the fleets a second
time with ``DIR/ansible-playbook``, another virtual environment's (for
example ansible-core 2.19 beside the pinned 2.21), interleaved with this
one's, and prints each core's figures and ratios: two cores compared in one
run. The seed's first run and the 1,024-CPU comparison use this one's.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
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
sys.path[:0] = [str(HERE / "plugins" / "module_utils"), str(HERE / "tests" / "fixtures"), str(HERE / "collections")]

from ansible_collections.cpupools.cpupools.plugins.plugin_utils import digest_store  # noqa: E402
from sysfs import CORPUS, write_tree  # noqa: E402

PING = """---
- name: Ping every host
  hosts: cpupools_nodes
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
"""

#: The seed's files at least this large are hard links in the copies (cmk.pyz, cmk): small ones, the
#: lock file among them, are copied, so that no two hosts share a file they open for writing.
LINK_SIZE = 64 * 1024

#: The kernel the simulated nodes run (Debian 13's): its release and its config, as a real node has them.
RELEASE = "6.12.57+deb13-amd64"
#: The options the plan's kernel arguments need (node/kargs.py), on in the nodes' kernel config.
CONFIG_ON = ("CONFIG_NO_HZ_FULL", "CONFIG_RCU_NOCB_CPU")


def with_release(facts_root: Path) -> Path:
    """``facts_root`` with the running kernel's release (``RELEASE``), as a node's /proc has it."""
    release = facts_root / "proc" / "sys" / "kernel" / "osrelease"
    release.parent.mkdir(parents=True, exist_ok=True)
    release.write_text(RELEASE + "\n")
    return facts_root


def node_topology(base: Path) -> Path:
    """The fleet's facts root: the embedded inventory's topology and the running kernel's release."""
    topology = base / "topology"
    if not topology.exists():
        shutil.copytree(HERE / "inventories" / "local" / "topology", topology, symlinks=True)
    return with_release(topology)  # a fleet kept (--keep) from a bench before the release was written gets it too


def kernel_config() -> str:
    """The nodes' kernel config: this machine's (``/proc/config.gz``) with ``CONFIG_ON`` on, else only those."""
    try:
        with gzip.open("/proc/config.gz", "rt") as config:
            lines = config.read().splitlines()
    except OSError:
        lines = []
    wanted = {f"# {option} is not set": f"{option}=y" for option in CONFIG_ON}
    lines = [wanted.get(line, line) for line in lines]
    lines += [f"{option}=y" for option in CONFIG_ON if f"{option}=y" not in lines]
    return "\n".join(lines) + "\n"


def with_kernel_config(base: Path, hosts: int) -> None:
    """Give each of the ``hosts`` roots of the fleet in ``base`` the kernel's config, before its first run."""
    text = kernel_config()
    for i in range(hosts):
        config = base / "roots" / f"node{i:04d}" / "boot" / f"config-{RELEASE}"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(text)


def make_fleet(base: Path, hosts: int, odd: tuple[str, Path] | None = None) -> Path:
    """The inventory of ``hosts`` hosts; ``odd`` = (fixture name, its tree) replaces the first host's topology."""
    base.mkdir(parents=True, exist_ok=True)
    topology = node_topology(base)
    lines = ["all:", "  children:", "    cpupools_nodes:", "      hosts:"]
    for i in range(hosts):
        name = f"node{i:04d}"
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


def clone_roots(seed: Path, base: Path, hosts: int) -> None:
    """Give each host of the fleet in ``base`` a copy of the converged root ``seed`` (node0000's)."""
    for i in range(hosts):
        name = f"node{i:04d}"
        target = base / "roots" / name
        if target.exists():
            continue
        shutil.copytree(
            seed,
            target,
            symlinks=True,
            copy_function=lambda src, dst: (
                os.link(src, dst) if os.path.getsize(src) >= LINK_SIZE else shutil.copy2(src, dst)
            ),
        )
        for path in target.rglob("*"):
            if path.is_file() and not path.is_symlink() and path.stat().st_size < LINK_SIZE:
                text = path.read_bytes()
                if b"node0000" in text:
                    stat = path.stat()
                    path.write_bytes(text.replace(b"node0000", name.encode()))
                    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def clone_records(repo: Path, hosts: int) -> int | None:
    """Give each host without one the seed's (node0000's) record in ``repo``'s work directory; how many were
    written, or None where ``repo``'s digest store is not this checkout's (another format, or none)."""
    store = Path("plugins", "plugin_utils", "digest_store.py")
    if not (repo / store).is_file() or (repo / store).read_bytes() != (HERE / store).read_bytes():
        return None
    work = str(repo)  # cpupools_work_dir "auto": a checkout's own directory (plugins/plugin_utils/work_dir.py)
    names = digest_store.named(work, "node0000")
    if not names:
        return 0
    written = 0
    for i in range(1, hosts):
        name = f"node{i:04d}"
        if not digest_store.named(work, name):
            digest_store.remember(work, name, names)
            written += 1
    return written


#: The task that writes the fleet's HTML report (changed on the first re-run of a new fleet: no file yet).
REPORT_TASK = "cpupools_report : Render the fleet report"
PLAN_TASK = "Plan the CPU pools"  # playbooks/plan.yml runs the role's tasks without the role

#: Extra environment of every run (--mitogen sets its strategy).
EXTRA_ENV: dict[str, str] = {}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


#: bin directories whose ansible-playbook the fleets' rounds run, interleaved (--ansible-bin adds to this one).
BINS = [Path(sys.executable).parent]


def core_version(bin_dir: Path) -> str:
    """``ansible-core X.Y.Z on Python A.B`` of a bin directory."""
    said = subprocess.run([str(bin_dir / "ansible"), "--version"], capture_output=True, text=True, check=True).stdout
    core = said.split("[core ", 1)[1].split("]", 1)[0]
    python = subprocess.run(
        [str(bin_dir / "python"), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return f"ansible-core {core} on Python {python}"


def run(
    repo: Path, inventory: Path, playbook: Path, forks: int, *extra: str, sizes: bool = False, bin_dir: Path = BINS[0]
) -> tuple[float, dict]:
    """Wall time and the bench callback's output (bench/callback/bench_json.py); the CPU seconds of the
    whole run (controller and the local "nodes" together) are in ``data["cpu"]``, the main process's in
    ``data["main"]``. ``bin_dir``: whose ansible-playbook runs."""
    env = dict(os.environ)
    workers_file = Path(tempfile.mkdtemp(prefix="cpupools-bench-")) / "workers"
    env.update(
        {
            "ANSIBLE_CONFIG": str(repo / "ansible.cfg"),
            "ANSIBLE_CALLBACK_PLUGINS": str(HERE / "bench" / "callback"),
            "ANSIBLE_STDOUT_CALLBACK": "bench_json",
            "ANSIBLE_FORKS": str(forks),
            "CPUPOOLS_BENCH_SIZES": "1" if sizes else "0",
            "CPUPOOLS_BENCH_WORKERS": str(workers_file),
            **EXTRA_ENV,
        }
    )
    cpu = children_cpu()
    start = time.perf_counter()
    proc = subprocess.run(
        [str(bin_dir / "ansible-playbook"), "-i", str(inventory), str(playbook), *extra],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{playbook} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    data["cpu"] = children_cpu() - cpu
    data["main"] = data["main_cpu"]["user"] + data["main_cpu"]["system"]
    data["work"] = data["main"] - data.get("main_wait", 0.0)
    data["workers"] = worker_seconds(workers_file)
    return wall, data


def worker_seconds(path: Path) -> float:
    """The CPU seconds of every worker of the run, from the bench callback's file (``_measure_workers``); removed."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        lines = []  # no worker ended (a run of no task)
    shutil.rmtree(path.parent, ignore_errors=True)
    return sum(float(line.rpartition("\t")[2]) for line in lines)


def measures(wall: float, data: dict, hosts: int) -> dict:
    """Wall time; per host: tasks (every result, skipped included), module executions, CPU s of the
    whole run and of the main process; changed results."""
    return {
        "wall": wall,
        "tasks": data["tasks"] / hosts,
        "modules": data["modules"] / hosts,
        "cpu": data["cpu"] / hosts,
        "main": data["main"] / hosts,
        "work": data["work"] / hosts,
        "controller": (data["main"] + data["workers"]) / hosts,
        "main_total": data["main"],
        "changed": data["changed"],
        "changed_tasks": data["changed_tasks"],
        "warnings": data.get("warnings", 0),
        "task_seconds": data.get("task_seconds", {}),
        "serial": serial_seconds(data, hosts),
    }


def serial_seconds(data: dict, hosts: int) -> float:
    """Wall seconds of the tasks that ran once for the play (one result in a fleet of more hosts): one worker
    works while the main process waits, whatever the controller's cores (docs/performance.md)."""
    results = data.get("task_results", {})
    if hosts < 2:
        return 0.0
    return sum(seconds for name, seconds in data.get("task_seconds", {}).items() if results.get(name) == 1)


def seed_fleet(repo: Path, base: Path, hosts: int, forks: int) -> tuple[Path, dict]:
    """A fleet of ``hosts`` hosts after a real first run of site.yml: node0000's root, and that run's measures."""
    inventory = make_fleet(base, hosts)
    with_kernel_config(base, hosts)
    wall, data = run(repo, inventory, repo / "site.yml", forks)
    return base / "roots" / "node0000", measures(wall, data, hosts)


def fleet_rounds(repo: Path, base: Path, seed: Path, hosts: int, forks: int, rounds: int) -> dict[Path, list[dict]]:
    """Rounds of (converged re-run, ping) over a fleet of ``hosts`` copies of the seed's root, for each of
    ``BINS`` in turn within a round (interleaved: each core sees the same load)."""
    inventory = make_fleet(base, hosts)
    clone_roots(seed, base, hosts)
    records = clone_records(repo, hosts)
    print(
        f"{hosts} hosts: "
        + (
            "no record of the seed's copied (the checkout's digest store is another)"
            if records is None
            else f"the seed's record of its last result copied to {records} hosts without one"
        ),
        flush=True,
    )
    out: dict[Path, list[dict]] = {bin_dir: [] for bin_dir in BINS}
    for i in range(rounds):
        for bin_dir in BINS:
            row = {}
            wall, data = run(repo, inventory, repo / "site.yml", forks, bin_dir=bin_dir)
            row["rerun"] = measures(wall, data, hosts)
            if i == 0 and set(data["changed_tasks"]) <= {REPORT_TASK}:
                row["rerun"]["changed"] = 0  # the fleet's report file is new: written once, on the first round
            wall, data = run(repo, inventory, base / "ping.yml", forks, bin_dir=bin_dir)
            row["ping"] = measures(wall, data, hosts)
            out[bin_dir].append(row)
    return out


def result_sizes(repo: Path, base: Path, forks: int, hosts: int) -> dict:
    """JSON bytes per host of each task's results in a converged re-run (bench_json with sizes on)."""
    _, data = run(repo, base / "hosts.yml", repo / "site.yml", forks, sizes=True)
    return data["sizes"]


def big_host(repo: Path, base: Path, hosts: int, forks: int, rounds: int) -> dict[str, list[float]]:
    """Converged re-run times of the fleet with its first host a 16-CPU and a 1,024-CPU node."""
    times: dict[str, list[float]] = {"1s8c-smt2": [], "8s64c-smt2": []}
    trees = {name: with_release(Path(write_tree(str(base / "corpus" / name), CORPUS[name]))) for name in times}
    for name in times:
        fleet = base / name
        inventory = make_fleet(fleet, hosts, (name, trees[name]))
        with_kernel_config(fleet, hosts)
        run(repo, inventory, repo / "site.yml", forks)
    for _ in range(rounds):
        for name in times:  # interleaved: both see the same load
            wall, data = run(repo, base / name / "hosts.yml", repo / "site.yml", forks)
            if data["changed"]:
                sys.exit(f"re-run with {name} changed something: not idempotent")
            times[name].append(wall)
    return times


def median(rows: list[dict], label: str, key: str) -> float:
    return statistics.median(r[label][key] for r in rows)


def report_fleet(hosts: int, rows: list[dict]) -> None:
    for label in ("rerun", "ping"):
        last = rows[-1][label]
        walls = ", ".join(f"{r[label]['wall']:.1f}" for r in rows)
        print(
            f"  {label:5}: wall {median(rows, label, 'wall'):6.1f} s (rounds: {walls}); "
            f"{last['tasks']:4.1f} tasks/host, {last['modules']:4.1f} module executions/host; "
            f"CPU s/host {median(rows, label, 'cpu'):.3f} all, {median(rows, label, 'main'):.3f} main process; "
            f"{last['changed']} changed {last['changed_tasks'] if last['changed'] else ''}; "
            f"{last['warnings']} warnings"
        )
    slowest = sorted(rows[-1]["rerun"]["task_seconds"].items(), key=lambda kv: -kv[1])[:4]
    print("  re-run's longest tasks: " + "; ".join(f"{name} {seconds:.1f} s" for name, seconds in slowest))
    serial = median(rows, "rerun", "serial")
    main_total = median(rows, "rerun", "main_total")
    print(
        f"  re-run's serial part: tasks run once for the play {serial:.1f} s, main process {main_total:.1f} CPU s; "
        f"per host {(serial + main_total) / hosts * 1000:.1f} ms (at most: they overlap a little)"
    )
    ratio = [r["rerun"]["wall"] / r["ping"]["wall"] for r in rows]
    main = [r["rerun"]["main"] / r["ping"]["main"] for r in rows]
    work = [r["rerun"]["work"] / r["ping"]["work"] for r in rows]
    cpu = [r["rerun"]["cpu"] / r["ping"]["cpu"] for r in rows]

    def fmt(xs: list[float]) -> str:
        return f"{statistics.median(xs):.2f}" + (f" ({', '.join(f'{x:.2f}' for x in xs)})" if len(xs) > 1 else "")

    print(
        f"  re-run / ping: wall {fmt(ratio)} (target <= 1.25); main-process CPU {fmt(main)} (target <= 1.25); "
        f"all CPU {fmt(cpu)}"
    )
    print(
        f"  main process without its wait for a free worker (ansible-core's 0.1 ms polling loop while every fork"
        f" is busy): re-run {median(rows, 'rerun', 'work'):.3f}, ping {median(rows, 'ping', 'work'):.3f} CPU s/host;"
        f" re-run / ping {fmt(work)}"
    )
    controller = [r["rerun"]["controller"] / r["ping"]["controller"] for r in rows]
    print(
        f"  the controller's CPU (the main process and the workers, not the modules, which a real fleet's nodes run):"
        f" re-run {median(rows, 'rerun', 'controller'):.3f}, ping {median(rows, 'ping', 'controller'):.3f}"
        f" CPU s/host; re-run / ping {fmt(controller)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="20", help="fleet sizes, comma-separated (default 20)")
    parser.add_argument("--forks", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--first-hosts", type=int, default=20, help="hosts of the seed fleet's first run")
    parser.add_argument("--repo", type=Path, default=HERE, help="checkout whose site.yml runs (default: this one)")
    parser.add_argument("--no-big", action="store_true", help="skip the 1,024-CPU host comparison")
    parser.add_argument("--big-hosts", type=int, default=20, help="hosts of the fleets of that comparison")
    parser.add_argument("--sizes", action="store_true", help="measure the results' JSON size per task and host")
    parser.add_argument("--keep", type=Path, help="build the fleets in DIR and keep them")
    parser.add_argument(
        "--mitogen", type=Path, help="run under mitogen_linear from DIR (the directory holding ansible_mitogen)"
    )
    parser.add_argument(
        "--ansible-bin",
        type=Path,
        action="append",
        default=[],
        help="also run the fleets' rounds with DIR/ansible-playbook (another venv's bin: another ansible-core), "
        "interleaved with this one's",
    )
    args = parser.parse_args()
    BINS.extend(path.absolute() for path in args.ansible_bin)
    labels = {bin_dir: core_version(bin_dir) for bin_dir in BINS}
    sizes = sorted({int(n) for n in args.hosts.split(",")})
    if args.mitogen:
        EXTRA_ENV.update(
            ANSIBLE_STRATEGY_PLUGINS=str(args.mitogen.resolve() / "ansible_mitogen" / "plugins" / "strategy"),
            ANSIBLE_STRATEGY="mitogen_linear",
        )
    repo = args.repo.resolve()
    base = args.keep or Path(tempfile.mkdtemp(prefix="cpupools-fleet-"))
    base.mkdir(parents=True, exist_ok=True)
    print(
        f"fleets of {', '.join(map(str, sizes))} hosts, forks {args.forks}, {args.rounds} rounds, "
        f"2 sockets x 22 cores SMT2 each; {os.cpu_count()} CPUs; site.yml of {repo}; "
        f"{' and '.join(labels.values())}"
        f"{'; mitogen_linear' if args.mitogen else ''}",
        flush=True,
    )
    failed = False
    try:
        seed, first = seed_fleet(repo, base / "seed", args.first_hosts, args.forks)
        print(
            f"first run of {args.first_hosts} hosts (the seed): wall {first['wall']:.1f} s; "
            f"{first['tasks']:.1f} tasks/host, {first['modules']:.1f} module executions/host; "
            f"CPU s/host {first['cpu']:.3f} all, {first['main']:.3f} main process",
            flush=True,
        )
        results: dict[Path, dict[int, list[dict]]] = {bin_dir: {} for bin_dir in BINS}
        for hosts in sizes:
            per_bin = fleet_rounds(repo, base / f"fleet{hosts}", seed, hosts, args.forks, args.rounds)
            for bin_dir, rows in per_bin.items():
                results[bin_dir][hosts] = rows
                print(f"{hosts} hosts, {labels[bin_dir]}:")
                report_fleet(hosts, rows)
                failed |= any(r["rerun"]["changed"] for r in rows)
            sys.stdout.flush()
        for bin_dir in BINS:
            for small, large in itertools.pairwise(sizes):
                slope = {
                    label: (
                        median(results[bin_dir][large], label, "main_total")
                        - median(results[bin_dir][small], label, "main_total")
                    )
                    / (large - small)
                    for label in ("rerun", "ping")
                }
                serial = (
                    median(results[bin_dir][large], "rerun", "serial")
                    - median(results[bin_dir][small], "rerun", "serial")
                ) / (large - small)
                print(
                    f"main-process CPU per added host, {small} to {large} hosts, {labels[bin_dir]}: "
                    f"re-run {slope['rerun'] * 1000:.1f} ms, ping {slope['ping'] * 1000:.1f} ms, "
                    f"ratio {slope['rerun'] / slope['ping']:.2f} (target: no faster growth than ping's, 1.00); "
                    f"tasks run once for the play {serial * 1000:.1f} ms per added host"
                )
        if args.sizes:
            smallest = sizes[0]
            table = result_sizes(repo, base / f"fleet{smallest}", args.forks, smallest)
            print(f"result bytes per host (JSON) of a converged re-run of {smallest} hosts, by task:")
            for name, entry in sorted(table.items(), key=lambda kv: -kv[1]["bytes"]):
                target = " (target <= 2000 per host)" if name.endswith(PLAN_TASK) else ""
                print(f"  {entry['bytes'] / smallest:9.0f}  {name} ({entry['results']} results){target}")
            print(f"  {sum(e['bytes'] for e in table.values()) / smallest:9.0f}  all")
        if not args.no_big:
            times = big_host(repo, base / "big", args.big_hosts, args.forks, args.rounds)
            small, big = statistics.median(times["1s8c-smt2"]), statistics.median(times["8s64c-smt2"])
            print(
                f"converged re-run of {args.big_hosts} hosts, the first with 16 CPUs: {small:.1f} s; "
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
