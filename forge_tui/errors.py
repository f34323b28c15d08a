"""The one exception type that reaches the user as a single line."""

from __future__ import annotations


class ForgeError(Exception):
    """A failure caused by the user's input or environment.

    The CLI prints ``str(err)`` on one line and exits with ``exit_code``; nothing else is shown.
    Internal bugs are not ForgeErrors and keep their traceback.
    """

    exit_code = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class WorkloadError(ForgeError):
    """The workload file is missing, malformed, or its model fails."""


class WorkspaceError(ForgeError):
    """The workspace path cannot be used."""


class ConfigError(ForgeError):
    """forge.toml is unreadable, has an unknown key, or a value of the wrong type."""
