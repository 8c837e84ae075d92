"""Power per pool on the node: the housekeeper's lines for it, and setting sysfs to them.

The plan (hardware/power.py ``plan_power``) decides, per group of CPUs, the
cpufreq governor, the scaling range (a fixed frequency is min = max), the
energy/performance preference and which cpuidle states are disabled, and
per uncore domain its range; it has checked them against what the node's
drivers offer. The agent stage writes them into the housekeeper's
configuration (``render_power_lines``), and ``cmk housekeep`` sets them
(``power_pass``): at boot from ``cpupools-power.service``, ordered before
containerd and the kubelet, and on every pass of the housekeeper's timer,
so a setting someone or something changed is put back within its interval.

Each file is written only when it reads otherwise, in an order the kernel
takes: the governor before the preference (the performance governor pins
it), and of a scaling range the bound that makes room first (a new minimum
above the current maximum needs the maximum raised first). Before a file is
first changed, its value is saved (``SAVED``, beside the node's other
cpupools state); a file the configuration no longer names (a CPU that left
the exclusive pool in a resize, a setting taken out of the inventory, an
uninstall: ``--restore``) gets its saved value back, so the node returns to
what its drivers chose.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterable, Mapping

from ..core.cpulist import format_cpulist, parse_cpulist
from ..core.errors import CpulistError, StateError
from .tasks import Facts

#: The values the housekeeper changed, as they were before it first did (path -> value).
SAVED = "/var/lib/cpupools/power-saved.json"
CPU = "sys/devices/system/cpu"
UNCORE = f"{CPU}/intel_uncore_frequency"
#: A ``power`` line's settings, in the order they are written (node/housekeep.py's configuration).
KEYS = ("pool", "governor", "min_khz", "max_khz", "epp", "cstates_off", "cstates_on")


def render_power_lines(power: Mapping) -> list[str]:
    """``power=<cpus> key=value ...`` per planned group and ``uncore=<domain> min_khz= max_khz=`` per domain."""
    lines = []
    for entry in power.get("cpus") or ():
        fields = [f"power={entry['cpus']}"]
        for key in KEYS:
            if key not in entry:
                continue
            value = entry[key]
            fields.append(f"{key}={','.join(str(v) for v in value) if isinstance(value, list) else value}")
        lines.append(" ".join(fields))
    for name, values in sorted((power.get("uncore") or {}).items()):
        lines.append(f"uncore={name} min_khz={values['min_khz']} max_khz={values['max_khz']}")
    return lines


def parse_power_lines(lines: Iterable[tuple[str, str, str]]) -> dict:
    """``(key, value, where)`` of the ``power`` and ``uncore`` lines back: ``cpus`` (entries with ``cpus`` a
    list) and ``uncore`` (domain -> range). A line that cannot be used raises ``StateError``."""
    entries, uncore = [], {}
    for key, value, where in lines:
        head, *fields = value.split(" ")
        settings: dict[str, object] = {}
        for field in fields:
            name, eq, text = field.partition("=")
            allowed = KEYS if key == "power" else ("min_khz", "max_khz")
            if not eq or name not in allowed or name in settings:
                raise StateError(f"{where}: {key}: {field!r} is not one of {', '.join(allowed)}=")
            if name in ("min_khz", "max_khz"):
                if not text.isdigit():
                    raise StateError(f"{where}: {name}={text} is not a frequency in kHz")
                settings[name] = int(text)
            elif name.startswith("cstates_"):
                if text and not all(part.isdigit() for part in text.split(",")):
                    raise StateError(f"{where}: {name}={text} is not a list of cpuidle state indexes")
                settings[name] = [int(part) for part in text.split(",") if part]
            else:
                if not text or "/" in text or text in (".", ".."):
                    raise StateError(f"{where}: {name}={text!r} is not a value sysfs takes")
                settings[name] = text
        if key == "uncore":
            if not head or "/" in head or head.startswith("."):
                raise StateError(f"{where}: uncore={head!r} is not an uncore domain's name")
            uncore[head] = settings
            continue
        try:
            cpus = parse_cpulist(head, f"{where}: power")
        except CpulistError as exc:
            raise StateError(str(exc)) from None
        entries.append({"cpus": cpus, **settings})
    return {"cpus": entries, "uncore": uncore}


def _desired(config: Mapping) -> list[tuple[str, str]]:
    """``(sysfs path, value)`` in the order to write them, for the whole configuration."""
    out: list[tuple[str, str]] = []
    for entry in config.get("cpus") or ():
        for cpu in entry["cpus"]:
            base = f"{CPU}/cpu{cpu}"
            if "governor" in entry:
                out.append((f"{base}/cpufreq/scaling_governor", str(entry["governor"])))
            for key, file in (("min_khz", "scaling_min_freq"), ("max_khz", "scaling_max_freq")):
                if key in entry:
                    out.append((f"{base}/cpufreq/{file}", str(entry[key])))
            if "epp" in entry:
                out.append((f"{base}/cpufreq/energy_performance_preference", str(entry["epp"])))
            for key, value in (("cstates_off", "1"), ("cstates_on", "0")):
                for index in entry.get(key) or ():
                    out.append((f"{base}/cpuidle/state{index}/disable", value))
    for name, values in sorted((config.get("uncore") or {}).items()):
        for key, file in (("min_khz", "min_freq_khz"), ("max_khz", "max_freq_khz")):
            if key in values:
                out.append((f"{UNCORE}/{name}/{file}", str(values[key])))
    return out


#: A range's lower bound -> its upper bound.
_RANGES = {"scaling_min_freq": "scaling_max_freq", "min_freq_khz": "max_freq_khz"}


def _order(writes: list[dict], current: Mapping[str, str | None]) -> list[dict]:
    """The writes with each range's upper bound first where the new lower bound is above the upper bound
    as it stands (the kernel refuses a minimum above the maximum); the lower bound first otherwise."""
    out = list(writes)
    for write in writes:
        directory, file = write["path"].rsplit("/", 1)
        if file not in _RANGES:
            continue
        upper = f"{directory}/{_RANGES[file]}"
        partner = next((w for w in out if w["path"] == upper), None)
        now = current.get(upper) or ""
        if partner is not None and now.isdigit() and write["to"].isdigit() and int(write["to"]) > int(now):
            out.remove(partner)
            out.insert(out.index(write), partner)
    return out


def read_saved(sysfs: Facts) -> dict[str, str]:
    text = sysfs.read(SAVED.lstrip("/"))
    if not text:
        return {}
    try:
        saved = json.loads(text)
    except ValueError:
        raise StateError(f"{SAVED}: not the housekeeper's saved values (not JSON)") from None
    if not isinstance(saved, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in saved.items()):
        raise StateError(f"{SAVED}: not the housekeeper's saved values")
    # Only what the housekeeper writes: a CPU's or the uncore's files, no way out of sysfs.
    for path in saved:
        if not path.startswith(f"{CPU}/") or ".." in path.split("/") or "\n" in saved[path]:
            raise StateError(f"{SAVED}: {path[:120]!r} is not a file the housekeeper sets")
    return saved


def _write_saved(sysfs: Facts, saved: Mapping[str, str]) -> None:
    path = sysfs.path(SAVED)
    if not saved:
        if os.path.lexists(path):
            os.unlink(path)
        return
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"  # the boot unit's pass and the timer's may meet
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(dict(sorted(saved.items())), indent=1) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def power_pass(config: Mapping | None, sysfs: Facts, check: bool = False) -> dict:
    """Set what ``config`` (``parse_power_lines``'s; None: restore everything) names, and give back what
    it no longer names its saved value. Returns ``writes`` (``path``, ``from``, ``to``, ``status``:
    ``written``, ``restored``, ``would write``, ``would restore`` or ``refused`` with ``error``) and
    ``summary``."""
    desired = _desired(config or {})
    wanted = dict(desired)
    saved = read_saved(sysfs)
    current = {path: _read(sysfs, path) for path in {*wanted, *saved}}
    restores = [
        {"path": "/" + path, "from": current[path], "to": value, "restore": True}
        for path, value in sorted(saved.items())
        if path not in wanted and current[path] is not None and current[path] != value
    ]
    # Given back already (or never changed since): forgotten. A file that is not there now (a CPU offline,
    # a driver unloaded) keeps its saved value, to be given back when it returns.
    gone = [path for path in saved if path not in wanted and current[path] == saved[path]]
    writes = [
        {"path": "/" + path, "from": current[path], "to": value, "restore": False}
        for path, value in desired
        if current[path] != value
    ]
    now = {"/" + path: value for path, value in current.items()}
    writes = _order(restores, now) + _order(writes, now)
    if check:
        for write in writes:
            write["status"] = "would restore" if write.pop("restore") else "would write"
        return {"writes": writes, "summary": power_summary(writes)}
    keep = dict(saved)
    for path in gone:
        keep.pop(path, None)
    for write in writes:
        path = write["path"].lstrip("/")
        if not write["restore"] and path not in keep and write["from"] is not None:
            keep[path] = write["from"]
    _write_saved(sysfs, keep)  # the values to go back to, on disk before the first one changes
    for write in writes:
        restore = write.pop("restore")
        path = write["path"].lstrip("/")
        if write["from"] is None:
            write["status"], write["error"] = "refused", "ENOENT: the file is not there (driver or CPU gone)"
            continue
        try:
            with open(sysfs.path(write["path"]), "w") as handle:
                handle.write(write["to"] + "\n")
        except OSError as exc:
            write["status"] = "refused"
            write["error"] = errno.errorcode.get(exc.errno or 0, str(exc.errno)) + f": {exc.strerror}"
            continue
        write["status"] = "restored" if restore else "written"
        if restore:
            keep.pop(path, None)
    _write_saved(sysfs, keep)
    return {"writes": writes, "summary": power_summary(writes)}


def _read(sysfs: Facts, path: str) -> str | None:
    text = sysfs.read(path)
    return None if text is None else text.strip()


def power_summary(writes: list[dict]) -> str:
    if not writes:
        return "power: every setting as planned"
    cpus = set()
    for write in writes:
        parts = write["path"].split("/")
        cpus.update(int(p[3:]) for p in parts if p.startswith("cpu") and p[3:].isdigit())
    statuses: dict[str, int] = {}
    for write in writes:
        statuses[write["status"]] = statuses.get(write["status"], 0) + 1
    said = ", ".join(f"{count} {status}" for status, count in sorted(statuses.items()))
    return f"power: {len(writes)} setting(s) to change ({said})" + (f" on CPUs {format_cpulist(cpus)}" if cpus else "")
