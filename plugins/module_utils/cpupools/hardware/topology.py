"""The CPU topology model, built from sysfs/procfs text.

``read_cpu_tree`` does the I/O (one function, so the facts module and the node
agent read a host the same way); ``build_topology`` turns the texts into a
``Topology``; ``Topology.to_facts``/``Topology.from_facts`` convert to and from
the JSON-safe dict returned as ``ansible_facts['cpupools']``.

Hyperthread siblings come from ``thread_siblings_list`` (or ``core_cpus_list``
on kernels that only have that name), never from CPU numbering. Sockets are
ordered by their lowest CPU id (CMK's "order of first appearance"), cores by
their lowest CPU id, and a core's logical index numbers cores system-wide in
that order, as ``lscpu -p`` numbers its ``Core`` column.

Below the socket: each CPU's NUMA node (``node/nodeN/cpulist``) and last-level
cache domain (``cache/index*/`` with ``level`` 3: ``shared_cpu_list``, and ``id``
or else the lowest CPU sharing it), its L2 (``cache/index2``, or the kernel's
``topology/cluster_cpus_list``: on E-core Xeons four cores share one), and the
NUMA distance table (``node/nodeN/distance``); ``locality`` reads them, for the
agent too.

Core types: on hybrid Intel parts ``/sys/devices/cpu_core/cpus`` lists the P
cores' CPUs and ``/sys/devices/cpu_atom/cpus`` the E cores'; elsewhere
(arm64 big.LITTLE) ``cpuN/cpu_capacity`` tells them apart. A homogeneous node
has no core types.

The machine that boots: ``present`` and ``possible`` CPUs, and SMT control
(``smt/control``, ``smt/active``), so the planner can tell a node whose SMT
siblings were switched off at runtime (they come back at the next boot) from
one booted without them.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from ..core.cpulist import format_cpulist, parse_cpulist, parse_isolcpus, split_cmdline
from ..core.errors import CpupoolsError, TopologyError
from .locality import (
    CPU_DIR,
    NODE_DIR,
    cache_domain,
    node_of_cpus,
    parse_distances,
    read_l2,
    read_l3,
    read_node_cpus,
    read_node_distances,
    read_text,
)

CMDLINE = "proc/cmdline"
_CPU_RE = re.compile(r"^cpu(\d+)$")
_NODE_RE = re.compile(r"^node(\d+)$")
#: ``files`` keys of ``read_cpu_tree`` for a CPU's L3 (``cpu/cpuN/`` + these).
L3_SHARED = "cache/l3/shared_cpu_list"
L3_ID = "cache/l3/id"
L2_SHARED = "cache/l2/shared_cpu_list"
L2_ID = "cache/l2/id"
CAPACITY = "cpu_capacity"
SMT_CONTROL = f"{CPU_DIR}/smt/control"
SMT_ACTIVE = f"{CPU_DIR}/smt/active"
#: The hybrid PMUs' CPU lists (Intel: P cores ``cpu_core``, E cores ``cpu_atom``).
HYBRID_PMUS = {"performance": "sys/devices/cpu_core/cpus", "efficiency": "sys/devices/cpu_atom/cpus"}
PERFORMANCE = "performance"
EFFICIENCY = "efficiency"
CORE_TYPES = (PERFORMANCE, EFFICIENCY)
#: Where only ``cpu_capacity`` tells core types apart (arm64), a CPU with at
#: least this share of the largest capacity is a performance core (big and
#: "prime" cores alike); below it, an efficiency (LITTLE) core.
PERFORMANCE_CAPACITY_SHARE = 0.75
#: A core's ids, the same in each of its threads (read_cpu_tree reads them once per core).
_CORE_FILES = ("physical_package_id", "die_id", "core_id")


@dataclass(frozen=True)
class Cpu:
    id: int
    socket: int
    die: int
    node: int
    core_id: int
    siblings: tuple[int, ...]
    base_frequency_khz: int | None = None
    #: L3 cache domain id; ``None`` where sysfs shows no level-3 cache.
    l3: int | None = None
    #: L2 cache domain id; ``None`` where sysfs shows neither an L2 nor a cluster.
    l2: int | None = None
    #: ``performance`` or ``efficiency`` on a hybrid node; ``None`` where all cores are alike.
    core_type: str | None = None
    #: ``cpu_capacity`` where the kernel has it (arm64), else ``None``.
    capacity: int | None = None


@dataclass(frozen=True)
class Core:
    """A physical core: its online hyperthreads, ascending."""

    index: int
    socket: int
    die: int
    node: int
    core_id: int
    cpus: tuple[int, ...]
    l3: int | None = None
    l2: int | None = None
    core_type: str | None = None

    @property
    def first(self) -> int:
        return self.cpus[0]


@dataclass(frozen=True)
class KernelArgs:
    """What the running kernel was booted with, and what it reports."""

    cmdline: str = ""
    isolcpus: tuple[int, ...] = ()
    isolcpus_flags: tuple[str, ...] = ()
    isolcpus_set: bool = False
    nohz_full: tuple[int, ...] | None = None
    rcu_nocbs: tuple[int, ...] | None = None
    irqaffinity: tuple[int, ...] | None = None
    isolated_active: tuple[int, ...] = ()
    nohz_full_active: tuple[int, ...] = ()

    @property
    def isolated_now(self) -> tuple[int, ...]:
        """The CPUs the running kernel isolates.

        Those ``isolcpus`` took out of the scheduler domains (sysfs
        ``isolated``); for an ``isolcpus`` without the ``domain`` flag
        (``managed_irq`` alone, the kubelet runtime's) its CPUs, which the
        kernel keeps interrupts off while sysfs ``isolated`` shows none.
        """
        if self.isolcpus_set and self.isolcpus_flags and "domain" not in self.isolcpus_flags:
            return tuple(sorted(set(self.isolated_active) | set(self.isolcpus)))
        return self.isolated_active


@dataclass
class Topology:
    cpus: dict[int, Cpu]
    offline: tuple[int, ...] = ()
    kernel: KernelArgs = field(default_factory=KernelArgs)
    #: NUMA node -> its row of the distance table (one entry per node, ascending).
    numa_distances: dict[int, tuple[int, ...]] = field(default_factory=dict)
    #: CPUs the firmware shows (``present``) and those the kernel could ever run (``possible``);
    #: empty where the files are missing (older fixture trees): then ``online + offline``.
    present: tuple[int, ...] = ()
    possible: tuple[int, ...] = ()
    #: ``smt/control`` (``on``, ``off``, ``forceoff``, ``notsupported``, ``notimplemented``,
    #: or a thread count) and ``smt/active``; ``None`` where the kernel has no SMT control.
    smt_control: str | None = None
    smt_active: bool | None = None
    cores: list[Core] = field(init=False)
    sockets: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self._check_siblings()
        groups: dict[tuple[int, ...], Cpu] = {}
        for cpu_id in sorted(self.cpus):
            cpu = self.cpus[cpu_id]
            groups.setdefault(cpu.siblings, cpu)
        ordered = sorted(groups, key=lambda sibs: sibs[0])
        self.cores = [
            Core(
                index=i,
                socket=groups[s].socket,
                die=groups[s].die,
                node=groups[s].node,
                core_id=groups[s].core_id,
                cpus=s,
                l3=groups[s].l3,
                l2=groups[s].l2,
                core_type=groups[s].core_type,
            )
            for i, s in enumerate(ordered)
        ]
        self.sockets = []
        for core in self.cores:
            if core.socket not in self.sockets:
                self.sockets.append(core.socket)
        self._core_of = {cpu: core for core in self.cores for cpu in core.cpus}
        types: dict[str, list[int]] = {}
        for cpu_id in sorted(self.cpus):
            kind = self.cpus[cpu_id].core_type
            if kind is not None:
                types.setdefault(kind, []).append(cpu_id)
        # Asked per core while planning: computed once.
        self._core_types = {kind: types[kind] for kind in CORE_TYPES if kind in types}
        self._l2_modules: dict[int, list[int]] | None = None
        if not self.present:
            self.present = tuple(sorted({*self.cpus, *self.offline}))
        if not self.possible:
            self.possible = self.present

    def _check_siblings(self) -> None:
        for cpu in self.cpus.values():
            if cpu.id not in cpu.siblings:
                raise TopologyError(
                    f"cpu{cpu.id}: its thread siblings {format_cpulist(cpu.siblings)} do not include itself"
                )
            for other in cpu.siblings:
                peer = self.cpus.get(other)
                if peer is None:
                    raise TopologyError(
                        f"cpu{cpu.id}: sibling cpu{other} is not online; sysfs topology is inconsistent"
                    )
                if (
                    peer.siblings != cpu.siblings
                    or peer.socket != cpu.socket
                    or peer.node != cpu.node
                    or peer.core_type != cpu.core_type
                ):
                    raise TopologyError(
                        f"cpu{cpu.id} and cpu{other} disagree on their siblings, socket, NUMA node or core type "
                        f"({format_cpulist(cpu.siblings)} vs {format_cpulist(peer.siblings)})"
                    )

    # Queries -----------------------------------------------------------------

    @property
    def online(self) -> list[int]:
        return sorted(self.cpus)

    def core_of(self, cpu: int) -> Core:
        return self._core_of[cpu]

    def cores_on(self, socket: int) -> list[Core]:
        return [core for core in self.cores if core.socket == socket]

    @property
    def threads_per_core(self) -> int:
        return max((len(core.cpus) for core in self.cores), default=0)

    @property
    def numa_nodes(self) -> dict[int, list[int]]:
        nodes: dict[int, list[int]] = {}
        for cpu_id in sorted(self.cpus):
            nodes.setdefault(self.cpus[cpu_id].node, []).append(cpu_id)
        return dict(sorted(nodes.items()))

    @property
    def l3_domains(self) -> dict[int, list[int]]:
        """L3 cache domain id -> its online CPUs (CPUs without an L3 left out)."""
        domains: dict[int, list[int]] = {}
        for cpu_id in sorted(self.cpus):
            l3 = self.cpus[cpu_id].l3
            if l3 is not None:
                domains.setdefault(l3, []).append(cpu_id)
        return dict(sorted(domains.items()))

    @property
    def l2_modules(self) -> dict[int, list[int]]:
        """L2 domain id -> its online CPUs, for the L2s shared by more than one core (E-core modules)."""
        if self._l2_modules is None:
            domains: dict[int, list[int]] = {}
            for core in self.cores:
                if core.l2 is not None:
                    domains.setdefault(core.l2, []).extend(core.cpus)
            self._l2_modules = {
                d: sorted(cpus) for d, cpus in sorted(domains.items()) if len(cpus) > 1 and not self._one_core(cpus)
            }
        return self._l2_modules

    def _one_core(self, cpus: list[int]) -> bool:
        return len({self.core_of(c).index for c in cpus}) == 1

    @property
    def core_types(self) -> dict[str, list[int]]:
        """``performance`` / ``efficiency`` -> online CPUs; empty on a node whose cores are all alike."""
        return self._core_types

    @property
    def hybrid(self) -> bool:
        return len(self.core_types) > 1

    def half_cores(self) -> list[Core]:
        """Online cores that lack a thread their kind of core has: one sibling is offline.

        Only where CPUs are offline (an offline CPU has no ``topology/``, so its
        core is known only by what is missing from the others); compared
        within a core type, since a hybrid's E cores have one thread by design.
        """
        if not self.offline:
            return []
        most: dict[str | None, int] = {}
        for core in self.cores:
            most[core.core_type] = max(most.get(core.core_type, 0), len(core.cpus))
        return [core for core in self.cores if len(core.cpus) < most[core.core_type]]

    def smt_switched_off(self) -> bool:
        """SMT was switched off at runtime: the next boot brings the siblings back.

        ``smt/control`` says ``off`` or ``forceoff`` (or a thread count of 1)
        while CPUs are offline, and the kernel command line has no ``nosmt``
        that would keep them off at boot.
        """
        control = (self.smt_control or "").strip()
        off = control in ("off", "forceoff") or control == "1"
        if not off or not self.offline:
            return False
        return not any(arg[0] == "nosmt" for arg in split_cmdline(self.kernel.cmdline))

    def nodes_on(self, socket: int) -> list[int]:
        """NUMA nodes of ``socket``'s cores, ordered by their lowest CPU id."""
        out: list[int] = []
        for core in self.cores_on(socket):
            if core.node not in out:
                out.append(core.node)
        return out

    @property
    def sst_bf_cpus(self) -> list[int]:
        """CPUs whose base frequency is above the lowest (SST-BF high priority).

        Empty when any online CPU lacks ``base_frequency`` or all are equal. On
        a hybrid node only the P cores are compared among themselves: P and E
        cores have different base frequencies by design (intel_pstate scales
        them differently), which is not SST-BF.
        """
        cpus = list(self.cpus.values())
        if self.hybrid:
            cpus = [cpu for cpu in cpus if cpu.core_type == PERFORMANCE]
        freqs = [cpu.base_frequency_khz for cpu in cpus]
        if not freqs or any(f is None for f in freqs):
            return []
        p1 = min(freqs)  # type: ignore[type-var]
        return sorted(cpu.id for cpu in cpus if cpu.base_frequency_khz > p1)  # type: ignore[operator]

    def sst_bf_cores(self) -> set[int]:
        """Indexes of cores all of whose threads are SST-BF high priority."""
        hp = set(self.sst_bf_cpus)
        return {core.index for core in self.cores if hp and all(c in hp for c in core.cpus)}

    # Facts -------------------------------------------------------------------

    def to_facts(self) -> dict:
        kernel = self.kernel
        socket_facts = {}
        for socket in self.sockets:
            cores = self.cores_on(socket)
            socket_facts[str(socket)] = {
                "cpus": format_cpulist(c for core in cores for c in core.cpus),
                "cores": [format_cpulist(core.cpus) for core in cores],
                "numa_nodes": sorted({core.node for core in cores}),
            }
        sst = self.sst_bf_cpus
        freqs = sorted({cpu.base_frequency_khz for cpu in self.cpus.values() if cpu.base_frequency_khz})
        siblings: dict[tuple[int, ...], str] = {}  # every thread of a core has the same: formatted once
        for cpu in self.cpus.values():
            if cpu.siblings not in siblings:
                siblings[cpu.siblings] = format_cpulist(cpu.siblings)
        return {
            "cpus": [
                {
                    "id": cpu.id,
                    "socket": cpu.socket,
                    "die": cpu.die,
                    "numa_node": cpu.node,
                    "core_id": cpu.core_id,
                    "core": self.core_of(cpu.id).index,
                    "siblings": siblings[cpu.siblings],
                    "base_frequency_khz": cpu.base_frequency_khz,
                    "l3": cpu.l3,
                    "l2": cpu.l2,
                    "core_type": cpu.core_type,
                    "capacity": cpu.capacity,
                }
                for cpu in (self.cpus[i] for i in sorted(self.cpus))
            ],
            "online": format_cpulist(self.cpus),
            "offline": format_cpulist(self.offline),
            "present": format_cpulist(self.present),
            "possible": format_cpulist(self.possible),
            "smt": {"control": self.smt_control, "active": self.smt_active},
            "sockets": socket_facts,
            "socket_order": list(self.sockets),
            "numa_nodes": {str(n): format_cpulist(cpus) for n, cpus in self.numa_nodes.items()},
            "numa_distances": {str(n): list(row) for n, row in sorted(self.numa_distances.items())},
            "l3_domains": {str(d): format_cpulist(cpus) for d, cpus in self.l3_domains.items()},
            "l2_modules": {str(d): format_cpulist(cpus) for d, cpus in self.l2_modules.items()},
            "core_types": {kind: format_cpulist(cpus) for kind, cpus in self.core_types.items()},
            "cores": len(self.cores),
            "threads_per_core": self.threads_per_core,
            "kernel": {
                "cmdline": kernel.cmdline,
                "isolcpus": {
                    "set": kernel.isolcpus_set,
                    "cpus": format_cpulist(kernel.isolcpus),
                    "flags": list(kernel.isolcpus_flags),
                },
                "nohz_full": None if kernel.nohz_full is None else format_cpulist(kernel.nohz_full),
                "rcu_nocbs": None if kernel.rcu_nocbs is None else format_cpulist(kernel.rcu_nocbs),
                "irqaffinity": None if kernel.irqaffinity is None else format_cpulist(kernel.irqaffinity),
                "isolated": format_cpulist(kernel.isolated_active),
                "nohz_full_active": format_cpulist(kernel.nohz_full_active),
            },
            "sst_bf": {
                "available": bool(sst),
                "high_priority_cpus": format_cpulist(sst),
                "base_frequencies_khz": freqs,
            },
        }

    @classmethod
    def from_facts(cls, facts: Mapping) -> Topology:
        """Rebuild the model from ``to_facts`` output (as it comes back from Ansible)."""
        try:
            cpus = {}
            for item in facts["cpus"]:
                cpu = Cpu(
                    id=int(item["id"]),
                    socket=int(item["socket"]),
                    die=int(item.get("die", 0)),
                    node=int(item.get("numa_node", 0)),
                    core_id=int(item.get("core_id", 0)),
                    siblings=tuple(parse_cpulist(item["siblings"], f"siblings of cpu{item['id']}")),
                    base_frequency_khz=item.get("base_frequency_khz"),
                    l3=None if item.get("l3") is None else int(item["l3"]),
                    l2=None if item.get("l2") is None else int(item["l2"]),
                    core_type=_core_type(item.get("core_type")),
                    capacity=None if item.get("capacity") is None else int(item["capacity"]),
                )
                cpus[cpu.id] = cpu
            distances = {
                int(node): tuple(int(d) for d in row) for node, row in (facts.get("numa_distances") or {}).items()
            }
            kernel = facts.get("kernel") or {}
            iso = kernel.get("isolcpus") or {}

            def optional(key: str) -> tuple[int, ...] | None:
                value = kernel.get(key)
                return None if value is None else tuple(parse_cpulist(value, key))

            kargs = KernelArgs(
                cmdline=kernel.get("cmdline", ""),
                isolcpus=tuple(parse_cpulist(iso.get("cpus", ""), "isolcpus")),
                isolcpus_flags=tuple(iso.get("flags", ())),
                isolcpus_set=bool(iso.get("set", False)),
                nohz_full=optional("nohz_full"),
                rcu_nocbs=optional("rcu_nocbs"),
                irqaffinity=optional("irqaffinity"),
                isolated_active=tuple(parse_cpulist(kernel.get("isolated", ""), "isolated")),
                nohz_full_active=tuple(parse_cpulist(kernel.get("nohz_full_active", ""), "nohz_full")),
            )
            offline = tuple(parse_cpulist(facts.get("offline", ""), "offline"))
            present = tuple(parse_cpulist(facts.get("present") or "", "present"))
            possible = tuple(parse_cpulist(facts.get("possible") or "", "possible"))
            smt = facts.get("smt") or {}
            smt_control = None if smt.get("control") is None else str(smt["control"])
            smt_active = None if smt.get("active") is None else bool(smt["active"])
        except CpupoolsError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise TopologyError(
                f"topology facts are incomplete or malformed ({exc!r}); run cpupools_facts first"
            ) from None
        if not cpus:
            raise TopologyError("topology facts list no online CPU")
        return cls(
            cpus=cpus,
            offline=offline,
            kernel=kargs,
            numa_distances=distances,
            present=present,
            possible=possible,
            smt_control=smt_control,
            smt_active=smt_active,
        )


def _core_type(value: object) -> str | None:
    if value is None:
        return None
    if value not in CORE_TYPES:
        raise TopologyError(f"core type {value!r} is not one of {', '.join(CORE_TYPES)}")
    return str(value)


def parse_kernel_cmdline(
    cmdline: str, isolated: str = "", nohz_full_active: str = "", nr_cpus: int | None = None
) -> KernelArgs:
    """Read the CPU-isolation arguments out of ``/proc/cmdline`` text.

    Every ``isolcpus=`` occurrence is read (flags and CPUs unioned, as CMK
    did); for the other arguments the last occurrence counts.
    """
    if nohz_full_active.strip() == "(null)":  # what the kernel prints without nohz_full=
        nohz_full_active = ""
    iso_cpus: set[int] = set()
    iso_flags: list[str] = []
    iso_set = False
    values: dict[str, tuple[int, ...]] = {}
    for key, value in split_cmdline(cmdline):
        if value is None:
            continue
        where = f"/proc/cmdline {key}="
        if key == "isolcpus":
            iso_set = True
            flags, cpus = parse_isolcpus(value, nr_cpus, where)
            iso_cpus.update(cpus)
            iso_flags.extend(f for f in flags if f not in iso_flags)
        elif key in ("nohz_full", "rcu_nocbs", "irqaffinity"):
            values[key] = tuple(parse_cpulist(value, where, nr_cpus))
    return KernelArgs(
        cmdline=cmdline.strip(),
        isolcpus=tuple(sorted(iso_cpus)),
        isolcpus_flags=tuple(iso_flags),
        isolcpus_set=iso_set,
        nohz_full=values.get("nohz_full"),
        rcu_nocbs=values.get("rcu_nocbs"),
        irqaffinity=values.get("irqaffinity"),
        isolated_active=tuple(parse_cpulist(isolated, "/sys/devices/system/cpu/isolated")),
        nohz_full_active=tuple(parse_cpulist(nohz_full_active, "/sys/devices/system/cpu/nohz_full")),
    )


def _int(text: str | None, what: str, default: int | None = None) -> int:
    if text is None:
        if default is None:
            raise TopologyError(f"{what} is missing")
        return default
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        raise TopologyError(f"{what}: {text!r} is not a number") from None


def build_topology(files: Mapping[str, str | None]) -> Topology:
    """Build a ``Topology`` from the texts ``read_cpu_tree`` collected.

    ``files`` maps paths relative to the root (``sys/devices/system/cpu/online``)
    to their text, or ``None`` for a file that does not exist; the special key
    ``"nodes/<cpu>"`` holds the NUMA node of a CPU (from ``nodeN/cpulist`` or
    its ``nodeN`` link), ``cpu/cpuN/cache/l3/{shared_cpu_list,id}`` its L3
    cache as ``locality.read_l3`` found it (``cache/l2/...`` its L2 as
    ``locality.read_l2`` found it), and ``node/nodeN/distance`` the distance
    rows.
    """
    base = CPU_DIR
    cpu_ids = sorted(int(k.split("/")[-1]) for k in files if k.startswith("cpus/"))
    possible = set(cpu_ids)
    online_text = files.get(f"{base}/online")
    if online_text is not None:
        online = set(parse_cpulist(online_text, f"{base}/online", limit=max(possible, default=0) + 1))
    else:
        online = {c for c in cpu_ids if (files.get(f"{base}/cpu{c}/online") or "1").strip() == "1"}
    offline = sorted(possible - online)
    limit = max(possible, default=0) + 1
    core_types = _core_types(files, online & possible, limit)
    cpus = {}
    freqs = {}
    parsed: dict[str, tuple[int, ...]] = {}
    # read_cpu_tree reads the L3 and the L2 of one CPU per domain: the others take theirs from there (two
    # L3 caches that claim one CPU are refused; the L2 was never checked, and stays so: an arm64 firmware's
    # cache ids need not be unique, and the first domain to name a CPU is its L2).
    l3_of = _domains_of(files, online & possible, L3_SHARED, L3_ID, "L3")
    l2_of = _domains_of(files, online & possible, L2_SHARED, L2_ID, "L2", strict=False)
    for cpu_id in sorted(online & possible):
        path = f"{base}/cpu{cpu_id}/topology"
        siblings_text = files.get(f"{path}/thread_siblings_list")
        if siblings_text is None:
            siblings_text = files.get(f"{path}/core_cpus_list")
        if siblings_text is None:
            raise TopologyError(f"{path}: neither thread_siblings_list nor core_cpus_list exists")
        siblings = parsed.get(siblings_text)  # the same text for every thread of a core: parsed once
        if siblings is None:
            siblings = parsed[siblings_text] = tuple(
                parse_cpulist(siblings_text, f"{path}/thread_siblings_list", limit=limit)
            )
        freq = files.get(f"{base}/cpu{cpu_id}/cpufreq/base_frequency")
        if freq is not None:
            freqs[cpu_id] = _int(freq, f"{base}/cpu{cpu_id}/cpufreq/base_frequency")
        capacity = files.get(f"{base}/cpu{cpu_id}/{CAPACITY}")
        cpus[cpu_id] = Cpu(
            id=cpu_id,
            socket=_int(files.get(f"{path}/physical_package_id"), f"{path}/physical_package_id"),
            die=_int(files.get(f"{path}/die_id"), f"{path}/die_id", 0),
            node=_int(files.get(f"nodes/{cpu_id}"), f"NUMA node of cpu{cpu_id}", 0),
            core_id=_int(files.get(f"{path}/core_id"), f"{path}/core_id"),
            siblings=siblings,
            base_frequency_khz=freqs.get(cpu_id),
            l3=l3_of.get(cpu_id),
            l2=l2_of.get(cpu_id),
            core_type=core_types.get(cpu_id),
            capacity=None if capacity is None else _int(capacity, f"{base}/cpu{cpu_id}/{CAPACITY}"),
        )
    if not cpus:
        raise TopologyError(f"no online CPU found under {base}")
    if not core_types:
        cpus = _capacity_types(cpus)
    kernel = parse_kernel_cmdline(
        files.get(CMDLINE) or "",
        files.get(f"{base}/isolated") or "",
        files.get(f"{base}/nohz_full") or "",
        nr_cpus=max(possible) + 1,
    )
    prefix = f"{NODE_DIR}/node"
    rows = {int(k[len(prefix) : -len("/distance")]): v for k, v in files.items() if k.startswith(prefix)}
    smt_active = files.get(SMT_ACTIVE)
    return Topology(
        cpus=cpus,
        offline=tuple(offline),
        kernel=kernel,
        numa_distances=parse_distances(rows),
        present=_cpu_file(files, f"{base}/present", limit),
        possible=_cpu_file(files, f"{base}/possible", limit),
        smt_control=(files.get(SMT_CONTROL) or "").strip() or None,
        smt_active=None if smt_active is None else smt_active.strip() == "1",
    )


def _domains_of(
    files: Mapping[str, str | None], online: set[int], shared: str, ident: str, level: str, strict: bool = True
) -> dict[int, int]:
    """CPU -> the id of its ``level`` cache, from the cache files of the CPUs ``read_cpu_tree`` read them for.

    A CPU whose files were not read takes the domain whose list names it.
    ``strict``: two domains naming one online CPU (or one id read with two
    lists) is a sysfs that contradicts itself, refused; otherwise the first
    domain (in CPU order) that names a CPU is its.
    """
    of: dict[int, int] = {}
    members_of: dict[int, tuple[int, ...]] = {}
    seen: dict[tuple[str | None, str | None], tuple[int, tuple[int, ...]] | None] = {}
    for cpu in sorted(online):
        texts = (files.get(f"{CPU_DIR}/cpu{cpu}/{shared}"), files.get(f"{CPU_DIR}/cpu{cpu}/{ident}"))
        if texts == (None, None):
            continue
        domain = seen.get(texts, False)  # the texts every CPU of a domain reads (a fixture gives them all)
        if domain is not False and (domain is None or cpu in domain[1]):
            continue  # judged already
        domain = seen[texts] = cache_domain(cpu, *texts, level)
        if domain is None:
            continue
        members = tuple(c for c in domain[1] if c in online)
        if not strict:
            for member in members:
                of.setdefault(member, domain[0])
            continue
        known = members_of.setdefault(domain[0], members)
        if known != members:
            raise TopologyError(
                f"{level} cache {domain[0]} is shared by CPUs {format_cpulist(known)} according to one CPU and by "
                f"{format_cpulist(members)} according to cpu{cpu}; sysfs cache information is inconsistent"
            )
        for member in members:
            if of.setdefault(member, domain[0]) != domain[0]:
                raise TopologyError(
                    f"cpu{member} is in {level} cache {of[member]} and in {level} cache {domain[0]} "
                    f"(according to cpu{cpu}); sysfs cache information is inconsistent"
                )
    return of


def _cpu_file(files: Mapping[str, str | None], key: str, limit: int) -> tuple[int, ...]:
    """A CPU list file (``present``, ``possible``); ``()`` where it is missing."""
    text = files.get(key)
    if text is None:
        return ()
    # possible can name CPUs past the last one with a directory (hotplug slots of a VM).
    return tuple(parse_cpulist(text, key, limit=max(limit, 1 << 16)))


def _core_types(files: Mapping[str, str | None], online: set[int], limit: int) -> dict[int, str]:
    """CPU -> ``performance``/``efficiency`` from the hybrid PMUs' CPU lists; ``{}`` on a homogeneous node."""
    lists = {kind: files.get(path) for kind, path in HYBRID_PMUS.items()}
    if any(text is None for text in lists.values()):
        return {}
    out: dict[int, str] = {}
    for kind, text in lists.items():
        for cpu in parse_cpulist(text or "", HYBRID_PMUS[kind], limit=limit):
            if cpu in out:
                raise TopologyError(f"cpu{cpu} is in both {HYBRID_PMUS['performance']} and {HYBRID_PMUS['efficiency']}")
            out[cpu] = kind
    missing = sorted(online - set(out))
    if missing and out:
        raise TopologyError(
            f"CPUs {format_cpulist(missing)} are in neither {HYBRID_PMUS['performance']} nor "
            f"{HYBRID_PMUS['efficiency']}; the hybrid core types are inconsistent"
        )
    return out if len({out[c] for c in online if c in out}) > 1 else {}


def _capacity_types(cpus: dict[int, Cpu]) -> dict[int, Cpu]:
    """Core types from ``cpu_capacity`` (arm64 big.LITTLE) where every CPU has one and they differ."""
    caps = [cpu.capacity for cpu in cpus.values()]
    if not caps or any(c is None for c in caps) or len(set(caps)) == 1:
        return cpus
    top = max(caps)  # type: ignore[type-var]
    out = {}
    for cpu_id, cpu in cpus.items():
        kind = PERFORMANCE if cpu.capacity >= PERFORMANCE_CAPACITY_SHARE * top else EFFICIENCY  # type: ignore[operator]
        out[cpu_id] = replace(cpu, core_type=kind)
    return out


def read_cpu_tree(root: str = "/") -> dict[str, str | None]:
    """Read every sysfs/procfs file ``build_topology`` needs under ``root``."""
    cpu_dir = os.path.join(root, CPU_DIR)
    try:
        entries = os.listdir(cpu_dir)
    except OSError as exc:
        raise TopologyError(f"cannot list {cpu_dir}: {exc.strerror}") from None
    files: dict[str, str | None] = {}
    for name in ("online", "offline", "present", "possible", "isolated", "nohz_full"):
        files[f"{CPU_DIR}/{name}"] = read_text(os.path.join(cpu_dir, name))
    online_list = files[f"{CPU_DIR}/online"]
    for key in (SMT_CONTROL, SMT_ACTIVE, *HYBRID_PMUS.values()):
        files[key] = read_text(os.path.join(root, key))
    files[CMDLINE] = read_text(os.path.join(root, CMDLINE))
    l2_read: set[int] = set()
    l3_read: set[int] = set()
    core_ids: dict[str, tuple[str | None, ...]] = {}
    node_of = node_of_cpus(read_node_cpus(root))
    for node, row in read_node_distances(root).items():
        files[f"{NODE_DIR}/node{node}/distance"] = row
    # In CPU order, so that the CPU that reads a cache domain's files is always its lowest (not the
    # directory's order). Paths by f-string, not os.path.join: 16,000 joins were a sixth of the read on
    # 1,024 CPUs.
    numbered = sorted((int(m.group(1)), name) for name in entries if (m := _CPU_RE.match(name)))
    for cpu, name in numbered:
        files[f"cpus/{cpu}"] = name
        rel = f"{CPU_DIR}/{name}"
        path = f"{cpu_dir}/{name}"
        if online_list is None:  # build_topology reads a CPU's own online file only without the node's list
            files[f"{rel}/online"] = read_text(f"{path}/online")
        siblings = files[f"{rel}/topology/thread_siblings_list"] = read_text(f"{path}/topology/thread_siblings_list")
        if siblings is None:  # its newer name, read only where it is missing
            siblings = files[f"{rel}/topology/core_cpus_list"] = read_text(f"{path}/topology/core_cpus_list")
        # The kernel makes a thread's siblings from its package and core: every thread of a core prints the
        # same list and the same ids, so the core's first thread reads them for the others (1,536 of the
        # 7,899 files on 1,024 CPUs). A thread whose list differs is a core of its own, and reads its own.
        ids = core_ids.get(siblings) if siblings is not None else None
        if ids is None:
            ids = tuple(read_text(f"{path}/topology/{topo}") for topo in _CORE_FILES)
            if siblings is not None:
                core_ids[siblings] = ids
        for index, topo in enumerate(_CORE_FILES):  # no zip(strict=): the nodes' Python may be 3.9
            files[f"{rel}/topology/{topo}"] = ids[index]
        files[f"{rel}/cpufreq/base_frequency"] = read_text(f"{path}/cpufreq/base_frequency")
        if cpu not in l3_read:  # one CPU per L3 domain: its list names the others
            _keep_domain(files, rel, "L3", (L3_SHARED, L3_ID), read_l3(root, cpu), l3_read)
        files[f"{rel}/{CAPACITY}"] = read_text(f"{path}/{CAPACITY}")
        if cpu not in l2_read:  # one CPU per L2: a core's siblings and a module's cores share it
            _keep_domain(files, rel, "L2", (L2_SHARED, L2_ID), read_l2(root, cpu), l2_read)
        if cpu not in node_of:
            for link in _list(path):
                nm = _NODE_RE.match(link)
                if nm:
                    node_of[cpu] = int(nm.group(1))
                    break
        if cpu in node_of:
            files[f"nodes/{cpu}"] = str(node_of[cpu])
    return files


def _keep_domain(
    files: dict[str, str | None],
    rel: str,
    level: str,
    names: tuple[str, str],
    read: tuple[str | None, str | None],
    covered: set[int],
) -> None:
    """Keep one CPU's (shared_cpu_list, id) of a cache level; the CPUs its list names need not be read."""
    shared, ident = read
    files[f"{rel}/{names[0]}"], files[f"{rel}/{names[1]}"] = shared, ident
    if shared is not None:
        with contextlib.suppress(CpupoolsError):  # build_topology reports it
            covered.update(parse_cpulist(shared, f"{rel} {level} shared_cpu_list"))


def _list(path: str) -> Iterable[str]:
    try:
        return os.listdir(path)
    except OSError:
        return ()


def check_facts_root(root: str | None) -> str:
    """Refuse a facts root that is not an absolute path to a directory holding sysfs; return it."""
    if not root or not root.strip():
        raise TopologyError("the root is empty; give an absolute path ('/' for the host itself)")
    if not os.path.isabs(root):
        raise TopologyError("is not an absolute path")
    if not os.path.exists(root):
        raise TopologyError("no such directory")
    if not os.path.isdir(root):
        raise TopologyError("is not a directory")
    if not os.path.isdir(os.path.join(root, CPU_DIR)):
        raise TopologyError(f"has no {CPU_DIR} directory (give '/' or a fixture tree)")
    return root


def gather_topology(root: str = "/") -> Topology:
    """Read and build the topology of the host (or fixture tree) at ``root``."""
    return build_topology(read_cpu_tree(root))
