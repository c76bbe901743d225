"""The bridge lifecycle (contract §4.5): pair a worker, redeem the code, read its status, revoke it.

LibreChat (`packages/api/src/code/bridge.ts`) calls these with a principal's API key; the
worker machine redeems the code with `runworker --pairing-code`, without any key.

Worker ids are global (the execute header names one), so a tenant could learn that another
tenant holds an id if pairing answered differently for it. It does not: a pairing names a
worker id, not a worker row, and creates nothing but the pairing. Until its code is redeemed
the id is visible to the pairing's tenant only, as an offline worker (status, revoke), whether
or not another tenant holds it. Redemption is the one step that can tell: a code for an id
another tenant holds is refused (`WORKER_ID_TAKEN`) and spent, and no one else's worker is
touched. LibreChat draws a fresh random id for every pairing, so that refusal means a clash
that only a guess of someone's id could cause.

Codes are 32 characters of base64url (192 random bits), kept as their SHA-256 only, spent by
the one redeemer that wins the conditional UPDATE, and dead after PAIRING_TTL_S.
"""

from __future__ import annotations

import logging
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from django.db import IntegrityError, transaction
from django.utils import timezone

from admission import refusals
from admission.connections import sync_queue
from admission.credentials import (
    RedisAclUnavailable,
    worker_credentials_issue,
    worker_credentials_revoke,
)
from admission.registration import worker_event_announce
from workspaces.access import Caller
from workspaces.features import EDIT_FEATURES, effective_edit_features
from workspaces.models import Worker, WorkerPairing, WorkerWorkspace
from workspaces.secrets import WORKER_TOKEN_PREFIX, hash_secret, new_secret

log = logging.getLogger("sluice.bridge")

PROTOCOL_VERSION = 1
PAIRING_TTL_S = 600
CODE_PATTERN = re.compile(r"[A-Za-z0-9_-]{32}")
# LibreChat refuses a status whose lease is not 1..60000 ms.
MAX_LEASE_MS = 60_000
# What a command runs in (workspaces/operations/command.py: /bin/sh -c).
COMMAND_RUNTIMES = ["sh"]
# LibreChat's ceiling on workspaces in one status (CODE_WORKSPACE_MAX_COUNT).
MAX_STATUS_WORKSPACES = 32


@dataclass(frozen=True)
class Pairing:
    worker_id: str
    code: str
    expires_at: datetime

    def as_json(self) -> dict[str, Any]:
        expires = self.expires_at.astimezone(UTC).isoformat(timespec="milliseconds")
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "workerId": self.worker_id,
            "code": self.code,
            "expiresAt": expires.replace("+00:00", "Z"),
        }


def _now(now: datetime | None) -> datetime:
    return now if now is not None else timezone.now()


def _new_code() -> str:
    """24 random bytes as exactly 32 base64url characters, never beginning with "-": one in 64
    would, and `runworker --pairing-code CODE` (as docs/workers.md gives it) would then take
    the code for an option and refuse to start."""
    while True:
        code = secrets.token_urlsafe(24)
        if not code.startswith("-"):
            return code


