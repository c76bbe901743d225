"""The wake-up reader on real Redis: many waiters, a constant number of connections."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

from admission import queue as queue_module
from admission.queue import AsyncQueue, SyncQueue

W = "w1"
WAITERS = 400


def connections_named(sync_redis: redis.Redis, name: str) -> int:
    return sum(1 for c in sync_redis.client_list() if c.get("name", "").startswith(name))


def run(
    coro_fn: Callable[[AsyncQueue, str], Awaitable[Any]], prefix: str, *, pool_max: int = 8
) -> Any:
    name = f"test-waiters-{uuid.uuid4().hex[:8]}"

    async def main() -> Any:
        pool = aioredis.BlockingConnectionPool.from_url(
            settings.ADMISSION_REDIS_URL,
            decode_responses=True,
            max_connections=pool_max,
            client_name=name,
            timeout=10,
        )
        client = aioredis.Redis(connection_pool=pool)
        queue = AsyncQueue(client, prefix)
        try:
            return await coro_fn(queue, name)
        finally:
            await queue.waiters.close()
            await client.aclose()

    return asyncio.run(main())


async def _enter(q: AsyncQueue, entry_id: str, workspace: str) -> str:
    entered = await q.enter(
        worker_id=W,
        entry_id=entry_id,
        key=(workspace, ""),
        queue_budget_ms=60_000,
        exec_budget_ms=60_000,
        queue_limit=10_000,
        slot_ceiling=1,
        operation="read_file",
    )
    return entered.status


async def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_many_waiters_hold_a_constant_number_of_connections(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    SyncQueue(sync_redis, redis_prefix).register_incarnation(
        worker_id=W, incarnation="inc", slots=1, ttl_ms=60_000
    )

    async def scenario(q: AsyncQueue, name: str) -> tuple[list[int], list[Any], float]:
        assert await _enter(q, "running", "busy") == "granted"
        counts: list[int] = []
        tasks: list[asyncio.Task[Any]] = []
        channel = q.keys(W).wake_prefix
        for batch in (10, WAITERS - 10):
            for i in range(len(tasks), len(tasks) + batch):
                assert await _enter(q, f"e{i}", "busy") == "waiting"
                tasks.append(
                    asyncio.create_task(q.wait(worker_id=W, entry_id=f"e{i}", timeout_ms=60_000))
                )
            # Every waiter is parked on the reader once its channel is subscribed.
            await _until(
                lambda: (
                    sum(len(v) for v in q.waiters.channels[channel].waiters.values()) == len(tasks)
                )
            )
            counts.append(connections_named(sync_redis, name))
        started = time.monotonic()
        for i in range(WAITERS):
            await q.leave(
                worker_id=W, entry_id=f"e{i}", slot_ceiling=1, message={"t": "cancelled", "i": i}
            )
        results = await asyncio.gather(*tasks)
        return counts, results, time.monotonic() - started

    counts, results, elapsed = run(scenario, redis_prefix)
    # 10 waiters or 400: the same connections (the command pool's, at most 8, and one
    # subscriber), where a blocking pop per waiter held 400.
    assert counts[0] == counts[1] <= 9, counts
    assert [r["i"] for r in results] == list(range(WAITERS))
    # Every waiter was woken by its push, not by a periodic look (those come every 5 s).
    assert elapsed < 4.0, elapsed


def test_a_push_made_before_the_wait_is_returned_at_once(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    SyncQueue(sync_redis, redis_prefix).register_incarnation(
        worker_id=W, incarnation="inc", slots=1, ttl_ms=60_000
    )

    async def scenario(q: AsyncQueue, _name: str) -> tuple[Any, float]:
        await _enter(q, "a", "k")
        await _enter(q, "b", "k")
        await q.leave(worker_id=W, entry_id="b", slot_ceiling=1, message={"t": "cancelled"})
        started = time.monotonic()
        message = await q.wait(worker_id=W, entry_id="b", timeout_ms=3_000)
        return message, time.monotonic() - started

    message, elapsed = run(scenario, redis_prefix)
    assert message == {"t": "cancelled"}
    assert elapsed < 1.0


def test_a_wait_times_out_with_none_and_a_cancelled_wait_leaves_no_waiter(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    async def scenario(q: AsyncQueue, _name: str) -> tuple[Any, float, int]:
        started = time.monotonic()
        message = await q.wait(worker_id=W, entry_id="nobody", timeout_ms=200)
        elapsed = time.monotonic() - started
        task = asyncio.create_task(q.wait(worker_id=W, entry_id="gone", timeout_ms=60_000))
        channel = q.keys(W).wake_prefix
        await _until(lambda: "gone" in q.waiters.channels[channel].waiters)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return message, elapsed, len(q.waiters.channels[channel].waiters)

    message, elapsed, left = run(scenario, redis_prefix)
    assert message is None
    assert 0.2 <= elapsed < 1.5
    assert left == 0


def test_a_push_during_a_reader_reconnect_still_wakes_its_waiter(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    SyncQueue(sync_redis, redis_prefix).register_incarnation(
        worker_id=W, incarnation="inc", slots=1, ttl_ms=60_000
    )

    async def scenario(q: AsyncQueue, name: str) -> tuple[Any, float]:
        await _enter(q, "a", "k")
        await _enter(q, "b", "k")
        task = asyncio.create_task(q.wait(worker_id=W, entry_id="b", timeout_ms=30_000))
        channel = q.keys(W).wake_prefix
        await _until(lambda: "b" in q.waiters.channels.get(channel, _Empty).waiters)
        # Cut the subscriber, then push while it is away: the announcement is lost, the
        # resubscription wakes the waiter to look at its list. (The waiter is registered
        # before the subscriber has connected and subscribed: on a loaded machine, later.)

        def subscribed() -> list[str]:
            return [
                c["id"]
                for c in sync_redis.client_list()
                if c.get("name") == f"{name}:wake"
                and int(c.get("sub", 0) or 0) + int(c.get("ssub", 0) or 0) > 0
            ]

        await _until(lambda: len(subscribed()) > 0)
        ours = subscribed()
        assert len(ours) == 1
        sync_redis.client_kill_filter(_id=ours[0])
        await q.leave(worker_id=W, entry_id="b", slot_ceiling=1, message={"t": "cancelled"})
        started = time.monotonic()
        message = await task
        return message, time.monotonic() - started

    message, elapsed = run(scenario, redis_prefix)
    assert message == {"t": "cancelled"}
    assert elapsed < 3.0  # well before the 5 s periodic look


class _Empty:
    waiters: dict[str, Any] = {}


def _announce(sync_redis: redis.Redis, q: AsyncQueue, entry_id: str, message: Any) -> None:
    """A push as the scripts make it (_common.lua push_wake): the list, then the announcement."""
    keys = q.keys(W)
    sync_redis.rpush(keys.wake(entry_id), json.dumps(message))
    try:
        sync_redis.execute_command("SPUBLISH", keys.wake_prefix, entry_id)
    except redis.ResponseError:  # Redis 6.2: plain pub/sub
        sync_redis.publish(keys.wake_prefix, entry_id)


def test_a_watch_held_from_before_sees_two_pushes_announced_before_its_first_look(
    sync_redis: redis.Redis, redis_prefix: str, monkeypatch: Any
) -> None:
    """A grant and a quick result can both be announced before the waiter looks: one clear
    then covers two pushes, and the second wait must still look (not wait for a periodic
    look, here an hour away)."""
    monkeypatch.setattr(queue_module, "SAFETY_LOOK_S", 3600.0)

    async def scenario(q: AsyncQueue, _name: str) -> list[Any]:
        async with (
            q.watching(worker_id=W, entry_id="b") as woken,
            q.watching(worker_id=W, entry_id="z") as last,
        ):
            last.clear()  # in case the subscription's confirmation woke it
            _announce(sync_redis, q, "b", {"t": "grant"})
            _announce(sync_redis, q, "b", {"t": "result"})
            _announce(sync_redis, q, "z", {"t": "marker"})
            # Announcements arrive in order: once z's is in, both of b's are.
            async with asyncio.timeout(10):
                await last.wait()
            assert woken.is_set()
            got = []
            async with asyncio.timeout(10):
                for _ in range(2):
                    got.append(
                        await q.wait(worker_id=W, entry_id="b", timeout_ms=60_000, woken=woken)
                    )
            return got

    assert run(scenario, redis_prefix) == [{"t": "grant"}, {"t": "result"}]


def test_a_watched_wait_looks_at_its_list_only_when_told_and_at_its_end(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    """Held from before the entry, a watch spares the look right after entering (a round trip
    per wait); a wait without one looks first, since a push may have come before it."""

    async def scenario(q: AsyncQueue, _name: str) -> tuple[int, int, Any]:
        looks = 0
        real_poll = q.poll

        async def counted(**kwargs: Any) -> Any:
            nonlocal looks
            looks += 1
            return await real_poll(**kwargs)

        q.poll = counted  # type: ignore[method-assign]
        # The reader's connection up first, on another worker's channel: a connection opening
        # subscribes every channel wanted then, and the watch asks for its own once more, so
        # the first channel is confirmed twice and the second confirmation (whenever it comes)
        # wakes its watches again. W's channel is then subscribed once, confirmed once.
        async with q.watching(worker_id="w-warm", entry_id="warm"):
            pass
        async with q.watching(worker_id=W, entry_id="quiet") as woken:
            woken.clear()  # the subscription's confirmation wakes every watch once
            assert await q.wait(worker_id=W, entry_id="quiet", timeout_ms=100, woken=woken) is None
            watched = looks
            looks = 0
            assert await q.wait(worker_id=W, entry_id="quiet", timeout_ms=100) is None
            unwatched = looks
            _announce(sync_redis, q, "quiet", {"t": "grant"})
            async with asyncio.timeout(10):
                message = await q.wait(
                    worker_id=W, entry_id="quiet", timeout_ms=60_000, woken=woken
                )
        return watched, unwatched, message

    watched, unwatched, message = run(scenario, redis_prefix)
    assert (watched, unwatched) == (1, 2)  # the last look at the deadline; plus the first
    assert message == {"t": "grant"}


def test_a_watched_wait_whose_time_ran_out_before_it_started_still_looks_once(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    """None means "nothing by a look made as the time ran out", however late the wait began."""

    async def scenario(q: AsyncQueue, _name: str) -> Any:
        async with q.watching(worker_id=W, entry_id="late") as woken:
            _announce(sync_redis, q, "late", {"t": "grant"})
            await _until(woken.is_set)  # the announcement is in
            woken.clear()  # as if a look had taken it and a second push went unannounced
            loop = asyncio.get_running_loop()
            real_time = loop.time
            reads = 0

            def late() -> float:
                # The deadline is reckoned from the first reading; by the next the loop has
                # fallen an hour behind (a swamped process).
                nonlocal reads
                reads += 1
                return real_time() + (0 if reads == 1 else 3600)

            loop.time = late  # type: ignore[method-assign]
            try:
                return await q.wait(worker_id=W, entry_id="late", timeout_ms=1, woken=woken)
            finally:
                loop.time = real_time  # type: ignore[method-assign]

    assert run(scenario, redis_prefix) == {"t": "grant"}
