"""Policy overrides per tenant and per worker: the most specific value wins, field by field
(worker, then tenant, then the global row), set by `set_policy --tenant/--worker` and live on
every API process from its next call (the policy version in Django's cache)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.core.cache import cache
from livesupport import git_workspace, run_command
from test_policy import manage, rate_limit_seen

from admission.models import PolicyOverride
from admission.policy import (
    VERSION_KEY,
    apolicy_version,
    forget_cached_policy,
    policy_for,
    policy_override_clear,
    policy_override_update,
    policy_row,
    policy_update,
    policy_version,
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


def test_a_cached_resolution_follows_another_process_s_change_on_the_next_call(
    transactional_db: None,
) -> None:
    tenant, worker = tenant_with_worker("acme", "acme-1")
    policy_row()  # made from the environment on first use (a save, so a bump of its own)
    forget_cached_policy()
    assert policy_for(worker_id="acme-1", tenant_id=tenant.pk).worker_queue_limit == 32
    # Another process's change, as this one sees it: a row it did not write (bulk_create sends
    # no signal, so nothing here forgets its cache) ...
    PolicyOverride.objects.bulk_create([PolicyOverride(worker=worker, worker_queue_limit=5)])
    # ... is not seen while the version stands (the cache is not re-read from Postgres) ...
    assert policy_for(worker_id="acme-1", tenant_id=tenant.pk).worker_queue_limit == 32
    # ... and is, on the very next call, once that process bumps the version in Django's cache.
    cache.set(VERSION_KEY, 12345, timeout=60)
    assert policy_for(worker_id="acme-1", tenant_id=tenant.pk).worker_queue_limit == 5


def test_every_write_of_the_policy_bumps_the_version(transactional_db: None) -> None:
    tenant, worker = tenant_with_worker("acme", "acme-1")
    seen = [policy_version()]

    def bumped() -> bool:
        seen.append(policy_version())
        return seen[-1] != seen[-2]

    policy_update({"WORKER_QUEUE_LIMIT": "31"})
    assert bumped()
    policy_override_update(tenant="acme", assignments={"WORKER_QUEUE_LIMIT": "8"})
    assert bumped()
    row = PolicyOverride.objects.get(tenant=tenant)
    row.job_timeout_ms = 60_000
    row.save()  # as Django admin saves it
    assert bumped()
    assert policy_override_clear(tenant="acme") is True
    assert bumped()
    PolicyOverride.objects.create(worker=worker, worker_queue_limit=3)
    worker.delete()  # its override goes with it
    assert bumped()
    # The async path reads the same version, with no thread hop.
    assert asyncio.run(apolicy_version()) == policy_version()


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
    done = run_command("set_policy", "--worker", "acme-1", "WORKSPACE_TOOLS_RATE_LIMIT=9/30s")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["worker acme-1: WORKSPACE_TOOLS_RATE_LIMIT=9/30s"]
    for args in (
        ["--tenant", "nope", "WORKER_QUEUE_LIMIT=3"],
        ["--worker", "acme-1", "CODEAPI_BRIDGE_MAX_WORKSPACE_LEASE_SLOTS=3"],
        ["--tenant", "acme", "--worker", "acme-1", "WORKER_QUEUE_LIMIT=3"],
        ["WORKER_QUEUE_LIMIT="],
    ):
        refused = run_command("set_policy", *args)
        assert refused.returncode != 0, args
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert list(PolicyOverride.objects.values_list("rate_limit", flat=True)) == ["9/30s"]
    assert policy_row().worker_queue_limit == 32


def shown(done: Any) -> dict[str, tuple[str, str]]:
    """`set_policy --show`'s lines as KEY -> (value, source)."""
    assert done.returncode == 0, done.stderr
    rows = {}
    for line in done.stdout.splitlines():
        assignment, _, source = line.partition("  from ")
        key, _, value = assignment.strip().partition("=")
        rows[key] = (value, source)
    return rows


