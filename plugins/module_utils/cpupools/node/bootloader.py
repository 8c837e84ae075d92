"""The boot-loader backends: write the owned kernel arguments, regenerate, verify.

``kargs.py`` derives the arguments and ``bootfiles.py`` parses and renders the
boot loaders' files (text in, text out); this module does the host side,
under a root directory:

* ``Host``: reads and writes files under ``root`` (and reads what the running
  kernel reports under ``facts_root``), finds programs, runs every command
  through one seam (the wrapper), and applies every change through one helper,
  ``Host.apply``, that records the action and skips it in check mode. So
  ``changed`` simply means "an action was recorded", and check mode predicts
  exactly the actions a real run takes.
* the three backends (``grub``: a drop-in + update-grub; ``grubby``;
  ``kernel-install``: ``/etc/kernel/cmdline`` + ``kernel-install add``) and
  ``detect``;
* ``boot_config``: what the boot loader will actually boot (the generated
  ``grub.cfg``, the BLS entries), so a regeneration that failed once is seen
  and retried on the next run instead of being reported as done;
* ``write_boot_config``: the whole run of the ``cpupools_kernel_args`` module.

Standard library only; the module passes its ``run_command`` in.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable, Mapping, Sequence

from ..core.cpulist import cmdline_spans
from ..core.errors import KernelArgsError
from ..core.files import replace_file
from . import bootfiles, kargs

BIN_DIRS = ("usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin")
#: The generated GRUB configuration each update tool writes (relative to the root).
GRUB_CFG = {
    "update-grub": "boot/grub/grub.cfg",
    "grub-mkconfig": "boot/grub/grub.cfg",
    "grub2-mkconfig": "boot/grub2/grub.cfg",
}
#: Where BLS entries live (the ESP may be mounted on /efi or /boot/efi).
BLS_DIRS = ("boot/loader/entries", "efi/loader/entries", "boot/efi/loader/entries")

#: ``run_command(argv, environ_update) -> (rc, stdout, stderr)``, as AnsibleModule's.
Runner = Callable[..., tuple[int, str, str]]


class Host:
    """Reads, writes and runs commands under ``root``; every change goes through ``apply``.

    ``facts_root`` is where the running kernel's own reports are read
    (``/proc/cmdline``, ``/sys/devices/system/cpu/isolated`` ...): the same
    root the topology facts come from. Files cpupools writes, and the boot
    loader files it reads, are under ``root``.
    """

    def __init__(
        self,
        root: str,
        run_command: Runner,
        *,
        facts_root: str | None = None,
        wrapper: Sequence[str] | None = None,
        check_mode: bool = False,
        which: Callable[[str], str | None] | None = None,
        move: Callable[[str, str], None] | None = None,
    ) -> None:
        self.root = root
        self.facts_root = facts_root or root
        self._run_command = run_command
        if wrapper is None:
            wrapper = shlex.split(os.environ.get("CPUPOOLS_COMMAND_WRAPPER", ""))
        self.wrapper = list(wrapper)
        self.check = check_mode
        self._which = which
        self._move = move or os.replace
        #: Every command run, or in check mode that a real run would run (argv, no wrapper).
        self.commands: list[list[str]] = []
        #: Every change made, or in check mode that a real run would make, in order.
        self.actions: list[str] = []

    # Reading ------------------------------------------------------------------

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel.lstrip("/"))

    def read(self, rel: str, root: str | None = None) -> str | None:
        """The text of ``rel`` under ``root`` (default the host's root); ``None`` when absent."""
        try:
            with open(os.path.join(root or self.root, rel.lstrip("/")), encoding="utf-8") as handle:
                return handle.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise KernelArgsError(f"cannot read /{rel.lstrip('/')}: {exc}", "kernel_args_backend") from None

    def read_running(self, rel: str) -> str | None:
        """What the running kernel reports (``proc/cmdline``, ``sys/...``), under ``facts_root``."""
        return self.read(rel, self.facts_root)

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(rel)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def resolve(self, name: str) -> str | None:
        """The program ``name``: on the real root through ``which``; under a sandbox only inside it."""
        if self.root == "/" and not self.wrapper and self._which is not None:
            return self._which(name)
        for rel in BIN_DIRS:
            candidate = self.path(os.path.join(rel, name))
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
        return None

    # Changing -----------------------------------------------------------------

    def apply(self, action: str, func: Callable[[], object]) -> object:
        """The one way to change the host: record ``action``; run ``func`` unless in check mode."""
        self.actions.append(action)
        if self.check:
            return None
        return func()

    def run(self, argv: Sequence[str], writes: bool = True) -> str:
        """The command seam: record ``argv`` and run it through the wrapper.

        A command that ``writes`` is an action (skipped in check mode, where
        it returns ``""``); a read (``grubby --info``) always runs.
        """
        argv = list(argv)
        self.commands.append(argv)
        if writes:
            return self.apply("run " + " ".join(argv), lambda: self._execute(argv)) or ""
        return self._execute(argv)

    def _execute(self, argv: list[str]) -> str:
        rc, out, err = self._run_command(self.wrapper + argv, environ_update={"LC_ALL": "C"})
        if rc != 0:
            raise KernelArgsError(
                f"{' '.join(argv)} failed (exit {rc}): {(err or out).strip()[:500]}", "kernel_args_backend"
            )
        return out

    def write(self, rel: str, text: str | None) -> None:
        """Replace ``rel`` atomically (``None`` removes it), through ``apply``."""
        rel = rel.lstrip("/")
        if text is None:
            if os.path.lexists(self.path(rel)):
                self.apply(f"remove /{rel}", lambda: os.unlink(self.path(rel)))
            return
        self.apply(f"write /{rel}", lambda: self._replace(rel, text))

    def _replace(self, rel: str, text: str) -> None:
        path = self.path(rel)
        mode = os.stat(path).st_mode & 0o7777 if os.path.exists(path) else 0o644
        replace_file(path, text.encode("utf-8"), mode, self._move)


class Record:
    """Values of owned arguments cpupools replaced, per backend (for state=absent)."""

    def __init__(self, host: Host, rel: str) -> None:
        self.host, self.rel = host, rel.lstrip("/")
        text = host.read(self.rel)
        try:
            self.data = json.loads(text) if text else {}
        except ValueError:
            raise KernelArgsError(
                f"/{self.rel} is not valid JSON; remove it only if no cpupools arguments are set",
                "kernel_args_record",
            ) from None
        self.before = self._canonical()

    def _canonical(self) -> str:
        backends = {name: entry for name, entry in self.data.get("backends", {}).items() if entry}
        return json.dumps(backends, sort_keys=True)

    def entry(self, backend: str) -> dict:
        return self.data.setdefault("backends", {}).setdefault(backend, {"original": {}})

    def drop(self, backend: str) -> None:
        self.data.get("backends", {}).pop(backend, None)

    def save(self) -> bool:
        if self._canonical() == self.before:
            return False
        text = (
            None
            if not self.data.get("backends")
            else json.dumps({"version": 1, **self.data}, indent=2, sort_keys=True) + "\n"
        )
        self.host.write(self.rel, text)
        return True


def take_over(record_entry: dict, desired: Mapping[str, str], current: Mapping[str, list]) -> dict:
    """Changes (key -> value/None) for a backend that edits a shared command line."""
    original = record_entry["original"]
    changes: dict[str, str | None] = {}
    for key in kargs.OWNED:
        if key in desired:
            if key not in original:
                values = current.get(key) or []
                original[key] = values[-1] if values else None
            changes[key] = desired[key]
        elif key in original:
            changes[key] = original.pop(key)
    return changes


# Detection and the update tools --------------------------------------------------


def detect(host: Host, forced: str) -> str:
    """The backend to use: ``forced`` when installed, else the first of grubby, GRUB, kernel-install."""
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


def update_grub_argv(host: Host) -> list[str] | None:
    """``update-grub``, or ``grub(2)-mkconfig -o <grub.cfg>``; ``None`` when neither is installed."""
    tool = host.resolve("update-grub")
    if tool:
        return [tool]
    for name in ("grub-mkconfig", "grub2-mkconfig"):
        tool = host.resolve(name)
        if tool:
            return [tool, "-o", host.path(GRUB_CFG[name])]
    return None


def grub_cfg_rel(argv: Sequence[str]) -> str:
    """The grub.cfg an update command writes (relative to the root)."""
    name = os.path.basename(argv[0])
    return GRUB_CFG.get(name, GRUB_CFG["update-grub"])


def kernel_install_argv(host: Host, release: str | None) -> list[str] | None:
    tool = host.resolve("kernel-install")
    if not tool or not release:
        return None
    for rel in (f"usr/lib/modules/{release}/vmlinuz", f"lib/modules/{release}/vmlinuz", f"boot/vmlinuz-{release}"):
        if os.path.isfile(host.path(rel)):
            return [tool, "add", release, host.path(rel)]
    return None


def kernel_release(host: Host, forced: str | None) -> str | None:
    """The release the arguments are for: ``forced``, else the running kernel's (under ``facts_root``)."""
    if forced:
        return forced
    if host.facts_root == "/":
        return os.uname().release
    text = host.read_running("proc/sys/kernel/osrelease")
    return text.strip() if text else None


def kernel_config(host: Host, release: str | None) -> str | None:
    """The build configuration of kernel ``release``; ``None`` when the node has none to read.

    ``boot/config-<release>`` under the root, as distributions install it;
    for the running kernel, else its own ``proc/config.gz`` under
    ``facts_root`` (CONFIG_IKCONFIG_PROC: nodes that ship no config in /boot,
    or whose /boot is another partition the image does not mount). Not for
    another release given with ``kernel_release``: that file describes the
    kernel that runs, not the one that boots next.
    """
    if not release:
        return None
    text = host.read(f"boot/config-{release}")
    if text is not None or kernel_release(host, None) != release:
        return text
    import gzip  # only here: most nodes have the file in /boot, and each run of the module imports this one
    import zlib

    path = os.path.join(host.facts_root, "proc/config.gz")
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            return handle.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise KernelArgsError(f"cannot read /proc/config.gz: {exc}", "kernel_release") from None


# Backends --------------------------------------------------------------------------


def _field(key: str) -> str:
    if key in kargs.HUGEPAGE_ARGS:
        return "hugepages"
    return "isolcpus_flags" if key == "isolcpus" else key


def _hint(key: str) -> str:
    if key in kargs.HUGEPAGE_ARGS:
        return "and give those pages in cpupools_hugepages"
    return "or use cpupools_isolcpus_source: adopt"


def grub_backend(host: Host, params: Mapping, desired: Mapping[str, str]) -> dict:
    """The GRUB drop-in that appends ``desired`` to GRUB_CMDLINE_LINUX, checked against the operator's files."""
    rel_dir = "etc/default/grub.d"
    name = params["name"]
    if not name or "/" in name or name.startswith("."):
        raise KernelArgsError(f"{name!r} is not a plain file name", "grub_dropin_name")
    ours_rel = f"{rel_dir}/{name}.cfg"
    default_text = host.read("etc/default/grub") or ""
    others = [
        (f"/{rel_dir}/{entry}", host.read(f"{rel_dir}/{entry}") or "")
        for entry in host.listdir(rel_dir)
        if entry.endswith(".cfg") and entry != f"{name}.cfg"
    ]
    user_eval = bootfiles.evaluate_grub_files([("/etc/default/grub", default_text), *others])
    old_text = host.read(ours_rel)
    old_args = bootfiles.read_grub_dropin(old_text, "/" + ours_rel) if old_text is not None else {}
    user_args = bootfiles.grub_user_args(user_eval)
    notes = []
    ours = {}
    for key, value in desired.items():
        if key in user_args:
            user_value, where = user_args[key]
            if kargs.normal_value(key, user_value) == kargs.normal_value(key, value):
                notes.append(
                    f"{key}={user_value} is already set in {where}; cpupools leaves it there and does not repeat it"
                )
                continue
            raise KernelArgsError(
                f"{where} sets {key}={user_value}, and the plan needs {key}={value}. cpupools never edits that file: "
                f"remove {key}= from it ({_hint(key)}). Nothing was written",
                _field(key),
            )
        ours[key] = value
    new_text = bootfiles.render_grub_dropin(ours) if ours else None

    def evaluated(text: str | None) -> dict:
        files = sorted([*others, (f"/{ours_rel}", text or "")], key=lambda item: os.path.basename(item[0]))
        return bootfiles.evaluate_grub_files([("/etc/default/grub", default_text), *files])

    final = evaluated(new_text)
    final_line = bootfiles.grub_cmdline(final)
    final_owned = kargs.owned_values(final_line)
    for key, value in ours.items():
        if final_owned.get(key, [None])[-1] != value:
            raise KernelArgsError(
                f"{final['origin'].get('GRUB_CMDLINE_LINUX', 'a drop-in')} is read after /{ours_rel} and replaces "
                f"GRUB_CMDLINE_LINUX, so {key}= would be lost; give cpupools_grub_dropin_name a name that sorts last. "
                "Nothing was written",
                "grub_dropin_name",
            )
    return {
        "rel": ours_rel,
        "old_text": old_text,
        "new_text": new_text,
        "before_line": bootfiles.grub_cmdline(evaluated(old_text)),
        "after_line": final_line,
        # A recovery entry has GRUB_CMDLINE_LINUX alone, a normal one GRUB_CMDLINE_LINUX_DEFAULT too.
        "boot_lines": [final_line, final["GRUB_CMDLINE_LINUX"].strip()],
        "owned_args": ours if params["state"] == "present" else {},
        "changed": old_text != new_text or (old_args != ours and new_text is not None),
        "notes": notes,
    }


def read_kernel_cmdline(host: Host, rel: str) -> str | None:
    text = host.read(rel)
    if text is None:
        return None
    if text.count('"') % 2 or any(ord(c) < 32 and c not in "\n\t" for c in text):
        raise KernelArgsError(
            f"cannot parse /{rel}: an unbalanced quote or a control character; nothing was written",
            "kernel_args_backend",
        )
    return text


def boot_base_cmdline(host: Host, running: str) -> str:
    """The command line kernel-install would use when ``/etc/kernel/cmdline`` does not exist yet."""
    base = host.read("usr/lib/kernel/cmdline")
    if base is None:
        spans = cmdline_spans(running)
        base = " ".join(running[s:e] for s, e, key, _ in spans if key not in ("BOOT_IMAGE", "initrd"))
    return base.strip() + "\n"


def cmdline_backend(host: Host, params: Mapping, desired: Mapping[str, str], record: Record, running: str) -> dict:
    """``/etc/kernel/cmdline`` edited in place; replaced values remembered in ``record``."""
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
    new_text: str | None = bootfiles.edit_cmdline(text, changes)
    if params["state"] == "absent":
        if entry.get("created"):
            new_text = None  # cpupools created the file: removing it restores the original state
        record.drop("kernel-install")
    elif old_text is None and not changes:
        new_text = None
    if not entry["original"] and not entry.get("created"):
        record.drop("kernel-install")
    owned = {k: v[-1] for k, v in kargs.owned_values(new_text or "").items() if v and v[-1] is not None}
    after = (new_text or "").strip()
    return {
        "rel": rel,
        "old_text": old_text,
        "new_text": new_text,
        "before_line": (old_text or "").strip(),
        "after_line": after,
        "boot_lines": [after],
        "owned_args": {k: v for k, v in owned.items() if k in desired},
        "changed": old_text != new_text,
        "notes": [],
    }


def grubby_backend(host: Host, params: Mapping, desired: Mapping[str, str], record: Record) -> dict:
    """One ``grubby --update-kernel=ALL`` with only the differences, from ``grubby --info=ALL``."""
    tool = host.resolve("grubby")
    if tool is None:  # detect() chose this backend because it found grubby
        raise KernelArgsError("grubby is no longer on PATH under the root", "kernel_args_backend")
    entries = bootfiles.parse_grubby_info(host.run([tool, "--info=ALL"], writes=False))
    first = entries[0]["args"]
    entry = record.entry("grubby")
    if params["state"] == "present":
        changes = take_over(entry, desired, kargs.owned_values(first))
    else:
        changes = dict(entry["original"])
        entry["original"] = {}
    if not entry["original"]:
        record.drop("grubby")
    argv = bootfiles.grubby_update_argv(entries, changes)
    after = bootfiles.edit_cmdline(first, changes)
    longest = max((bootfiles.edit_cmdline(e["args"], changes) for e in entries), key=len)
    owned = {k: v[-1] for k, v in kargs.owned_values(after).items() if v and v[-1] is not None}
    return {
        "rel": "",
        "argv": None if argv is None else [tool, *argv],
        "before_line": first,
        "after_line": after,
        "boot_lines": [after],
        "longest_line": longest,
        "owned_args": {k: v for k, v in owned.items() if k in desired},
        "changed": argv is not None,
        "notes": [],
    }


# What the boot loader will boot ------------------------------------------------------


def boot_config(host: Host, backend: str, update_argv: Sequence[str] | None, release: str | None) -> dict | None:
    """The generated boot configuration: ``{"path", "cmdlines"}``, or ``None`` when it cannot be read.

    GRUB: the ``linux`` lines of the grub.cfg the update tool writes. kernel-install:
    the ``options`` of the BLS entries of ``release``. grubby edits the entries
    themselves (read back with ``--info``), so it needs no second look.
    """
    if backend == "grub" and update_argv:
        rel = grub_cfg_rel(update_argv)
        text = host.read(rel)
        lines = bootfiles.grub_cfg_cmdlines(text) if text is not None else []
        # A BLS-style grub.cfg (blscfg) has no linux lines: its entries are grubby's.
        return {"path": "/" + rel, "cmdlines": lines} if lines else None
    if backend == "kernel-install" and update_argv and release:
        for rel_dir in BLS_DIRS:
            lines = []
            for name in host.listdir(rel_dir):
                if not name.endswith(".conf"):
                    continue
                entry = bootfiles.bls_entry(host.read(f"{rel_dir}/{name}") or "")
                if entry.get("version") == release or (not entry.get("version") and release in name):
                    lines.append(entry.get("options", ""))
            if lines:
                return {"path": "/" + rel_dir, "cmdlines": lines}
    return None


def boot_differences(host: Host, backend: str, update_argv, release, result: Mapping) -> tuple[str, list[dict]]:
    """``(path, differences)`` between what will boot and the configuration; ``("", [])`` when unknown."""
    config = boot_config(host, backend, update_argv, release)
    if config is None:
        return "", []
    return config["path"], bootfiles.boot_differences(config["path"], config["cmdlines"], result["boot_lines"])


def restore(host: Host, rel: str, text: str | None) -> None:
    """Put ``rel`` back as it was before this run (``None``: it did not exist)."""
    if text is None:
        if os.path.lexists(host.path(rel)):
            os.unlink(host.path(rel))
    else:
        host._replace(rel, text)


# The module's run ------------------------------------------------------------------


def compute(host: Host, params: Mapping) -> tuple[str, dict, dict]:
    """Read everything and compute ``(backend, result, context)``; changes nothing."""
    options = kargs.make_options(params)
    running = (host.read_running("proc/cmdline") or "").strip()
    release = kernel_release(host, params.get("kernel_release"))
    config = kernel_config(host, release)
    notes: list[str] = []
    warnings: list[str] = []
    desired: dict[str, str] = {}
    outputs: dict = {}
    if params["state"] == "present":
        if not params.get("plan"):
            raise KernelArgsError("state=present needs the plan (the variable cpupools_plan)", "plan")
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
        result = cmdline_backend(host, params, desired, record, running)
    ours = kargs.render_args(result["owned_args"])
    configured = {k: v[-1] for k, v in kargs.owned_values(result["after_line"]).items() if v and v[-1] is not None}
    kargs.check_cmdline_length(
        result.get("longest_line", result["after_line"]),
        options.command_line_size,
        ours,
        f"in the boot configuration ({backend})",
    )
    kargs.check_cmdline_length(
        bootfiles.project_cmdline(running, configured), options.command_line_size, ours, "at the next boot"
    )
    context = {
        "running": running,
        "release": release,
        "record": record,
        "ours": ours,
        "notes": notes + result["notes"],
        "warnings": warnings,
        "outputs": outputs,
    }
    return backend, result, context


def write_boot_config(host: Host, params: Mapping) -> dict:
    """Bring the boot configuration to the plan; the module's result (``warnings`` for the caller to emit).

    ``params["update"]``: ``auto`` regenerates when a file changed or the
    generated configuration disagrees with it; ``never`` leaves the
    regeneration to the caller (the role's handler), reporting ``update_needed``;
    ``always`` regenerates in any case; ``only`` regenerates and changes no
    file (the handler: the file was written by the task that notified it).
    After a regeneration the generated configuration is read back, and a
    disagreement is an error naming the arguments. ``repairs``: those of the
    ``warnings`` about what the regeneration puts right (a configuration
    generated before the arguments were written): true of the node before
    this stage, not after it.
    """
    backend, result, ctx = compute(host, params)
    update = params["update"]
    notes, warnings = ctx["notes"], ctx["warnings"]
    release = ctx["release"]

    if update != "only":
        if backend == "grubby":
            if result["argv"]:
                host.run(result["argv"])
        elif result["changed"]:
            host.write(result["rel"], result["new_text"])
        ctx["record"].save()
    file_changed = result["changed"] and update != "only"

    update_argv = None
    if backend == "grub":
        update_argv = update_grub_argv(host)
        if update_argv is None and (file_changed or update in ("always", "only")):
            notes.append(f"no update-grub or grub-mkconfig under {host.root}: grub.cfg was not regenerated")
    elif backend == "kernel-install":
        update_argv = kernel_install_argv(host, release)
        if file_changed and update_argv is None and update != "never":
            notes.append(
                "kernel-install or the kernel image was not found: existing boot entries keep their old "
                "options until the next kernel install (run kernel-install add)"
            )

    # What will boot now, compared with the configuration as this run leaves it.
    cfg_path, stale = ("", [])
    repairs = []  # warnings about what this run (or the caller's handler) puts right
    if update_argv:
        cfg_path, stale = boot_differences(host, backend, update_argv, release, result)
        if stale and not file_changed and update != "only":
            repairs.append(
                "the boot configuration disagrees with the kernel arguments "
                f"({bootfiles.describe_differences(stale)}); regenerating it"
            )
            warnings.append(repairs[-1])
    needs_update = bool(update_argv) and (file_changed or bool(stale))
    run_update = bool(update_argv) and (update in ("always", "only") or (update == "auto" and needs_update))
    update_needed = needs_update and update == "never"
    if update_needed:
        # The caller regenerates (the role's handler): recorded here, so this
        # task reports the change that makes the caller run it.
        host.actions.append("regenerate the boot configuration (" + " ".join(update_argv or []) + ")")
    if run_update and update_argv:
        try:
            host.run(update_argv)
            if not host.check:
                cfg_path, after = boot_differences(host, backend, update_argv, release, result)
                if after:
                    raise KernelArgsError(
                        f"{' '.join(update_argv)} ran, but the boot configuration still disagrees with the kernel "
                        f"arguments: {bootfiles.describe_differences(after)}. The next run tries again",
                        "kernel_args_backend",
                    )
                stale = []
        except KernelArgsError:
            if file_changed and backend != "grubby" and not host.check:
                restore(host, result["rel"], result["old_text"])  # the file must match what will boot
            raise

    pending, _ = kargs.pending_args(
        {k: (v[-1] if v else None) for k, v in kargs.owned_values(result["after_line"]).items()},
        ctx["running"],
        partitions=host.read_running(kargs.PARTITIONS_FILE),
    )
    not_applied = kargs.unapplied_args(
        ctx["running"],
        host.read_running("sys/devices/system/cpu/isolated"),
        host.read_running("sys/devices/system/cpu/nohz_full"),
    )
    warnings += [u["message"] for u in not_applied]
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
        "changed": bool(host.actions),
        "actions": list(host.actions),
        "backend": backend,
        "args": result["owned_args"],
        "cmdline": {"desired": ctx["ours"], "configured": result["after_line"], "running": ctx["running"]},
        "reboot_required": bool(pending),
        "pending": pending,
        "not_applied": [{k: u[k] for k in ("arg", "running", "active")} for u in not_applied],
        "update_needed": update_needed,
        "boot_config": {"path": cfg_path, "differences": stale},
        "commands": host.commands,
        "notes": notes,
        "warnings": warnings,
        "repairs": repairs,
        "outputs": ctx["outputs"],
        "path": "/" + result["rel"] if result["rel"] else "",
        "kernel_release": release,
        "diff": diff,
    }
