"""Fair share across flows: the grant order and the capacity share, as the admission scripts
decide them, on real Redis with fixed clocks (admission/lua/_common.lua: fair_tag, grant,
share_room)."""

from __future__ import annotations

import itertools
from typing import Any

import redis
from queuekit import run

from admission.queue import AsyncQueue, Entered, SyncQueue

W = "w1"
T0 = 1_000_000


def register(sync_redis: redis.Redis, prefix: str, slots: int) -> SyncQueue:
    queue = SyncQueue(sync_redis, prefix)
    # Registered for longer than any test here runs (the TTL is Redis's own, real time).
    queue.register_incarnation(worker_id=W, incarnation="inc1", slots=slots, ttl_ms=600_000)
    return queue


async def enter(
    q: AsyncQueue,
    entry_id: str,
    flow: str,
    key: tuple[str, str] = ("ws", ""),
    *,
    operation: str = "execute_command",
    **kw: Any,
) -> Entered:
    args: dict[str, Any] = dict(
        worker_id=W,
        queue_budget_ms=60_000,
        exec_budget_ms=60_000,
        queue_limit=32,
        slot_ceiling=8,
        operation=operation,
        flow=flow,
        flow_share_percent=50,
    )
    args.update(kw)
    return await q.enter(entry_id=entry_id, key=key, now_ms=T0, **args)


def entries(sq: SyncQueue) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in sq.snapshot(W)[1]}


def running(sq: SyncQueue) -> list[dict[str, Any]]:
    """Running entries, the earliest granted first."""
    return sorted((e for e in entries(sq).values() if e["st"] == "r"), key=lambda e: e["seq"])


def settle(sq: SyncQueue, entry: dict[str, Any], at_ms: int = T0 + 1) -> None:
    assert sq.settle(
        worker_id=W,
        entry_id=entry["id"],
        incarnation="inc1",
        ticket=entry["seq"],
        payload={"t": "result"},
        now_ms=at_ms,
    )


def drain(sq: SyncQueue) -> list[list[str]]:
    """Settle the earliest granted running call until the queue is empty: the ids each
    settlement granted, in ticket order."""
    steps = []
    left = running(sq)
    seen = {e["id"] for e in left}
    while left:
        settle(sq, left[0])
        left = running(sq)
        now = [e["id"] for e in left if e["id"] not in seen]
        seen.update(now)
        if now:
            steps.append(now)
    assert not entries(sq), "a call was left waiting with nothing running: it starved"
    return steps


