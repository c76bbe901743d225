"""The completion drainer lands rows in batches, and a row it has read is never left to Redis.

Real Redis and Postgres; the drainer object is driven pass by pass (no thread), under a
consumer name of its own.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
import redis

from admission.completion import (
    CompletionDraft,
    CompletionDrainer,
    _decode,
    _encode,
    stream_key,
)
from admission.models import CompletionLog

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client(settings: Any) -> Any:
    # A stream of this test's own: the live API processes' drainers must not take its rows.
    settings.REDIS_KEY_PREFIX = f"{settings.REDIS_KEY_PREFIX}drain-{uuid.uuid4().hex[:6]}:"
    conn = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
    yield conn
    conn.delete(stream_key())
    conn.close()


def drainer(client: redis.Redis, **kwargs: Any) -> CompletionDrainer:
    made = CompletionDrainer(client, **kwargs)
    made.consumer = f"test-{uuid.uuid4().hex[:6]}"
    made.ensure_group()
    return made


def add_row(client: redis.Redis) -> str:
    draft = CompletionDraft(
        operation="read_file", outcome="completed", admission_outcome="admitted"
    )
    draft.answered(200)
    client.xadd(stream_key(), dict(_encode(draft.row())))  # type: ignore[arg-type]
    return draft.uid


def test_rows_arriving_within_the_linger_land_in_one_batch_and_leave_the_stream(
    client: redis.Redis,
) -> None:
    drain = drainer(client, linger_s=1.0, block_ms=2000)
    uids: list[str] = []

    def trickle() -> None:
        for _ in range(4):
            uids.append(add_row(client))
            time.sleep(0.1)

    feeder = threading.Thread(target=trickle)
    feeder.start()
    landed = drain.drain_once()
    feeder.join()
    assert landed == 4
    assert CompletionLog.objects.filter(uid__in=uids).count() == 4
    # Acknowledged and deleted: nothing of them is left for another drainer.
    left: list[Any] = client.xrange(stream_key()) or []
    assert left == [] or all(_decode(fields)["uid"] not in uids for _, fields in left)


def test_a_row_an_earlier_release_wrote_one_field_per_column_still_lands(
    client: redis.Redis,
) -> None:
    """Rows still in the stream after an upgrade: written one string field per column, ""
    for None (as API processes did before the row became one JSON field)."""
    old = CompletionDraft(operation="read_file", outcome="completed", admission_outcome="admitted")
    old.answered(200)
    row = old.row()
    assert row["exec_ms"] is None
    client.xadd(stream_key(), {k: "" if v is None else str(v) for k, v in row.items()})
    new = add_row(client)
    assert drainer(client, linger_s=0.0, block_ms=2000).drain_once() == 2
    landed = CompletionLog.objects.get(uid=old.uid)
    assert (landed.http_status, landed.exec_ms, landed.operation) == (200, None, "read_file")
    assert CompletionLog.objects.filter(uid=new).count() == 1


def test_a_full_batch_does_not_wait_for_the_linger(client: redis.Redis) -> None:
    drain = drainer(client, batch=3, linger_s=30.0, block_ms=2000)
    uids = [add_row(client) for _ in range(3)]
    started = time.monotonic()
    assert drain.drain_once() == 3
    assert time.monotonic() - started < 10.0  # far below the 30 s linger
    assert CompletionLog.objects.filter(uid__in=uids).count() == 3
