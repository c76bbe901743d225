"""Reads the admission path needs from Postgres, one query each."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db.models import Exists, OuterRef, Subquery

from admission.models import Quarantine
from workspaces.access import Caller, caller_for, default_worker_id, principal_for_api_key
from workspaces.models import Worker, WorkerWorkspace


@dataclass(frozen=True)
class Target:
    """The worker a call is for, as far as this call is concerned."""

    worker_id: str
    incarnation_id: str
    token_hash: str
    workspace_registered: bool
    operations: frozenset[str]
    linked_worktree_lanes: bool
    quarantined: bool


def call_target(
    *, caller: Caller, worker_id: str, workspace_id: str, key_hash: str
) -> Target | None:
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
        .values(
            "worker_id", "incarnation_id", "token_hash", "ws_operations", "ws_lanes", "quarantined"
        )
        .first()
    )
    if row is None:
        return None
    return Target(
        worker_id=row["worker_id"],
        incarnation_id=row["incarnation_id"],
        token_hash=row["token_hash"],
        workspace_registered=row["ws_operations"] is not None,
        operations=frozenset(row["ws_operations"] or ()),
        linked_worktree_lanes=bool(row["ws_lanes"]),
        quarantined=bool(row["quarantined"]),
    )


@dataclass(frozen=True)
class Resolved:
    """What one thread hop learns for a call: who calls, which worker, what it offers."""

    caller: Caller | None
    worker_id: str | None
    target: Target | None


def call_resolve(
    *,
    token: str | None,
    worker_id: str | None,
    request: dict[str, Any] | None,
    key_hash: Callable[[str], str],
) -> Resolved:
    """Authenticate, pick the worker (the named one or the tenant's default) and load its offer.

    One trip to a worker thread for all the call's reads; the target is only loaded when the
    request was valid (`request` is None otherwise).
    """
    principal = principal_for_api_key(token) if token else None
    if principal is None:
        return Resolved(None, None, None)
    caller = caller_for(principal)
    if request is None:
        return Resolved(caller, worker_id, None)
    if worker_id is None:
        worker_id = default_worker_id(caller)
        if worker_id is None:
            return Resolved(caller, None, None)
    target = call_target(
        caller=caller,
        worker_id=worker_id,
        workspace_id=str(request["workspaceId"]),
        key_hash=key_hash(worker_id),
    )
    return Resolved(caller, worker_id, target)
