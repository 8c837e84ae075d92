#!/usr/bin/env python3
"""By hand: what a cgroup v2 isolated partition gives against isolcpus=domain (issue 41).

Boots the Debian 13 guest of tests/guest/kubelet_guest.py (kernel 6.12,
cgroup v2, systemd; no cluster: its kubelet has no credentials and does not
start) twice, with the exclusive CPUs of the guest scenario (2-3 and 6-7, one
core of each NUMA node) isolated two ways:

- ``domain``: ``isolcpus=domain,managed_irq,2-3,6-7`` on the command line,
  as cpupools writes it for cmk;
- ``partition``: no ``isolcpus``; after boot, a cgroup under the root with
  ``cpuset.cpus`` 2-3,6-7 and ``cpuset.cpus.partition`` ``isolated``; then
  the partition shrunk to 2-3 and grown back, without a reboot.

Both boots have ``nohz_full``, ``rcu_nocbs`` and ``irqaffinity`` as
cpupools writes them (those have no runtime switch). For each state it prints,
as JSON: what the kernel says is isolated, the unbound workqueue mask, whether
the isolated CPUs have scheduler domains, how many tasks (user, kernel threads
that may move, per-CPU kernel threads) may run on them and how many ran there
in 10 s, the interrupts and local timer ticks they took in 10 s, the ticks of
CPU 3 running one busy task, what ``taskset -c 3`` gets in a cgroup outside
the partition (where a cmk workload's pod cgroup is), and, with
``--oslat``, 10 s of oslat on CPU 3. Under emulation the latencies only
compare the two ways with each other; the counts are the kernel's.

    .venv/bin/python tests/guest/measure_partitions.py [--oslat] > partitions.json

What it found is in docs/kernel-args.md, "Isolated cpuset partitions".
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import guest_image as image  # noqa: E402
import kubelet_guest as kg  # noqa: E402
from guest_vm import Guest  # noqa: E402

ISOLATED = "2-3,6-7"
COMMON = "nohz_full=2-3,6-7 rcu_nocbs=2-3,6-7 irqaffinity=0-1,4-5"
ARGS = {"domain": f"isolcpus=domain,managed_irq,{ISOLATED} {COMMON}", "partition": COMMON}
PARTITION = "/sys/fs/cgroup/cpupools-exclusive"

#: One Python process on the guest reads everything of one state (a shell loop would fork per file: minutes).
PROBE = r"""
import glob, json, os, subprocess, time
ISO = {2, 3, 6, 7}
def cpus(text):
    out = set()
    for part in text.strip().split(","):
        if part:
            a, _, b = part.partition("-")
            out.update(range(int(a), int(b or a) + 1))
    return out
def read(path):
    try:
        return open(path).read().strip()
    except OSError as exc:
        return f"({exc.strerror})"
def tasks():
    rows = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            status = open(f"/proc/{pid}/status").read()
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        rest = stat.rsplit(")", 1)[1].split()
        flags, last = int(rest[6]), int(rest[36])
        kthread = bool(flags & 0x00200000)
        pinned = bool(flags & 0x04000000)  # PF_NO_SETAFFINITY
        allowed = cpus(fields["Cpus_allowed_list"])
        rows.append({"pid": int(pid), "comm": fields["Name"].strip(), "kthread": kthread,
                     "movable": kthread and not pinned and len(allowed) > 1,
                     "allowed": allowed, "last": last})
    return rows
def interrupts():
    lines = open("/proc/interrupts").read().splitlines()
    cols = [int(c[3:]) for c in lines[0].split()]
    per_cpu = {c: 0 for c in cols}
    loc = {c: 0 for c in cols}
    for line in lines[1:]:
        name, _, rest = line.partition(":")
        values = rest.split()[: len(cols)]
        if len(values) < len(cols) or not all(v.isdigit() for v in values):
            continue
        for c, v in zip(cols, values):
            per_cpu[c] += int(v)
            if name.strip() == "LOC":
                loc[c] += int(v)
    return per_cpu, loc
before_tasks = {t["pid"]: t["last"] for t in tasks()}
irq0, loc0 = interrupts()
ran = set()
for _ in range(10):
    time.sleep(1)
    for t in tasks():
        if t["last"] in ISO:
            ran.add((t["pid"], t["comm"]))
irq1, loc1 = interrupts()
now = tasks()
allowed_on = [t for t in now if t["allowed"] & ISO]
debug = "/sys/kernel/debug/sched/domains"
if not os.path.isdir(debug):
    subprocess.run(["mount", "-t", "debugfs", "none", "/sys/kernel/debug"], check=False)
