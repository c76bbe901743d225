"""A client that goes away cancels its view, even when something inside the view drops the
first cancel (api/execute/body.py `cancelled`): redis-py sends each command through
`asyncio.wait_for`, which on Python 3.11 loses a cancel that lands with the command's result.
Found as the flake of `test_every_abandoned_post_leaves_exactly_one_completion_row`: its call
ran and answered 200 for a client long gone."""

from __future__ import annotations

import asyncio

from api.execute.body import cancelled as _cancelled


def test_a_view_that_drops_the_first_cancel_is_cancelled_again_and_never_goes_on() -> None:
    went_on: list[str] = []
    dropped: list[str] = []

    async def view() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            dropped.append("first cancel")  # as a library that swallowed it would
        await asyncio.sleep(1)  # the call's wait for its grant, say
        went_on.append("ran")
        return "200"

    async def scenario() -> asyncio.Task[str]:
        task = asyncio.create_task(view())
        await asyncio.sleep(0)
        await _cancelled(task)
        return task

    task = asyncio.run(scenario())
    assert dropped == ["first cancel"]
    assert task.cancelled() and went_on == []
