"""Many real concurrent callers (processes and connections) against one worker's queue."""

from __future__ import annotations

import asyncio
import multiprocessing
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

from admission.queue import AsyncQueue, SyncQueue

W = "busy"


def _burst(prefix: str, proc: int, calls: int, barrier: Any, out: Any) -> None:
    async def main() -> list[tuple[str, str, int | None]]:
        client = aioredis.Redis.from_url(
            settings.ADMISSION_REDIS_URL, decode_responses=True, max_connections=64
        )
        q = AsyncQueue(client, prefix)
        barrier.wait()

        async def one(i: int) -> tuple[str, str, int | None]:
            entry = f"p{proc}-{i}"
            result = await q.enter(
                worker_id=W,
                entry_id=entry,
                key=("shared", ""),
                queue_budget_ms=60_000,
                exec_budget_ms=60_000,
                queue_limit=32,
                slot_ceiling=8,
                operation="write_file",
            )
            return entry, result.status, result.ticket

        try:
            return list(await asyncio.gather(*(one(i) for i in range(calls))))
        finally:
            await client.aclose()

    out.put(asyncio.run(main()))


def test_200_concurrent_enters_from_4_processes_hold_exactly_32(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    sq = SyncQueue(sync_redis, redis_prefix)
    sq.register_incarnation(worker_id=W, incarnation="inc", slots=4, ttl_ms=60_000)
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_burst, args=(redis_prefix, p, 50, barrier, out)) for p in range(4)]
    for p in procs:
        p.start()
    results = [row for _ in procs for row in out.get(timeout=60)]
    for p in procs:
        p.join(timeout=10)
    statuses = [status for _, status, _ in results]
    assert statuses.count("granted") == 1
    assert statuses.count("waiting") == 31
    assert statuses.count("full") == 168
    _, entries, stats = sq.snapshot(W)
    assert len(entries) == 32 and stats["queue_full"] == "168"
    # Tickets are unique and the FIFO is ticket order.
    tickets = [t for _, status, t in results if status != "full"]
    assert sorted(tickets) == list(range(1, 33))
    assert [e["seq"] for e in entries] == list(range(1, 33))

    # Releasing one at a time hands the single key's turn to the next ticket, in order.
    granted_order = []
    for _ in range(32):
        running = [e for e in sq.snapshot(W)[1] if e["st"] == "r"]
        assert len(running) == 1
        granted_order.append(running[0]["seq"])
        assert sq.settle(
            worker_id=W,
            entry_id=running[0]["id"],
            incarnation="inc",
            ticket=running[0]["seq"],
            payload={},
        )
    assert granted_order == list(range(1, 33))
