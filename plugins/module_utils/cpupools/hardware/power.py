"""What a node offers for power and frequency, per CPU: cpufreq, cpuidle and the uncore, read from sysfs.

The per-pool power settings (a governor or a fixed frequency for the
exclusive pool, the deepest C-state it may enter, the uncore frequency) can
only be planned against what the node's drivers offer, and ``verify.yml``
reads the same files back. This module reads them, once per file:

- cpufreq, per policy (``cpu/cpufreq/policyN``: ``affected_cpus``,
  ``scaling_driver``, ``scaling_governor``, ``scaling_available_governors``,
  ``cpuinfo_{min,max}_freq``, ``scaling_{min,max}_freq``, and with
  intel_pstate or amd-pstate-epp in active mode
  ``energy_performance_preference`` and its available values); the
  intel_pstate or amd_pstate mode (``intel_pstate/status``,
  ``amd_pstate/status``) and turbo (``intel_pstate/no_turbo``,
  ``cpufreq/boost``). A CPU without a policy (a VM without a cpufreq
  driver) has none.
- cpuidle: the driver and governor (``cpu/cpuidle/current_driver``,
  ``current_governor`` or ``current_governor_ro``) and, per online CPU,
  each state's ``name``, exit ``latency`` and target ``residency`` (µs) and
  whether it is ``disable``d (``cpuN/cpuidle/stateK``). The states are the
  same on every CPU with intel_idle; acpi_idle takes them from each CPU's
  ACPI ``_CST``, so they are read per CPU and grouped.
- the uncore (``cpu/intel_uncore_frequency/``): one domain per directory,
  ``package_PP_die_DD`` (the MSR driver) or ``uncoreNN`` (TPMI, with
  ``package_id`` and ``domain_id``), each with its ``{min,max}_freq_khz``
  and ``initial_{min,max}_freq_khz``.

Nothing here is read by the topology facts the planner always takes (a
node of 1,024 CPUs has ~16,000 cpuidle files): the facts module reads it
when asked (``power: true``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from ..core.cpulist import format_cpulist, parse_cpulist
from ..core.errors import CpupoolsError, show
from .locality import CPU_DIR, read_text

CPUFREQ_DIR = f"{CPU_DIR}/cpufreq"
CPUIDLE_DIR = f"{CPU_DIR}/cpuidle"
UNCORE_DIR = f"{CPU_DIR}/intel_uncore_frequency"
UNCORE_DRIVER = "intel_uncore_frequency"
#: The driver whose mode its own directory's ``status`` names: intel_pstate, amd_pstate (amd-pstate*).
PSTATE_STATUS = {"intel_pstate": f"{CPU_DIR}/intel_pstate/status", "amd_pstate": f"{CPU_DIR}/amd_pstate/status"}
_POLICY_RE = re.compile(r"^policy(\d+)$")
_STATE_RE = re.compile(r"^state(\d+)$")
_CPU_RE = re.compile(r"^cpu(\d+)$")
_UNCORE_MSR_RE = re.compile(r"^package_(\d+)_die_(\d+)$")
_UNCORE_TPMI_RE = re.compile(r"^uncore(\d+)$")


class PowerError(CpupoolsError):
    """A power setting the node cannot take."""


@dataclass(frozen=True)
class IdleState:
    """One cpuidle state of a CPU: its index (``stateK``), name, exit latency and target residency (µs)."""

    index: int
    name: str
    latency_us: int
    residency_us: int

    def to_facts(self) -> dict:
        return asdict(self)


def _strip(text: str | None) -> str | None:
    return None if text is None else text.strip()


def _int(text: str | None) -> int | None:
    value = _strip(text)
    if value is None or not re.fullmatch(r"-?\d+", value):
        return None
    return int(value)


def _words(text: str | None) -> list[str]:
    return (_strip(text) or "").split()


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _group(per_cpu: Mapping[int, dict]) -> list[dict]:
    """CPUs with the same settings as one entry, ``cpus`` a compressed cpulist, in order of their first CPU."""
    groups: dict[str, list[int]] = {}
    values: dict[str, dict] = {}
    for cpu in sorted(per_cpu):
        key = repr(sorted(per_cpu[cpu].items()))
        groups.setdefault(key, []).append(cpu)
        values[key] = per_cpu[cpu]
    return [{"cpus": format_cpulist(cpus), **values[key]} for key, cpus in groups.items()]


def read_cpufreq(root: str) -> dict:
    """The cpufreq driver, its mode and turbo, and per CPU the policy's settings (grouped)."""
    base = os.path.join(root, CPUFREQ_DIR)
    per_cpu: dict[int, dict] = {}
    drivers: set[str] = set()
    for name in sorted(_listdir(base)):
        if not _POLICY_RE.match(name):
            continue
        policy = os.path.join(base, name)
        cpus = _strip(read_text(os.path.join(policy, "affected_cpus")))
        if not cpus:
            continue  # every CPU of the policy is offline
        driver = _strip(read_text(os.path.join(policy, "scaling_driver")))
        if driver:
            drivers.add(driver)
        settings = {
            "driver": driver,
            "governor": _strip(read_text(os.path.join(policy, "scaling_governor"))),
            "governors": _words(read_text(os.path.join(policy, "scaling_available_governors"))),
            "min_khz": _int(read_text(os.path.join(policy, "cpuinfo_min_freq"))),
            "max_khz": _int(read_text(os.path.join(policy, "cpuinfo_max_freq"))),
            "scaling_min_khz": _int(read_text(os.path.join(policy, "scaling_min_freq"))),
            "scaling_max_khz": _int(read_text(os.path.join(policy, "scaling_max_freq"))),
            "epp": _strip(read_text(os.path.join(policy, "energy_performance_preference"))),
            "epps": _words(read_text(os.path.join(policy, "energy_performance_available_preferences"))),
        }
        for cpu in parse_cpulist(cpus.replace(" ", ","), f"{CPUFREQ_DIR}/{name}/affected_cpus"):
            per_cpu[cpu] = settings
    driver = sorted(drivers)[0] if len(drivers) == 1 else (" ".join(sorted(drivers)) or None)
    mode = None
    for family, path in PSTATE_STATUS.items():
        if driver and driver.replace("-", "_").startswith(family):
            mode = _strip(read_text(os.path.join(root, path)))
    no_turbo = _int(read_text(os.path.join(root, CPU_DIR, "intel_pstate", "no_turbo")))
    boost = _int(read_text(os.path.join(base, "boost")))
    turbo = (not no_turbo) if no_turbo is not None else (bool(boost) if boost is not None else None)
    return {"driver": driver, "mode": mode, "turbo": turbo, "policies": _group(per_cpu)}


