"""Operators' cancel, drain and resume in the admission scripts: real Redis, fixed clocks."""

from __future__ import annotations

import redis
import test_queue
from queuekit import run
from test_queue import T0, W, enter, states

from admission.queue import AsyncQueue, SyncQueue, worker_keys

# test_queue's worker: registered as inc1 with 2 slots.
sq = test_queue.sq


def settle(sq: SyncQueue, entry_id: str, ticket: int, now: int) -> bool:
    return sq.settle(
        worker_id=W,
        entry_id=entry_id,
        incarnation="inc1",
        ticket=ticket,
        payload={"t": "result"},
        now_ms=now,
    )


def test_a_drained_worker_grants_nothing_while_its_running_call_finishes(
    sq: SyncQueue, redis_prefix: str
) -> None:
    async def scenario(q: AsyncQueue) -> None:
        running = await enter(q, "running", ("a", ""), T0)
        assert running.status == "granted"
        assert sq.drain(worker_id=W, note={"by": "ops"})
        # A free slot and a free key: still it waits.
        assert (await enter(q, "new", ("b", ""), T0 + 1)).status == "waiting"
        # The running call settles normally; the slot it frees grants nothing either.
        assert settle(sq, "running", running.ticket, T0 + 2)
        assert states(sq) == {"new": ("w", None)}
        assert await q.poll(worker_id=W, entry_id="new") is None

    run(scenario, redis_prefix)


def test_a_resumed_worker_grants_its_queue_in_arrival_order(
    sq: SyncQueue, redis_prefix: str
) -> None:
    async def scenario(q: AsyncQueue) -> list[tuple[str, int]]:
        assert sq.drain(worker_id=W, note={"by": "ops"})
        for i, name in enumerate(["first", "second", "third"]):
            assert (await enter(q, name, (f"ws{i}", ""), T0 + i)).status == "waiting"
        assert sq.resume(worker_id=W, slot_ceiling=8, now_ms=T0 + 10) == (True, 2)
        grants = []
        for name in ["first", "second"]:
            message = await q.poll(worker_id=W, entry_id=name)
            assert message is not None and message["t"] == "grant"
            grants.append((name, int(message["slot"])))
        assert states(sq)["third"] == ("w", None)
        # Resumed, a worker grants as before: the next free slot goes to the third.
        assert settle(sq, "first", int(states_seq(sq, "first")), T0 + 11)
        assert states(sq)["third"] == ("r", 0)
        assert sq.resume(worker_id=W, slot_ceiling=8, now_ms=T0 + 12) == (False, 0)
        return grants

    assert run(scenario, redis_prefix) == [("first", 0), ("second", 1)]


def states_seq(sq: SyncQueue, entry_id: str) -> int:
    _, entries, _ = sq.snapshot(W)
    return next(int(e["seq"]) for e in entries if e["id"] == entry_id)


def test_an_operator_cancels_a_waiting_call_and_never_a_running_one(
    sq: SyncQueue, redis_prefix: str
) -> None:
    async def scenario(q: AsyncQueue) -> None:
        assert (await enter(q, "running", ("ws", ""), T0)).status == "granted"
        assert (await enter(q, "waiting", ("ws", ""), T0 + 1, durable=True)).status == "waiting"
        assert (
            sq.cancel_waiting(worker_id=W, entry_id="running", slot_ceiling=8, now_ms=T0 + 2)
            == "running"
        )
        assert (
            sq.cancel_waiting(worker_id=W, entry_id="waiting", slot_ceiling=8, now_ms=T0 + 2)
            == "cancelled"
        )
        assert states(sq) == {"running": ("r", 0)}
        # Its request is told an operator cancelled it, and so is its status (for its row).
        assert await q.poll(worker_id=W, entry_id="waiting") == {"t": "cancelled", "by": "operator"}
        status = await q.durable_status(worker_id=W, entry_id="waiting")
        assert status is not None and (status["state"], status["by"]) == ("cancelled", "operator")
        assert (
            sq.cancel_waiting(worker_id=W, entry_id="waiting", slot_ceiling=8, now_ms=T0 + 2)
            == "gone"
        )

    run(scenario, redis_prefix)


def test_a_drain_outlives_a_worker_restart_and_a_deregistered_worker_tells_its_queue_offline(
    sq: SyncQueue, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    async def scenario(q: AsyncQueue) -> None:
        assert sq.drain(worker_id=W, note={"by": "ops"})
        assert not sq.drain(worker_id=W, note={"by": "ops"})  # drained already
        assert sync_redis.pttl(worker_keys(redis_prefix, W).drain) == -1  # no expiry
        sq.register_incarnation(worker_id=W, incarnation="inc2", slots=2, ttl_ms=30_000)
        assert W in sq.drained([W, "another"]) and "another" not in sq.drained([W])
        assert (await enter(q, "waits", ("ws", ""), T0)).status == "waiting"
        # Deregistering while drained answers the queue as it always did: offline.
        assert sq.deregister(worker_id=W, incarnation="inc2") == 1
        assert await q.poll(worker_id=W, entry_id="waits") == {"t": "offline"}

    run(scenario, redis_prefix)
