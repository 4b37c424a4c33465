"""The one error the local stack raises for what a user
must fix (a port, a package, a crashed service)."""

from __future__ import annotations

from icekeeper.common.exit_codes import UsageError


class StackError(RuntimeError):
    """A service that would not start; the message says
    why and points at its log or what to install."""


class UnknownService(StackError, UsageError):
    """`--only` named a service the stack does not have: nothing was started or stopped."""
