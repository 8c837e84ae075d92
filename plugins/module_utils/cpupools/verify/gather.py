"""verify, reading: the running node's interrupts, workqueues, kernel command line and kubelet state, as data.

Parsers take the kernel's text and return data; the readers read it under a
facts root (``/`` on a node, a fixture tree in tests) through ``node.tasks``'
``Facts``. The kernel facts they rely on:

* ``/proc/irq/N/effective_affinity_list`` is where the IRQ is delivered
  (absent on kernels and chips without it: ``smp_affinity_list`` stands in);
  the kernel keeps a *managed* IRQ (a multi-queue device's per-CPU vector,
  ``IRQD_AFFINITY_MANAGED`` in the ``dstate`` block of
  ``/sys/kernel/debug/irq/irqs/N``) on the CPUs it was spread over, isolated
  or not; with ``isolcpus=managed_irq`` only while no housekeeping CPU is in
  its mask.
* ``/sys/devices/virtual/workqueue/cpumask`` is a hex mask, 32-bit groups
  separated by commas, highest first.
"""

from __future__ import annotations

import json
import os
import re

from ..core.cpulist import parse_cpulist, parse_cpumask
from ..core.errors import CpulistError, VerifyError
from ..hardware.topology import parse_kernel_cmdline
from ..node.tasks import Facts, kernel_cpus

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


#: The name kernel/irq/debugfs.c prints in the ``dstate`` block of a managed IRQ.
MANAGED_FLAG = "IRQD_AFFINITY_MANAGED"


#: A per-queue vector's action name: a queue index at its end (``nvme0q3``, ``virtio1-req.0``,
#: ``eth0-TxRx-5``, ``mlx5_comp7``, ``i40e-eth0-TxRx-3``), what managed spreading applies to.
QUEUE_NAME = re.compile(r"(?:q|queue|-|\.|_comp|comp|rx|tx|txrx|req\.?|input\.|output\.)\d+$", re.IGNORECASE)


DEFAULT_KUBELET_STATE = "/var/lib/kubelet/cpu_manager_state"


def parse_interrupts(text: str) -> tuple[list[int], dict[str, dict]]:
    """``/proc/interrupts``: the CPUs of its columns and one row per source.

    A row is ``{"counts": {cpu: n}, "name": str, "device": bool}``: numbered
    rows are device IRQs (name: the action names after the chip and hwirq
    columns), the others the architecture's per-CPU rows (``LOC``, ``RES``,
    ``CAL``, ``TLB``, ...; name: their description). Columns are the online
    CPUs only, in the header's order; a row with fewer numbers (``ERR``) has
    counts for the first CPUs.
    """
    lines = text.splitlines()
    if not lines:
        return [], {}
    cpus = [int(word[3:]) for word in lines[0].split() if word.startswith("CPU") and word[3:].isdigit()]
    rows: dict[str, dict] = {}
    for line in lines[1:]:
        key, colon, rest = line.partition(":")
        key = key.strip()
        if not colon or not key:
            continue
        words = rest.split()
        counts: dict[int, int] = {}
        index = 0
        while index < len(words) and index < len(cpus) and words[index].isdigit():
            counts[cpus[index]] = int(words[index])
            index += 1
        tail = words[index:]
        device = key.isdigit()
        rows[key] = {"counts": counts, "name": _action_names(tail) if device else " ".join(tail), "device": device}
    return cpus, rows


_HWIRQ = re.compile(r"^(?:\d+|None)-\S+$")


def _action_names(words: list[str]) -> str:
    """The action names of a device IRQ row: what follows ``<hwirq>-<flow>`` (x86:
    ``IO-APIC 5-edge ACPI:Ged``) or ``Level``/``Edge`` (arm64: ``GICv3 27 Level arch_timer``)."""
    for index, word in enumerate(words):
        if _HWIRQ.match(word) or word in ("Level", "Edge"):
            return " ".join(words[index + 1 :])
    return ""


def parse_debugfs_irq(text: str) -> bool:
    """Whether a ``/sys/kernel/debug/irq/irqs/N`` dump names ``IRQD_AFFINITY_MANAGED`` (its ``dstate`` block
    lists one set flag per line, indented)."""
    return any(line.strip() == MANAGED_FLAG for line in text.splitlines())


