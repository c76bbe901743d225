"""A waiting call cancelled (its client went away) in the same instant it is woken must still
be cancelled: otherwise it runs for nobody and its row says 200 (found as a flake of
`test_every_abandoned_post_leaves_exactly_one_completion_row`: the disconnect was seen and the
view cancelled 8 ms after it entered, during its wake-up subscription, and the call still ran).

On Python 3.11 `asyncio.wait_for` returns the awaited result when it is cancelled after that
result is ready, so the cancel is lost; `asyncio.timeout` re-raises it. The server's own code
therefore never calls `wait_for`.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER_PACKAGES = ("admission", "api", "config", "dashboard", "workspaces", "protocol", "client")


def test_a_waiter_cancelled_as_it_is_woken_stays_cancelled(redis_prefix: str) -> None:
    """`AsyncQueue.wait`, the wait of every queued call, on real Redis: its wake-up event is
    set and its task cancelled in one step of the loop (the event's task runs first)."""
    import redis.asyncio as aioredis
    from django.conf import settings

    from admission.queue import AsyncQueue

    async def race() -> str:
        client = aioredis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
        queue = AsyncQueue(client, redis_prefix)
        try:
            task = asyncio.create_task(
                queue.wait(worker_id="w1", entry_id="gone", timeout_ms=2_000)
            )
            channel = queue.keys("w1").wake_prefix
            # Until the waiter is blocked on its event (past its look at the list): asyncio's
            # Event keeps the futures of those waiting on it.
            deadline = asyncio.get_running_loop().time() + 10
            while True:
                ch = queue.waiters.channels.get(channel)
                events = list(ch.waiters.get("gone", ())) if ch else []
                if events and events[0]._waiters:
                    break
                assert asyncio.get_running_loop().time() < deadline, "the waiter never waited"
                await asyncio.sleep(0.005)
            events[0].set()
            task.cancel()
            try:
                answer = await task
            except asyncio.CancelledError:
                return "cancelled"
            # With asyncio.wait_for the cancel was lost: the wait went on to its timeout.
            return f"went on and returned {answer!r}"
        finally:
            await queue.waiters.close()
            await client.aclose()

    assert asyncio.run(race()) == "cancelled"


def test_no_server_module_uses_asyncio_wait_for() -> None:
    offenders = []
    for package in SERVER_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "tests" in path.relative_to(ROOT).parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr == "wait_for"
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "asyncio"
                ):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == [], "asyncio.wait_for can swallow a cancel; use asyncio.timeout"
