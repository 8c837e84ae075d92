#!/usr/bin/python
"""Ansible module: write the kernel arguments derived from the CPU pool plan."""

DOCUMENTATION = r"""
---
module: cpupools_kernel_args
short_description: Write the kernel arguments derived from the cpupools plan into the boot loader
description:
  - Derives C(isolcpus), C(nohz_full), C(rcu_nocbs) and C(irqaffinity) from the plan of the
    C(cpupools_plan) role and writes them into the boot loader configuration, changing only
    those four arguments. Every other kernel argument is left exactly as it is.
  - C(grub) writes a drop-in C(/etc/default/grub.d/<name>.cfg) that appends to
    C(GRUB_CMDLINE_LINUX); C(grubby) runs C(grubby --update-kernel=ALL) with only the
    differences; C(kernel-install) edits C(/etc/kernel/cmdline) in place.
  - Compares the result with the running kernel (C(/proc/cmdline),
    C(/sys/devices/system/cpu/isolated) and C(nohz_full)) and reports which arguments wait for a reboot.
    It never reboots.
  - Every command goes through one seam (O(command_wrapper)) and is listed in RV(commands).
options:
  state:
    description: >-
      C(present) writes the arguments; C(absent) removes exactly those cpupools wrote and restores the
      values it replaced.
    type: str
    choices: [present, absent]
    default: present
  plan:
    description: The plan (host fact C(cpupools_plan)). Required when O(state=present).
    type: dict
  backend:
    description: Boot loader backend; C(auto) detects it under O(root) (grubby, then GRUB, then kernel-install).
    type: str
    choices: [auto, grub, grubby, kernel-install]
    default: auto
  root:
    description: Root directory of the host; every file is read and written under it (tests use a fixture tree).
    type: path
    default: /
  report_files:
    description:
      - Paths (as on the node, under O(root)) to report back in RV(files_present) when they exist. The role
        lists its optional drop-ins, so that switched-off ones are removed only when they are there, without
        one more module run per file.
    type: list
    elements: path
    default: []
  host:
    description: Name of the host in error messages (the role passes the inventory name); default the node's hostname.
    type: str
  name:
    description: Name of the GRUB drop-in, C(/etc/default/grub.d/<name>.cfg). Sort it after other drop-ins.
    type: str
    default: 99-cpupools
  isolcpus_flags:
    description: Flags written in front of the isolcpus cpulist (C(nohz), C(domain), C(managed_irq)).
    type: list
    elements: str
    default: [managed_irq, domain]
  keep_adopted:
    description: >-
      In adopt mode, keep the running kernel's isolcpus (with its flags) and other owned arguments, so a
      migrated CMK node needs no reboot.
    type: bool
    default: true
  nohz_full:
    description: Write C(nohz_full=) with the exclusive pool's CPUs.
    type: bool
    default: true
  rcu_nocbs:
    description: Write C(rcu_nocbs=) with the exclusive pool's CPUs.
    type: bool
    default: true
  irqaffinity:
    description: Write C(irqaffinity=) with the housekeeping CPUs.
    type: bool
    default: true
  command_line_size:
    description: The kernel's COMMAND_LINE_SIZE in bytes, terminating NUL included (2048 on x86).
    type: int
    default: 2048
  update:
    description:
      - When to regenerate the boot configuration (C(update-grub) or C(grub-mkconfig -o), C(kernel-install add)).
      - C(auto) after this run changed a file; C(never) leaves it to the caller (the role's handler);
        C(always) runs it now (the handler's call). grubby changes the entries directly.
    type: str
    choices: [auto, never, always]
    default: auto
  command_wrapper:
    description:
      - Argv prefix every command is run through (the seam tests observe). Defaults to the
        whitespace-split environment variable C(CPUPOOLS_COMMAND_WRAPPER).
    type: list
    elements: str
  kernel_release:
    description: >-
      Release of the kernel the arguments are for; default the running one (or
      C(<root>/proc/sys/kernel/osrelease)).
    type: str
  record:
    description: File (under O(root)) that remembers the values cpupools replaced, for O(state=absent).
    type: path
    default: /var/lib/cpupools/kernel-args.json
attributes:
  check_mode:
    support: full
    description: >-
      Reads everything (and runs C(grubby --info)), writes nothing, runs no other command, and reports
      what would change.
  diff_mode:
    support: full
    description: Shows the old and new kernel command line, and the old and new file.
author:
  - cpupools contributors
"""

