"""One execute_command through run_operation, sandboxed or bare, for the sandbox tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workspaces.operations import Confinement, run_operation
from workspaces.sandbox import Sandbox

Run = Callable[..., dict[str, Any]]


def command_runner(sandbox: Sandbox | None, repo: Path, *, network: bool = True) -> Run:
    def _run(command: str, *, worktree: str | None = None, **fields: Any) -> dict[str, Any]:
        root = repo / ".worktrees" / worktree if worktree else repo
        request: dict[str, object] = {
            "protocolVersion": 1,
            "operation": "execute_command",
            "workspaceId": "repo",
            "command": command,
            "cwd": "",
            "timeoutMs": 30_000,
            "maxOutputBytes": 256 * 1024,
            **fields,
        }
        if worktree:
            request["worktree"] = worktree
        confinement = Confinement(sandbox, str(repo), network) if sandbox else None
        return run_operation(
            request, root=str(root), deadline=time.monotonic() + 60, confinement=confinement
        )

    return _run
