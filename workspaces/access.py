"""Who may reach what. Tenant scoping lives here and nowhere else.

An outsider asking for another tenant's worker gets exactly what a request for a worker
that does not exist gets: `None`, so callers cannot tell the two apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db.models import F, Q
from django.utils import timezone

from workspaces.models import ApiKey, Principal, Worker
from workspaces.secrets import hash_secret, keyed_hash

# last_used_at is written at most this often per key, so a burst of calls is not a burst of UPDATEs.
LAST_USED_RESOLUTION = timedelta(seconds=60)


@dataclass(frozen=True)
class Caller:
    """The authenticated principal of one request, as the admission path needs it."""

    principal_id: int
    tenant_id: int
    tenant_hash: str
    principal_hash: str

    @property
    def scope(self) -> str:
        """Opaque per-principal name for Redis keys (rate limits, request ids)."""
        return self.principal_hash


def caller_for(principal: Principal) -> Caller:
    return Caller(
        principal_id=principal.pk,
        tenant_id=principal.tenant_id,
        tenant_hash=keyed_hash("tenant", str(principal.tenant_id)),
        principal_hash=keyed_hash("principal", f"{principal.tenant_id}:{principal.pk}"),
    )


def principal_for_api_key(raw_key: str) -> Principal | None:
    """The active principal owning this unrevoked key, or None."""
    if not raw_key or len(raw_key) > 256:
        return None
    key = (
        ApiKey.objects.select_related("principal__tenant")
        .filter(key_hash=hash_secret(raw_key), revoked_at__isnull=True, principal__is_active=True)
        .first()
    )
    if key is None:
        return None
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=key.pk).filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_RESOLUTION)
        ).update(last_used_at=now)
    return key.principal


def default_worker_id(caller: Caller) -> str | None:
    """The worker id the caller's tenant runs unnamed calls on, or None when none is set."""
    return (
        Worker.objects.filter(pk=F("tenant__default_worker"), tenant_id=caller.tenant_id)
        .values_list("worker_id", flat=True)
        .first()
    )


def worker_for(caller: Caller, worker_id: str) -> Worker | None:
    """The caller's tenant's worker of that id, with its workspaces; None for missing and foreign alike."""
    return (
        Worker.objects.filter(tenant_id=caller.tenant_id, worker_id=worker_id)
        .prefetch_related("workspaces")
        .first()
    )
