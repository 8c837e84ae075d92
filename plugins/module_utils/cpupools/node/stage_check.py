"""Is a node converged? One pass over every artefact the stages write, read-only.

The stages of site.yml write the kernel arguments (the ``kernel`` stage:
boot loader, optional drop-ins for systemd, irqbalance and the kubelet) and
the node agent (the ``agent`` stage: the ``cmk`` launcher and zipapp, the pool
state, the agent's settings, the reconcile service and timer; on every
runtime, the housekeeper: the zipapp's copy it runs from, its configuration,
its service and timer). This module
derives every one of those artefacts with the functions the stages use and
compares each with the node, so that one module execution per host can say
which stages have work to do and why. The files the stages write are
rendered here, once, and the stages write exactly this text: the check and
the stage cannot disagree about a file's content.

A stage without a check here (``STAGES``) is never reported converged: the
playbooks run every stage whose name is not in a host's converged list.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..hardware.topology import Topology
from .agent_files import sha256_of, under

# Names, not "from . import bootloader": mitogen's module loader cannot import a
# submodule as a name of its package.
from .bootloader import Host, Runner, write_boot_config
from .cmk15 import configmap_name, traces_on_node
from .housekeep import CONFIG_PATH as HOUSEKEEP_CONFIG
from .housekeep import render_config as render_housekeep_config
from .kargs import resolve_isolcpus_flags
from .kubelet import HEADER as KUBELET_HEADER
from .kubelet import Node as KubeletNode
from .kubelet import configure as configure_kubelet
from .kubelet import desired_config as kubelet_config
from .state_writer import apply_state

#: The stages that have a converged check, in the order site.yml runs them.
STAGES = ("kernel", "agent")

#: First lines of every file the stages render (no timestamp: byte-identical re-runs).
HEADER = "# Managed by cpupools (Ansible). Local edits are overwritten by the next run.\n"

#: Where the optional drop-ins of the kernel stage go, under the root.
CPUAFFINITY_PATH = "/etc/systemd/system.conf.d/50-cpupools.conf"
IRQBALANCE_PATH = "/etc/systemd/system/irqbalance.service.d/50-cpupools.conf"
KUBELET_FILE = "50-cpupools.conf"
UNIT_DIR = "/etc/systemd/system"
UNIT = "cpupools-reconcile"
SETTINGS_FILE = "cpupools.agent"
#: The housekeeper (node/housekeep.py): the agent's zipapp copied where every runtime has it (on a cmk
#: node too: /opt/bin, the directory pods mount, holds cmk's own), its unit and its configuration.
HOUSEKEEP_UNIT = "cpupools-housekeep"
HOUSEKEEP_PROGRAM = "/usr/local/lib/cpupools/cpupools.pyz"
DEFAULT_EXCLUSIVE_RESOURCE = "cmk.intel.com/exclusive-cores"
DEFAULT_ENI_RESOURCE = "cmk.intel.com/exclusive-non-isolcpus-cores"


@dataclass(frozen=True)
class NodeFile:
    """A file a stage writes: its path on the node (absolute, without the root), text and mode."""

    stage: str
    path: str
    content: str
    mode: int
    root_owned: bool = False  # the task sets owner and group root
    wanted: bool = True  # an optional drop-in the node does not get is removed (OPTIONAL)

    def to_result(self) -> dict:
        return {
            "stage": self.stage,
            "path": self.path,
            "content": self.content,
            "mode": f"{self.mode:04o}",
            "wanted": self.wanted,
        }


# Renderers ------------------------------------------------------------------------------


def render_cpuaffinity(outputs: Mapping) -> str:
    return (
        HEADER + "# Confines systemd and every service it starts to the housekeeping CPUs, so\n"
        "# host daemons stay off the cpupools pools. Takes effect at the next boot.\n"
        f"[Manager]\nCPUAffinity={outputs['cpu_affinity']}\n"
    )


def wants_cpuaffinity(values: Mapping) -> bool:
    """Whether the node gets the systemd ``CPUAffinity=`` drop-in (``cpupools_systemd_cpuaffinity``).

    ``auto``: where the kernel leaves host processes free to run on the
    isolated CPUs. That is where ``isolcpus`` has no ``domain`` flag (the
    kubelet runtime's ``managed_irq``), and on every node with the unified
    cgroup hierarchy (v2): ``domain`` only starts init on the housekeeping
    CPUs, and as soon as something enables the cpuset controller (the kubelet
    does, for its pods) the kernel gives every task of the root's children
    their cpuset's CPUs, all of them, unless the task's affinity was asked for
    (``sched_setaffinity``, as systemd's ``CPUAffinity=`` does; kernel 6.2 and
    later keep that). On the Debian 13 guest with cmk's ``domain``,
    systemd-udevd ran on an exclusive CPU after the kubelet started.
    """
    setting = values["systemd_cpuaffinity"]
    if setting != "auto":
        return bool(setting)
    if "domain" not in resolve_isolcpus_flags(values.get("isolcpus_flags"), values.get("runtime")):
        return True
    facts_root = values.get("facts_root") or values.get("root") or "/"
    return os.path.exists(under(facts_root, "/sys/fs/cgroup/cgroup.controllers"))


def render_irqbalance(outputs: Mapping) -> str:
    return (
        HEADER + "# Keeps irqbalance from moving interrupts onto the cpupools pools' CPUs.\n"
        "# A value set in /etc/default/irqbalance (EnvironmentFile=) takes precedence.\n"
        f"[Service]\nEnvironment=IRQBALANCE_BANNED_CPULIST={outputs['irqbalance_banned_cpulist']}\n"
    )


def agent_node_name(values: Mapping, host: str) -> str:
    """The Node name the agent re-advertises under (the agent role's default chain)."""
    return str(values.get("agent_node_name") or values.get("k8s_node_name") or host)


def render_reconcile_service(values: Mapping, host: str) -> str:
    conf_dir, agent = values["conf_dir"], values["agent_path"]
    argv = f"{agent} reconcile --conf-dir={conf_dir}"
    if values.get("metrics_dir"):
        argv += f" --metrics-dir={values['metrics_dir']}"
    if values.get("agent_kubeconfig"):
        argv += f" --kubeconfig={values['agent_kubeconfig']} --node-name={agent_node_name(values, host)}"
    exclusive = values.get("k8s_exclusive_resource") or DEFAULT_EXCLUSIVE_RESOURCE
    eni = values.get("k8s_eni_resource") or DEFAULT_ENI_RESOURCE
    return (
        HEADER + "[Unit]\n"
        "Description=cpupools: free the CPU lists of exited workloads (cmk reconcile)\n"
        "Documentation=https://github.com/cpupools/cpupools/blob/main/docs/agent.md\n"
        f"ConditionPathExists={conf_dir}/lock\n\n"
        "[Service]\nType=oneshot\n"
        f"ExecStart={argv}\n"
        "Environment=CMK_PROC_FS=/proc\n"
        f"Environment=CMK_LOCK_TIMEOUT={values['lock_timeout']}\n"
        f"Environment=CPUPOOLS_EXCLUSIVE_RESOURCE={exclusive}\n"
        f"Environment=CPUPOOLS_ENI_RESOURCE={eni}\n"
        "Nice=-5\n"
    )


def render_timer(command: str, interval: int) -> str:
    """A timer that starts its service ``interval`` seconds after boot and every ``interval`` seconds."""
    return (
        HEADER + "[Unit]\n"
        f"Description=cpupools: run cmk {command} every {interval} s\n\n"
        f"[Timer]\nOnBootSec={interval}s\nOnUnitActiveSec={interval}s\nAccuracySec=1s\n\n"
        "[Install]\nWantedBy=timers.target\n"
    )


def render_housekeep_service() -> str:
    return (
        HEADER + "[Unit]\n"
        "Description=cpupools: keep kernel threads and host tasks off the isolated CPUs (cmk housekeep)\n"
        "Documentation=https://github.com/cpupools/cpupools/blob/main/docs/agent.md#the-housekeeper\n"
        # After what resets tasks' CPUs at start: the kubelet enabling the cpuset controller, udev's workers.
        "After=systemd-udevd.service containerd.service kubelet.service\n"
        f"ConditionPathExists={HOUSEKEEP_CONFIG}\n\n"
        "[Service]\nType=oneshot\n"
        f"ExecStart=/usr/bin/env python3 -IS {HOUSEKEEP_PROGRAM} housekeep --config={HOUSEKEEP_CONFIG}\n"
        "Environment=CMK_PROC_FS=/proc\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )


def render_housekeep_power_service() -> str:
    return (
        HEADER + "[Unit]\n"
        "Description=cpupools: power and frequency per pool, before the workloads (cmk housekeep --power-only)\n"
        "Documentation=https://github.com/cpupools/cpupools/blob/main/docs/power.md\n"
        # Before what starts workloads; after the drivers' modules are loaded (the timer's passes catch a late one).
        "DefaultDependencies=no\n"
        "After=local-fs.target systemd-modules-load.service\n"
        "Before=containerd.service crio.service docker.service kubelet.service multi-user.target\n"
        f"ConditionPathExists={HOUSEKEEP_CONFIG}\n\n"
        "[Service]\nType=oneshot\n"
        f"ExecStart=/usr/bin/env python3 -IS {HOUSEKEEP_PROGRAM} housekeep --config={HOUSEKEEP_CONFIG} --power-only\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )


def render_agent_settings(pid_ns: int, isolate_shell: bool) -> str:
    return (
        HEADER + "# The node's PID namespace (inode of /proc/self/ns/pid on the node): cmk\n"
        "# records and judges PIDs of this namespace only.\n"
        f"node_pid_ns={pid_ns}\n"
        "# The node defaults of cmk (docs/agent.md). isolate_shell=1: cmk isolate runs\n"
        '# "COMMAND ARGS..." through /bin/sh -c, as CMK v1.4 did; 0: as argv. A\n'
        "# workload's CMK_ISOLATE_SHELL=1|0 overrides it.\n"
        f"isolate_shell={'1' if isolate_shell else '0'}\n"
    )


def node_pid_namespace(proc: str = "/proc") -> int:
    """Inode of this process's PID namespace: the one the reconcile timer and the holders' PIDs live in."""
    return os.stat(os.path.join(proc, "self/ns/pid")).st_ino


def kubelet_path(values: Mapping) -> str:
    return values["kubelet_config_dir"].rstrip("/") + "/" + KUBELET_FILE


def desired_files(values: Mapping, outputs: Mapping, host: str, pid_ns: int) -> dict[str, NodeFile]:
    """Every file the kernel and agent stages write when present, by name (the stages' keys)."""
    files = {
        "cpuaffinity": NodeFile(
            "kernel", CPUAFFINITY_PATH, render_cpuaffinity(outputs), 0o644, True, wants_cpuaffinity(values)
        ),
        "irqbalance": NodeFile(
            "kernel", IRQBALANCE_PATH, render_irqbalance(outputs), 0o644, True, bool(values["irqbalance_banned"])
        ),
        "settings": NodeFile(
            "agent",
            values["conf_dir"].rstrip("/") + "/" + SETTINGS_FILE,
            render_agent_settings(pid_ns, bool(values["agent_isolate_shell"])),
            0o644,
        ),
        "service": NodeFile("agent", f"{UNIT_DIR}/{UNIT}.service", render_reconcile_service(values, host), 0o644),
        "timer": NodeFile(
            "agent", f"{UNIT_DIR}/{UNIT}.timer", render_timer("reconcile", values["reconcile_interval"]), 0o644
        ),
        "housekeep": NodeFile(
            "agent",
            HOUSEKEEP_CONFIG,
            render_housekeep_config(
                outputs["isolated_cpus"],
                outputs["housekeeping_cpus"],
                values["conf_dir"] if values["runtime"] == "cmk" else None,
                values["housekeep_keep"],
                outputs.get("power") or {},
            ),
            0o644,
            True,
            bool(values["housekeep"]),
        ),
        "housekeep_service": NodeFile(
            "agent",
            f"{UNIT_DIR}/{HOUSEKEEP_UNIT}.service",
            render_housekeep_service(),
            0o644,
            True,
            bool(values["housekeep"]),
        ),
        "housekeep_power": NodeFile(
            "agent",
            f"{UNIT_DIR}/{HOUSEKEEP_UNIT}-power.service",
            render_housekeep_power_service(),
            0o644,
            True,
            bool(values["housekeep"]),
        ),
        "housekeep_timer": NodeFile(
            "agent",
            f"{UNIT_DIR}/{HOUSEKEEP_UNIT}.timer",
            render_timer("housekeep", values["housekeep_interval"]),
            0o644,
            True,
            bool(values["housekeep"]),
        ),
    }
    return files


#: The housekeeper's files, in the order the agent stage writes them.
HOUSEKEEP_FILES = ("housekeep", "housekeep_service", "housekeep_power", "housekeep_timer")


#: Which inventory switch turns each optional drop-in on.
OPTIONAL = {"cpuaffinity": "systemd_cpuaffinity", "irqbalance": "irqbalance_banned"}


# Comparisons ---------------------------------------------------------------------------


def file_difference(root: str, wanted: NodeFile) -> str | None:
    """Why the node's copy of ``wanted`` differs (None: identical content, mode and owner)."""
    path = under(root, wanted.path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return f"{wanted.path} is missing"
    if not stat.S_ISREG(info.st_mode):
        return f"{wanted.path} is not a regular file"
    with open(path, "rb") as handle:
        if handle.read() != wanted.content.encode():
            return f"{wanted.path} differs from the rendered content"
    return mode_difference(wanted.path, info, wanted.mode, wanted.root_owned)


def mode_difference(name: str, info: os.stat_result, mode: int, root_owned: bool) -> str | None:
    if stat.S_IMODE(info.st_mode) != mode:
        return f"{name} has mode {stat.S_IMODE(info.st_mode):04o}, not {mode:04o}"
    if root_owned and (info.st_uid, info.st_gid) != (0, 0):
        return f"{name} is owned by {info.st_uid}:{info.st_gid}, not root:root"
    return None


def directory_difference(root: str, path: str, mode: int = 0o755, root_owned: bool = False) -> str | None:
    """Why the directory a stage creates (``file: state=directory``) is not as that task leaves it."""
    try:
        info = os.stat(under(root, path))
    except FileNotFoundError:
        return f"{path} is missing"
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a directory"
    return mode_difference(path, info, mode, root_owned)


#: The files of the cpupools-hugepages unit (roles/cpupools_kernel/vars/main.yml).
HUGEPAGES_FILES = (
    "/etc/cpupools-hugepages.conf",
    "/usr/local/sbin/cpupools-hugepages",
    "/etc/systemd/system/cpupools-hugepages.service",
)


def hugepages_reasons(plan: Mapping, root: str) -> list[str]:
    """The hugepages unit is not compared here: wherever it has work or files, the kernel stage runs."""
    if (plan.get("hugepages") or {}).get("runtime"):
        return ["hugepages: the cpupools-hugepages unit is not compared by the fast path"]
    present = [path for path in HUGEPAGES_FILES if os.path.lexists(under(root, path))]
    return [f"hugepages: {present[0]} is present and no page is planned through the unit"] if present else []


def kubelet_reasons(values: Mapping, plan: Mapping, topology: Topology | None, host_io: Host) -> list[str]:
    """What the kernel stage's kubelet task would do (its own module logic, in check mode)."""
    settings = {
        **values,
        "state": "present",
        "plan": plan,
        "dropin": values["kubelet_dropin"],
        "reservation": values["kubelet_reservation"],
    }
    node = KubeletNode(host_io, kubelet_path(values), values["kubelet_state_file"])
    result = configure_kubelet(node, kubelet_config(settings, topology), values["runtime"], KUBELET_HEADER)
    reasons = [f"kubelet: {action}" for action in result["actions"]]
    if result["restart_required"]:  # the stage says so and exports it for playbooks/reboot.yml
        reasons.append(f"kubelet: the drop-in waits for the drained restart ({result['restart_reason']})")
    return reasons


def kernel_reasons(values: Mapping, kernel: Mapping, files: Mapping[str, NodeFile], root: str) -> list[str]:
    """What the kernel stage would change: the boot configuration, the drop-ins, a reboot it may do."""
    reasons = [f"kernel arguments: {action}" for action in kernel["actions"]]
    for name, switch in OPTIONAL.items():
        wanted = files[name]
        if wanted.wanted:
            for reason in (
                directory_difference(root, os.path.dirname(wanted.path), root_owned=True),
                file_difference(root, wanted),
            ):
                if reason:
                    reasons.append(f"{name}: {reason}")
        elif os.path.lexists(under(root, wanted.path)):
            reasons.append(f"{name}: {wanted.path} is present but {switch} is {values[switch]}")
    if values["reboot_ok"] and kernel["reboot_required"] and values["root"] == "/":
        reasons.append("reboot: the running kernel lacks the written arguments and cpupools_reboot_ok is true")
    return reasons


def agent_reasons(
    values: Mapping,
    state: Mapping,
    files: Mapping[str, NodeFile],
    build: Mapping | None,
    systemctl: Callable[[Sequence[str]], int] | None,
) -> list[str]:
    """What the agent stage would change: the build, cmk, the pool state, the settings, the units."""
    root = values["root"]
    dest = values["agent_path"]
    reasons = built_reasons("cmk", root, build, ((dest + ".pyz", "pyz_sha256"), (dest, "launcher_sha256")))
    if state["changed"]:
        reasons.append("pool state: " + ("differs from the plan" if state["after"] != state["before"] else "re-pin"))
    if root != "/":
        reason = directory_difference(root, UNIT_DIR)
        if reason:
            reasons.append(f"units: {reason}")
    for name in ("settings", "service", "timer"):
        reason = file_difference(root, files[name])
        if reason:
            reasons.append(f"{name}: {reason}")
    if manage_services(values) and systemctl is not None:
        timer = f"{UNIT}.timer"
        if systemctl(["is-enabled", "--quiet", timer]) != 0:
            reasons.append(f"units: {timer} is not enabled")
        if systemctl(["is-active", "--quiet", timer]) != 0:
            reasons.append(f"units: {timer} is not active")
    return reasons + housekeep_reasons(values, files, build, systemctl)


def built_reasons(name: str, root: str, build: Mapping | None, copies: Sequence[tuple[str, str]]) -> list[str]:
    """Why the node's copies of the controller's build (``(path, digest key)``, mode 0755, in a directory
    of mode 0755) are not the build's."""
    if not build:
        return [f"{name}: no build of the agent was given to compare with"]
    reasons = []
    for directory in dict.fromkeys(os.path.dirname(path) or "/" for path, _key in copies):
        reason = directory_difference(root, directory)
        if reason:
            reasons.append(f"{name}: {reason}")
    for dest, key in copies:
        path = under(root, dest)
        digest = sha256_of(path)
        if digest is None:
            reasons.append(f"{name}: {dest} is missing")
        elif digest != build.get(key):
            reasons.append(f"{name}: {dest} differs from the build")
        elif stat.S_IMODE(os.stat(path).st_mode) != 0o755:
            reasons.append(f"{name}: {dest} is not mode 0755")
    return reasons


def housekeep_reasons(
    values: Mapping,
    files: Mapping[str, NodeFile],
    build: Mapping | None,
    systemctl: Callable[[Sequence[str]], int] | None,
) -> list[str]:
    """What the agent stage would change of the housekeeper, on every runtime: its program (the build's
    zipapp), configuration and units when ``cpupools_housekeep`` is on, their removal when it is off."""
    root = values["root"]
    if not values["housekeep"] or values.get("state") == "absent":
        paths = [
            *(files[name].path for name in HOUSEKEEP_FILES[1:]),
            os.path.dirname(HOUSEKEEP_CONFIG),
            os.path.dirname(HOUSEKEEP_PROGRAM),
        ]
        return [
            f"housekeep: {path} is present but cpupools_housekeep is false"
            for path in paths
            if os.path.lexists(under(root, path))
        ]
    reasons = built_reasons("housekeep", root, build, ((HOUSEKEEP_PROGRAM, "pyz_sha256"),))
    reason = directory_difference(root, os.path.dirname(HOUSEKEEP_CONFIG), root_owned=True)
    if reason:
        reasons.append(f"housekeep: {reason}")
    for name in HOUSEKEEP_FILES:
        reason = file_difference(root, files[name])
        if reason:
            reasons.append(f"housekeep: {reason}")
    if manage_services(values) and systemctl is not None:
        timer, service = f"{HOUSEKEEP_UNIT}.timer", f"{HOUSEKEEP_UNIT}.service"
        power = f"{HOUSEKEEP_UNIT}-power.service"
        checks = ((service, "is-enabled"), (power, "is-enabled"), (timer, "is-enabled"), (timer, "is-active"))
        for unit, check in checks:
            if systemctl([check, "--quiet", unit]) != 0:
                reasons.append(f"housekeep: {unit} is not {check[3:]}")
    return reasons


def cmk_v15_configmap(values: Mapping, host: str) -> str:
    """The CMK v1.5 ConfigMap the agent stage must read before it adopts this node ("" when none).

    A node that shows CMK v1.5 (``cmk15.traces_on_node``: CMK's ``cmk`` at
    ``cpupools_agent_path`` and no pool state in ``cpupools_conf_dir``) keeps its
    running workloads' task lists only in ``cmk-config-<node>``. Without a
    kubeconfig to read it, the run is refused here, in the plan play, before
    anything changes: starting from empty lists would hand those CPUs out again.
    """
    if values["state"] != "present" or values["runtime"] != "cmk":
        return ""
    traces = traces_on_node(values["root"], values["conf_dir"], values["agent_path"])
    if not traces:
        return ""
    name = configmap_name(str(values.get("k8s_node_name") or host))
    if not values["k8s_kubeconfig"] and not values["k8s_in_cluster"]:
        from ..core.errors import StateError

        raise StateError(
            f"CMK v1.5 runs on this node ({traces}) and keeps its task lists only in ConfigMap {name}, "
            "which cannot be read without a kubeconfig: set cpupools_k8s_kubeconfig (a path on the controller) "
            "or cpupools_k8s_in_cluster: true; adopting without them would hand out the CPUs of its running "
            "workloads again",
            "k8s_kubeconfig",
        )
    return name


def manage_services(values: Mapping) -> bool:
    chosen = values.get("manage_services")
    return values["root"] == "/" if chosen is None else bool(chosen)


# The whole check ------------------------------------------------------------------------


def kernel_params(values: Mapping, plan: Mapping, host: str) -> dict:
    """The options of the kernel stage's cpupools_kernel_args task, from the checked inputs."""
    return {
        "state": "present",
        "plan": plan,
        "backend": values["kernel_args_backend"],
        "root": values["root"],
        "facts_root": values["facts_root"] or values["root"],
        "host": host,
        "name": values["grub_dropin_name"],
        "isolcpus_flags": values["isolcpus_flags"]
        if isinstance(values["isolcpus_flags"], str)
        else list(values["isolcpus_flags"]),
        "keep_adopted": values["keep_adopted"],
        "nohz_full": values["nohz_full"],
        "rcu_nocbs": values["rcu_nocbs"],
        "irqaffinity": values["irqaffinity"],
        "command_line_size": values["command_line_size"],
        "update": "never",
        "command_wrapper": list(values["command_wrapper"]) or None,
        "report_files": [],
        "kernel_release": values["kernel_release"] or None,
        "record": "/var/lib/cpupools/kernel-args.json",
    }


def check_node(
    values: Mapping,
    plan: Mapping,
    host: str,
    *,
    run_command: Runner,
    task_gid: int | None,
    build: Mapping | None,
    which: Callable[[str], str | None] | None = None,
    systemctl: Callable[[Sequence[str]], int] | None = None,
    pid_ns: int | None = None,
    topology: Topology | None = None,
) -> dict:
    """Compare the node with everything the kernel and agent stages would write; change nothing.

    Raises the stages' own refusals (``KernelArgsError``, ``StateError``,
    ``ResizeError``) exactly as they would, before any stage runs.
    Returns ``stages`` (name -> list of reasons, empty when converged),
    ``files`` (the rendered files, for the stages to write), ``exports``
    (the facts a skipped stage would have set, for the report), ``warnings``
    (for the caller to say), ``state_warnings`` (those of the pool state,
    which the agent stage is told were said) and ``agent_leftovers`` (``leftover_paths``).
    """
    root = values["root"]
    host_io = Host(
        root,
        run_command,
        facts_root=values["facts_root"] or root,
        wrapper=list(values["command_wrapper"]) or None,
        check_mode=True,
        which=which,
    )
    kernel = write_boot_config(host_io, kernel_params(values, plan, host))
    cmk = values["runtime"] == "cmk"  # other runtimes: the agent stage removes the agent and its state
    state = apply_state(
        os.path.join(root, values["conf_dir"].lstrip("/")),
        dict(plan) if cmk else None,
        present=cmk,
        force=values["agent_force"],
        task_gid=task_gid,
        lock_timeout=values["lock_timeout"],
        check_mode=True,
    )
    files = desired_files(values, kernel["outputs"], host, node_pid_namespace() if pid_ns is None else pid_ns)
    kubelet_io = Host(root, run_command, facts_root=values["facts_root"] or root, check_mode=True, which=which)
    stages = {
        "kernel": [
            *kernel_reasons(values, kernel, files, root),
            *kubelet_reasons(values, plan, topology, kubelet_io),
            *hugepages_reasons(plan, root),
        ],
        "agent": agent_reasons(values, state, files, build, systemctl)
        if cmk
        else agent_leftovers(values, root) + housekeep_reasons(values, files, build, systemctl),
    }
    return {
        "stages": stages,
        "files": {name: item.to_result() for name, item in files.items()},
        "exports": exports(kernel, state),
        "warnings": [*kernel["warnings"], *state["warnings"]],
        # what the agent stage's cpupools_state would warn about again: it is told they were said
        "state_warnings": list(state["warnings"]),
        # on a node of another runtime, what of cmk the agent stage removes: it skips the removal when nothing
        "agent_leftovers": [] if cmk else leftover_paths(values, root),
    }


def leftover_paths(values: Mapping, root: str) -> list[str]:
    """On a node of another runtime, the paths (on the node) the agent stage would remove: the launcher and its
    zipapp, the pool state and the reconcile units (roles/cpupools_agent/tasks/absent.yml)."""
    paths = [
        values["agent_path"],
        values["agent_path"] + ".pyz",
        values["conf_dir"],
        f"{UNIT_DIR}/{UNIT}.service",
        f"{UNIT_DIR}/{UNIT}.timer",
    ]
    return [path for path in paths if os.path.lexists(under(root, path))]


def agent_leftovers(values: Mapping, root: str) -> list[str]:
    """The reasons of ``leftover_paths``: nothing there, nothing to do."""
    return [
        f"agent: cpupools_runtime is {values['runtime']}: the agent stage removes {path}"
        for path in leftover_paths(values, root)
    ]


def kernel_exports(kernel: Mapping) -> dict:
    """The facts the kernel stage sets from its module's result (the module returns them as ``exports``)."""
    return {
        "cpupools_reboot_required": kernel["reboot_required"],
        "cpupools_pending_kernel_args": kernel["pending"],
        "cpupools_kernel_cmdline": kernel["cmdline"],
        "cpupools_housekeeping": kernel["outputs"],
        "cpupools_kernel_status": {
            "reboot_required": kernel["reboot_required"],
            "pending": [item["arg"] for item in kernel["pending"]],
            # what of them the running kernel could take without the reboot (kargs.runtime_part)
            "pending_now": {item["arg"]: item["now"] for item in kernel["pending"] if item.get("now")},
            "not_applied": [item["arg"] for item in kernel["not_applied"]],
            "desired_cmdline_args": kernel.get("args") or {},
            # what the kernel stage warns about (the report shows them; the stage does not repeat them)
            "warnings": [str(w) for w in kernel.get("warnings") or []],
        },
    }


def exports(kernel: Mapping, state: Mapping) -> dict:
    """The facts the kernel and agent stages set for the k8s stage and the report (one shape, whoever sets them)."""
    return {**kernel_exports(kernel), "cpupools_agent_status": {"present": True, "tasks": state.get("tasks") or {}}}


#: Why the k8s stage does nothing on a host, by key (``k8s_skip``): the plan play's action groups such
#: hosts by key (``cpupools_k8s_skipped_<key>``), so that its message reads one host's result per reason.
K8S_SKIP_REASONS = {
    "disabled": "cpupools_k8s_enabled is false",
    "unconfigured": (
        "no kubeconfig is configured: set cpupools_k8s_kubeconfig (a path on the controller)"
        " or cpupools_k8s_in_cluster: true"
    ),
}


def k8s_skip(values: Mapping) -> str:
    """The key of ``K8S_SKIP_REASONS`` why the k8s stage does nothing on this host; "" = it runs."""
    if not values["k8s_enabled"]:
        return "disabled"
    if not values["k8s_kubeconfig"] and not values["k8s_in_cluster"]:
        return "unconfigured"
    return ""


def k8s_skip_reason(values: Mapping) -> str:
    """Why the k8s stage does nothing on this host ("" = it runs): the role's ``cpupools_k8s_skip_reason``.

    The plan play groups such hosts out of the k8s play (``cpupools_k8s_skipped``)
    and sets the status that stage would export; tests/playbook/test_k8s_skip.py
    holds this equal to the role's own variable, which decides when the role
    runs without the plan play (playbooks/uninstall.yml, reboot.yml).
    """
    key = k8s_skip(values)
    return K8S_SKIP_REASONS[key] if key else ""


def k8s_skipped_status(reason: str) -> dict:
    """The ``cpupools_k8s_status`` the k8s stage exports for a host it skips (roles/cpupools_k8s/tasks/main.yml)."""
    return {"enabled": False, "skipped_reason": reason, "advertised": {}, "expected": {}}


def todo(stages: Mapping[str, Sequence[str]], enabled: bool, state: str, known: Sequence[str] = STAGES) -> list[str]:
    """The stages to run: those with a reason; every one when the fast path is off or the state is absent."""
    if not enabled or state != "present":
        return list(known)
    return [name for name in known if name not in stages or stages[name]]