def pairing_create(
    *,
    caller: Caller,
    worker_id: str,
    binding: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Pairing:
    """A fresh single-use code for `worker_id` in the caller's tenant. Any earlier unspent code
    of the tenant for that id stops working. Nothing else is looked at (see the module's note)."""
    at = _now(now)
    code = _new_code()
    expires_at = at + timedelta(seconds=PAIRING_TTL_S)
    with transaction.atomic():
        WorkerPairing.objects.filter(
            tenant_id=caller.tenant_id, worker_id=worker_id, redeemed_at__isnull=True
        ).delete()
        WorkerPairing.objects.create(
            tenant_id=caller.tenant_id,
            worker_id=worker_id,
            code_hash=hash_secret(code),
            created_by_id=caller.principal_id,
            binding=binding,
            created_at=at,
            expires_at=expires_at,
        )
    return Pairing(worker_id=worker_id, code=code, expires_at=expires_at)


def _spent_why(code_hash: str, at: datetime) -> refusals.Refusal:
    row = WorkerPairing.objects.filter(code_hash=code_hash).values("redeemed_at").first()
    if row is None:
        return refusals.pairing_code_unknown()
    if row["redeemed_at"] is not None:
        return refusals.pairing_code_used()
    return refusals.pairing_code_expired()


def pairing_redeem(*, code: str, now: datetime | None = None) -> dict[str, Any]:
    """Spend `code` once: the worker's id, a fresh token (the old one stops working) and, with
    per-worker Redis users on, its own Redis URLs. Of concurrent redeemers exactly one wins;
    the others are told the code was used. If Redis cannot issue the worker's user, nothing is
    saved and the code stays good."""
    at = _now(now)
    code_hash = hash_secret(code)
    taken: str | None = None
    redis_creds = None
    with transaction.atomic():
        won = WorkerPairing.objects.filter(
            code_hash=code_hash, redeemed_at__isnull=True, expires_at__gt=at
        ).update(redeemed_at=at)
        if won != 1:
            raise _spent_why(code_hash, at)
        pairing = WorkerPairing.objects.get(code_hash=code_hash)
        token, _, token_hash = new_secret(WORKER_TOKEN_PREFIX)
        worker = Worker.objects.select_for_update().filter(worker_id=pairing.worker_id).first()
        if worker is None:
            try:
                with transaction.atomic():
                    worker = Worker.objects.create(
                        worker_id=pairing.worker_id,
                        tenant_id=pairing.tenant_id,
                        token_hash=token_hash,
                        created_at=at,
                    )
            except IntegrityError:
                # Another tenant's redemption created the id a moment ago.
                worker = None
                taken = pairing.worker_id
        elif worker.tenant_id != pairing.tenant_id:
            taken = pairing.worker_id
        else:
            Worker.objects.filter(pk=worker.pk).update(token_hash=token_hash, revoked_at=None)
        if taken is None:
            assert worker is not None
            try:
                redis_creds = worker_credentials_issue(worker=worker)
            except (RedisAclUnavailable, redis.RedisError) as exc:
                log.error("pairing: cannot issue worker %s its Redis user: %s", worker, exc)
                raise refusals.admission_unavailable() from None
    if taken is not None:
        # Committed: the code is spent, and nobody's worker was touched.
        raise refusals.worker_id_taken(taken)
    return {
        "protocolVersion": PROTOCOL_VERSION,
        "workerId": pairing.worker_id,
        "workerToken": token,
        **(
            {
                "redisUrl": redis_creds.redis_url,
                "admissionRedisUrl": redis_creds.admission_redis_url,
                "admissionRedisCluster": redis_creds.admission_redis_cluster,
            }
            if redis_creds is not None
            else {}
        ),
    }


def _pending(caller: Caller, worker_id: str, at: datetime) -> bool:
    return WorkerPairing.objects.filter(
        tenant_id=caller.tenant_id, worker_id=worker_id, redeemed_at__isnull=True, expires_at__gt=at
    ).exists()


def _offline(worker_id: str) -> dict[str, Any]:
    return {
        "protocolVersion": PROTOCOL_VERSION,
        "workerId": worker_id,
        "online": False,
        "ready": False,
    }


# Which instruction file a workspace advertises to LibreChat, which takes one per workspace.
INSTRUCTION_PREFERENCE = ("AGENTS.md", "CLAUDE.md")


def _instructions(files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The one instruction file LibreChat's status parser accepts per workspace (AGENTS.md
    first), as its descriptor: path, bytes, sha256, truncated (Sluice serves only whole files)."""
    by_path = {str(f["path"]): f for f in files}
    for path in (*INSTRUCTION_PREFERENCE, *sorted(by_path)):
        if path in by_path:
            f = by_path[path]
            return [
                {
                    "path": path,
                    "bytes": int(f["bytes"]),
                    "sha256": str(f["sha256"]),
                    "truncated": False,
                }
            ]
    return []


def _capabilities(worker: Worker) -> tuple[dict[str, Any], bool]:
    offers = list(
        WorkerWorkspace.objects.filter(worker=worker)
        .order_by("workspace_id")
        .values_list("workspace_id", "operations", "edit_features", "instruction_files")
    )
    operations = sorted({op for _, ops, _, _ in offers for op in ops})
    tools: dict[str, Any] = {"operations": operations}
    if offers and len(offers) <= MAX_STATUS_WORKSPACES:
        # LibreChat selects workspaces only from this full form; past its ceiling it gets the
        # worker-wide operations alone rather than a truncated list.
        workspaces = []
        for ws, ops, _, files in offers:
            entry: dict[str, Any] = {"id": ws, "operations": sorted(ops)}
            instructions = _instructions(files or [])
            if instructions:
                entry["instructions"] = instructions
            workspaces.append(entry)
        tools = {
            "protocolVersion": PROTOCOL_VERSION,
            "operations": operations,
            "workspaces": workspaces,
        }
        # LibreChat negotiates edit features worker-wide: those every editing workspace
        # offers. (Linked worktrees are not advertised as `workspaceScopes`: LibreChat's
        # older status parser refuses the whole status when it sees that key.)
        editing = [
            effective_edit_features(features)
            for _, ops, features, _ in offers
            if {"edit_file", "preview_edit"} & set(ops)
        ]
        if editing:
            common = frozenset.intersection(*editing)
            if common:
                tools["editFileFeatures"] = [f for f in EDIT_FEATURES if f in common]
    capabilities = {
        # An older worker that never reported a profile runs commands unconfined.
        "sandboxProfile": worker.sandbox_profile or "none",
        "runtimes": COMMAND_RUNTIMES if "execute_command" in operations else [],
        "workspaceTools": tools,
    }
    return capabilities, bool(operations)


def worker_status(*, caller: Caller, worker_id: str, now: datetime | None = None) -> dict[str, Any]:
    """Online (registered in Redis), ready (that registration is the one Postgres holds, and it
    offers something), its lease, and what it offers. Another tenant's worker raises exactly
    what a missing one does; an id the caller's tenant is pairing reads as offline."""
    at = _now(now)
    worker = Worker.objects.filter(worker_id=worker_id, tenant_id=caller.tenant_id).first()
    if worker is None:
        if _pending(caller, worker_id, at):
            return _offline(worker_id)
        raise refusals.worker_not_found(worker_id)
    if worker.revoked_at is not None:
        return _offline(worker_id)
    try:
        incarnation, ttl_ms = sync_queue().registration(worker_id=worker_id)
    except redis.RedisError:
        raise refusals.admission_unavailable() from None
    if incarnation is None:
        return _offline(worker_id)
    capabilities, offers = _capabilities(worker)
    return {
        **_offline(worker_id),
        "online": True,
        "ready": offers and incarnation == worker.incarnation_id,
        "leaseExpiresInMs": max(1, min(ttl_ms, MAX_LEASE_MS)),
        "capabilities": capabilities,
    }


def worker_revoke(*, caller: Caller, worker_id: str, now: datetime | None = None) -> None:
    """Revoke the worker at once: its token and Redis user stop working, the calls waiting for
    it are told WORKER_OFFLINE, its unspent pairing codes expire. Idempotent (LibreChat retries a
    revoke until it succeeds), and an id the caller's tenant only paired is revoked as well."""
    at = _now(now)
    with transaction.atomic():
        # The pairings first: a redemption in flight holds its row, so waiting for it here
        # means the worker it creates is seen (and revoked) below, not missed.
        pairings = list(
            WorkerPairing.objects.select_for_update()
            .filter(tenant_id=caller.tenant_id, worker_id=worker_id)
            .values_list("pk", "redeemed_at")
        )
        worker = (
            Worker.objects.select_for_update()
            .filter(worker_id=worker_id, tenant_id=caller.tenant_id)
            .first()
        )
        if worker is None and not pairings:
            raise refusals.worker_not_found(worker_id)
        # Unspent codes die by expiring now. The rows stay, so a revoke that LibreChat retries
        # (its first answer lost) still finds the id and answers the same.
        WorkerPairing.objects.filter(
            pk__in=[pk for pk, spent in pairings if spent is None], expires_at__gt=at
        ).update(expires_at=at)
        if worker is not None:
            # A hash no secret was ever issued for: no token matches it any more.
            Worker.objects.filter(pk=worker.pk).update(
                token_hash=hash_secret(secrets.token_urlsafe(32)),
                redis_password_hash="",
                incarnation_id="",
                revoked_at=worker.revoked_at or at,
            )
    if worker is None:
        return
    try:
        # Deleting the ACL user also closes the worker's Redis connections.
        worker_credentials_revoke(worker_id=worker_id)
        told = sync_queue().revoke(worker_id=worker_id)
    except redis.RedisError:
        # The token is already dead; a retried revoke finishes the Redis part.
        raise refusals.admission_unavailable() from None
    if worker.revoked_at is None:  # the first revoke, not LibreChat retrying it
        worker_event_announce(
            kind="revoked",
            worker_id=worker_id,
            incarnation=worker.incarnation_id,
            detail=f"told {told} calls",
        )
