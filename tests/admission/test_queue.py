"""The admission scripts against real Redis, with fixed clocks (no sleeping)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import pytest
import redis
from queuekit import run

from admission.queue import AsyncQueue, SyncQueue, worker_keys

W = "w1"
T0 = 1_000_000


@pytest.fixture
def sq(sync_redis: redis.Redis, redis_prefix: str) -> SyncQueue:
    queue = SyncQueue(sync_redis, redis_prefix)
    queue.register_incarnation(worker_id=W, incarnation="inc1", slots=2, ttl_ms=30_000)
    return queue


def enter(
    q: AsyncQueue, entry_id: str, key: tuple[str, str], now: int, **kw: Any
) -> Awaitable[Any]:
    args: dict[str, Any] = dict(
        worker_id=W,
        queue_budget_ms=10_000,
        exec_budget_ms=30_000,
        queue_limit=32,
        slot_ceiling=8,
        operation="execute_command",
    )
    args.update(kw)
    return q.enter(entry_id=entry_id, key=key, now_ms=now, **args)


def states(sq: SyncQueue) -> dict[str, tuple[str, int | None]]:
    _, entries, _ = sq.snapshot(W)
    return {e["id"]: (e["st"], e.get("slot")) for e in entries}


def test_calls_on_one_key_wait_and_start_in_arrival_order(sq: SyncQueue, redis_prefix: str) -> None:
    async def scenario(q: AsyncQueue) -> list[str]:
        first = await enter(q, "a", ("ws", ""), T0)
        assert first.status == "granted" and first.grant is not None and first.grant.slot == 0
        for i, name in enumerate("bcd"):
            assert (await enter(q, name, ("ws", ""), T0 + 1 + i)).status == "waiting"
        order = []
        ticket = first.ticket
        current = "a"
        for _ in range(3):
            assert sq.settle(
                worker_id=W,
                entry_id=current,
                incarnation="inc1",
                ticket=ticket,
                payload={"t": "result"},
                now_ms=T0 + 100,
            )
            granted = [e for e, (st, _) in states(sq).items() if st == "r"]
            assert len(granted) == 1
            current = granted[0]
            message = await q.wait(worker_id=W, entry_id=current, timeout_ms=100)
            assert message is not None and message["t"] == "grant" and message["slot"] == 0
            ticket = message["seq"]
            order.append(current)
        return order

    assert run(scenario, redis_prefix) == ["b", "c", "d"]


def test_free_keys_pass_calls_stuck_behind_a_busy_key(sq: SyncQueue, redis_prefix: str) -> None:
    async def scenario(q: AsyncQueue) -> None:
        assert (await enter(q, "a1", ("A", ""), T0)).status == "granted"
        assert (await enter(q, "a2", ("A", ""), T0 + 1)).status == "waiting"
        b = await enter(q, "b1", ("B", ""), T0 + 2)
        assert b.status == "granted" and b.grant is not None and b.grant.slot == 1

    run(scenario, redis_prefix)


def test_sibling_lanes_run_together_and_the_checkout_waits_for_both(
    sq: SyncQueue, redis_prefix: str
) -> None:
    sq.register_incarnation(worker_id=W, incarnation="inc2", slots=4, ttl_ms=30_000)

    async def scenario(q: AsyncQueue) -> None:
        assert (await enter(q, "l1", ("repo", "one"), T0)).status == "granted"
        assert (await enter(q, "l2", ("repo", "two"), T0 + 1)).status == "granted"
        assert (await enter(q, "co", ("repo", ""), T0 + 2)).status == "waiting"
        # A newer lane call may not overtake the waiting checkout, even on a free lane.
        assert (await enter(q, "l3", ("repo", "three"), T0 + 3)).status == "waiting"
        l1 = states(sq)
        assert l1["l1"] == ("r", 0) and l1["l2"] == ("r", 1)
        sq.settle(
            worker_id=W, entry_id="l1", incarnation="inc2", ticket=1, payload={}, now_ms=T0 + 10
        )
        assert states(sq)["co"][0] == "w"
        sq.settle(
            worker_id=W, entry_id="l2", incarnation="inc2", ticket=2, payload={}, now_ms=T0 + 11
        )
        after = states(sq)
        assert after["co"] == ("r", 0)
        assert after["l3"][0] == "w"

    run(scenario, redis_prefix)


def test_the_call_takes_the_lowest_free_slot(sq: SyncQueue, redis_prefix: str) -> None:
    sq.register_incarnation(worker_id=W, incarnation="inc2", slots=3, ttl_ms=30_000)

    async def scenario(q: AsyncQueue) -> None:
        for i, key in enumerate("ABC"):
            entered = await enter(q, key, (key, ""), T0 + i)
            assert entered.grant is not None and entered.grant.slot == i
        sq.settle(
            worker_id=W, entry_id="A", incarnation="inc2", ticket=1, payload={}, now_ms=T0 + 5
        )
        d = await enter(q, "D", ("D", ""), T0 + 6)
        assert d.grant is not None and d.grant.slot == 0

    run(scenario, redis_prefix)


def test_running_calls_count_toward_the_queue_limit(sq: SyncQueue, redis_prefix: str) -> None:
    async def scenario(q: AsyncQueue) -> None:
        assert (await enter(q, "r1", ("A", ""), T0, queue_limit=3)).status == "granted"
        assert (await enter(q, "r2", ("B", ""), T0, queue_limit=3)).status == "granted"
        assert (await enter(q, "w1", ("A", ""), T0, queue_limit=3)).status == "waiting"
        full = await enter(q, "x", ("C", ""), T0, queue_limit=3)
        assert full.status == "full" and full.held == 3

    run(scenario, redis_prefix)
    assert sq.snapshot(W)[2]["queue_full"] == "1"


def test_exec_deadline_starts_at_admission_not_arrival(sq: SyncQueue, redis_prefix: str) -> None:
    async def scenario(q: AsyncQueue) -> None:
        await enter(q, "long", ("A", ""), T0, exec_budget_ms=60_000)
        await enter(q, "read", ("A", ""), T0, queue_budget_ms=30_000, exec_budget_ms=30_000)
        sq.settle(
            worker_id=W,
            entry_id="long",
            incarnation="inc1",
            ticket=1,
            payload={},
            now_ms=T0 + 20_000,
        )
        grant = await q.wait(worker_id=W, entry_id="read", timeout_ms=100)
        assert grant is not None
        assert grant["ta"] == T0 + 20_000
        assert grant["dl"] == T0 + 20_000 + 30_000

    run(scenario, redis_prefix)


def test_expired_entries_free_their_place_when_the_next_call_enters(
    sq: SyncQueue, redis_prefix: str
) -> None:
    async def scenario(q: AsyncQueue) -> None:
        await enter(q, "running", ("A", ""), T0, exec_budget_ms=5_000, queue_limit=2)
        await enter(q, "waiting", ("A", ""), T0, queue_budget_ms=3_000, queue_limit=2)
        assert (await enter(q, "x", ("B", ""), T0 + 2_999, queue_limit=2)).status == "full"
        # The waiter's queue deadline passed, the runner's exec deadline not yet.
        late = await enter(q, "y", ("B", ""), T0 + 3_000, queue_limit=2)
        assert late.status == "granted"
        assert set(states(sq)) == {"running", "y"}
        # Past the runner's exec deadline its slot and place are free again.
        z = await enter(q, "z", ("A", ""), T0 + 5_000, queue_limit=2)
        assert z.status == "granted" and z.grant is not None and z.grant.slot == 0

    run(scenario, redis_prefix)


def test_leaving_unblocks_younger_calls_and_never_touches_a_running_call(
    sq: SyncQueue, redis_prefix: str
) -> None:
    sq.register_incarnation(worker_id=W, incarnation="inc2", slots=4, ttl_ms=30_000)

    async def scenario(q: AsyncQueue) -> None:
        await enter(q, "lane", ("repo", "one"), T0)
        await enter(q, "checkout", ("repo", ""), T0 + 1)
        await enter(q, "lane2", ("repo", "two"), T0 + 2)
        assert states(sq)["lane2"][0] == "w"
        assert (await q.leave(worker_id=W, entry_id="checkout", slot_ceiling=8, now_ms=T0 + 3))[
            0
        ] == "left"
        assert states(sq)["lane2"] == ("r", 1)
        status, grant = await q.leave(worker_id=W, entry_id="lane", slot_ceiling=8, now_ms=T0 + 4)
        assert status == "running" and grant is not None and grant.slot == 0
        assert "lane" in states(sq)
        assert (await q.leave(worker_id=W, entry_id="nope", slot_ceiling=8, now_ms=T0 + 4))[
            0
        ] == "gone"

    run(scenario, redis_prefix)


def test_a_release_with_a_stale_ticket_frees_nothing(sq: SyncQueue, redis_prefix: str) -> None:
    async def scenario(q: AsyncQueue) -> None:
        first = await enter(q, "a", ("A", ""), T0)
        assert not await q.release(
            worker_id=W, entry_id="a", ticket=first.ticket + 5, slot_ceiling=8, now_ms=T0
        )
        assert "a" in states(sq)
        assert await q.release(
            worker_id=W, entry_id="a", ticket=first.ticket, slot_ceiling=8, now_ms=T0
        )
        assert states(sq) == {}

    run(scenario, redis_prefix)


def test_settlements_with_a_wrong_fence_or_after_the_deadline_are_discarded_and_counted(
    sq: SyncQueue, redis_prefix: str
) -> None:
    async def scenario(q: AsyncQueue) -> None:
        await enter(q, "a", ("A", ""), T0, exec_budget_ms=1_000)

    run(scenario, redis_prefix)
    settle = dict(worker_id=W, entry_id="a", payload={"t": "result"})
    assert not sq.settle(incarnation="other", ticket=1, now_ms=T0 + 1, **settle)  # type: ignore[arg-type]
    assert not sq.settle(incarnation="inc1", ticket=2, now_ms=T0 + 1, **settle)  # type: ignore[arg-type]
    assert not sq.settle(incarnation="inc1", ticket=1, now_ms=T0 + 1_000, **settle)  # type: ignore[arg-type]
    assert sq.settle(incarnation="inc1", ticket=1, now_ms=T0 + 999, **settle)  # type: ignore[arg-type]
    assert not sq.settle(incarnation="inc1", ticket=1, now_ms=T0 + 999, **settle)  # type: ignore[arg-type]
    assert sq.snapshot(W)[2]["settle_discarded"] == "4"


def test_a_new_incarnation_tells_waiters_offline_and_runners_vanished(
    sq: SyncQueue, redis_prefix: str
) -> None:
    async def enter_two(q: AsyncQueue) -> None:
        await enter(q, "run", ("A", ""), T0)
        await enter(q, "wait", ("A", ""), T0)

    run(enter_two, redis_prefix)
    assert sq.register_incarnation(worker_id=W, incarnation="inc9", slots=2, ttl_ms=30_000) == (
        1,
        1,
    )

    async def messages(q: AsyncQueue) -> tuple[Any, Any]:
        return (
            await q.poll(worker_id=W, entry_id="run"),
            await q.poll(worker_id=W, entry_id="wait"),
        )

    assert run(messages, redis_prefix) == ({"t": "vanished"}, {"t": "offline"})
    assert states(sq) == {}


def test_an_unregistered_worker_is_offline_and_enter_leaves_no_key_behind(
    redis_prefix: str, sync_redis: redis.Redis
) -> None:
    async def scenario(q: AsyncQueue) -> str:
        return (await enter(q, "a", ("A", ""), T0)).status

    assert run(scenario, redis_prefix) == "offline"
    assert list(sync_redis.scan_iter(match=f"{redis_prefix}*")) == []


def test_every_queue_key_has_a_ttl(
    sq: SyncQueue, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    async def scenario(q: AsyncQueue) -> None:
        await enter(q, "a", ("A", ""), T0, exec_budget_ms=5_000)
        await enter(q, "b", ("A", ""), T0)
        await enter(q, "c", ("B", ""), T0, queue_limit=2)  # refused: bumps the stats counter

    run(scenario, redis_prefix)
    sq.settle(worker_id=W, entry_id="a", incarnation="inc1", ticket=1, payload={}, now_ms=T0 + 1)
    keys = list(sync_redis.scan_iter(match=f"{redis_prefix}*"))
    k = worker_keys(redis_prefix, W)
    assert {k.reg, k.queue, k.entries, k.stats, k.wake("a"), k.wake("b")} <= set(keys)
    for key in keys:
        assert sync_redis.pttl(key) > 0, key


def test_a_deregistered_worker_tells_everything_still_queued_offline(
    sq: SyncQueue, redis_prefix: str
) -> None:
    async def scenario(q: AsyncQueue) -> None:
        await enter(q, "a", ("A", ""), T0)
        await enter(q, "b", ("A", ""), T0)

    run(scenario, redis_prefix)
    assert sq.deregister(worker_id=W, incarnation="wrong") == -1
    assert sq.deregister(worker_id=W, incarnation="inc1") == 2

    async def after(q: AsyncQueue) -> tuple[Any, str]:
        return await q.poll(worker_id=W, entry_id="b"), (await enter(q, "c", ("A", ""), T0)).status

    assert run(after, redis_prefix) == ({"t": "offline"}, "offline")


def test_a_grant_nobody_takes_is_dropped_after_the_claim_window(
    sq: SyncQueue, redis_prefix: str
) -> None:
    async def scenario(q: AsyncQueue) -> None:
        await enter(q, "a", ("A", ""), T0)
        await enter(q, "dead", ("A", ""), T0 + 1)
        await enter(q, "alive", ("A", ""), T0 + 2)
        sq.settle(
            worker_id=W, entry_id="a", incarnation="inc1", ticket=1, payload={}, now_ms=T0 + 10
        )
        assert states(sq)["dead"][0] == "r"  # granted, but its waiter never pops the grant
        assert (await enter(q, "b", ("B", ""), T0 + 10 + 2_999)).status == "granted"
        assert "dead" in states(sq)
        await enter(q, "c", ("C", ""), T0 + 10 + 3_000)
        after = states(sq)
        assert "dead" not in after
        assert after["alive"][0] == "r"
        # A waiter that took its grant keeps its slot however long it runs.
        assert await q.wait(worker_id=W, entry_id="alive", timeout_ms=100) is not None
        await enter(q, "d", ("D", ""), T0 + 20_000)
        assert "alive" in states(sq)

    run(scenario, redis_prefix)
