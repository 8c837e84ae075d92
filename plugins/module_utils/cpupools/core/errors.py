"""The one exception type for user errors, and how a message quotes a value and counts."""

from __future__ import annotations


def show(value: object, width: int = 60) -> str:
    """``repr`` of a value for a one-line message: no newline, never longer than ``width``.

    A value in a message may be hostile or huge (an environment variable, an
    option, an inventory value): it is quoted (``repr`` escapes control
    characters) and shortened, never echoed whole.
    """
    text = repr(value)
    return text if len(text) <= width else f"{text[: width - 5]}...{text[-2:]}"


def plural(n: int, word: str) -> str:
    """``1 core``, ``2 cores``; a count typed beyond any host is shortened as ``show`` does."""
    return f"{show(n)} {word}" if n == 1 else f"{show(n)} {word}s"


class CpupoolsError(ValueError):
    """A user error: bad input, a topology that cannot fit, a corrupt state.

    ``field`` names the input (option or inventory variable without the
    ``cpupools_`` prefix) the message is about, when there is one, so the
    caller can say which variable to fix. The message itself says what is
    wrong and with which numbers; it never needs a traceback to be understood.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def describe(self, host: str | None = None, prefix: str = "cpupools_") -> str:
        """Render ``host X: variable Y: message`` for a person."""
        parts = []
        if host:
            parts.append(f"host {host}")
        if self.field:
            parts.append(f"{prefix}{self.field}")
        parts.append(str(self))
        return ": ".join(parts)


class PlanError(CpupoolsError):
    """The requested pools do not fit, or the inputs are invalid."""


class CpulistError(CpupoolsError):
    """Malformed cpulist text."""


class TopologyError(CpupoolsError):
    """The sysfs tree is missing or inconsistent."""


class ReportError(CpupoolsError):
    """A report input is malformed (a bug in the stage that produced it)."""


class K8sError(CpupoolsError):
    """Kubernetes input is invalid, or the API server refused or could not be reached."""


class KernelArgsError(CpupoolsError):
    """Kernel arguments that cannot be derived, validated, parsed or written."""


class StateError(CpupoolsError):
    """The pool state directory is missing, corrupt, busy, or cannot serve a request.

    ``exit_status`` is the status ``cmk`` exits with for this error
    (docs/agent.md lists them); subclasses name the distinct cases.
    """

    exit_status = 78  # EX_CONFIG: state directory missing or corrupt


class UsageError(StateError):
    """A bad command line or environment value (``CMK_NUM_CORES``, ``--socket-id``)."""

    exit_status = 64


class UnknownPoolError(StateError):
    """The requested pool or socket does not exist in the state, or has no cpulist."""

    exit_status = 65


class LockTimeoutError(StateError):
    """``<conf>/lock`` stayed held by another process for ``CMK_LOCK_TIMEOUT`` seconds."""

    exit_status = 69


class NoFreeListsError(StateError):
    """Fewer free exclusive cpulists than requested: every one has a live holder."""

    exit_status = 75


class StatePermissionError(StateError):
    """The caller may not read or write the state directory."""

    exit_status = 77


class ResizeError(StateError):
    """A new plan cannot keep the live tasks: refused before any change."""


class VerifyError(CpupoolsError):
    """A verify input that cannot be used: a plan without its keys, a bad cpulist, an unknown check."""
