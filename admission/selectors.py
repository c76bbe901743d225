"""Reads the admission path needs from Postgres, written as SQL: they run on every call."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.db import connection

from admission.models import Quarantine
from workspaces.access import (
    KEY_OWNER_COLUMNS,
    Caller,
    caller_for_api_key,
    caller_from_row,
    key_owner_sql,
    key_param,
)
from workspaces.features import effective_edit_features
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
    edit_features: frozenset[str] = frozenset()
    instruction_files: frozenset[str] = frozenset()  # paths the worker advertised (§2.2.1)


@cache
def _target_parts() -> tuple[str, str]:
    """The worker `w`'s columns and the join of its offer. Parameters: %(key_hash)s (the
    isolation key, for the quarantine gate) and %(workspace)s."""
    offer, quarantine = WorkerWorkspace._meta.db_table, Quarantine._meta.db_table
    columns = (
        "w.worker_id, w.incarnation_id, w.token_hash, o.operations, o.linked_worktree_lanes, "
        "o.edit_features, o.instruction_files, "
        f"EXISTS (SELECT 1 FROM {quarantine} q WHERE q.worker_id = w.worker_id "
        "AND q.isolation_key_hash = %(key_hash)s AND q.released_at IS NULL)"
    )
    join = f"LEFT JOIN {offer} o ON o.worker_id = w.id AND o.workspace_id = %(workspace)s "
    return columns, join


@cache
def _target_sql() -> str:
    columns, offer_join = _target_parts()
    return (
        f"SELECT {columns} FROM {Worker._meta.db_table} w {offer_join}"
        "WHERE w.tenant_id = %(tenant)s AND w.worker_id = %(worker)s"
    )


@cache
def _call_sql() -> str:
    # Key, caller and target in one round trip: the worker named by %(worker)s, or when that
    # is NULL the tenant's default worker (`d`), always within the key's own tenant (`t`).
    columns, offer_join = _target_parts()
    return key_owner_sql(
        f", {columns}",
        f"LEFT JOIN {Worker._meta.db_table} w ON w.tenant_id = t.id "
        f"AND w.worker_id = COALESCE(%(worker)s, d.worker_id) {offer_join}",
    )


def _target(row: tuple[Any, ...]) -> Target | None:
    worker_id, incarnation_id, token_hash, operations, lanes, features, files, quarantined = row
    if worker_id is None:
        return None
    if isinstance(operations, str):
        operations = json.loads(operations)
    if isinstance(features, str):
        features = json.loads(features)
    if isinstance(files, str):
        files = json.loads(files)
    return Target(
        worker_id=worker_id,
        incarnation_id=incarnation_id,
        token_hash=token_hash,
        workspace_registered=operations is not None,
        operations=frozenset(operations or ()),
        linked_worktree_lanes=bool(lanes),
        quarantined=bool(quarantined),
        edit_features=effective_edit_features(features),
        instruction_files=frozenset(str(f["path"]) for f in files or ()),
    )


def _fetch(sql: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else tuple(row)


def call_target(
    *, caller: Caller, worker_id: str, workspace_id: str, key_hash: str
) -> Target | None:
    """The caller's tenant's worker with its offer for this workspace; None for missing or foreign."""
    params = {
        "key_hash": key_hash,
        "workspace": workspace_id,
        "tenant": caller.tenant_id,
        "worker": worker_id,
    }
    row = _fetch(_target_sql(), params)
    return None if row is None else _target(row)


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

    One thread hop and, when the call names its worker, one query for all of it; the target
    is only loaded when the request was valid (`request` is None otherwise). A call on the
    default worker takes a second query: its isolation key hash (for the quarantine gate)
    depends on which worker that is.
    """
    if request is None:
        caller = caller_for_api_key(token or "")
        return Resolved(None, None, None) if caller is None else Resolved(caller, worker_id, None)
    key = key_param(token or "")
    if key is None:
        return Resolved(None, None, None)
    workspace = str(request["workspaceId"])
    params = {
        "key": key,
        "worker": worker_id,
        "workspace": workspace,
        "key_hash": key_hash(worker_id) if worker_id else "",
    }
    row = _fetch(_call_sql(), params)
    if row is None:
        return Resolved(None, None, None)
    caller = caller_from_row(row)
    if worker_id is not None:
        return Resolved(caller, worker_id, _target(row[KEY_OWNER_COLUMNS:]))
    if caller.default_worker_id is None:
        return Resolved(caller, None, None)
    target = call_target(
        caller=caller,
        worker_id=caller.default_worker_id,
        workspace_id=workspace,
        key_hash=key_hash(caller.default_worker_id),
    )
    return Resolved(caller, caller.default_worker_id, target)