def test_set_policy_show_prints_the_effective_policy_and_where_each_value_comes_from(
    live_env: dict[str, str], transactional_db: None
) -> None:
    tenant_with_worker("acme", "acme-1")
    tenant_with_worker("other", "other-1")
    policy_update({"WORKER_QUEUE_LIMIT": "32", "JOB_TIMEOUT": "300000"})
    policy_override_update(
        tenant="acme", assignments={"WORKER_QUEUE_LIMIT": "8", "WORKSPACE_TOOLS_RATE_LIMIT": "10/s"}
    )
    policy_override_update(
        worker="acme-1",
        assignments={"WORKER_QUEUE_LIMIT": "2", "WORKSPACE_TOOLS_RATE_LIMIT_ENABLED": "off"},
    )
    on_worker = shown(run_command("set_policy", "--show", "--worker", "acme-1"))
    assert on_worker["WORKER_QUEUE_LIMIT"] == ("2", "worker acme-1 override")
    assert on_worker["WORKSPACE_TOOLS_RATE_LIMIT_ENABLED"] == ("off", "worker acme-1 override")
    assert on_worker["WORKSPACE_TOOLS_RATE_LIMIT"] == ("10/s", "tenant acme override")
    assert on_worker["JOB_TIMEOUT"] == ("300000", "global policy")
    slots = str(policy_row().max_lease_slots)
    assert on_worker["CODEAPI_BRIDGE_MAX_WORKSPACE_LEASE_SLOTS"] == (
        slots,
        "global policy (global only)",
    )
    # What it prints is what the calls run under.
    policy = policy_for(worker_id="acme-1", tenant_id=Tenant.objects.get(name="acme").pk)
    assert int(on_worker["WORKER_QUEUE_LIMIT"][0]) == policy.worker_queue_limit
    assert policy.rate_limit_enabled is False
    on_tenant = shown(run_command("set_policy", "--show", "--tenant", "acme"))
    assert on_tenant["WORKER_QUEUE_LIMIT"] == ("8", "tenant acme override")
    assert on_tenant["WORKSPACE_TOOLS_RATE_LIMIT_ENABLED"][1] == "global policy"
    on_other = shown(run_command("set_policy", "--show", "--worker", "other-1"))
    assert {source for _, source in on_other.values()} <= {
        "global policy",
        "global policy (global only)",
    }
    overall = shown(run_command("set_policy", "--show"))
    assert overall["WORKER_QUEUE_LIMIT"] == ("32", "global policy")
    assert (
        set(overall)
        == set(on_worker)
        == {
            "JOB_TIMEOUT",
            "WORKSPACE_QUEUE_CEILING_MS",
            "WORKER_QUEUE_LIMIT",
            "WORKER_FLOW_SHARE_PERCENT",
            "CODEAPI_BRIDGE_MAX_WORKSPACE_LEASE_SLOTS",
            "WORKSPACE_TOOLS_RATE_LIMIT",
            "WORKSPACE_TOOLS_RATE_LIMIT_ENABLED",
        }
    )
    refused = run_command("set_policy", "--show", "--worker", "nope")
    assert refused.returncode != 0
    assert len(refused.stderr.strip().splitlines()) == 1 and "nope" in refused.stderr


def test_set_policy_check_env_says_so_when_everything_matches(
    live_env: dict[str, str], transactional_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_QUEUE_LIMIT", str(policy_row().worker_queue_limit))
    done = run_command("set_policy", "--check-env")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "the stored policy follows every policy variable set in the environment"
    )


def test_overrides_reach_a_second_api_process_on_its_next_call_and_only_their_target(
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
            # Live on the next call (issue 16 asks for within 2 s).
            assert rate_limit_seen(http, owner) == "77"
            assert rate_limit_seen(http, outsider) == "120"
            done = manage(
                live_env,
                "set_policy",
                "--worker",
                owner.worker_id,
                "WORKSPACE_TOOLS_RATE_LIMIT=55/30s",
            )
            assert done.returncode == 0, done.stderr
            assert rate_limit_seen(http, owner) == "55"
            with api.client() as first:
                assert rate_limit_seen(first, owner) == "55"
        finally:
            # The deletes bump the version: neither process keeps these overrides.
            PolicyOverride.objects.all().delete()
            assert rate_limit_seen(http, owner) == "120"
            with api.client() as first:
                assert rate_limit_seen(first, owner) == "120"
