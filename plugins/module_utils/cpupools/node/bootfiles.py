"""The boot loaders' files that hold the kernel arguments: parsed, evaluated and rendered.

Pure text in, text out, beside ``bootloader.py``, which reads and writes them
and runs the boot loader tools; what the arguments are is ``kargs.py``'s.

* The GRUB drop-in (``evaluate_grub_files`` evaluates ``/etc/default/grub``
  and its drop-ins as the shell would, ``render_grub_dropin``,
  ``read_grub_dropin``), ``grubby --info=ALL`` output (``parse_grubby_info``,
  ``grubby_update_argv``) and ``/etc/kernel/cmdline`` (``edit_cmdline``).
* What the boot loader will actually boot: the ``linux`` lines of a generated
  ``grub.cfg`` (``grub_cfg_cmdlines``), BLS entries (``bls_entry``), compared
  with the configuration by ``boot_differences``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from ..core.cpulist import cmdline_spans, split_cmdline
from ..core.errors import KernelArgsError
from .kargs import OWNED, merged_value, normal_value, owned_values, render_args

DROPIN_MARKER = "# cpupools: kernel arguments derived from the CPU pool plan"
GRUB_VARS = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")


# Command line editing (/etc/kernel/cmdline, projections) --------------------------


def edit_cmdline(text: str, changes: Mapping[str, str | None]) -> str:
    """Set (value) or remove (``None``) owned arguments in command line text.

    Every other byte is kept: a changed argument is replaced where it stands,
    a new one is appended after the last argument (before a trailing
    newline), a removed one takes one separating space with it. Removing an
    argument this function appended gives back the original text exactly.
    """
    spans = cmdline_spans(text)
    out = text
    pending = dict(changes)
    # Work from the end so earlier offsets stay valid.
    last_of = {key: i for i, (_, _, key, _) in enumerate(spans) if key in pending}
    for index in range(len(spans) - 1, -1, -1):
        start, end, key, _ = spans[index]
        if key not in pending:
            continue
        value = pending[key]
        if value is not None and index == last_of[key]:
            out = out[:start] + f"{key}={value}" + out[end:]
        else:
            if start > 0 and out[start - 1] in " \t":
                start -= 1
            elif end < len(out) and out[end] in " \t":
                end += 1
            out = out[:start] + out[end:]
    added = [f"{key}={value}" for key, value in changes.items() if value is not None and key not in last_of]
    if added:
        body = out.rstrip("\n")
        tail = out[len(body) :]
        sep = " " if body else ""
        out = body + sep + " ".join(added) + tail
    return out


def project_cmdline(cmdline: str, args: Mapping[str, str]) -> str:
    """``cmdline`` with every owned argument dropped and ``args`` appended (for length checks)."""
    kept = [cmdline[s:e] for s, e, key, _ in cmdline_spans(cmdline) if key not in OWNED]
    return " ".join([*kept, render_args(args)]).strip()


# GRUB ---------------------------------------------------------------------------

_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_OPEN = re.compile(r"^(if|case|for|while|until|select)\b|\{\s*$")
_CLOSE = re.compile(r"^(fi|esac|done)\b|^\}")
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


class _Unsupported(Exception):
    pass


def _logical_lines(text: str) -> Iterable[tuple[int, str]]:
    """Join lines while a quote is open or a line ends in a backslash."""
    buf: list[str] = []
    first = 0
    quote = ""
    for number, line in enumerate(text.split("\n"), start=1):
        if not buf:
            first = number
        buf.append(line)
        i = 0
        while i < len(line):
            c = line[i]
            if quote == "'":
                if c == "'":
                    quote = ""
            elif c == "\\":
                i += 1
            elif quote == '"':
                if c == '"':
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c == "#" and (i == 0 or line[i - 1].isspace()):
                break
            i += 1
        if quote or (line.endswith("\\") and not line.endswith("\\\\")):
            continue
        yield first, "\n".join(buf)
        buf = []
    if buf:
        raise _Unsupported(f"line {first}: a quote is never closed")


def _expand(text: str, env: Mapping[str, str | None]) -> str:
    if "$(" in text or "`" in text:
        raise _Unsupported("command substitution")
    if re.search(r"\$\{[^}]*[^A-Za-z0-9_}]", text):
        raise _Unsupported("parameter expansion other than ${NAME}")

    def sub(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        value = env.get(name, "")
        if value is None:
            raise _Unsupported(f"${name} was set in a way cpupools cannot follow")
        return value

    return _VAR.sub(sub, text)


def _shell_value(text: str, env: Mapping[str, str | None]) -> str:
    """The value of ``NAME=<text>`` as a POSIX shell assigns it (the common forms only)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            rest = text[i:].strip()
            if rest and not rest.startswith("#"):
                raise _Unsupported("a command after the assignment")
            break
        if c == "'":
            j = text.find("'", i + 1)
            out.append(text[i + 1 : j])
            i = j + 1
        elif c == '"':
            j = i + 1
            part: list[str] = []
            while text[j] != '"':
                if text[j] == "\\" and j + 1 < n and text[j + 1] in '"\\$`\n':
                    if text[j + 1] != "\n":
                        part.append("\x00" if text[j + 1] == "$" else text[j + 1])
                    j += 2
                    continue
                part.append(text[j])
                j += 1
            out.append(_expand("".join(part), env).replace("\x00", "$"))
            i = j + 1
        elif c == "\\" and i + 1 < n:
            out.append(text[i + 1] if text[i + 1] != "\n" else "")
            i += 2
        elif c in ";&|<>()`":
            raise _Unsupported(f"the shell operator {c!r}")
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in "'\"\\;&|<>()`":
                j += 1
            out.append(_expand(text[i:j], env))
            i = j
    return "".join(out)


