"""Revoking a key (or disabling a principal) writes the marks the grant scripts check, in
the same step as the Postgres change (real Postgres, real Redis)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.test import Client
from django.utils import timezone

from admission.queue import REVOKED_KEY_TTL_MS, revoked_key_prefix
from admission.revocation import api_keys_revoke, principal_active_set
from workspaces.models import ApiKey, Principal, Tenant
from workspaces.secrets import new_secret

pytestmark = pytest.mark.django_db


def make_key(principal: Principal) -> ApiKey:
    _, visible, key_hash = new_secret("slk_")
    return ApiKey.objects.create(principal=principal, prefix=visible, key_hash=key_hash)


@pytest.fixture
def owner() -> Principal:
    return Principal.objects.create(tenant=Tenant.objects.create(name="acme"), name="owner")


@pytest.fixture
def marks() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
    yield client
    for key in client.scan_iter(match=revoked_key_prefix(settings.REDIS_KEY_PREFIX) + "*"):
        client.delete(key)
    client.close()


def marked(client: redis.Redis, key: ApiKey) -> bool:
    return bool(client.exists(revoked_key_prefix(settings.REDIS_KEY_PREFIX) + str(key.pk)))


def test_revoking_marks_each_newly_revoked_key_and_keeps_earlier_revocations(
    owner: Principal, marks: redis.Redis
) -> None:
    fresh, old, other = make_key(owner), make_key(owner), make_key(owner)
    earlier = timezone.now() - timedelta(days=3)
    ApiKey.objects.filter(pk=old.pk).update(revoked_at=earlier)
    assert api_keys_revoke(keys=ApiKey.objects.filter(pk__in=[fresh.pk, old.pk])) == 1
    fresh.refresh_from_db()
    old.refresh_from_db()
    assert fresh.revoked_at is not None and old.revoked_at == earlier
    # Only the key revoked now can have calls waiting; the one revoked days ago cannot.
    assert marked(marks, fresh) and not marked(marks, old) and not marked(marks, other)
    ttl_ms = marks.pttl(revoked_key_prefix(settings.REDIS_KEY_PREFIX) + str(fresh.pk))
    assert REVOKED_KEY_TTL_MS - 5_000 < ttl_ms <= REVOKED_KEY_TTL_MS
    assert api_keys_revoke(keys=ApiKey.objects.filter(pk=fresh.pk)) == 0


def test_disabling_a_principal_marks_its_keys_and_enabling_it_again_clears_them(
    owner: Principal, marks: redis.Redis
) -> None:
    live, revoked = make_key(owner), make_key(owner)
    api_keys_revoke(keys=ApiKey.objects.filter(pk=revoked.pk))
    principal_active_set(principal=owner, active=False)
    assert not Principal.objects.get(pk=owner.pk).is_active
    assert marked(marks, live) and marked(marks, revoked)
    principal_active_set(principal=owner, active=True)
    assert Principal.objects.get(pk=owner.pk).is_active
    # The live key works again at once; the revoked one stays marked.
    assert not marked(marks, live) and marked(marks, revoked)


def test_the_admins_revoke_action_and_principal_form_write_the_marks(
    admin_client: Client, owner: Principal, marks: redis.Redis
) -> None:
    key, kept = make_key(owner), make_key(owner)
    response = admin_client.post(
        "/admin/workspaces/apikey/", {"action": "revoke_keys", "_selected_action": [key.pk]}
    )
    assert response.status_code == 302
    assert marked(marks, key) and not marked(marks, kept)
    # Unticking "active" on the principal's page (an unticked checkbox is simply not sent).
    inline = {
        "api_keys-TOTAL_FORMS": "2",
        "api_keys-INITIAL_FORMS": "2",
        "api_keys-0-id": str(key.pk),
        "api_keys-0-principal": str(owner.pk),
        "api_keys-1-id": str(kept.pk),
        "api_keys-1-principal": str(owner.pk),
    }
    response = admin_client.post(
        f"/admin/workspaces/principal/{owner.pk}/change/", {"name": owner.name, **inline}
    )
    assert response.status_code == 302, response.content[:2000]
    assert not Principal.objects.get(pk=owner.pk).is_active
    assert marked(marks, kept)