out = {
    "cmdline": read("/proc/cmdline"),
    "kernel_isolated": read("/sys/devices/system/cpu/isolated"),
    "nohz_full": read("/sys/devices/system/cpu/nohz_full"),
    "cgroup_isolated": read("/sys/fs/cgroup/cpuset.cpus.isolated"),
    "root_effective": read("/sys/fs/cgroup/cpuset.cpus.effective"),
    "system_slice_effective": read("/sys/fs/cgroup/system.slice/cpuset.cpus.effective"),
    "partition": read("PARTITION/cpuset.cpus.partition"),
    "workqueue_cpumask": read("/sys/devices/virtual/workqueue/cpumask"),
    "sched_domains": {c: sorted(os.listdir(f"{debug}/cpu{c}")) if os.path.isdir(f"{debug}/cpu{c}") else None
                      for c in (0, 2, 3, 6, 7)},
    "may_run_on_isolated": {
        "user": sum(1 for t in allowed_on if not t["kthread"]),
        "kthread_movable": sum(1 for t in allowed_on if t["movable"]),
        "kthread_per_cpu": sum(1 for t in allowed_on if t["kthread"] and not t["movable"]),
        "user_names": sorted({t["comm"] for t in allowed_on if not t["kthread"]})[:20],
        "movable_names": sorted({t["comm"] for t in allowed_on if t["movable"]})[:20],
    },
    "ran_on_isolated_in_10s": sorted({comm for _, comm in ran}),
    "interrupts_in_10s": {c: irq1[c] - irq0[c] for c in sorted(irq0)},
    "local_timer_in_10s": {c: loc1[c] - loc0[c] for c in sorted(loc0)},
}
print(json.dumps(out))
""".replace("PARTITION", PARTITION)


#: One busy task on CPU 3 (in the partition when there is one, where alone it may run there): the local
#: timer ticks CPU 3 takes in 10 s (nohz_full stops the tick of a CPU with one task).
BUSY = (
    "setsid -f sh -c 'test -d PARTITION && echo $$ > PARTITION/cgroup.procs; echo $$ > /run/busy.pid; "
    'exec taskset -c 3 sh -c "while :; do :; done"\' </dev/null >/dev/null 2>&1; sleep 3; '
    "a=$(awk '/LOC:/{print $5}' /proc/interrupts); sleep 10; b=$(awk '/LOC:/{print $5}' /proc/interrupts); "
    "kill $(cat /run/busy.pid); echo $((b - a))"
).replace("PARTITION", PARTITION)


def probe(guest: Guest, oslat: bool) -> dict:
    guest.ssh(f"cat > /root/probe.py <<'EOF'\n{PROBE}\nEOF")
    found = json.loads(guest.ssh("python3 /root/probe.py", timeout=300))
    found["busy_cpu3_local_timer_in_10s"] = int(guest.ssh(BUSY, timeout=120).strip())
    # A process of another cgroup (this SSH session's) asking for CPU 3, as cmk isolate would for a workload
    # in its pod's cgroup: the kernel's answer.
    found["outside_cgroup_taskset_cpu3"] = guest.ssh("taskset -c 3 true 2>&1; echo status $?").strip()
    if oslat:
        out = guest.ssh("oslat --cpu-list 3 --duration 10 --rtprio 1 2>&1 | tail -12", timeout=300)
        found["oslat_cpu3"] = [line.strip() for line in out.splitlines() if line.strip()]
    return found


def boot_with(guest: Guest, args: str) -> float:
    guest.ssh(
        f"printf 'GRUB_CMDLINE_LINUX=\"$GRUB_CMDLINE_LINUX {args}\"\\n' >/etc/default/grub.d/99-measure.cfg"
        " && update-grub >/dev/null 2>&1",
        timeout=600,
    )
    old = guest.ssh("cat /proc/sys/kernel/random/boot_id").strip()
    start = time.monotonic()
    guest.ssh("systemctl reboot || true")
    while True:
        time.sleep(10)
        try:
            guest.wait_for_ssh()
            if guest.ssh("cat /proc/sys/kernel/random/boot_id").strip() != old:
                return time.monotonic() - start
        except RuntimeError:
            continue


def partition(guest: Guest, cpus: str) -> str:
    return guest.ssh(
        "cd /sys/fs/cgroup && grep -qw cpuset cgroup.subtree_control || echo +cpuset > cgroup.subtree_control; "
        f"mkdir -p {PARTITION} && echo {cpus} > {PARTITION}/cpuset.cpus && "
        f"echo isolated > {PARTITION}/cpuset.cpus.partition; cat {PARTITION}/cpuset.cpus.partition"
    ).strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oslat", action="store_true")
    opts = parser.parse_args()
    base = image.build(kg.TRIXIE_KUBELET)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="cpupools-partitions-") as work:
        guest = Guest(base, Path(work))
        try:
            guest.start()
            guest.wait_for_ssh()
            results["kernel"] = guest.ssh("uname -r").strip()
            for way, args in ARGS.items():
                results[f"boot_{way}_s"] = round(boot_with(guest, args))
                if way == "partition":
                    results["partition_state"] = partition(guest, ISOLATED)
                results[way] = probe(guest, opts.oslat)
            # Without a reboot: one core fewer, then back.
            results["shrunk_state"] = partition(guest, "2-3")
            results["partition_shrunk"] = probe(guest, False)
            results["grown_state"] = partition(guest, ISOLATED)
            results["partition_grown"] = probe(guest, False)
        finally:
            guest.stop()
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