def read_idle_states(root: str, cpu: int) -> tuple[list[IdleState], list[str]]:
    """CPU ``cpu``'s cpuidle states, by index, and the names of those disabled."""
    base = os.path.join(root, CPU_DIR, f"cpu{cpu}", "cpuidle")
    states, disabled = [], []
    indexes = sorted(int(m.group(1)) for m in map(_STATE_RE.match, _listdir(base)) if m)
    for index in indexes:
        path = os.path.join(base, f"state{index}")
        name = _strip(read_text(os.path.join(path, "name"))) or f"state{index}"
        states.append(
            IdleState(
                index,
                name,
                _int(read_text(os.path.join(path, "latency"))) or 0,
                _int(read_text(os.path.join(path, "residency"))) or 0,
            )
        )
        if _int(read_text(os.path.join(path, "disable"))):
            disabled.append(name)
    return states, disabled


def read_cpuidle(root: str, cpus: Iterable[int]) -> dict:
    """The cpuidle driver and governor, and per CPU its states and the disabled ones (grouped)."""
    base = os.path.join(root, CPUIDLE_DIR)
    driver = _strip(read_text(os.path.join(base, "current_driver")))
    governor = _strip(read_text(os.path.join(base, "current_governor"))) or _strip(
        read_text(os.path.join(base, "current_governor_ro"))
    )
    per_cpu: dict[int, dict] = {}
    for cpu in cpus:
        states, disabled = read_idle_states(root, cpu)
        if states:
            per_cpu[cpu] = {"states": [state.to_facts() for state in states], "disabled": disabled}
    if driver == "none":
        driver = None
    return {"driver": driver, "governor": governor, "groups": _group(per_cpu)}


