"""A finished call's row is written exactly once: when its response is closed, or later by the
fallback timer, or by the flush of a process about to stop, whichever comes first. Real Redis."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis
import redis.asyncio
from django.conf import settings

from admission import completion
from admission.completion import CompletionDraft, completion_emit_many, metrics_key, stream_key
from admission.connections import async_queue
from admission.refusals import Refusal
from api.execute.context import Emission, Emissions


@pytest.fixture(autouse=True)
def own_stream(settings: Any) -> Any:
    # A stream of this test's own: no running API's drainer takes rows from it.
    settings.REDIS_KEY_PREFIX = f"{settings.REDIS_KEY_PREFIX}emit-{uuid.uuid4().hex[:6]}:"
    yield
    with redis.Redis.from_url(settings.ADMISSION_REDIS_URL) as client:
        client.delete(stream_key(), metrics_key())


def rows_of(uid: str) -> int:
    with redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True) as client:
        entries: list[Any] = client.xrange(stream_key()) or []
    return sum(1 for _, fields in entries if completion._decode(fields)["uid"] == uid)


def finished_draft() -> CompletionDraft:
    draft = CompletionDraft(
        operation="read_file", outcome="completed", admission_outcome="admitted"
    )
    draft.answered(200)
    return draft


def test_an_emission_writes_its_row_once_however_often_it_is_triggered() -> None:
    draft = finished_draft()

    async def run() -> None:
        emissions = Emissions()
        emission = Emission(draft, async_queue(), emissions)
        emission()  # the response's close
        emission()  # the fallback timer, later
        await emissions.flush()

    asyncio.run(run())
    assert rows_of(draft.uid) == 1


def test_a_process_about_to_stop_writes_the_rows_not_written_yet() -> None:
    draft = finished_draft()

    async def run() -> None:
        emissions = Emissions()
        emission = Emission(draft, async_queue(), emissions)
        await emissions.flush()  # nobody closed the response, the timer has not fired
        emission()
        await emissions.flush()

    asyncio.run(run())
    assert rows_of(draft.uid) == 1


def refused_draft(code: str = "WORKER_QUEUE_FULL") -> CompletionDraft:
    draft = CompletionDraft(operation="read_file", worker_id="w-emit", tenant_hash="t" * 32)
    draft.answered(429, Refusal(code, "refused"))
    return draft


def one_by_one(drafts: list[CompletionDraft]) -> dict[str, int]:
    """The counters the rows make when each is recorded by itself."""
    expected: dict[str, int] = {}
    for draft in drafts:
        single = completion._Counts()
        completion.metrics_record(single, draft.row())
        for name, amount in single.fields.items():
            expected[name] = expected.get(name, 0) + amount
    return expected


def counters() -> dict[str, int]:
    with redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True) as client:
        return {k: int(v) for k, v in client.hgetall(metrics_key()).items()}


def test_a_batch_counts_each_row_once_with_one_increment_per_counter(monkeypatch: Any) -> None:
    drafts = [refused_draft() for _ in range(5)] + [finished_draft() for _ in range(2)]
    increments: list[tuple[str, int]] = []
    real_pipeline = redis.asyncio.Redis.pipeline

    def recording_pipeline(self: Any, *args: Any, **kwargs: Any) -> Any:
        pipe = real_pipeline(self, *args, **kwargs)
        real_hincrby = pipe.hincrby

        def hincrby(key: str, name: str, amount: int) -> Any:
            increments.append((name, amount))
            return real_hincrby(key, name, amount)

        monkeypatch.setattr(pipe, "hincrby", hincrby)
        return pipe

    monkeypatch.setattr(redis.asyncio.Redis, "pipeline", recording_pipeline)

    async def run() -> None:
        await completion_emit_many(drafts, async_queue().client)

    asyncio.run(run())
    assert all(rows_of(d.uid) == 1 for d in drafts)
    names = [name for name, _ in increments]
    assert len(names) == len(set(names))  # one HINCRBY per counter, whatever the batch's size
    assert counters() == one_by_one(drafts)
    assert counters()["c||WORKER_QUEUE_FULL"] == 5


def test_counters_that_missed_the_hash_ride_along_with_the_next_batch_once() -> None:
    drafts = [refused_draft("RATE_LIMITED") for _ in range(2)]

    async def run() -> None:
        completion._unrecorded.hincrby("", "r||rate_limited", 3)  # 3 rows went to Postgres
        await completion_emit_many(drafts[:1], async_queue().client)
        await completion_emit_many(drafts[1:], async_queue().client)

    asyncio.run(run())
    assert counters()["r||rate_limited"] == 3 + 2
    assert completion._unrecorded.fields == {}


def test_rows_emitted_close_together_go_in_one_round_trip(monkeypatch: Any) -> None:
    """Rows gather for ROW_GATHER_S before one write (here an hour: none goes by itself), and a
    process about to stop writes what has gathered at once."""
    monkeypatch.setattr(completion, "ROW_GATHER_S", 3600.0)
    writes: list[int] = []
    real = completion.completion_emit_many

    async def counting(drafts: list[CompletionDraft], client: Any) -> None:
        writes.append(len(drafts))
        await real(drafts, client)

    monkeypatch.setattr(completion, "completion_emit_many", counting)
    drafts = [refused_draft() for _ in range(3)]

    async def run() -> None:
        for draft in drafts:
            completion.emit_row(draft)
        for _ in range(3):
            await asyncio.sleep(0)
        assert writes == []  # still gathering
        await Emissions().flush()

    asyncio.run(run())
    assert writes == [3]
    assert all(rows_of(d.uid) == 1 for d in drafts)


def test_a_gathered_row_is_written_by_itself_when_its_window_ends(monkeypatch: Any) -> None:
    draft = refused_draft()
    real = completion.completion_emit_many

    async def run() -> None:
        written = asyncio.Event()

        async def signalling(drafts: list[CompletionDraft], client: Any) -> None:
            await real(drafts, client)
            written.set()

        monkeypatch.setattr(completion, "completion_emit_many", signalling)
        completion.emit_row(draft)
        await asyncio.wait_for(written.wait(), timeout=10)  # nobody flushes: the timer does

    asyncio.run(run())
    assert rows_of(draft.uid) == 1


def test_a_rate_limited_call_is_labelled_with_its_worker_only_once_the_worker_was_found() -> None:
    """A rate limit refuses before the queue: the worker id is the caller's claim unless the
    lookup found it in the caller's tenant, and only then may it become a /metrics label."""
    claimed, found = refused_draft("RATE_LIMITED"), refused_draft("RATE_LIMITED")
    found.worker_found()
    assert "worker_confirmed" not in found.row()  # not a column
    assert completion.metrics_worker_label(claimed.row()) == ""
    label = completion.metrics_worker_label(found.row(), worker_confirmed=found.worker_confirmed)
    assert label == "w-emit"

    async def run() -> None:
        completion.emit_row(claimed)
        completion.emit_row(found)
        await completion.emitted_rows_flush()

    asyncio.run(run())
    assert counters()["r|w-emit|rate_limited"] == 1
    assert counters()["r||rate_limited"] == 1
