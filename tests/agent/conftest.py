"""Fixtures of the node agent tests (defined in agent_support, importable by the tests)."""

from agent_support import cmk, state_dir  # noqa: F401