def read_uncore(root: str) -> dict:
    """The uncore frequency domains of intel_uncore_frequency (MSR or TPMI), or no driver."""
    base = os.path.join(root, UNCORE_DIR)
    names = _listdir(base)
    domains = []
    for name in sorted(names):
        path = os.path.join(base, name)
        msr, tpmi = _UNCORE_MSR_RE.match(name), _UNCORE_TPMI_RE.match(name)
        if msr:
            package, die = int(msr.group(1)), int(msr.group(2))
        elif tpmi:
            package = _int(read_text(os.path.join(path, "package_id")))
            die = _int(read_text(os.path.join(path, "domain_id")))
        else:
            continue
        domains.append(
            {
                "name": name,
                "package": package,
                "die": die,
                "min_khz": _int(read_text(os.path.join(path, "min_freq_khz"))),
                "max_khz": _int(read_text(os.path.join(path, "max_freq_khz"))),
                "initial_min_khz": _int(read_text(os.path.join(path, "initial_min_freq_khz"))),
                "initial_max_khz": _int(read_text(os.path.join(path, "initial_max_freq_khz"))),
            }
        )
    return {"driver": UNCORE_DRIVER if domains else None, "domains": domains}


def read_power(root: str, cpus: Iterable[int]) -> dict:
    """What the node at ``root`` offers for power and frequency; ``cpus``: its online CPUs."""
    return {"cpufreq": read_cpufreq(root), "cpuidle": read_cpuidle(root, cpus), "uncore": read_uncore(root)}


def per_cpu(power: Mapping) -> dict[int, dict]:
    """CPU -> its settings, from ``read_power``'s groups: ``governor``, ``scaling_min_khz``,
    ``scaling_max_khz`` (None without cpufreq), ``states`` (names, by index), ``disabled``, and
    ``deepest``: the enabled state with the longest exit latency (None without cpuidle)."""
    out: dict[int, dict] = {}
    for policy in power["cpufreq"]["policies"]:
        for cpu in parse_cpulist(policy["cpus"]):
            out.setdefault(cpu, {}).update(
                governor=policy["governor"],
                scaling_min_khz=policy["scaling_min_khz"],
                scaling_max_khz=policy["scaling_max_khz"],
            )
    for group in power["cpuidle"]["groups"]:
        enabled = [s for s in group["states"] if s["name"] not in group["disabled"]]
        deepest = max(enabled, key=lambda s: (s["latency_us"], s["index"]))["name"] if enabled else None
        for cpu in parse_cpulist(group["cpus"]):
            out.setdefault(cpu, {}).update(
                states=[s["name"] for s in group["states"]], disabled=list(group["disabled"]), deepest=deepest
            )
    for settings in out.values():
        for key in ("governor", "scaling_min_khz", "scaling_max_khz", "deepest"):
            settings.setdefault(key, None)
        settings.setdefault("states", [])
        settings.setdefault("disabled", [])
    return out


