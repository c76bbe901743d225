"""The grant is the dispatch: the scripts that grant push the call's envelope onto the worker's
Celery queue list themselves (real Redis, fixed clocks, no API process in the loop)."""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Any

import pytest
import redis
from queuekit import dispatching_queue, entering, run
from queuekit import pushed as queuekit_pushed

from admission.queue import AsyncQueue, SyncQueue, offer_tokens, worker_keys

W = "wd1"
T0 = 1_000_000
OFFER = {
    "ws": offer_tokens(
        operations=["execute_command", "read_file"],
        lanes=False,
        edit_features=frozenset(),
        instruction_files=[],
    )
}


@pytest.fixture
def sq(sync_redis: redis.Redis, redis_prefix: str) -> SyncQueue:
    queue: SyncQueue = dispatching_queue(sync_redis, redis_prefix, W, OFFER)
    return queue


def pushed(sync_redis: redis.Redis) -> list[str]:
    return queuekit_pushed(sync_redis, W)


def enter(q: AsyncQueue, entry_id: str, now: int, **kw: Any) -> Awaitable[Any]:
    return entering(q, W, entry_id, now, {"queue_budget_ms": 10_000}, **kw)


def test_enter_and_release_each_push_the_granted_envelope(
    sq: SyncQueue, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    async def scenario(q: AsyncQueue) -> tuple[Any, Any, bool]:
        first = await enter(q, "a", T0)
        second = await enter(q, "b", T0 + 1)
        released = await q.release(
            worker_id=W, entry_id="a", ticket=first.ticket, slot_ceiling=8, now_ms=T0 + 5
        )
        return first, second, released

    first, second, released = run(scenario, redis_prefix)
    assert first.status == "granted" and first.grant.dispatched
    assert second.status == "waiting"
    assert released
    # b's envelope went out in the same step that freed a's slot, and only once.
    assert pushed(sync_redis) == ["envelope-a", "envelope-b"]
    assert sq.grant_of(worker_id=W, entry_id="b") == {
        "ticket": second.ticket,
        "slot": 0,
        "incarnation": "inc1",
        "execDeadlineMs": T0 + 5 + 30_000,
    }
    # The envelope is gone from the entry's side: a second grant could not push it again.
    assert not sync_redis.hexists(worker_keys(redis_prefix, W).env, "b")


def test_a_settlement_grants_and_pushes_the_next_call(
    sq: SyncQueue, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    async def scenario(q: AsyncQueue) -> Any:
        first = await enter(q, "a", T0)
        await enter(q, "b", T0 + 1)
        return first

    first = run(scenario, redis_prefix)
    assert sq.settle(
        worker_id=W, entry_id="a", incarnation="inc1", ticket=first.ticket, payload={"ok": True},
        now_ms=T0 + 10,
    )  # fmt: skip
    assert pushed(sync_redis) == ["envelope-a", "envelope-b"]
    assert sq.grant_of(worker_id=W, entry_id="b") is not None


def test_expiry_of_a_running_entry_grants_and_pushes_the_next(
    sq: SyncQueue, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    async def scenario(q: AsyncQueue) -> Any:
        await enter(q, "a", T0, exec_budget_ms=1_000)
        await enter(q, "b", T0 + 1, queue_budget_ms=60_000)
        # Nobody released a (its API process died): the next script to run prunes it past its
        # exec deadline and grants b in the same step.
        return await enter(q, "c", T0 + 1_001, key=("other", ""))

    third = run(scenario, redis_prefix)
    assert pushed(sync_redis) == ["envelope-a", "envelope-b"]
    assert third.status == "waiting"  # one slot, now b's
    assert sq.grant_of(worker_id=W, entry_id="a") is None


def test_a_stale_incarnations_waiting_entry_is_refused_not_dispatched(
    sq: SyncQueue, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    k = worker_keys(redis_prefix, W)

    async def scenario(q: AsyncQueue) -> Any:
        first = await enter(q, "a", T0)
        await enter(q, "b", T0 + 1, durable=True)
        # The registration moved on under b (as if a replacement registered without the
        # sweep reaching b): b must never start on the new incarnation.
        sync_redis.hset(k.reg, "inc", "inc2")
        await q.release(
            worker_id=W, entry_id="a", ticket=first.ticket, slot_ceiling=8, now_ms=T0 + 5
        )
        return await q.poll(worker_id=W, entry_id="b")

    told = run(scenario, redis_prefix)
    assert told == {"t": "offline"}
    assert pushed(sync_redis) == ["envelope-a"]
    assert not sync_redis.hexists(k.entries, "b") and not sync_redis.hexists(k.env, "b")
    status = json.loads(sync_redis.get(k.status("b")) or "{}")
    assert status["state"] == "failed" and status["code"] == "WORKER_OFFLINE"


def test_a_withdrawn_offer_refuses_the_waiting_call_with_mismatch(
    sq: SyncQueue, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    async def scenario(q: AsyncQueue) -> Any:
        first = await enter(q, "a", T0)
        await enter(q, "b", T0 + 1)
        sq.register_incarnation(
            worker_id=W,
            incarnation="inc1",
            slots=1,
            ttl_ms=30_000,
            offer={"ws": offer_tokens(operations=["read_file"], lanes=False,
                                      edit_features=frozenset(), instruction_files=[])},
        )  # fmt: skip
        await q.release(
            worker_id=W, entry_id="a", ticket=first.ticket, slot_ceiling=8, now_ms=T0 + 5
        )
        return await q.poll(worker_id=W, entry_id="b")

    assert run(scenario, redis_prefix) == {"t": "mismatch"}
    assert pushed(sync_redis) == ["envelope-a"]


def test_a_durable_status_follows_the_call_and_outlives_it_ten_minutes(
    sq: SyncQueue, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    k = worker_keys(redis_prefix, W)

    seconds, micros = sync_redis.time()
    now = int(seconds) * 1000 + int(micros) // 1000

    async def scenario(q: AsyncQueue) -> tuple[Any, Any]:
        first = await enter(q, "a", now, durable=True)
        queued = await enter(q, "b", now + 1, durable=True)
        return first, queued

    first, _ = run(scenario, redis_prefix)
    assert json.loads(sync_redis.get(k.status("a")) or "{}")["state"] == "admitted"
    assert json.loads(sync_redis.get(k.status("b")) or "{}")["state"] == "queued"
    # Settled by Redis's own clock (a real settlement), so the TTL is measured on it too.
    assert sq.settle(
        worker_id=W, entry_id="a", incarnation="inc1", ticket=first.ticket, payload={"ok": True}
    )
    done = json.loads(sync_redis.get(k.status("a")) or "{}")
    assert done["state"] == "settled" and json.loads(done["payload"]) == {"ok": True}
    assert 10 * 60 * 1000 <= sync_redis.pttl(k.status("a")) <= 16 * 60 * 1000
    assert json.loads(sync_redis.get(k.status("b")) or "{}")["state"] == "admitted"


def test_a_settlement_taking_the_next_call_hands_its_envelope_to_the_settler_not_the_broker(
    sq: SyncQueue, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    k = worker_keys(redis_prefix, W)

    async def scenario(q: AsyncQueue) -> Any:
        first = await enter(q, "a", T0)
        await enter(q, "b", T0 + 1)
        await enter(q, "c", T0 + 2)
        return first

    first = run(scenario, redis_prefix)
    accepted, handed = sq.settle_taking_next(
        worker_id=W, entry_id="a", incarnation="inc1", ticket=first.ticket, payload={"ok": True},
        now_ms=T0 + 10,
    )  # fmt: skip
    # b is granted and dispatched in the same step, to the settler only: the broker never
    # sees it (so no second consumer can take it), and its envelope is gone from Redis.
    assert accepted and handed is not None
    assert (handed.message, handed.entry_id) == ("envelope-b", "b")
    assert pushed(sync_redis) == ["envelope-a"]
    assert not sync_redis.hexists(k.env, "b")
    # The facts handed along are those written to b's entry: the worker reads nothing more.
    assert (
        handed.grant
        == sq.grant_of(worker_id=W, entry_id="b")
        == {
            "ticket": first.ticket + 1,
            "slot": 0,
            "incarnation": "inc1",
            "execDeadlineMs": T0 + 10 + 30_000,
        }
    )
    # c still waits (one slot), and a second settlement of a hands nothing.
    assert sq.grant_of(worker_id=W, entry_id="c") is None
    assert sq.settle_taking_next(
        worker_id=W, entry_id="a", incarnation="inc1", ticket=first.ticket, payload={"ok": True},
        now_ms=T0 + 11,
    ) == (False, None)  # fmt: skip


def test_a_settlement_granting_two_calls_hands_one_and_pushes_the_other(
    sq: SyncQueue, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    sq.register_incarnation(worker_id=W, incarnation="inc1", slots=2, ttl_ms=30_000, offer=OFFER)

    async def scenario(q: AsyncQueue) -> Any:
        first = await enter(q, "a", T0)  # key ws
        await enter(q, "x", T0 + 1, key=("other", ""), exec_budget_ms=1_000)  # second slot
        await enter(q, "b", T0 + 2)  # waits behind a (same key)
        await enter(q, "c", T0 + 3, key=("third", ""))  # waits for a slot
        return first

    first = run(scenario, redis_prefix)
    assert pushed(sync_redis) == ["envelope-a", "envelope-x"]
    # Settled after x's exec deadline: the same step prunes x and frees a, so b and c both
    # start. The settler takes the first (b); c goes through the broker as usual.
    accepted, handed = sq.settle_taking_next(
        worker_id=W, entry_id="a", incarnation="inc1", ticket=first.ticket, payload={"ok": True},
        now_ms=T0 + 1_100,
    )  # fmt: skip
    assert accepted and handed is not None
    assert (handed.message, handed.entry_id) == ("envelope-b", "b")
    assert pushed(sync_redis) == ["envelope-a", "envelope-x", "envelope-c"]
    assert handed.grant == sq.grant_of(worker_id=W, entry_id="b")
    assert handed.grant is not None and handed.grant["slot"] == 0  # a's slot; x's (1) to c
    assert sq.grant_of(worker_id=W, entry_id="c") is not None


def test_without_taking_the_next_call_goes_to_the_broker(
    sq: SyncQueue, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    async def scenario(q: AsyncQueue) -> Any:
        first = await enter(q, "a", T0)
        await enter(q, "b", T0 + 1)
        return first

    first = run(scenario, redis_prefix)
    # A worker in its warm shutdown takes nothing more.
    assert sq.settle_taking_next(
        worker_id=W, entry_id="a", incarnation="inc1", ticket=first.ticket, payload={"ok": True},
        now_ms=T0 + 10, take_next=False,
    ) == (True, None)  # fmt: skip
    assert pushed(sync_redis) == ["envelope-a", "envelope-b"]
