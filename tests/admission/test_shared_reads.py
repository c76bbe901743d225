"""Reads share a workspace: reads on one isolation key run together up to the slots; a write
waits for running reads and is not overtaken by later reads; lanes and the checkout keep their
hierarchy (admission/lua/_common.lua, conflicts and grant), on real Redis with fixed clocks."""

from __future__ import annotations

import redis
from queuekit import run
from test_fair_share import enter, entries, register, running, settle

from admission.queue import SHARED_OPERATIONS, AsyncQueue, SyncQueue

READ, WRITE = "read_file", "write_file"


def states(sq: SyncQueue) -> dict[str, str]:
    return {i: e["st"] for i, e in entries(sq).items()}


def test_reads_search_text_and_listings_are_the_shared_operations() -> None:
    assert {"read_file", "list_files", "search_text", "preview_edit"} == SHARED_OPERATIONS


def test_reads_on_one_workspace_run_together_up_to_the_slot_count(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    sq = register(sync_redis, redis_prefix, slots=3)

    async def scenario(q: AsyncQueue) -> list[str]:
        ops = ["search_text", "read_file", "list_files", "search_text"]
        return [(await enter(q, f"r{i}", "A", operation=op)).status for i, op in enumerate(ops)]

    assert run(scenario, redis_prefix) == ["granted", "granted", "granted", "waiting"]
    settle(sq, running(sq)[0])
    assert states(sq) == {"r1": "r", "r2": "r", "r3": "r"}


def test_a_write_waits_for_running_reads_and_later_reads_wait_behind_it(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    sq = register(sync_redis, redis_prefix, slots=4)

    async def scenario(q: AsyncQueue) -> list[str]:
        got = [(await enter(q, "r1", "A", operation=READ)).status]
        got.append((await enter(q, "r2", "B", operation=READ)).status)
        got.append((await enter(q, "w", "A", operation=WRITE)).status)
        # Slots are free and r3 conflicts with no running call, but the write came first.
        got.append((await enter(q, "r3", "A", operation=READ)).status)
        return got

    assert run(scenario, redis_prefix) == ["granted", "granted", "waiting", "waiting"]
    settle(sq, entries(sq)["r1"])
    assert states(sq) == {"r2": "r", "w": "w", "r3": "w"}
    settle(sq, entries(sq)["r2"])
    assert states(sq) == {"w": "r", "r3": "w"}
    settle(sq, entries(sq)["w"])
    assert states(sq) == {"r3": "r"}


def test_another_flows_later_read_does_not_overtake_a_write_at_the_head(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    sq = register(sync_redis, redis_prefix, slots=4)

    async def scenario(q: AsyncQueue) -> str:
        await enter(q, "r1", "A", operation=READ)
        await enter(q, "w", "A", operation=WRITE)
        return (await enter(q, "b", "B", operation=READ)).status

    # B is a new flow (its turn comes at once), yet its read lands after the waiting write.
    assert run(scenario, redis_prefix) == "waiting"
    settle(sq, entries(sq)["r1"])
    assert states(sq) == {"w": "r", "b": "w"}


def test_reads_on_lanes_and_their_checkout_share_but_writes_keep_the_hierarchy(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    sq = register(sync_redis, redis_prefix, slots=6)
    one, two, checkout = ("repo", "one"), ("repo", "two"), ("repo", "")

    async def scenario(q: AsyncQueue) -> list[str]:
        got = [(await enter(q, "r-one", "A", one, operation=READ)).status]
        got.append((await enter(q, "r-co", "A", checkout, operation=READ)).status)
        # A write on lane two runs beside reads on lane one, but not beside a checkout read.
        got.append((await enter(q, "w-two", "A", two, operation=WRITE)).status)
        got.append((await enter(q, "r-two", "A", two, operation=READ)).status)
        got.append((await enter(q, "r-one2", "A", one, operation=READ)).status)
        return got

    assert run(scenario, redis_prefix) == ["granted", "granted", "waiting", "waiting", "granted"]
    settle(sq, entries(sq)["r-co"])
    assert states(sq) == {"r-one": "r", "w-two": "r", "r-two": "w", "r-one2": "r"}

    async def checkout_write(q: AsyncQueue) -> list[str]:
        got = [(await enter(q, "w-co", "A", checkout, operation=WRITE)).status]
        got.append((await enter(q, "r-one3", "A", one, operation=READ)).status)
        return got

    # The checkout write waits for every running lane call, and a later lane read waits for it.
    assert run(checkout_write, redis_prefix) == ["waiting", "waiting"]
    for name in ("r-one", "r-one2", "w-two"):
        settle(sq, entries(sq)[name])
    assert states(sq)["r-two"] == "r" and states(sq)["w-co"] == "w"
    settle(sq, entries(sq)["r-two"])
    assert states(sq) == {"w-co": "r", "r-one3": "w"}
