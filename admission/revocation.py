"""Revoking API keys: Postgres records it, and Redis tells the grant scripts at once.

A call that waits for its slot is dispatched by whichever Lua script grants it (enter, leave,
release, settle: docs/admission.md), with no API process in between to ask Postgres whether
its key is still good. So a revocation also writes a marker per key (`SyncQueue
.mark_keys_revoked`) that every grant checks atomically: a waiting call of a revoked key is
taken out of its queue and answered 401 UNAUTHENTICATED, not started, and its place goes to
the next call. The marker lives longer than any call can wait (`REVOKED_KEY_TTL_MS`); after
that no call of the key can be waiting, and no new one authenticates.

The markers are written inside the Postgres transaction, before it commits: when Redis is
unreachable the revocation fails as a whole and says so, instead of leaving a key revoked in
Postgres whose waiting calls would still run.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from admission.callers import forget_cached_callers
from admission.connections import sync_queue
from workspaces.models import ApiKey, Principal


def api_keys_revoke(*, keys: QuerySet[ApiKey], now: datetime | None = None) -> int:
    """Revoke the unrevoked keys among `keys` (already revoked ones keep their original
    time). Returns how many were revoked."""
    with transaction.atomic():
        ids = list(
            keys.filter(revoked_at__isnull=True).select_for_update().values_list("pk", flat=True)
        )
        if not ids:
            return 0
        sync_queue().mark_keys_revoked(key_ids=ids)
        ApiKey.objects.filter(pk__in=ids).update(revoked_at=now or timezone.now())
    forget_cached_callers()
    return len(ids)


def principal_active_set(*, principal: Principal, active: bool) -> None:
    """Enable or disable a principal. Disabled, its keys stop authenticating and its waiting
    calls are refused at their grant as a revoked key's are (the same markers). Enabled
    again, the markers of its unrevoked keys are dropped, so they work at once."""
    with transaction.atomic():
        Principal.objects.filter(pk=principal.pk).update(is_active=active)
        keys = ApiKey.objects.filter(principal=principal)
        if active:
            ids = list(keys.filter(revoked_at__isnull=True).values_list("pk", flat=True))
            sync_queue().unmark_keys_revoked(key_ids=ids)
        else:
            sync_queue().mark_keys_revoked(key_ids=list(keys.values_list("pk", flat=True)))
    principal.is_active = active
    forget_cached_callers()