def parse_cstate_limit(value: object) -> tuple[str, object]:
    """A C-state limit as given in the inventory: a state's name (``C1E``) or an exit latency in µs
    (``latency:10`` or an integer): ``("name", "C1E")`` or ``("latency", 10)``."""
    if isinstance(value, bool) or value is None:
        raise PowerError(f"{show(value)}: give a C-state's name (C1, C1E) or an exit latency in µs (latency:10)")
    if isinstance(value, int):
        latency = value
    else:
        text = str(value).strip()
        if not text:
            raise PowerError("'': give a C-state's name (C1, C1E) or an exit latency in µs (latency:10)")
        match = re.fullmatch(r"(?:latency:)?\s*(\d+)\s*(?:us)?", text)
        if not match:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_ .-]{0,31}", text):
                raise PowerError(f"{show(value)} is not a C-state's name (C1, C1E) or an exit latency (latency:10)")
            return "name", text
        latency = int(match.group(1))
    if latency < 0:
        raise PowerError(f"{show(value)}: an exit latency is 0 or more µs")
    return "latency", latency


def states_to_disable(states: list[Mapping], limit: object, where: str = "this node") -> list[str]:
    """The names of ``states`` (``IdleState.to_facts`` dicts) deeper than ``limit``: those with a longer
    exit latency than the named state (or than the latency given). Refuses a name the node has not,
    saying which it has; a latency below every state's keeps only the shallowest (POLL)."""
    if not states:
        raise PowerError(f"{where} has no cpuidle states (no cpuidle driver): a C-state limit cannot apply")
    kind, wanted = parse_cstate_limit(limit)
    if kind == "name":
        named = [s for s in states if s["name"].lower() == str(wanted).lower()]
        if not named:
            have = ", ".join(f"{s['name']} ({s['latency_us']} µs)" for s in states)
            raise PowerError(f"{wanted} is not a C-state of {where}; it has {have}")
        ceiling = named[0]["latency_us"]
        order = named[0]["index"]
        return [s["name"] for s in states if (s["latency_us"], s["index"]) > (ceiling, order)]
    shallowest = min(states, key=lambda s: (s["latency_us"], s["index"]))
    return [s["name"] for s in states if s["latency_us"] > int(wanted) and s is not shallowest]


# The per-pool settings (cpupools_power) -------------------------------------------------

#: What a pool's settings may hold: the cpufreq governor, a fixed frequency (min = max) or a range, the
#: energy/performance preference (intel_pstate, amd-pstate-epp in active mode), the deepest C-state.
POOL_KEYS = ("governor", "frequency_khz", "min_khz", "max_khz", "epp", "cstate_limit")
#: The uncore's settings (intel_uncore_frequency, every domain of the node).
UNCORE_KEYS = ("min_khz", "max_khz")
UNCORE = "uncore"
_WORD = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def _name(value: object) -> str:
    """A key as written when it is a short plain word, else quoted and shortened (``show``)."""
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_-]{1,40}", value):
        return value
    return show(value)