def read_irqs(facts: Facts, actions: Mapping[str, str] | None = None) -> list[dict]:
    """Every ``/proc/irq/N`` with a handler: effective CPUs, affinity, action names, managed or not.

    ``managed`` is read from debugfs when it is readable (``managed_how`` "debugfs"),
    else inferred (``managed_how`` says so) or ``None`` when nothing suggests it.
    """
    actions = actions or {}
    default = facts.read("proc/irq/default_smp_affinity")
    default_cpus = parse_cpumask(default) if default else None
    debugfs = facts.path("sys/kernel/debug/irq/irqs")
    debugfs_ok = os.access(debugfs, os.R_OK | os.X_OK) and os.path.isdir(debugfs)
    out = []
    for name in facts.listdir("proc/irq"):
        if not name.isdigit():
            continue
        base = f"proc/irq/{name}"
        affinity_text = facts.read(f"{base}/smp_affinity_list")
        if affinity_text is None:
            continue  # freed while we read
        effective_text = facts.read(f"{base}/effective_affinity_list")
        try:
            affinity = kernel_cpus(affinity_text)
            effective = kernel_cpus(effective_text) if effective_text is not None else affinity
        except CpulistError:
            continue
        label = actions.get(name) or ", ".join(
            entry for entry in facts.listdir(base) if os.path.isdir(facts.path(f"{base}/{entry}"))
        )
        if actions and name not in actions and not label:
            continue  # no handler: /proc/interrupts leaves it out, and it never fires
        managed: bool | None = None
        how: str | None = None
        dump = facts.read(f"sys/kernel/debug/irq/irqs/{name}") if debugfs_ok else None
        if dump is not None:
            managed, how = parse_debugfs_irq(dump), "debugfs"
        elif label and default_cpus is not None and affinity != default_cpus and QUEUE_NAME.search(label):
            # Without debugfs: a per-queue vector whose affinity is not the default
            # (irqaffinity=) set, and that no driver hint put there (virtio-net and
            # many NICs hint one CPU per queue without the kernel managing it), was
            # spread by the kernel: managed, as far as can be told.
            hint = facts.read(f"{base}/affinity_hint")
            try:
                hinted = bool(hint and parse_cpumask(hint))
            except CpulistError:
                hinted = True
            if not hinted:
                managed, how = True, "per-queue vector (inferred)"
        out.append(
            {
                "irq": name,
                "name": label,
                "effective": effective,
                "affinity": affinity,
                "effective_from": "effective_affinity_list" if effective_text is not None else "smp_affinity_list",
                "managed": managed,
                "managed_how": how,
            }
        )
    out.sort(key=lambda item: int(item["irq"]))
    return out


def read_workqueues(facts: Facts) -> dict:
    """The unbound workqueue mask and each WQ_SYSFS workqueue's own mask (``None``: no file)."""
    base = "sys/devices/virtual/workqueue"
    text = facts.read(f"{base}/cpumask")
    own = {}
    for name in facts.listdir(base):
        mask = facts.read(f"{base}/{name}/cpumask")
        if mask is not None:
            own[name] = parse_cpumask(mask, f"{base}/{name}/cpumask")
    return {"cpumask": None if text is None else parse_cpumask(text, f"{base}/cpumask"), "workqueues": own}


def read_kernel(facts: Facts) -> dict:
    """Release, command line and what sysfs says is isolated and tickless (``None``: no such file)."""
    cmdline = (facts.read("proc/cmdline") or "").strip()
    isolated = facts.read("sys/devices/system/cpu/isolated")
    nohz = facts.read("sys/devices/system/cpu/nohz_full")
    try:
        args = parse_kernel_cmdline(cmdline, isolated or "", nohz or "")
    except CpulistError as exc:
        raise VerifyError(f"the running kernel's command line cannot be read: {exc}") from None
    return {
        "release": (facts.read("proc/sys/kernel/osrelease") or "").strip(),
        "cmdline": cmdline,
        "args": args,
        "isolated": None if isolated is None else list(args.isolated_active),
        "nohz_full": None if nohz is None else list(args.nohz_full_active),
    }


def read_kubelet_held(text: str | None) -> list[dict]:
    """The kubelet's ``cpu_manager_state`` entries: ``[{"holder": "pod/container", "cpus": [...]}]``."""
    if not text:
        return []
    try:
        data = json.loads(text)
    except ValueError:
        return []
    entries = data.get("entries") if isinstance(data, dict) else None
    held = []
    if isinstance(entries, dict):
        for pod, containers in sorted(entries.items()):
            if isinstance(containers, dict):
                for container, cpus in sorted(containers.items()):
                    try:
                        held.append({"holder": f"{pod}/{container}", "cpus": parse_cpulist(str(cpus))})
                    except CpulistError:
                        continue
    return held


def facts_read_root(root: str, path: str) -> str | None:
    """A file cpupools or the kubelet wrote, under ``root``."""
    return Facts(root).read(path)
