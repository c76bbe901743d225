"""The API publishes assignments itself (workspaces/dispatch.py); this holds its message to the
one Celery and kombu write for the same task, on a real Redis, so an upgrade that changes
their format fails here rather than in a worker."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from django.conf import settings
from kombu.utils.json import loads as kombu_loads

from admission.connections import async_broker
from workspaces.dispatch import (
    assignment_dispatch,
    assignment_message,
    assignment_of_message,
    broker_queue_key,
    worker_queue_name,
)
from workspaces.tasks import run_assignment

ASSIGNMENT = {
    "assignmentId": "a" * 32,
    "workerId": "dispatch-w",
    "incarnation": "i" * 32,
    "ticket": 7,
    "slot": 1,
    "request": {"protocolVersion": 1, "operation": "read_file", "workspaceId": "r", "path": "x"},
    "execDeadlineMs": 1,
    "remainingMs": 1,
    "commandTimeoutMs": 1,
    "sig": "s" * 64,
}
# Differ by nature between two publishes of the same task.
VOLATILE_HEADERS = {"id", "root_id"}
VOLATILE_PROPERTIES = {"correlation_id", "delivery_tag", "reply_to"}
# Celery's publish adds these for AMQP brokers (a per-message TTL) and copies the argument
# summaries into the properties too; the Redis transport and the worker read neither.
AMQP_ONLY_PROPERTIES = {"expiration", "argsrepr", "kwargsrepr"}


@pytest.fixture
def broker() -> Any:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    key = broker_queue_key(worker_queue_name(str(ASSIGNMENT["workerId"])))
    client.delete(key)
    yield client, key
    client.delete(key)


def popped(client: redis.Redis, key: str) -> dict[str, Any]:
    raw = client.rpop(key)
    assert raw is not None
    message: dict[str, Any] = kombu_loads(raw)
    return message


def test_the_published_message_is_the_one_apply_async_writes(broker: Any) -> None:
    client, key = broker
    expires = datetime.fromtimestamp(time.time() + 60, tz=UTC)
    run_assignment.apply_async(
        args=[ASSIGNMENT],
        queue=worker_queue_name(str(ASSIGNMENT["workerId"])),
        expires=expires,
        argsrepr=f"(<assignment {ASSIGNMENT['assignmentId']}>,)",
        kwargsrepr="{}",
    )
    theirs = popped(client, key)

    async def publish() -> None:
        await assignment_dispatch(async_broker(), assignment=ASSIGNMENT, expires=expires)

    asyncio.run(publish())
    ours = popped(client, key)
    assert client.llen(key) == 0

    assert set(ours) == set(theirs)
    for field in ("content-type", "content-encoding"):
        assert ours[field] == theirs[field]
    assert ours["properties"]["body_encoding"] == theirs["properties"]["body_encoding"] == "base64"
    # The body the worker decodes: the same arguments, bit for bit.
    assert base64.b64decode(ours["body"]) == base64.b64decode(theirs["body"])
    assert json.loads(base64.b64decode(ours["body"]))[0] == [ASSIGNMENT]

    assert set(ours["headers"]) == set(theirs["headers"])
    for name, value in theirs["headers"].items():
        if name not in VOLATILE_HEADERS:
            assert ours["headers"][name] == value, name
    assert ours["headers"]["id"] == ours["headers"]["root_id"]
    assert ours["headers"]["expires"] == expires.isoformat()

    expected = set(theirs["properties"]) - AMQP_ONLY_PROPERTIES
    assert set(ours["properties"]) == expected
    for name in expected - VOLATILE_PROPERTIES:
        assert ours["properties"][name] == theirs["properties"][name], name
    assert ours["properties"]["correlation_id"] == ours["headers"]["id"]
    assert ours["properties"]["delivery_tag"] != theirs["properties"]["delivery_tag"]


def test_a_handed_over_message_reads_back_as_its_assignment_until_it_expires() -> None:
    # The settle script may hand a granted call's message to the settling worker thread
    # (a same-worker handoff); the thread reads it as Celery would have.
    later = datetime.fromtimestamp(time.time() + 60, tz=UTC)
    _, message = assignment_message(ASSIGNMENT, expires=later)
    assert assignment_of_message(message) == ASSIGNMENT
    # Past its expiry Celery drops a message unrun; so does the handoff.
    earlier = datetime.fromtimestamp(time.time() - 1, tz=UTC)
    assert assignment_of_message(assignment_message(ASSIGNMENT, expires=earlier)[1]) is None
    # Anything else is not an assignment.
    other = json.loads(message)
    other["headers"]["task"] = "some.other.task"
    assert assignment_of_message(json.dumps(other)) is None
    assert assignment_of_message("not json") is None
    assert assignment_of_message(json.dumps({"headers": {}})) is None