def evaluate_grub_files(files: Sequence[tuple[str, str]], env: Mapping[str, str | None] | None = None) -> dict:
    """Follow GRUB_CMDLINE_LINUX(_DEFAULT) through shell files sourced in order.

    ``files`` is ``[(path, text), ...]`` in the order grub-mkconfig sources
    them (``/etc/default/grub``, then ``/etc/default/grub.d/*.cfg`` sorted).
    Returns ``{"GRUB_CMDLINE_LINUX": ..., "GRUB_CMDLINE_LINUX_DEFAULT": ...,
    "origin": {var: path}}``. Assignments of other variables are followed too
    (a value they cannot be read from poisons them). A form cpupools cannot
    follow for one of the two variables (command substitution, a conditional
    assignment, a command using them) is an error: guessing could drop or
    duplicate an argument.
    """
    state: dict[str, str | None] = dict(env or {})
    for var in GRUB_VARS:
        state.setdefault(var, "")
    origin: dict[str, str] = {}
    for path, text in files:
        depth = 0
        try:
            lines = list(_logical_lines(text))
        except _Unsupported as exc:
            raise KernelArgsError(f"cannot parse {path}: {exc}; nothing was written", "kernel_args_backend") from None
        for number, raw in lines:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            match = _ASSIGN.match(line)
            if _OPEN.search(line):
                depth += 1
            if match is None:
                if _CLOSE.search(line):
                    depth = max(depth - 1, 0)
                elif any(re.search(rf"\b{var}\b", line) for var in GRUB_VARS):
                    raise KernelArgsError(
                        f"cannot parse {path} line {number}: {line!r} changes the kernel command line in a way "
                        "cpupools cannot follow; nothing was written",
                        "kernel_args_backend",
                    )
                continue
            name, value = match.group(1), match.group(2)
            try:
                if name in GRUB_VARS and depth:
                    raise _Unsupported("a conditional assignment")
                state[name] = _shell_value(value, state)
                if name in GRUB_VARS:
                    origin[name] = path
            except (_Unsupported, IndexError, ValueError) as exc:
                if name in GRUB_VARS:
                    reason = exc if isinstance(exc, _Unsupported) else "an unbalanced quote"
                    raise KernelArgsError(
                        f"cannot parse {path} line {number}: {name} uses {reason}; nothing was written",
                        "kernel_args_backend",
                    ) from None
                state[name] = None
    return {
        "GRUB_CMDLINE_LINUX": state["GRUB_CMDLINE_LINUX"] or "",
        "GRUB_CMDLINE_LINUX_DEFAULT": state["GRUB_CMDLINE_LINUX_DEFAULT"] or "",
        "origin": origin,
    }


def grub_cmdline(evaluated: Mapping[str, str]) -> str:
    """The arguments GRUB's 10_linux puts on a normal entry's ``linux`` line."""
    return " ".join(
        part
        for part in (evaluated["GRUB_CMDLINE_LINUX"].strip(), evaluated["GRUB_CMDLINE_LINUX_DEFAULT"].strip())
        if part
    )


def render_grub_dropin(args: Mapping[str, str]) -> str:
    """Our ``/etc/default/grub.d/<name>.cfg``: appends the owned arguments to GRUB_CMDLINE_LINUX."""
    return (
        f"{DROPIN_MARKER}\n"
        "# Written by the cpupools_kernel_args module; edits are overwritten on the next run.\n"
        "# It appends to GRUB_CMDLINE_LINUX (every boot entry, recovery included) and keeps\n"
        "# what /etc/default/grub sets. Remove it with state=absent, then run update-grub.\n"
        f'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX {render_args(args)}"\n'
    )


def read_grub_dropin(text: str, path: str) -> dict[str, str]:
    """The owned arguments our drop-in appends; refuses a file cpupools did not write."""
    if DROPIN_MARKER not in text:
        raise KernelArgsError(
            f"{path} exists and was not written by cpupools; choose another cpupools_grub_dropin_name "
            "or remove the file. Nothing was written",
            "grub_dropin_name",
        )
    evaluated = evaluate_grub_files([(path, text)], {"GRUB_CMDLINE_LINUX": ""})
    return {
        key: value
        for key, value in split_cmdline(evaluated["GRUB_CMDLINE_LINUX"])
        if key in OWNED and value is not None
    }