def test_waiting_calls_of_two_flows_on_one_workspace_are_granted_in_turns(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    sq = register(sync_redis, redis_prefix, slots=1)

    async def scenario(q: AsyncQueue) -> None:
        assert (await enter(q, "a1", "A")).status == "granted"
        for name in ("a2", "a3", "a4", "a5"):
            assert (await enter(q, name, "A")).status == "waiting"
        for name in ("b1", "b2"):
            assert (await enter(q, name, "B")).status == "waiting"

    run(scenario, redis_prefix)
    # Arrival order would be a2 a3 a4 a5 b1 b2: the other flow's calls take every other turn.
    assert [ids for step in drain(sq) for ids in step] == ["a2", "b1", "a3", "b2", "a4", "a5"]


def test_a_read_behind_another_principals_twelve_commands_waits_for_one_of_them(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    sq = register(sync_redis, redis_prefix, slots=1)

    async def scenario(q: AsyncQueue) -> None:
        for i in range(12):
            await enter(q, f"cmd{i}", "A")
        await enter(q, "read", "B", operation="read_file")

    run(scenario, redis_prefix)
    order = [ids for step in drain(sq) for ids in step]
    # cmd0 runs; then cmd1 (at the read's own turn, entered earlier), then the read.
    assert order.index("read") == 1


def test_a_grant_that_passes_an_older_waiting_call_is_marked_out_of_order(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    sq = register(sync_redis, redis_prefix, slots=1)

    async def scenario(q: AsyncQueue) -> dict[str, int]:
        for name in ("a1", "a2", "a3"):
            await enter(q, name, "A")
        await enter(q, "b1", "B")
        marks = {}
        for _ in range(3):
            settle(sq, running(sq)[0])
            granted = running(sq)[0]["id"]
            message = await q.wait(worker_id=W, entry_id=granted, timeout_ms=100)
            assert message is not None and message["t"] == "grant"
            marks[granted] = message["oo"]
        return marks

    # b1 passed a3 (older, still waiting); a2 and a3 passed nobody.
    assert run(scenario, redis_prefix) == {"a2": 0, "b1": 1, "a3": 0}


def test_one_flow_alone_keeps_arrival_order_across_keys_and_within_each_key(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    sq = register(sync_redis, redis_prefix, slots=1)

    async def scenario(q: AsyncQueue) -> None:
        for i, key in enumerate("XYXXYX"):
            await enter(q, f"{key}{i}", "A", (key, ""))

    run(scenario, redis_prefix)
    assert [ids for step in drain(sq) for ids in step] == ["Y1", "X2", "X3", "Y4", "X5"]


def test_every_small_mix_of_two_flows_on_lanes_a_checkout_and_a_free_key_keeps_each_order(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    """Exhaustive over every arrival sequence of 4 calls (flow A on two sibling lanes and
    their checkout; flow B on one lane and another workspace), all entered before the first
    settlement, on two slots: nobody starves, each flow's calls on one key start in arrival
    order, and no lane call starts before an older checkout call of its flow, though free keys
    pass busy ones and the flows take turns."""
    keys = {"1": ("repo", "one"), "2": ("repo", "two"), "C": ("repo", ""), "X": ("ws", "")}
    kinds = [("A", "1"), ("A", "2"), ("A", "C"), ("B", "1"), ("B", "X")]
    combos = list(itertools.product(kinds, repeat=4))

    async def scenario(q: AsyncQueue) -> list[tuple[Any, list[str]]]:
        seen = []
        # One queue for all: each sequence leaves it empty for the next.
        sq = register(sync_redis, redis_prefix, slots=2)
        for combo in combos:
            for i, (flow, k) in enumerate(combo):
                await enter(q, f"{flow}{k}{i}", flow, keys[k])
            first = [e["id"] for e in running(sq)]
            seen.append((combo, first + [x for step in drain(sq) for x in step]))
        return seen

    for combo, order in run(scenario, redis_prefix):
        assert sorted(order) == sorted(f"{f}{k}{i}" for i, (f, k) in enumerate(combo))
        for f, k in kinds:
            own = [x for x in order if x.startswith(f + k)]
            assert own == sorted(own, key=lambda x: int(x[2:])), (combo, order)
        for checkout in (x for x in order if x[1] == "C"):
            for lane in (x for x in order if x[0] == checkout[0] and x[1] in "12"):
                if int(lane[2:]) > int(checkout[2:]):
                    assert order.index(lane) > order.index(checkout), (combo, order)


def test_no_flow_gets_three_turns_in_a_row_while_another_has_a_call_waiting(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    """Every sequence of 7 calls from flows A/B on one workspace, entered before the first
    settlement, one slot: each flow's calls start in arrival order, and the flows take turns
    by rounds (a flow may end one round and open the next, never more)."""
    combos = list(itertools.product("AB", repeat=7))

    async def scenario(q: AsyncQueue) -> list[tuple[Any, list[str]]]:
        seen = []
        sq = register(sync_redis, redis_prefix, slots=1)
        for combo in combos:
            for i, flow in enumerate(combo):
                await enter(q, f"{flow}{i}", flow)
            seen.append((combo, [x for step in drain(sq) for x in step]))
        return seen

    for combo, waited in run(scenario, redis_prefix):
        for f in "AB":
            own = [x for x in waited if x[0] == f]
            assert own == sorted(own, key=lambda x: int(x[1:])), (combo, waited)
        for i in range(2, len(waited)):
            if waited[i][0] == waited[i - 1][0] == waited[i - 2][0]:
                assert all(x[0] == waited[i][0] for x in waited[i:]), (combo, waited)


def test_alone_a_flow_may_fill_the_whole_queue(sync_redis: redis.Redis, redis_prefix: str) -> None:
    register(sync_redis, redis_prefix, slots=1)

    async def scenario(q: AsyncQueue) -> list[str]:
        return [(await enter(q, f"a{i}", "A", queue_limit=8)).status for i in range(9)]

    statuses = run(scenario, redis_prefix)
    assert statuses[:8] == ["granted"] + ["waiting"] * 7 and statuses[8] == "full"


def test_when_another_flow_arrives_the_flooding_one_keeps_only_its_share(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    sq = register(sync_redis, redis_prefix, slots=1)

    async def scenario(q: AsyncQueue) -> tuple[list[str], list[str], list[str]]:
        for i in range(8):
            await enter(q, f"a{i}", "A", queue_limit=8)
        b = await enter(q, "b0", "B", queue_limit=8)
        told = []
        for i in range(8):
            message = await q.poll(worker_id=W, entry_id=f"a{i}")
            if message is not None and message["t"] == "full":
                told.append(f"a{i}")
        again = [(await enter(q, "a8", "A", queue_limit=8)).status]
        more = [(await enter(q, f"b{i}", "B", queue_limit=8)).status for i in range(1, 5)]
        return [b.status, *again], told, more

    statuses, told, more = run(scenario, redis_prefix)
    # Half of 8: A keeps a0..a3 (a0 running), its four newest waiting calls are told "full"
    # (not started); A's next call is refused while B is in the queue; B too stops at 4.
    assert statuses == ["waiting", "full"]
    assert told == ["a4", "a5", "a6", "a7"]
    assert sorted(entries(sq)) == ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"]
    assert more == ["waiting", "waiting", "waiting", "full"]


def test_a_third_flow_takes_the_place_of_the_newest_call_of_the_biggest_holder(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    sq = register(sync_redis, redis_prefix, slots=1)

    async def scenario(q: AsyncQueue) -> str:
        for i in range(4):
            await enter(q, f"a{i}", "A", queue_limit=8)
        for i in range(4):
            await enter(q, f"b{i}", "B", queue_limit=8)
        return (await enter(q, "c0", "C", queue_limit=8)).status

    # A and B each hold their share (4 of 8) and the queue is full: C is still admitted.
    assert run(scenario, redis_prefix) == "waiting"
    held = sorted(entries(sq))
    assert "c0" in held and len(held) == 8 and "b3" not in held


def test_a_share_of_100_percent_lets_one_flow_keep_a_full_queue(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    register(sync_redis, redis_prefix, slots=1)

    async def scenario(q: AsyncQueue) -> str:
        for i in range(4):
            await enter(q, f"a{i}", "A", queue_limit=4, flow_share_percent=100)
        return (await enter(q, "b0", "B", queue_limit=4, flow_share_percent=100)).status

    assert run(scenario, redis_prefix) == "full"
