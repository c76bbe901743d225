"""The two queries every call makes (written as SQL for speed) keep the ORM's rules.

`caller_for_api_key`: the key unrevoked, its principal active, the default worker only one of
the principal's own tenant, last_used_at written at most once a minute. `call_target`: only the
caller's tenant's worker, the offer for this workspace, and a quarantine only while unreleased
and only for this isolation key.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from admission.models import Quarantine
from admission.selectors import call_resolve, call_target
from workspaces.access import Caller, caller_for_api_key, principal_hash
from workspaces.models import ApiKey, Principal, Tenant, Worker, WorkerWorkspace
from workspaces.secrets import keyed_hash, new_secret

pytestmark = pytest.mark.django_db

OPERATIONS = ["read_file", "search_text"]


def tenant_with_key(name: str) -> tuple[Tenant, Principal, str]:
    tenant = Tenant.objects.create(name=name)
    principal = Principal.objects.create(tenant=tenant, name="owner")
    raw, visible, key_hash = new_secret("slk_")
    ApiKey.objects.create(principal=principal, prefix=visible, key_hash=key_hash)
    return tenant, principal, raw


def worker_of(tenant: Tenant, worker_id: str, *, offered: str | None = "repo") -> Worker:
    worker = Worker.objects.create(
        worker_id=worker_id, tenant=tenant, token_hash="t" * 64, incarnation_id="i" * 32
    )
    if offered:
        WorkerWorkspace.objects.create(
            worker=worker, workspace_id=offered, operations=OPERATIONS, linked_worktree_lanes=True
        )
    return worker


def caller_of(raw: str) -> Caller:
    caller = caller_for_api_key(raw)
    assert caller is not None
    return caller


def test_a_valid_key_names_its_principal_tenant_and_hashes() -> None:
    tenant, principal, raw = tenant_with_key("acme")
    caller = caller_of(raw)
    assert (caller.principal_id, caller.tenant_id) == (principal.pk, tenant.pk)
    assert caller.tenant_hash == keyed_hash("tenant", str(tenant.pk))
    assert caller.scope == principal_hash(tenant_id=tenant.pk, principal_id=principal.pk)
    assert caller.default_worker_id is None


@pytest.mark.parametrize("raw", ["", "x", "slk_" + "a" * 300])
def test_unknown_empty_and_overlong_keys_name_nobody(raw: str) -> None:
    tenant_with_key("acme")
    assert caller_for_api_key(raw) is None


def test_a_revoked_key_or_an_inactive_principal_names_nobody() -> None:
    _, principal, revoked = tenant_with_key("acme")
    ApiKey.objects.filter(principal=principal).update(revoked_at=timezone.now())
    _, inactive, raw = tenant_with_key("globex")
    Principal.objects.filter(pk=inactive.pk).update(is_active=False)
    assert caller_for_api_key(revoked) is None
    assert caller_for_api_key(raw) is None


def test_the_default_worker_is_the_tenants_own_or_none() -> None:
    tenant, _, raw = tenant_with_key("acme")
    other, _, other_raw = tenant_with_key("globex")
    own = worker_of(tenant, "acme-w")
    foreign = worker_of(other, "globex-w")
    Tenant.objects.filter(pk=tenant.pk).update(default_worker=own)
    # The admin refuses a foreign default; a row written around it must still not leak.
    Tenant.objects.filter(pk=other.pk).update(default_worker=own)
    assert caller_of(raw).default_worker_id == "acme-w"
    assert caller_of(other_raw).default_worker_id is None
    Tenant.objects.filter(pk=other.pk).update(default_worker=foreign)
    assert caller_of(other_raw).default_worker_id == "globex-w"


def test_last_used_is_written_once_a_minute_at_most() -> None:
    _, principal, raw = tenant_with_key("acme")
    caller_of(raw)
    first = ApiKey.objects.get(principal=principal).last_used_at
    assert first is not None
    caller_of(raw)
    assert ApiKey.objects.get(principal=principal).last_used_at == first
    stale = timezone.now() - timedelta(minutes=5)
    ApiKey.objects.filter(principal=principal).update(last_used_at=stale)
    caller_of(raw)
    latest = ApiKey.objects.get(principal=principal).last_used_at
    assert latest is not None and latest > stale


def test_the_target_is_the_callers_tenants_worker_with_its_offer() -> None:
    tenant, _, raw = tenant_with_key("acme")
    _, _, other_raw = tenant_with_key("globex")
    worker_of(tenant, "acme-w")
    caller = caller_of(raw)
    target = call_target(caller=caller, worker_id="acme-w", workspace_id="repo", key_hash="k")
    assert target is not None
    assert (target.worker_id, target.incarnation_id, target.token_hash) == (
        "acme-w",
        "i" * 32,
        "t" * 64,
    )
    assert target.workspace_registered and target.linked_worktree_lanes
    assert target.operations == frozenset(OPERATIONS)
    assert not target.quarantined
    unoffered = call_target(caller=caller, worker_id="acme-w", workspace_id="other", key_hash="k")
    assert unoffered is not None
    assert not unoffered.workspace_registered and unoffered.operations == frozenset()
    foreign = caller_of(other_raw)
    assert (
        call_target(caller=foreign, worker_id="acme-w", workspace_id="repo", key_hash="k") is None
    )
    assert call_target(caller=caller, worker_id="nobody", workspace_id="repo", key_hash="k") is None


def test_a_quarantine_gates_only_its_own_key_and_only_until_released() -> None:
    tenant, _, raw = tenant_with_key("acme")
    worker_of(tenant, "acme-w")
    caller = caller_of(raw)
    gate = Quarantine.objects.create(
        worker_id="acme-w",
        workspace_id="repo",
        isolation_key_hash="hot",
        operation="write_file",
        reason="unknown outcome",
    )

    def quarantined(key_hash: str) -> bool:
        target = call_target(
            caller=caller, worker_id="acme-w", workspace_id="repo", key_hash=key_hash
        )
        assert target is not None
        return target.quarantined

    assert quarantined("hot") and not quarantined("cold")
    Quarantine.objects.filter(pk=gate.pk).update(released_at=timezone.now())
    assert not quarantined("hot")


def test_resolve_falls_back_to_the_default_worker_and_says_when_there_is_none() -> None:
    tenant, _, raw = tenant_with_key("acme")
    request = {"workspaceId": "repo"}
    unset = call_resolve(token=raw, worker_id=None, request=request, key_hash=lambda w: w)
    assert unset.caller is not None and unset.worker_id is None and unset.target is None
    Tenant.objects.filter(pk=tenant.pk).update(default_worker=worker_of(tenant, "acme-w"))
    chosen = call_resolve(token=raw, worker_id=None, request=request, key_hash=lambda w: w)
    assert chosen.worker_id == "acme-w" and chosen.target is not None
    assert chosen.target.workspace_registered
    nobody = call_resolve(token="slk_wrong", worker_id=None, request=request, key_hash=lambda w: w)
    assert nobody == call_resolve(token=None, worker_id="acme-w", request=None, key_hash=str)
    assert nobody.caller is None


def test_resolve_in_one_query_keeps_every_rule_of_the_separate_lookups() -> None:
    tenant, _, raw = tenant_with_key("acme")
    other, _, _ = tenant_with_key("globex")
    own = worker_of(tenant, "acme-w")
    worker_of(other, "globex-w")
    Tenant.objects.filter(pk=tenant.pk).update(default_worker=own)
    Quarantine.objects.create(
        worker_id="acme-w",
        workspace_id="repo",
        isolation_key_hash="hash-of-acme-w",
        operation="write_file",
        reason="unknown outcome",
    )
    request = {"workspaceId": "repo"}

    def resolve(worker_id: str | None, token: str = raw) -> Any:
        return call_resolve(
            token=token, worker_id=worker_id, request=request, key_hash=lambda w: f"hash-of-{w}"
        )

    named = resolve("acme-w")
    assert named.caller == caller_of(raw) and named.worker_id == "acme-w"
    assert named.target == call_target(
        caller=caller_of(raw), worker_id="acme-w", workspace_id="repo", key_hash="hash-of-acme-w"
    )
    assert named.target is not None and named.target.quarantined
    # Defaulted, the quarantine gate is checked under the default worker's key hash too.
    defaulted = resolve(None)
    assert defaulted.worker_id == "acme-w" and defaulted.target == named.target
    # A named worker of another tenant is missing, whatever the default.
    foreign = resolve("globex-w")
    assert foreign.caller is not None and foreign.worker_id == "globex-w"
    assert foreign.target is None
    assert resolve("acme-w", token="slk_wrong") == resolve(None, token="")
    assert resolve(None, token="").caller is None
