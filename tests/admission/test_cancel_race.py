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


def test_a_bounded_wait_cancelled_as_it_is_woken_stays_cancelled() -> None:
    """The pattern admission uses for every bounded wait (queue.wait, the wake-up reader)."""

    async def bounded(event: asyncio.Event) -> bool:
        async with asyncio.timeout(5):
            return await event.wait()

    async def race() -> str:
        event = asyncio.Event()
        task = asyncio.create_task(bounded(event))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        # Woken and cancelled in one step of the loop: the wake-up's task runs first.
        event.set()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "returned"

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
