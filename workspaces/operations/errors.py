"""Typed failures of workspace operations, and the deadline check every long loop uses.

Kept apart from ``__init__`` so the operation modules can import it without a cycle; the
package re-exports both classes, so callers write ``from workspaces.operations import
OperationError``.
"""

from __future__ import annotations

import time


class OperationError(Exception):
    """The worker ran or refused the call; ``code`` is a §2.5 worker code.

    ``message`` is a short sentence that names only workspace-relative paths: it travels to
    the API client, and a host path in it would leak the worker's layout.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r})"


class OutcomeUnknown(OperationError):
    """A mutation was started and the worker cannot tell whether it took effect.

    The caller must quarantine the isolation key: retrying could apply the change twice, and
    reporting a clean failure could hide a half-applied one. Raised with code
    ``WRITE_UNAVAILABLE`` by writes and edits, ``COMMAND_UNAVAILABLE`` by a command whose
    output could not be collected after it started.
    """


def check_deadline(deadline: float, code: str) -> None:
    """Raise ``code`` once ``time.monotonic()`` has passed ``deadline``.

    Past the deadline the API has already answered the client, so any further work is
    wasted and, for a mutation, would land after the client was told the outcome is unknown.
    """
    if time.monotonic() >= deadline:
        raise OperationError(code, "The operation ran past its deadline.")
