"""Validates a worker's command line before it registers: refuse early, in one line."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Any

from sluice_protocol import OPERATIONS

from workspaces.features import EDIT_FEATURES
from workspaces.operations.instructions import instruction_files

WORKSPACE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}", re.ASCII)
MAX_SLOTS = 64


class WorkerConfigError(ValueError):
    pass


@dataclass(frozen=True)
class WorkspaceRoot:
    workspace_id: str
    root: str  # realpath; never sent to the server
    operations: frozenset[str]
    network: bool = True  # False: its commands get an empty network namespace (loopback only)


def default_slots() -> int:
    return min(4, max(2, (os.cpu_count() or 2) // 2))


def parse_workspaces(specs: list[str]) -> list[WorkspaceRoot]:
    """`ID=PATH` pairs -> workspaces; refuses missing paths, duplicates, overlaps and aliases."""
    if not specs:
        raise WorkerConfigError("at least one --workspace ID=PATH is required")
    roots: list[WorkspaceRoot] = []
    for spec in specs:
        workspace_id, sep, path = spec.partition("=")
        if not sep or not path:
            raise WorkerConfigError(f"--workspace expects ID=PATH, got {spec!r}")
        if not WORKSPACE_ID.fullmatch(workspace_id):
            raise WorkerConfigError(
                f"workspace id {workspace_id!r} is not valid (letters, digits, . _ : -)"
            )
        if not os.path.isdir(path):
            raise WorkerConfigError(
                f"workspace {workspace_id}: path {path} does not exist or is not a directory"
            )
        roots.append(WorkspaceRoot(workspace_id, os.path.realpath(path), OPERATIONS))
    for i, a in enumerate(roots):
        for b in roots[i + 1 :]:
            if a.workspace_id == b.workspace_id:
                raise WorkerConfigError(f"workspace id {a.workspace_id} is given twice")
            if a.root == b.root:
                raise WorkerConfigError(
                    f"workspaces {a.workspace_id} and {b.workspace_id} are the same directory"
                )
            if _inside(a.root, b.root) or _inside(b.root, a.root):
                raise WorkerConfigError(f"workspaces {a.workspace_id} and {b.workspace_id} overlap")
    return roots


def without_network(roots: list[WorkspaceRoot], ids: list[str]) -> list[WorkspaceRoot]:
    """Marks the workspaces named by --workspace-no-network; an unknown id is refused."""
    known = {w.workspace_id for w in roots}
    for workspace_id in ids:
        if workspace_id not in known:
            raise WorkerConfigError(
                f"--workspace-no-network {workspace_id}: no such --workspace on this worker"
            )
    return [replace(w, network=w.workspace_id not in ids) for w in roots]


def check_limit(flag: str, value: int) -> int:
    if value < 0:
        raise WorkerConfigError(f"{flag} must be 0 (no limit) or more, not {value}")
    return value


def registration_workspaces(roots: list[WorkspaceRoot], *, lanes: bool) -> list[dict[str, Any]]:
    """The `workspaces` of a registration body (§4.1, §2.2.1). Instruction files are read now,
    so each (re-)registration advertises what the roots hold at that moment."""
    return [
        {
            "workspaceId": w.workspace_id,
            "operations": sorted(w.operations),
            "linkedWorktreeLanes": lanes,
            "editFeatures": list(EDIT_FEATURES),
            "instructionFiles": instruction_files(w.root),
        }
        for w in roots
    ]


def _inside(child: str, parent: str) -> bool:
    return child.startswith(parent.rstrip(os.sep) + os.sep)


def check_slots(slots: int) -> int:
    if not 1 <= slots <= MAX_SLOTS:
        raise WorkerConfigError(f"--slots must be within 1..{MAX_SLOTS}, not {slots}")
    return slots
