"""The one exception type for user errors."""

from __future__ import annotations


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