def to_settings(raw: object, pools: Iterable[str], what: str = "cpupools_power") -> dict:
    """``cpupools_power`` checked for its shape, before any node is read: pool (or ``uncore``) -> settings.

    ``frequency_khz`` becomes ``min_khz`` = ``max_khz``; a C-state limit is kept as given (its meaning
    depends on the node's states). Raises ``PowerError`` naming the key.
    """
    if raw in (None, "", {}):
        return {}
    if not isinstance(raw, Mapping):
        raise PowerError(
            f"{what + ': ' if what else ''}{show(raw)} is not a mapping of pool to settings, "
            "e.g. {exclusive: {governor: performance}}"
        )
    names = tuple(pools)
    out: dict[str, dict] = {}
    for pool, settings in raw.items():
        where = f"{what}.{_name(pool)}" if what else _name(pool)
        if pool not in (*names, UNCORE):
            raise PowerError(f"{where}: not a pool; give one of {', '.join((*names, UNCORE))}")
        allowed = UNCORE_KEYS if pool == UNCORE else POOL_KEYS
        if not isinstance(settings, Mapping) or not settings:
            raise PowerError(f"{where}: give a mapping of settings ({', '.join(allowed)})")
        unknown = sorted(_name(key) for key in settings if key not in allowed)
        if unknown:
            raise PowerError(f"{where}: {', '.join(unknown)} is not a setting; give {', '.join(allowed)}")
        checked: dict[str, object] = {}
        for key in ("frequency_khz", "min_khz", "max_khz"):
            if key in settings:
                value = settings[key]
                if isinstance(value, bool) or not re.fullmatch(r"\d{1,9}", str(value).strip()) or int(value) <= 0:
                    raise PowerError(f"{where}.{key}: {show(value)} is not a frequency in kHz (a positive integer)")
                checked[key] = int(value)
        if "frequency_khz" in checked:
            if "min_khz" in checked or "max_khz" in checked:
                raise PowerError(f"{where}: give frequency_khz (a fixed frequency) or min_khz/max_khz, not both")
            checked["min_khz"] = checked["max_khz"] = checked.pop("frequency_khz")
        if checked.get("min_khz", 0) > checked.get("max_khz", 1 << 40):
            raise PowerError(f"{where}: min_khz {checked['min_khz']} is above max_khz {checked['max_khz']}")
        for key in ("governor", "epp"):
            if key in settings:
                value = str(settings[key]).strip()
                if not _WORD.match(value) and not (key == "epp" and re.fullmatch(r"\d{1,3}", value)):
                    raise PowerError(f"{where}.{key}: {show(settings[key])} is not a {key} name")
                if key == "epp" and value.isdigit() and int(value) > 255:
                    raise PowerError(f"{where}.epp: {value} is above 255")
                checked[key] = value
        if "cstate_limit" in settings:
            try:
                parse_cstate_limit(settings["cstate_limit"])  # its form; the node's states decide the rest
            except PowerError as exc:
                raise PowerError(f"{where}.cstate_limit: {exc}") from None
            checked["cstate_limit"] = settings["cstate_limit"]
        out[str(pool)] = checked
    return out


