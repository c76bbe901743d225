"""How a durable call that ends because its service stops or its key is revoked reads to
LibreChat's durable client (tests/librechat_rules.py): a code it maps, with the status that
says "not started", never its catch-all 422 WORKSPACE_TOOL_REJECTED. Real Redis, fixed clocks."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from librechat_rules import DURABLE_UNMAPPED, librechat_durable_failure
from queuekit import dispatching_queue, entering, run

from admission.durable import durable_status
from admission.queue import AsyncQueue, SyncQueue, offer_tokens
from admission.refusals import Refusal

W = "wdl1"
T0 = 1_000_000
REVOKED, GOOD = 17, 18
OFFER = {
    "ws": offer_tokens(
        operations=["execute_command"], lanes=False, edit_features=frozenset(), instruction_files=[]
    )
}


def status_of(refusal: Refusal) -> int:
    from api.errors import status_of as edge_status_of

    return edge_status_of(refusal)


@pytest.fixture
def sq(sync_redis: redis.Redis, redis_prefix: str) -> SyncQueue:
    queue: SyncQueue = dispatching_queue(sync_redis, redis_prefix, W, OFFER)
    return queue


def ended(redis_prefix: str, end: Any) -> dict[str, Any]:
    """A durable call "b" waits behind "a"; `end(q, first)` ends it; its status then."""

    async def scenario(q: AsyncQueue) -> dict[str, Any]:
        first = await entering(q, W, "a", T0, {"key_id": GOOD, "queue_budget_ms": 60_000})
        waiting = await entering(
            q, W, "b", T0 + 1, {"key_id": REVOKED, "durable": True, "queue_budget_ms": 60_000}
        )
        assert waiting.status == "waiting"
        await end(q, first)
        status = await durable_status(
            q, request_id="rid-b", worker_id=W, entry_id="b", status_of=status_of, now_ms=T0 + 20
        )
        assert status is not None
        return status

    return run(scenario, redis_prefix)


def test_a_durable_call_whose_key_is_revoked_while_it_waits_reads_as_forbidden(
    sq: SyncQueue, redis_prefix: str
) -> None:
    async def revoke_then_free_the_slot(q: AsyncQueue, first: Any) -> None:
        sq.mark_keys_revoked(key_ids=[REVOKED])
        await q.release(worker_id=W, entry_id="a", ticket=first.ticket, slot_ceiling=8,
                        now_ms=T0 + 10)  # fmt: skip

    status = ended(redis_prefix, revoke_then_free_the_slot)
    assert status["state"] == "failed"
    assert librechat_durable_failure(status) == (403, "WORKER_UNAUTHORIZED")
    assert "revoked" in status["error"]["message"] and "not started" in status["error"]["message"]


def test_a_durable_call_taken_out_by_a_stopping_service_reads_as_worker_offline(
    sq: SyncQueue, redis_prefix: str
) -> None:
    async def stop(q: AsyncQueue, first: Any) -> None:
        await q.leave(worker_id=W, entry_id="b", slot_ceiling=8, code="SERVICE_SHUTTING_DOWN",
                      now_ms=T0 + 10)  # fmt: skip

    status = ended(redis_prefix, stop)
    assert status["state"] == "failed"
    assert librechat_durable_failure(status) == (503, "WORKER_OFFLINE")
    assert "not started" in status["error"]["message"]


@pytest.mark.parametrize("code", ["SERVICE_SHUTTING_DOWN", "UNAUTHENTICATED"])
def test_no_durable_ending_falls_to_librechats_catch_all(code: str) -> None:
    from admission.durable import STATUS_CODES, _failure

    answered = STATUS_CODES.get(_failure(code, W).code, _failure(code, W).code)
    assert librechat_durable_failure({"error": {"code": answered}}) != DURABLE_UNMAPPED
