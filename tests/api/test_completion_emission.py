"""A finished call's row is written exactly once: when its response is closed, or later by the
fallback timer, or by the flush of a process about to stop, whichever comes first. Real Redis."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis
from django.conf import settings

from admission.completion import CompletionDraft, stream_key
from admission.connections import async_queue
from api import workspace_tools as views


@pytest.fixture(autouse=True)
def own_stream(settings: Any) -> Any:
    # A stream of this test's own: no running API's drainer takes rows from it.
    settings.REDIS_KEY_PREFIX = f"{settings.REDIS_KEY_PREFIX}emit-{uuid.uuid4().hex[:6]}:"
    yield
    with redis.Redis.from_url(settings.ADMISSION_REDIS_URL) as client:
        client.delete(stream_key())


def rows_of(uid: str) -> int:
    with redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True) as client:
        entries: list[Any] = client.xrange(stream_key()) or []
    return sum(1 for _, fields in entries if fields.get("uid") == uid)


def finished_draft() -> CompletionDraft:
    draft = CompletionDraft(
        operation="read_file", outcome="completed", admission_outcome="admitted"
    )
    draft.answered(200)
    return draft


def test_an_emission_writes_its_row_once_however_often_it_is_triggered() -> None:
    draft = finished_draft()

    async def run() -> None:
        emission = views._Emission(draft, async_queue())
        emission()  # the response's close
        emission()  # the fallback timer, later
        await views.emissions_flush()

    asyncio.run(run())
    assert rows_of(draft.uid) == 1


def test_a_process_about_to_stop_writes_the_rows_not_written_yet() -> None:
    draft = finished_draft()

    async def run() -> None:
        emission = views._Emission(draft, async_queue())
        await views.emissions_flush()  # nobody closed the response, the timer has not fired
        emission()
        await views.emissions_flush()

    asyncio.run(run())
    assert rows_of(draft.uid) == 1
