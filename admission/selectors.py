"""Reads the admission path needs from Postgres, one query each."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Exists, OuterRef, Subquery

from admission.models import Quarantine
from workspaces.access import Caller
from workspaces.models import Worker, WorkerWorkspace


@dataclass(frozen=True)
class Target:
    """The worker a call is for, as far as this call is concerned."""

    worker_id: str
    incarnation_id: str
    workspace_registered: bool
    operations: frozenset[str]
    linked_worktree_lanes: bool
    quarantined: bool


def call_target(*, caller: Caller, worker_id: str, workspace_id: str, key_hash: str) -> Target | None:
    """The caller's tenant's worker with its offer for this workspace; None for missing or foreign."""
    workspace = WorkerWorkspace.objects.filter(worker=OuterRef("pk"), workspace_id=workspace_id)
    row = (
        Worker.objects.filter(tenant_id=caller.tenant_id, worker_id=worker_id)
        .annotate(
            ws_operations=Subquery(workspace.values("operations")[:1]),
            ws_lanes=Subquery(workspace.values("linked_worktree_lanes")[:1]),
            quarantined=Exists(
                Quarantine.objects.filter(
                    worker_id=worker_id, isolation_key_hash=key_hash, released_at__isnull=True
                )
            ),
        )
        .values("worker_id", "incarnation_id", "ws_operations", "ws_lanes", "quarantined")
        .first()
    )
    if row is None:
        return None
    return Target(
        worker_id=row["worker_id"],
        incarnation_id=row["incarnation_id"],
        workspace_registered=row["ws_operations"] is not None,
        operations=frozenset(row["ws_operations"] or ()),
        linked_worktree_lanes=bool(row["ws_lanes"]),
        quarantined=bool(row["quarantined"]),
    )
