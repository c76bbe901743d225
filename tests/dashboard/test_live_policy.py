"""A worker's live card shows the policy its calls run under, overrides included."""

from __future__ import annotations

from admission.policy import forget_cached_policy, policy_override_update
from dashboard.live import live_cards
from workspaces.models import Tenant, Worker


def test_a_card_shows_the_effective_queue_limit_and_names_the_overrides(db: None) -> None:
    tenant = Tenant.objects.create(name="acme")
    Worker.objects.create(worker_id="acme-1", tenant=tenant, token_hash="x" * 64)
    Worker.objects.create(
        worker_id="plain-1", tenant=Tenant.objects.create(name="plain"), token_hash="y" * 64
    )
    forget_cached_policy()
    policy_override_update(tenant="acme", assignments={"WORKER_QUEUE_LIMIT": "8"})
    policy_override_update(worker="acme-1", assignments={"WORKSPACE_TOOLS_RATE_LIMIT": "30/30s"})
    cards = {c.worker_id: c for c in live_cards(worker_ids=["acme-1", "plain-1"])}
    assert cards["acme-1"].queue_limit == 8
    assert cards["acme-1"].policy_note == "queue limit 8 (tenant), rate limit 30/30s (worker)"
    assert (cards["plain-1"].queue_limit, cards["plain-1"].policy_note) == (32, "")