EXAMPLES = r"""
- name: Write the kernel arguments of the plan
  cpupools_kernel_args:
    plan: "{{ cpupools_plan }}"
    isolcpus_flags: [managed_irq, domain]
  register: kargs

- name: Remove them again
  cpupools_kernel_args:
    state: absent
"""

RETURN = r"""
backend:
  description: The backend used.
  type: str
  returned: always
  sample: grub
args:
  description: The owned arguments cpupools has in the boot configuration after this run (key -> value).
  type: dict
  returned: always
  sample: {"isolcpus": "managed_irq,domain,1-5", "nohz_full": "1-3", "rcu_nocbs": "1-3", "irqaffinity": "0,6-7"}
cmdline:
  description: >-
    C(desired) (the owned arguments as text), C(configured) (the boot loader's command line after this
    run, as far as it is known) and C(running) (C(/proc/cmdline)).
  type: dict
  returned: always
reboot_required:
  description: >-
    True when the running kernel lacks an owned argument the boot configuration has (or has one it no
    longer has).
  type: bool
  returned: always
pending:
  description: Exactly the owned arguments that differ between the boot configuration and the running kernel.
  type: list
  elements: dict
  returned: always
  sample: [{"arg": "isolcpus", "configured": "managed_irq,domain,1-5", "running": null}]
not_applied:
  description: >-
    Owned arguments on the running command line that the kernel does not apply, according to
    C(/sys/devices/system/cpu/isolated) and C(nohz_full) (a reboot does not fix these; each is also a warning).
  type: list
  elements: dict
  returned: always
  sample: [{"arg": "isolcpus", "running": "managed_irq,domain,1-5", "active": ""}]
update_needed:
  description: >-
    True when a boot configuration file changed and the boot loader update (update-grub, kernel-install
    add) has not been run by this call.
  type: bool
  returned: always
commands:
  description: Every command run (or, in check mode, that would change something), as argv lists without the wrapper.
  type: list
  elements: list
  returned: always
notes:
  description: What was left out and why (adopt mode, empty pools, arguments the operator's own files already set).
  type: list
  elements: str
  returned: always
outputs:
  description: >-
    Values for the optional host drop-ins (housekeeping CPUs, CPUAffinity, irqbalance banned cpulist,
    kubelet reservations).
  type: dict
  returned: always
files_present:
  description: Those of O(report_files) that exist.
  type: list
  elements: str
  returned: always
path:
  description: The file this backend writes (drop-in or C(/etc/kernel/cmdline)); empty for grubby.
  type: str
  returned: always
"""

import json
import os
import shlex
import socket
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.cpupools import kargs
from ansible.module_utils.cpupools.errors import CpupoolsError, KernelArgsError

BIN_DIRS = ("usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin")

ARGUMENT_SPEC = {
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "plan": {"type": "dict"},
    "backend": {"type": "str", "choices": ["auto", "grub", "grubby", "kernel-install"], "default": "auto"},
    "root": {"type": "path", "default": "/"},
    "host": {"type": "str"},
    "name": {"type": "str", "default": "99-cpupools"},
    "isolcpus_flags": {"type": "list", "elements": "str", "default": list(kargs.DEFAULT_ISOLCPUS_FLAGS)},
    "keep_adopted": {"type": "bool", "default": True},
    "nohz_full": {"type": "bool", "default": True},
    "rcu_nocbs": {"type": "bool", "default": True},
    "irqaffinity": {"type": "bool", "default": True},
    "command_line_size": {"type": "int", "default": kargs.COMMAND_LINE_SIZE},
    "update": {"type": "str", "choices": ["auto", "never", "always"], "default": "auto"},
    "command_wrapper": {"type": "list", "elements": "str"},
    "report_files": {"type": "list", "elements": "path", "default": []},
    "kernel_release": {"type": "str"},
    "record": {"type": "path", "default": "/var/lib/cpupools/kernel-args.json"},
}


