"""The 10-minute rollup answers exactly what the completion log answers, late rows included.

Real Postgres; hand-made rows over a day and a bit; the rollup's clock is a parameter.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from admission.completion import CompletionDrainer
from admission.models import CompletionLog
from dashboard import history
from dashboard.models import DepthBucket, QueueDepthSample, SeriesBucket
from dashboard.rollup import Rollup, touched_buckets
from dashboard.window import ROLLUP_STEP, Window

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2030, 1, 7, 0, 0, tzinfo=UTC)
UNTIL = T0 + timedelta(hours=24, minutes=3, seconds=17)  # ragged at both ends of a 24 h window


def make_row(rng: random.Random, at: datetime, **fields: Any) -> CompletionLog:
    roll = rng.random()
    wait = rng.randrange(0, 3000)
    values: dict[str, Any] = {
        "uid": uuid.uuid4().hex,
        "request_id": uuid.uuid4().hex,
        "created_at": at,
        "tenant_hash": rng.choice(["t1", "t2"]) * 16,
        "principal_hash": rng.choice(["p1", "p2", "p3"]) * 16,
        "worker_id": rng.choice(["w1", "w2"]),
        "workspace_id": rng.choice(["a", "b", "c"]),
        "operation": rng.choice(["read_file", "execute_command"]),
        "http_status": 200,
        "outcome": "completed",
        "admission_outcome": "admitted",
        "fencing_ticket": 1,
        "slot_index": rng.randrange(2),
        "queue_wait_ms": wait,
        # Some runs cross one or more bucket boundaries.
        "exec_ms": rng.choice([5, 80, 2_000, 400_000]),
        "duration_ms": wait,
    }
    values["isolation_key_hash"] = (values["workspace_id"] + rng.choice("xy")) * 16
    if roll < 0.1:
        values |= {
            "http_status": 503,
            "code": "WORKSPACE_QUEUE_TIMEOUT",
            "admission_outcome": "queue_timeout",
            "slot_index": None,
            "exec_ms": None,
        }
    elif roll < 0.15:
        values |= {"http_status": 429, "code": "RATE_LIMITED", "admission_outcome": "rate_limited"}
        values |= {"fencing_ticket": None, "slot_index": None, "exec_ms": None, "queue_wait_ms": 0}
    elif roll < 0.2:
        values |= {"http_status": 409, "code": "EDIT_CONFLICT"}
    values.update(fields)
    return CompletionLog(**values)


def day_of_rows(seed: int = 16, count: int = 600) -> list[CompletionLog]:
    rng = random.Random(seed)
    span_s = (UNTIL - T0).total_seconds() + 3600
    rows = [
        make_row(rng, T0 - timedelta(hours=1) + timedelta(seconds=rng.random() * span_s))
        for _ in range(count)
    ]
    return CompletionLog.objects.bulk_create(rows)


def answers(window: Window) -> dict[str, Any]:
    return {
        "outcomes": history.outcomes(window),
        "waits": history.wait_percentiles(window),
        "runs": history.exec_percentiles(window),
        # Busy slots are seconds / bucket width: the rollup stores seconds, so allow rounding.
        "busy": [(t, round(v, 6)) for t, v in history.slot_usage(window)],
        "failures": history.failures(window),
        "callers": history.callers(window),
        "workspaces": history.top_contended(window, by_key=False),
        "keys": history.top_contended(window, by_key=True),
    }


def windows(raw: bool) -> list[Window]:
    since = UNTIL - timedelta(hours=24)
    return [Window(since, UNTIL, worker=w, raw=raw) for w in (None, "w1", "w2")]


def test_a_rolled_up_24h_window_answers_exactly_what_the_log_answers() -> None:
    day_of_rows()
    expected = [answers(w) for w in windows(raw=True)]
    assert Rollup().tick(now=UNTIL) > 0
    got = [answers(w) for w in windows(raw=False)]
    for w, e, g in zip(windows(raw=False), expected, got, strict=True):
        r0, r1 = w.rollup_range
        # The whole buckets came from the rollup; only the ragged ends from the log.
        assert r0 > w.since and r1 == datetime(2030, 1, 8, 0, 0, tzinfo=UTC)
        assert g == e
    assert SeriesBucket.objects.filter(worker_id="").exists()  # all workers' percentiles


def test_a_row_landed_late_or_twice_counts_once_once_its_buckets_are_recomputed() -> None:
    day_of_rows()
    rollup = Rollup()
    rollup.tick(now=UNTIL)
    rng = random.Random(7)
    late = CompletionLog.objects.bulk_create(
        [make_row(rng, T0 + timedelta(hours=5, minutes=m), exec_ms=500_000) for m in range(3)]
    )
    # Before anyone says so, the rollup does not know: a 24 h window would miss the rows.
    assert answers(windows(raw=False)[0]) != answers(windows(raw=True)[0])
    rollup.rows_landed(late)
    rollup.rows_landed(late)  # delivered twice
    assert rollup.tick(now=UNTIL + timedelta(seconds=5)) > 0
    for raw, rolled in zip(windows(raw=True), windows(raw=False), strict=True):
        assert answers(rolled) == answers(raw)


def test_an_open_bucket_waits_until_it_is_complete_and_reads_from_the_log_meanwhile() -> None:
    day_of_rows(count=50)
    rollup = Rollup()
    rollup.tick(now=UNTIL)
    rng = random.Random(3)
    fresh = CompletionLog.objects.bulk_create([make_row(rng, UNTIL - timedelta(seconds=30))])
    rollup.rows_landed(fresh)
    # Its bucket (00:00-00:10 of the next day) is still open: nothing is recomputed yet, and a
    # window reads that bucket from the log.
    assert rollup.tick(now=UNTIL + timedelta(seconds=5)) == 0
    w = Window(UNTIL + timedelta(seconds=5) - timedelta(hours=24), UNTIL + timedelta(seconds=5))
    raw = Window(w.since, w.until, raw=True)
    assert answers(w) == answers(raw)


def test_a_batch_touches_its_arrival_bucket_and_every_bucket_its_run_spans() -> None:
    rng = random.Random(1)
    at = T0 + timedelta(minutes=9)
    short = make_row(rng, at, worker_id="w1", queue_wait_ms=0, exec_ms=10)
    long = make_row(rng, at, worker_id="w2", queue_wait_ms=60_000, exec_ms=500_000)
    assert touched_buckets([short, long]) == {(T0, "w1"), (T0, "w2"), (T0 + ROLLUP_STEP, "w2")}


def test_the_drainer_tells_the_rollup_what_it_landed(settings: Any) -> None:
    import redis

    from admission.completion import CompletionDraft, _encode, stream_key

    settings.REDIS_KEY_PREFIX = f"{settings.REDIS_KEY_PREFIX}rollup-{uuid.uuid4().hex[:6]}:"
    client = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
    told: list[list[CompletionLog]] = []
    try:
        drainer = CompletionDrainer(client, on_landed=told.append, block_ms=2000)
        drainer.consumer = f"test-{uuid.uuid4().hex[:6]}"
        drainer.ensure_group()
        draft = CompletionDraft(
            worker_id="w1", operation="read_file", outcome="completed", admission_outcome="admitted"
        )
        draft.answered(200)
        client.xadd(stream_key(), dict(_encode(draft.row())))  # type: ignore[arg-type]
        assert drainer.drain_once() == 1
        assert [[r.uid for r in batch] for batch in told] == [[draft.uid]]
    finally:
        client.delete(stream_key())
        client.close()


def test_a_rolled_up_24h_queue_depth_chart_is_the_samples_chart() -> None:
    rng = random.Random(5)
    QueueDepthSample.objects.bulk_create(
        QueueDepthSample(
            at=T0 + timedelta(seconds=s), worker_id=w, waiting=rng.randrange(9), running=1
        )
        for s in range(0, int((UNTIL - T0).total_seconds()), 45)
        for w in ("w1", "w2")
    )
    expected = [history.queue_depth(w) for w in windows(raw=True)]
    Rollup().tick(now=UNTIL)
    assert [history.queue_depth(w) for w in windows(raw=False)] == expected
    # Every complete bucket of each worker: the one UNTIL falls in is still open.
    assert DepthBucket.objects.count() == 2 * 144
