"""Builds the message that hands an admitted call to the Celery queue of the one worker that
must run it.

The message is Celery's own task message (protocol 2, built by Celery: `app.amqp.as_task_v2`)
in the envelope kombu's Redis transport keeps in a queue's list. The call enters its admission
queue with it, and whoever grants the call pushes it: the admission script itself, or the
waiting API process where the scripts cannot reach the broker (admission/queue.py says which).
The worker consumes its queue with Celery as usual.

Why not `apply_async`: it is synchronous, so the event loop would hand it to a thread, and
kombu builds a new Redis client for every message it publishes (docs/benchmarks.md, "Celery
publish"). tests/workspaces/test_dispatch_message.py holds the envelope to the one kombu
writes itself, so a Celery or kombu upgrade that changes it fails there first.
"""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from kombu import serialization
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads


def worker_queue_name(worker_id: str) -> str:
    return f"sluice.worker.{worker_id}"


def broker_queue_key(queue: str) -> str:
    """The Redis list that holds a Celery queue (kombu's key, under Celery's key prefix)."""
    return str(settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "")) + queue


def assignment_message(assignment: dict[str, Any], *, expires: datetime) -> tuple[str, str]:
    """(queue list key, message) carrying one assignment to its worker's run_assignment task."""
    from workspaces.tasks import run_assignment

    # The project's Celery app (config/celery.py), found the way shared tasks find it, so this
    # module needs nothing above it.
    app = run_assignment.app

    queue = worker_queue_name(str(assignment["workerId"]))
    task_id = str(uuid.uuid4())
    headers, properties, body, _ = app.amqp.as_task_v2(
        task_id,
        run_assignment.name,
        args=[assignment],
        kwargs={},
        expires=expires,
        ignore_result=True,
        # Celery logs a task's arguments when it fails; they hold file content and commands.
        argsrepr=f"(<assignment {assignment['assignmentId']}>,)",
        kwargsrepr="{}",
    )
    content_type, content_encoding, payload = serialization.dumps(body, serializer="json")
    raw = payload.encode(content_encoding) if isinstance(payload, str) else payload
    envelope = {
        "body": base64.b64encode(raw).decode("ascii"),
        "content-encoding": content_encoding,
        "content-type": content_type,
        "headers": headers,
        "properties": {
            **properties,
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return broker_queue_key(queue), kombu_dumps(envelope)


async def assignment_dispatch(
    broker: Any, *, assignment: dict[str, Any], expires: datetime
) -> None:
    """Publish one assignment. Pushed twice (a retry after a lost reply) it still runs once:
    the worker runs a ticket at most once."""
    key, message = assignment_message(assignment, expires=expires)
    await broker.lpush(key, message)


def assignment_of_message(message: str) -> dict[str, Any] | None:
    """The assignment a message built by assignment_message carries, or None when it is not
    one (another task, another encoding). The settling worker thread takes the message of the
    call its settlement granted from the settle script (a same-worker handoff) and runs it as
    Celery would have: past its `expires`, Celery drops a message unrun, and so does this."""
    from workspaces.tasks import run_assignment

    try:
        envelope = kombu_loads(message)
        headers = envelope["headers"]
        if headers.get("task") != run_assignment.name:
            return None
        if envelope.get("properties", {}).get("body_encoding") != "base64":
            return None
        args, _kwargs, _embed = kombu_loads(base64.b64decode(envelope["body"]))
        assignment = args[0]
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    expires = headers.get("expires")
    if expires and datetime.fromisoformat(str(expires)) <= datetime.now(tz=UTC):
        return None
    return assignment if isinstance(assignment, dict) else None