def grub_user_args(evaluated: Mapping) -> dict[str, tuple[str | None, str]]:
    """Owned arguments the operator's own GRUB files set: ``key -> (value, file)``."""
    found: dict[str, tuple[str | None, str]] = {}
    for var in GRUB_VARS:
        for key, values in owned_values(evaluated[var]).items():
            found[key] = (merged_value(key, values), evaluated["origin"].get(var, "/etc/default/grub"))
    return found


# grubby ---------------------------------------------------------------------------


def parse_grubby_info(text: str) -> list[dict]:
    """Entries of ``grubby --info=ALL``: ``[{"index": 0, "kernel": ..., "args": ...}, ...]``.

    Entries grubby reports as ``non linux entry`` are left out.
    """
    entries: list[dict] = []
    current: dict | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line == "non linux entry":
            if current is not None:
                current["linux"] = False
            continue
        key, eq, value = line.partition("=")
        if not eq or not re.match(r"^[a-z_]+$", key):
            raise KernelArgsError(
                f"cannot parse grubby --info=ALL output line {number}: {raw!r}; nothing was written",
                "kernel_args_backend",
            )
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        if key == "index":
            if not value.isdigit():
                raise KernelArgsError(
                    f"cannot parse grubby --info=ALL output line {number}: {raw!r}", "kernel_args_backend"
                )
            current = {"index": int(value), "linux": True}
            entries.append(current)
        elif current is None:
            raise KernelArgsError(
                f"cannot parse grubby --info=ALL output line {number}: {raw!r} comes before any index=",
                "kernel_args_backend",
            )
        else:
            current[key] = value
    linux = [e for e in entries if e.get("linux") and "kernel" in e]
    for entry in linux:
        entry.setdefault("args", "")
    if not linux:
        raise KernelArgsError("grubby --info=ALL lists no Linux boot entry; nothing was written", "kernel_args_backend")
    return linux


def grubby_update_argv(entries: Sequence[Mapping], desired: Mapping[str, str | None]) -> list[str] | None:
    """The one ``grubby --update-kernel=ALL`` call that brings every entry to ``desired``.

    ``desired`` maps owned keys to a value or ``None`` (remove). Keys already
    right in every entry are left out; ``None`` when nothing differs.
    """
    remove: list[str] = []
    add: list[str] = []
    for key, value in desired.items():
        per_entry = [owned_values(e["args"]).get(key, []) for e in entries]
        if value is None:
            if any(per_entry):
                remove.append(key)
        elif any(values != [value] for values in per_entry):
            if any(per_entry):
                remove.append(key)
            add.append(f"{key}={value}")
    if not remove and not add:
        return None
    argv = ["--update-kernel=ALL"]
    if remove:
        argv.append("--remove-args=" + " ".join(remove))
    if add:
        argv.append("--args=" + " ".join(add))
    return argv


# What the boot loader will boot (generated grub.cfg, BLS entries) ----------------

_LINUX_CMDS = ("linux", "linux16", "linuxefi")


def grub_cfg_cmdlines(text: str) -> list[str]:
    """The arguments of every ``linux`` line of a generated ``grub.cfg`` (kernel path left out)."""
    out = []
    for raw in text.splitlines():
        words = raw.strip().split(None, 2)
        if len(words) >= 2 and words[0] in _LINUX_CMDS:
            out.append(words[2] if len(words) == 3 else "")
    return out


def bls_entry(text: str) -> dict[str, str]:
    """The keys of a Boot Loader Specification entry (``version``, ``options``, ...); first value wins."""
    entry: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(" ")
        entry.setdefault(key, value.strip())
    return entry


def boot_differences(where: str, booted: Sequence[str], expected: Sequence[str]) -> list[dict]:
    """Owned arguments on which a boot entry disagrees with the configuration.

    ``booted``: the argument string of each generated boot entry; ``expected``:
    the command lines one entry may rightly have (GRUB gives normal entries
    ``GRUB_CMDLINE_LINUX_DEFAULT`` too, recovery entries not). One item per
    owned key and entry that matches none of them, compared by meaning.
    """
    wants = [{key: merged_value(key, owned_values(line).get(key, [])) for key in OWNED} for line in expected]
    out = []
    for number, line in enumerate(booted, start=1):
        have = {key: merged_value(key, owned_values(line).get(key, [])) for key in OWNED}
        if any(all(normal_value(k, have[k]) == normal_value(k, want[k]) for k in OWNED) for want in wants):
            continue
        want = wants[0]
        for key in OWNED:
            if normal_value(key, have[key]) != normal_value(key, want[key]):
                out.append({"file": where, "entry": number, "arg": key, "boots": have[key], "configured": want[key]})
    return out


def describe_differences(differences: Sequence[Mapping]) -> str:
    """One line for a person: ``/boot/grub/grub.cfg entry 1 boots isolcpus=(none), configured isolcpus=1-3``."""
    parts = []
    for item in differences[:4]:
        boots = "(none)" if item["boots"] is None else item["boots"]
        configured = "(none)" if item["configured"] is None else item["configured"]
        parts.append(
            f"{item['file']} entry {item['entry']} boots {item['arg']}={boots}, configured {item['arg']}={configured}"
        )
    if len(differences) > 4:
        parts.append(f"and {len(differences) - 4} more")
    return "; ".join(parts)
