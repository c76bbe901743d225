"""The seven workspace operations a worker executes on real files (§2.2), and their dispatch.

Runs inside the worker process and imports no Django, so it can be tested on its own. Input
is a request already validated and normalized by ``sluice_protocol``; containment is
still enforced here (see ``paths``), because validation cannot see symlinks.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from sluice_protocol import PROTOCOL_VERSION

from workspaces.operations.command import Confinement, execute_command
from workspaces.operations.edit import edit_file, preview_edit
from workspaces.operations.errors import OperationError, OutcomeUnknown
from workspaces.operations.files import list_files, read_file, write_file
from workspaces.operations.lanes import resolve_lane
from workspaces.operations.search import search_text
from workspaces.operations.treeprocs import WALKS, TreeProcesses

__all__ = [
    "Confinement",
    "OperationError",
    "OutcomeUnknown",
    "TreeProcesses",
    "resolve_lane",
    "run_operation",
]

Handler = Callable[..., dict[str, object]]

_HANDLERS: dict[str, Handler] = {
    "read_file": read_file,
    "list_files": list_files,
    "search_text": search_text,
    "write_file": write_file,
    "preview_edit": preview_edit,
    "edit_file": edit_file,
    "execute_command": execute_command,
}

# The code an operation gets when its workspace does not offer it. preview_edit counts as an
# edit: a workspace that takes no edits has nothing to preview.
_NOT_OFFERED = {
    "read_file": "WORKER_MISMATCH",
    "list_files": "WORKER_MISMATCH",
    "search_text": "WORKER_MISMATCH",
    "write_file": "WRITE_DISABLED",
    "preview_edit": "WRITE_DISABLED",
    "edit_file": "WRITE_DISABLED",
    "execute_command": "COMMAND_DISABLED",
}

# What an unexpected OSError (EIO, ENOSPC, EMFILE...) becomes; handlers map the expected ones.
_UNAVAILABLE = {
    "write_file": "WRITE_UNAVAILABLE",
    "edit_file": "WRITE_UNAVAILABLE",
    "execute_command": "COMMAND_UNAVAILABLE",
}


def run_operation(
    request: dict[str, object],
    *,
    root: str,
    deadline: float,
    offered: frozenset[str] | None = None,
    confinement: Confinement | None = None,
    walkers: TreeProcesses | None = None,
) -> dict[str, object]:
    """Run one validated request under ``root`` (a workspace or lane realpath).

    ``confinement`` sandboxes ``execute_command`` (the other operations are the worker's own
    code and check their paths themselves); without it a command runs unconfined.
    ``walkers`` runs ``search_text`` and ``list_files`` in a process of their own; without it,
    in this thread.

    Returns the complete §2.2 result. Raises ``OperationError`` for a refusal or failure, and
    ``OutcomeUnknown`` when a mutation may or may not have happened.
    """
    operation = str(request.get("operation"))
    handler = _HANDLERS.get(operation)
    if handler is None:
        raise OperationError("INVALID_REQUEST", "The operation is not one of the seven known ones.")
    if offered is not None and operation not in offered:
        raise OperationError(_NOT_OFFERED[operation], f"This workspace does not offer {operation}.")
    try:
        extra = {"confinement": confinement} if operation == "execute_command" else {}
        if walkers is not None and operation in WALKS:
            handler = walkers.run
        result = handler(request, root=os.path.realpath(root), deadline=deadline, **extra)
    except OperationError:
        raise
    except OSError as exc:
        # Raised before any mutation started (handlers turn failures after that point into
        # OutcomeUnknown), so this is a plain failure. strerror only: exc's filename is a host path.
        if exc.errno == errno.ENAMETOOLONG:
            # The caller's path, not a passing failure: a resend could never succeed.
            raise OperationError(
                "INVALID_PATH", "The path is too long for the filesystem."
            ) from None
        code = _UNAVAILABLE.get(operation, "READ_UNAVAILABLE")
        raise OperationError(
            code, f"The worker could not complete {operation}: {exc.strerror}."
        ) from None
    return {
        "protocolVersion": PROTOCOL_VERSION,
        "operation": operation,
        "workspaceId": request.get("workspaceId"),
        **result,
    }