def plan_power(settings: Mapping, facts: Mapping, pool_cpus: Mapping[str, Iterable[int]], host: str) -> dict:
    """The per-CPU settings of ``settings`` (``to_settings``'s) on the node whose power ``facts`` these are
    (``read_power``'s), for the pools' CPUs: what the node cannot take is refused, saying what it has.

    Returns ``cpus`` (one entry per pool and group of CPUs with the same idle states: ``cpus``, ``pool``
    and what to write: ``governor``, ``min_khz``, ``max_khz``, ``epp``, ``cstates_off`` and ``cstates_on``
    as state indexes with their ``cstate_names``), ``uncore`` (domain name -> ``min_khz``, ``max_khz``) and
    the node's drivers (``driver``, ``mode``, ``idle_driver``). Empty settings plan nothing.
    """
    if not settings:
        return {}
    freq = {cpu: policy for policy in facts["cpufreq"]["policies"] for cpu in parse_cpulist(policy["cpus"])}
    idle = {cpu: group for group in facts["cpuidle"]["groups"] for cpu in parse_cpulist(group["cpus"])}
    entries = []
    for pool, wanted in settings.items():
        if pool == UNCORE:
            continue
        cpus = sorted(pool_cpus.get(pool) or ())
        if not cpus:
            continue  # the pool is empty on this node: nothing to set
        where = f"cpupools_power.{pool}"
        if any(key in wanted for key in ("governor", "min_khz", "max_khz", "epp")):
            missing = [cpu for cpu in cpus if cpu not in freq]
            if missing:
                raise PowerError(
                    f"{where}: CPUs {format_cpulist(missing)} have no cpufreq policy (no cpufreq driver"
                    f"{'' if not facts['cpufreq']['driver'] else ' for them'}): governor, frequencies and epp "
                    "cannot be set; leave them out for this node class"
                )
        for cpu in cpus:
            _check_cpufreq(where, cpu, wanted, freq.get(cpu), facts["cpufreq"])
        groups: dict[str, list[int]] = {}
        for cpu in cpus:
            groups.setdefault(repr(idle[cpu]["states"]) if cpu in idle else "", []).append(cpu)
        for members in groups.values():
            entry = {"cpus": format_cpulist(members), "pool": pool}
            entry.update({key: wanted[key] for key in ("governor", "min_khz", "max_khz", "epp") if key in wanted})
            if "cstate_limit" in wanted:
                group = idle.get(members[0])
                states = group["states"] if group else []
                off = set(states_to_disable(states, wanted["cstate_limit"], f"{host} (CPUs {entry['cpus']})"))
                entry["cstates_off"] = [s["index"] for s in states if s["name"] in off]
                entry["cstates_on"] = [s["index"] for s in states if s["name"] not in off]
                entry["cstate_names"] = {str(s["index"]): s["name"] for s in states}
            entries.append(entry)
    uncore = {}
    if UNCORE in settings:
        domains = facts["uncore"]["domains"]
        if not domains:
            raise PowerError(
                "cpupools_power.uncore: the node has no intel_uncore_frequency driver "
                "(Intel servers only, module intel_uncore_frequency or _tpmi): leave uncore out for this node class"
            )
        for domain in domains:
            low, high = domain["initial_min_khz"], domain["initial_max_khz"]
            values = {
                "min_khz": settings[UNCORE].get("min_khz", low),
                "max_khz": settings[UNCORE].get("max_khz", high),
            }
            for key, value in values.items():
                if low is not None and high is not None and not low <= value <= high:
                    raise PowerError(
                        f"cpupools_power.uncore.{key}: {value} kHz is outside {domain['name']}'s range {low}-{high} kHz"
                    )
            if values["min_khz"] > values["max_khz"]:
                raise PowerError("cpupools_power.uncore: min_khz is above max_khz")
            uncore[domain["name"]] = values
    return {
        "cpus": entries,
        "uncore": uncore,
        "driver": facts["cpufreq"]["driver"],
        "mode": facts["cpufreq"]["mode"],
        "idle_driver": facts["cpuidle"]["driver"],
    }


def _check_cpufreq(where: str, cpu: int, wanted: Mapping, policy: Mapping | None, cpufreq: Mapping) -> None:
    if policy is None:
        return
    governor = wanted.get("governor")
    if governor is not None and governor not in policy["governors"]:
        raise PowerError(
            f"{where}: governor {governor} is not offered on CPU {cpu} (driver {policy['driver']}"
            f"{', mode ' + cpufreq['mode'] if cpufreq.get('mode') else ''}); it has {', '.join(policy['governors'])}"
        )
    low, high = policy["min_khz"], policy["max_khz"]
    for key in ("min_khz", "max_khz"):
        value = wanted.get(key)
        if value is not None and low is not None and high is not None and not low <= value <= high:
            raise PowerError(f"{where}: {key} {value} kHz is outside CPU {cpu}'s range {low}-{high} kHz")
    epp = wanted.get("epp")
    if epp is not None:
        if policy["epp"] is None:
            raise PowerError(
                f"{where}: CPU {cpu} has no energy_performance_preference (driver {policy['driver']}"
                f"{', mode ' + cpufreq['mode'] if cpufreq.get('mode') else ''}: only intel_pstate and amd-pstate-epp "
                "in active mode have one)"
            )
        if not epp.isdigit() and epp not in policy["epps"]:
            raise PowerError(f"{where}: epp {epp} is not offered on CPU {cpu}; it has {', '.join(policy['epps'])}")
        if (governor or policy["governor"]) == "performance" and epp != "performance":
            raise PowerError(
                f"{where}: epp {epp} with the performance governor: the driver pins the preference to "
                "performance under that governor (writing another fails with EBUSY); use governor powersave"
            )