class Host:
    """Reads, writes and commands under ``root``; every command goes through ``run``."""

    def __init__(self, module):
        self.module = module
        self.root = module.params["root"]
        wrapper = module.params["command_wrapper"]
        if wrapper is None:
            wrapper = shlex.split(os.environ.get("CPUPOOLS_COMMAND_WRAPPER", ""))
        self.wrapper = list(wrapper)
        self.commands = []
        self.check = module.check_mode

    def path(self, rel):
        return os.path.join(self.root, rel.lstrip("/"))

    def read(self, rel):
        try:
            with open(self.path(rel), encoding="utf-8") as handle:
                return handle.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise KernelArgsError(f"cannot read {rel}: {exc}", "kernel_args_backend") from None

    def resolve(self, name):
        if self.root == "/" and not self.wrapper:
            return self.module.get_bin_path(name, opt_dirs=["/usr/sbin", "/sbin"])
        for rel in BIN_DIRS:
            candidate = self.path(os.path.join(rel, name))
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
        return None

    def run(self, argv, writes=True):
        """The one seam: record ``argv``; run it (through the wrapper) unless it writes in check mode."""
        self.commands.append(list(argv))
        if writes and self.check:
            return ""
        rc, out, err = self.module.run_command(self.wrapper + list(argv), environ_update={"LC_ALL": "C"})
        if rc != 0:
            raise KernelArgsError(
                f"{' '.join(argv)} failed (exit {rc}): {(err or out).strip()[:500]}", "kernel_args_backend"
            )
        return out

    def write(self, rel, text):
        """Atomic replace (``None`` removes); nothing in check mode."""
        if self.check:
            return
        path = self.path(rel)
        if text is None:
            if os.path.lexists(path):
                os.unlink(path)
            return
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".cpupools-", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            if os.path.exists(path):
                os.chmod(tmp, os.stat(path).st_mode & 0o7777)
            else:
                os.chmod(tmp, 0o644)
            self.module.atomic_move(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


class Record:
    """Values of owned arguments cpupools replaced, per backend (for state=absent)."""

    def __init__(self, host, rel):
        self.host, self.rel = host, rel
        text = host.read(rel)
        try:
            self.data = json.loads(text) if text else {}
        except ValueError:
            raise KernelArgsError(
                f"{rel} is not valid JSON; remove it only if no cpupools arguments are set", "kernel_args_record"
            ) from None
        self.before = self._canonical()

    def _canonical(self):
        backends = {name: entry for name, entry in self.data.get("backends", {}).items() if entry}
        return json.dumps(backends, sort_keys=True)

    def entry(self, backend):
        return self.data.setdefault("backends", {}).setdefault(backend, {"original": {}})

    def drop(self, backend):
        self.data.get("backends", {}).pop(backend, None)

    def save(self):
        if self._canonical() == self.before:
            return False
        text = (
            None
            if not self.data.get("backends")
            else json.dumps({"version": 1, **self.data}, indent=2, sort_keys=True) + "\n"
        )
        self.host.write(self.rel, text)
        return True


def take_over(record_entry, desired, current):
    """Changes (key -> value/None) for a backend that edits a shared command line."""
    original = record_entry["original"]
    changes = {}
    for key in kargs.OWNED:
        if key in desired:
            if key not in original:
                values = current.get(key) or []
                original[key] = values[-1] if values else None
            changes[key] = desired[key]
        elif key in original:
            changes[key] = original.pop(key)
    return changes


# Backends ------------------------------------------------------------------------


def detect(host, forced):
    have = {
        "grubby": host.resolve("grubby") is not None,
        # Under a sandbox root, a forced grub needs neither the update tool nor
        # /etc/default/grub (an empty sandbox has nothing of the user's to keep):
        # the drop-in is still written, and the result says grub.cfg was not
        # regenerated. On a real root both are required.
        "grub": (host.read("etc/default/grub") is not None or (forced == "grub" and host.root != "/"))
        and (update_grub_argv(host) is not None or host.root != "/"),
        "kernel-install": host.read("etc/kernel/cmdline") is not None
        or (host.resolve("kernel-install") is not None and os.path.isdir(host.path("boot/loader/entries"))),
    }
    if forced != "auto":
        if not have[forced]:
            need = {
                "grubby": "the grubby program",
                "grub": "/etc/default/grub and update-grub or grub-mkconfig",
                "kernel-install": "/etc/kernel/cmdline, or kernel-install with /boot/loader/entries",
            }[forced]
            raise KernelArgsError(
                f"backend {forced} is forced but not installed under {host.root} (it needs {need}); "
                "nothing was written",
                "kernel_args_backend",
            )
        return forced
    for name in ("grubby", "grub", "kernel-install"):
        if have[name]:
            return name
    raise KernelArgsError(
        f"no supported boot loader found under {host.root} (grubby, /etc/default/grub with update-grub, "
        "/etc/kernel/cmdline); set cpupools_kernel_args_backend",
        "kernel_args_backend",
    )


def update_grub_argv(host):
    tool = host.resolve("update-grub")
    if tool:
        return [tool]
    for name, out in (("grub-mkconfig", "boot/grub/grub.cfg"), ("grub2-mkconfig", "boot/grub2/grub.cfg")):
        tool = host.resolve(name)
        if tool:
            return [tool, "-o", host.path(out)]
    return None


def grub_backend(host, params, desired):
    rel_dir = "etc/default/grub.d"
    name = params["name"]
    if not name or "/" in name or name.startswith("."):
        raise KernelArgsError(f"{name!r} is not a plain file name", "grub_dropin_name")
    ours_rel = f"{rel_dir}/{name}.cfg"
    default_text = host.read("etc/default/grub") or ""
    others = []
    directory = host.path(rel_dir)
    if os.path.isdir(directory):
        for entry in sorted(os.listdir(directory)):
            if entry.endswith(".cfg") and entry != f"{name}.cfg":
                others.append((f"/{rel_dir}/{entry}", host.read(f"{rel_dir}/{entry}") or ""))
    user_files = [("/etc/default/grub", default_text), *others]
    user_eval = kargs.evaluate_grub_files(user_files)
    old_text = host.read(ours_rel)
    old_args = kargs.read_grub_dropin(old_text, "/" + ours_rel) if old_text is not None else {}
    user_args = kargs.grub_user_args(user_eval)
    notes = []
    ours = {}
    for key, value in desired.items():
        if key in user_args:
            user_value, where = user_args[key]
            if kargs._normal(key, user_value) == kargs._normal(key, value):
                notes.append(
                    f"{key}={user_value} is already set in {where}; cpupools leaves it there and does not repeat it"
                )
                continue
            raise KernelArgsError(
                f"{where} sets {key}={user_value}, and the plan needs {key}={value}. cpupools never edits that file: "
                f"remove {key}= from it (or use cpupools_isolcpus_source: adopt). Nothing was written",
                _field(key),
            )
        ours[key] = value
    new_text = kargs.render_grub_dropin(ours) if ours else None
    ordered = sorted([*others, (f"/{ours_rel}", new_text or "")], key=lambda item: os.path.basename(item[0]))
    final = kargs.evaluate_grub_files([("/etc/default/grub", default_text), *ordered])
    final_line = kargs.grub_cmdline(final)
    final_owned = kargs.owned_values(final_line)
    for key, value in ours.items():
        if final_owned.get(key, [None])[-1] != value:
            raise KernelArgsError(
                f"{final['origin'].get('GRUB_CMDLINE_LINUX', 'a drop-in')} is read after /{ours_rel} and replaces "
                f"GRUB_CMDLINE_LINUX, so {key}= would be lost; give cpupools_grub_dropin_name a name that sorts last. "
                "Nothing was written",
                "grub_dropin_name",
            )
    old_eval = kargs.evaluate_grub_files(
        [
            ("/etc/default/grub", default_text),
            *sorted([*others, (f"/{ours_rel}", old_text or "")], key=lambda i: os.path.basename(i[0])),
        ]
    )
    return {
        "rel": ours_rel,
        "old_text": old_text,
        "new_text": new_text,
        "before_line": kargs.grub_cmdline(old_eval),
        "after_line": final_line,
        "owned_args": ours if params["state"] == "present" else {},
        "changed": old_text != new_text or (old_args != ours and new_text is not None),
        "notes": notes,
    }


def _field(key):
    return "isolcpus_flags" if key == "isolcpus" else key


def read_kernel_cmdline(host, rel):
    text = host.read(rel)
    if text is None:
        return None
    if text.count('"') % 2 or any(ord(c) < 32 and c not in "\n\t" for c in text):
        raise KernelArgsError(
            f"cannot parse /{rel}: an unbalanced quote or a control character; nothing was written",
            "kernel_args_backend",
        )
    return text


def boot_base_cmdline(host, running):
    base = host.read("usr/lib/kernel/cmdline")
    if base is None:
        spans = kargs.cmdline_spans(running)
        base = " ".join(running[s:e] for s, e, key, _ in spans if key not in ("BOOT_IMAGE", "initrd"))
    return base.strip() + "\n"


def apply_cmdline_backend(host, params, desired, record, running):
    rel = "etc/kernel/cmdline"
    old_text = read_kernel_cmdline(host, rel)
    entry = record.entry("kernel-install")
    text = old_text
    if text is None:
        text = boot_base_cmdline(host, running)
    if params["state"] == "present":
        changes = take_over(entry, desired, kargs.owned_values(text))
        if old_text is None and desired:
            entry["created"] = True
    else:
        changes = dict(entry["original"])
        entry["original"] = {}
    new_text = kargs.edit_cmdline(text, changes)
    if params["state"] == "absent":
        if entry.get("created"):
            new_text = None  # cpupools created the file: removing it restores the original state
        record.drop("kernel-install")
    elif old_text is None and not changes:
        new_text = None
    if not entry["original"] and not entry.get("created"):
        record.drop("kernel-install")
    owned = {k: v[-1] for k, v in kargs.owned_values(new_text or "").items() if v and v[-1] is not None}
    return {
        "rel": rel,
        "old_text": old_text,
        "new_text": new_text,
        "before_line": (old_text or "").strip(),
        "after_line": (new_text or "").strip(),
        "owned_args": {k: v for k, v in owned.items() if k in desired},
        "changed": old_text != new_text,
        "notes": [],
    }


def grubby_backend(host, params, desired, record):
    tool = host.resolve("grubby")
    entries = kargs.parse_grubby_info(host.run([tool, "--info=ALL"], writes=False))
    first = entries[0]["args"]
    entry = record.entry("grubby")
    if params["state"] == "present":
        changes = take_over(entry, desired, kargs.owned_values(first))
    else:
        changes = dict(entry["original"])
        entry["original"] = {}
    if not entry["original"]:
        record.drop("grubby")
    argv = kargs.grubby_update_argv(entries, changes)
    after = kargs.edit_cmdline(first, changes)
    longest = max((kargs.edit_cmdline(e["args"], changes) for e in entries), key=len)
    owned = {k: v[-1] for k, v in kargs.owned_values(after).items() if v and v[-1] is not None}
    return {
        "rel": "",
        "argv": None if argv is None else [tool, *argv],
        "before_line": first,
        "after_line": after,
        "longest_line": longest,
        "owned_args": {k: v for k, v in owned.items() if k in desired},
        "changed": argv is not None,
        "notes": [],
    }


def kernel_install_argv(host, release):
    tool = host.resolve("kernel-install")
    if not tool or not release:
        return None
    for rel in (f"usr/lib/modules/{release}/vmlinuz", f"lib/modules/{release}/vmlinuz", f"boot/vmlinuz-{release}"):
        if os.path.isfile(host.path(rel)):
            return [tool, "add", release, host.path(rel)]
    return None


# main ------------------------------------------------------------------------------


def kernel_release(host, params):
    if params["kernel_release"]:
        return params["kernel_release"]
    if host.root == "/":
        return os.uname().release
    text = host.read("proc/sys/kernel/osrelease")
    return text.strip() if text else None


def execute(module):
    params = module.params
    host = Host(module)
    state = params["state"]
    options = kargs.make_options(params)
    running = (host.read("proc/cmdline") or "").strip()
    isolated = host.read("sys/devices/system/cpu/isolated")
    nohz_active = host.read("sys/devices/system/cpu/nohz_full")
    release = kernel_release(host, params)
    config = host.read(f"boot/config-{release}") if release else None
    notes, warnings = [], []
    desired = {}
    outputs = {}
    if state == "present":
        if not params["plan"]:
            raise KernelArgsError("state=present needs the plan (host fact cpupools_plan)", "plan")
        desired, notes = kargs.derive_kernel_args(params["plan"], options, running)
        warnings += kargs.validate_kernel_args(desired, release, config)
        outputs = kargs.housekeeping_outputs(params["plan"])
    backend = detect(host, params["backend"])
    record = Record(host, params["record"])
    if backend == "grub":
        result = grub_backend(host, params, desired)
    elif backend == "grubby":
        result = grubby_backend(host, params, desired, record)
    else:
        result = apply_cmdline_backend(host, params, desired, record, running)
    notes += result["notes"]
    ours = kargs.render_args(result["owned_args"])
    configured = {k: v[-1] for k, v in kargs.owned_values(result["after_line"]).items() if v and v[-1] is not None}
    kargs.check_cmdline_length(
        result.get("longest_line", result["after_line"]),
        options.command_line_size,
        ours,
        f"in the boot configuration ({backend})",
    )
    kargs.check_cmdline_length(
        kargs.project_cmdline(running, configured), options.command_line_size, ours, "at the next boot"
    )

    # Apply -----------------------------------------------------------------
    changed = result["changed"]
    if backend == "grubby":
        if result["argv"]:
            host.run(result["argv"])
    elif changed:
        host.write(result["rel"], result["new_text"])
    record_changed = record.save()
    update = params["update"]
    update_argv = None
    if backend == "grub":
        update_argv = update_grub_argv(host)
        if update_argv is None and (changed or update == "always"):
            notes.append(f"no update-grub or grub-mkconfig under {host.root}: grub.cfg was not regenerated")
    elif backend == "kernel-install":
        update_argv = kernel_install_argv(host, release)
        if changed and update_argv is None and update != "never":
            notes.append(
                "kernel-install or the kernel image was not found: existing boot entries keep their old "
                "options until the next kernel install (run kernel-install add)"
            )
    run_update = update == "always" or (update == "auto" and changed)
    update_needed = changed and update == "never" and update_argv is not None
    if update_argv and run_update:
        try:
            host.run(update_argv)
        except KernelArgsError:
            if changed and backend != "grubby" and not host.check:
                host.write(result["rel"], result["old_text"])  # roll back: the file must match the boot config
            raise
        changed = changed or update == "always"
    pending, _ = kargs.pending_args(
        {k: (v[-1] if v else None) for k, v in kargs.owned_values(result["after_line"]).items()}, running
    )
    not_applied = kargs.unapplied_args(running, isolated, nohz_active)
    warnings += [u["message"] for u in not_applied]
    for warning in warnings:
        module.warn(warning)
    diff = [
        {
            "before_header": "kernel command line (boot configuration)",
            "after_header": "kernel command line (boot configuration)",
            "before": result["before_line"] + "\n",
            "after": result["after_line"] + "\n",
        }
    ]
    if backend != "grubby":
        diff.append(
            {
                "before_header": "/" + result["rel"],
                "after_header": "/" + result["rel"],
                "before": result["old_text"] or "",
                "after": result["new_text"] or "",
            }
        )
    return {
        "changed": bool(changed or record_changed),
        "backend": backend,
        "args": result["owned_args"],
        "cmdline": {"desired": ours, "configured": result["after_line"], "running": running},
        "reboot_required": bool(pending),
        "pending": pending,
        "not_applied": [{k: u[k] for k in ("arg", "running", "active")} for u in not_applied],
        "update_needed": update_needed,
        "commands": host.commands,
        "notes": notes,
        "outputs": outputs,
        "files_present": sorted(f for f in module.params["report_files"] if os.path.lexists(host.path(f.lstrip("/")))),
        "path": "/" + result["rel"] if result["rel"] else "",
        "kernel_release": release,
        "diff": diff,
    }


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = execute(module)
    except CpupoolsError as exc:
        module.fail_json(msg=exc.describe(module.params["host"] or socket.gethostname()))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
