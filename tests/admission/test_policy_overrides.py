"""Policy overrides per tenant and per worker: the most specific value wins, field by field
(worker, then tenant, then the global row), set by `set_policy --tenant/--worker` and live
within 2 s on every API process."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from livesupport import git_workspace
from test_policy import manage, rate_limit_seen

from admission.models import PolicyOverride
from admission.policy import (
    forget_cached_policy,
    policy_for,
    policy_override_clear,
    policy_override_update,
    policy_row,
    policy_update,
)
from admission.ratelimit import RatePolicy
from workspaces.models import Tenant, Worker


def tenant_with_worker(name: str, worker_id: str) -> tuple[Tenant, Worker]:
    tenant = Tenant.objects.create(name=name)
    return tenant, Worker.objects.create(worker_id=worker_id, tenant=tenant, token_hash="x" * 64)


def test_the_most_specific_value_wins_field_by_field(transactional_db: None) -> None:
    tenant, worker = tenant_with_worker("acme", "acme-1")
    _, other = tenant_with_worker("other", "other-1")
    second = Worker.objects.create(worker_id="acme-2", tenant=tenant, token_hash="y" * 64)
    policy_update({"WORKER_QUEUE_LIMIT": "32", "JOB_TIMEOUT": "300000"})
    policy_override_update(
        tenant="acme", assignments={"WORKER_QUEUE_LIMIT": "8", "WORKSPACE_TOOLS_RATE_LIMIT": "10/s"}
    )
    policy_override_update(worker="acme-1", assignments={"WORKER_QUEUE_LIMIT": "2"})

    on_worker = policy_for(worker_id=worker.worker_id, tenant_id=tenant.pk)
    assert on_worker.worker_queue_limit == 2  # the worker's own
    assert on_worker.rate == RatePolicy(limit=10, window_ms=1_000)  # its tenant's
    assert on_worker.job_timeout_ms == 300_000  # the global row's
    on_sibling = policy_for(worker_id=second.worker_id, tenant_id=tenant.pk)
    assert (on_sibling.worker_queue_limit, on_sibling.rate.limit) == (8, 10)
    elsewhere = policy_for(worker_id=other.worker_id, tenant_id=other.tenant_id)
    assert (elsewhere.worker_queue_limit, elsewhere.rate.limit) == (32, 120)

    # An empty value inherits again; clearing removes the row.
    policy_override_update(worker="acme-1", assignments={"WORKER_QUEUE_LIMIT": ""})
    assert policy_for(worker_id="acme-1", tenant_id=tenant.pk).worker_queue_limit == 8
    assert policy_override_clear(tenant="acme") is True
    assert policy_for(worker_id="acme-1", tenant_id=tenant.pk).worker_queue_limit == 32
    assert PolicyOverride.objects.filter(tenant=tenant).count() == 0


def test_a_cached_resolution_follows_a_change_after_the_cache_expires(
    transactional_db: None, settings: Any
) -> None:
    tenant, worker = tenant_with_worker("acme", "acme-1")
    settings.POLICY_CACHE_S = 0.2
    forget_cached_policy()
    assert policy_for(worker_id="acme-1", tenant_id=tenant.pk).worker_queue_limit == 32
    # Written behind this process's back, as another process would.
    PolicyOverride.objects.create(worker=worker, worker_queue_limit=5)
    deadline = time.monotonic() + 2
    while policy_for(worker_id="acme-1", tenant_id=tenant.pk).worker_queue_limit != 5:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_an_override_refuses_a_global_only_key_and_bad_values_leaving_it_as_it_was(
    transactional_db: None,
) -> None:
    tenant_with_worker("acme", "acme-1")
    policy_override_update(tenant="acme", assignments={"WORKER_QUEUE_LIMIT": "8"})
    for assignments, named in [
        ({"CODEAPI_BRIDGE_MAX_WORKSPACE_LEASE_SLOTS": "2"}, "global only"),
        ({"WORKER_QUEUE_LIMIT": "4", "JOB_TIMEOUT": "5"}, "JOB_TIMEOUT"),
        ({"WORKSPACE_TOOLS_RATE_LIMIT": "10/30"}, "10/30"),
    ]:
        with pytest.raises(ValueError, match=named):
            policy_override_update(tenant="acme", assignments=assignments)
    with pytest.raises(ValueError, match="no tenant named 'nope'"):
        policy_override_update(tenant="nope", assignments={"WORKER_QUEUE_LIMIT": "4"})
    assert list(PolicyOverride.objects.values_list("worker_queue_limit", "job_timeout_ms")) == [
        (8, None)
    ]


def test_an_override_refuses_a_rate_limit_below_an_operation_weight(transactional_db: None) -> None:
    tenant_with_worker("acme", "acme-1")
    row = policy_row()
    row.operation_weights = {**row.operation_weights, "execute_command": 10}
    row.save()
    with pytest.raises(ValueError, match="execute_command"):
        policy_override_update(tenant="acme", assignments={"WORKSPACE_TOOLS_RATE_LIMIT": "5/30s"})
    assert not PolicyOverride.objects.exists()


def test_set_policy_with_tenant_or_worker_prints_the_override_and_refuses_in_one_line(
    live_env: dict[str, str], transactional_db: None
) -> None:
    tenant_with_worker("acme", "acme-1")
    done = manage(live_env, "set_policy", "--worker", "acme-1", "WORKSPACE_TOOLS_RATE_LIMIT=9/30s")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["worker acme-1: WORKSPACE_TOOLS_RATE_LIMIT=9/30s"]
    for args in (
        ["--tenant", "nope", "WORKER_QUEUE_LIMIT=3"],
        ["--worker", "acme-1", "CODEAPI_BRIDGE_MAX_WORKSPACE_LEASE_SLOTS=3"],
        ["--tenant", "acme", "--worker", "acme-1", "WORKER_QUEUE_LIMIT=3"],
        ["WORKER_QUEUE_LIMIT="],
    ):
        refused = manage(live_env, "set_policy", *args)
        assert refused.returncode != 0, args
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert list(PolicyOverride.objects.values_list("rate_limit", flat=True)) == ["9/30s"]
    assert policy_row().worker_queue_limit == 32


def wait_for_limit(http: httpx.Client, account: Any, expected: str, within_s: float) -> float:
    started = time.monotonic()
    while (seen := rate_limit_seen(http, account)) != expected:
        assert time.monotonic() - started < within_s, f"still {seen} after {within_s} s"
        time.sleep(0.05)
    return time.monotonic() - started


def test_overrides_reach_a_second_api_process_within_2_s_and_only_their_target(
    api_servers: list[Any],
    api: Any,
    live_env: dict[str, str],
    account_factory: Any,
    worker_factory: Any,
    tmp_path: Any,
) -> None:
    owner = account_factory()
    outsider = account_factory()
    worker_factory(owner, {"repo": git_workspace(tmp_path / "repo")})
    worker_factory(outsider, {"repo": git_workspace(tmp_path / "other")})
    with api_servers[1].client() as http:
        assert rate_limit_seen(http, owner) == "120"
        try:
            done = manage(
                live_env,
                "set_policy",
                "--tenant",
                owner.tenant,
                "WORKSPACE_TOOLS_RATE_LIMIT=77/30s",
            )
            assert done.returncode == 0, done.stderr
            assert wait_for_limit(http, owner, "77", within_s=2.0) <= 2.0
            assert rate_limit_seen(http, outsider) == "120"
            done = manage(
                live_env,
                "set_policy",
                "--worker",
                owner.worker_id,
                "WORKSPACE_TOOLS_RATE_LIMIT=55/30s",
            )
            assert done.returncode == 0, done.stderr
            assert wait_for_limit(http, owner, "55", within_s=2.0) <= 2.0
        finally:
            # No later test may meet these overrides in an API process's cache.
            PolicyOverride.objects.all().delete()
            wait_for_limit(http, owner, "120", within_s=5.0)
            with api.client() as first:
                wait_for_limit(first, owner, "120", within_s=5.0)
