"""Who may reach what. Tenant scoping lives here and nowhere else.

An outsider asking for another tenant's worker gets exactly what a request for a worker
that does not exist gets: `None`, so callers cannot tell the two apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from typing import Any

from django.db import connection
from django.db.models import Q
from django.utils import timezone

from workspaces.models import ApiKey, Principal, Tenant, Worker
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
    # The worker of the caller's tenant that runs calls naming no worker; None when unset.
    default_worker_id: str | None = None
    # The key it authenticated with (a waiting call re-checks it before dispatch).
    key_id: int | None = None

    @property
    def scope(self) -> str:
        """Opaque per-principal name for Redis keys (rate limits, request ids)."""
        return self.principal_hash


def principal_hash(*, tenant_id: int, principal_id: int) -> str:
    return keyed_hash("principal", f"{tenant_id}:{principal_id}")


@cache
def key_owner_sql(extra_columns: str = "", extra_joins: str = "") -> str:
    """The key lookup every call makes, written out: the ORM took longer to build it than
    Postgres took to answer it. Its rules: the key unrevoked, its principal active, the
    default worker (`d`) only one of the principal's own tenant (`t`). Parameter: %(key)s.
    The admission path adds its worker and offer in the same query (`extra_*`)."""
    key, principal, tenant, worker = (m._meta.db_table for m in (ApiKey, Principal, Tenant, Worker))
    return (
        f"SELECT k.id, k.last_used_at, p.id, p.tenant_id, d.worker_id{extra_columns} FROM {key} k "
        f"JOIN {principal} p ON p.id = k.principal_id "
        f"JOIN {tenant} t ON t.id = p.tenant_id "
        f"LEFT JOIN {worker} d ON d.id = t.default_worker_id AND d.tenant_id = t.id "
        f"{extra_joins}"
        "WHERE k.key_hash = %(key)s AND k.revoked_at IS NULL AND p.is_active"
    )


KEY_OWNER_COLUMNS = 5


def key_param(raw_key: str) -> str | None:
    """The %(key)s parameter for a presented key; None for one that cannot be a key."""
    if not raw_key or len(raw_key) > 256:
        return None
    return hash_secret(raw_key)


def caller_from_row(row: tuple[Any, ...]) -> Caller:
    """The caller of a key_owner_sql() row (its first KEY_OWNER_COLUMNS columns); notes the
    key's use at most once a minute."""
    key_id, last_used_at, principal_id, tenant_id, default_worker = row[:KEY_OWNER_COLUMNS]
    now = timezone.now()
    if last_used_at is None or now - last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=key_id).filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_RESOLUTION)
        ).update(last_used_at=now)
    return Caller(
        principal_id=principal_id,
        tenant_id=tenant_id,
        tenant_hash=keyed_hash("tenant", str(tenant_id)),
        principal_hash=principal_hash(tenant_id=tenant_id, principal_id=principal_id),
        default_worker_id=default_worker,
        key_id=key_id,
    )


def caller_for_api_key(raw_key: str) -> Caller | None:
    """The caller owning this unrevoked key of an active principal, or None. One query."""
    key = key_param(raw_key)
    if key is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute(key_owner_sql(), {"key": key})
        row = cursor.fetchone()
    return None if row is None else caller_from_row(row)
