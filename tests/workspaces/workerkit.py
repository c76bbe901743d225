"""Shared by the worker end-to-end tests (test_worker_*.py): calls through HTTP, and a look at
the worker's admission state in Redis, read through the key builder the server itself uses.

The tests run real processes (uvicorn API servers, `manage.py runworker`); nothing here stands
in for a part of Sluice. It only reads what those processes left in Redis, or, where a test
plays a hostile or confused party (a duplicate Celery delivery, a hostile settlement), does
exactly what such a party with broker credentials could do.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import httpx
import redis
import redis.asyncio as aioredis
from django.conf import settings
from sluice_protocol import isolation_key, validate_request

from admission.queue import AsyncQueue, Grant, SyncQueue, worker_keys
from workspaces.dispatch import worker_queue_name
from workspaces.signing import sign, signing_key_for_token

EXECUTE = "/v1/workspace-tools/execute"


def request(operation: str, workspace: str = "repo", **fields: Any) -> dict[str, Any]:
    return {"protocolVersion": 1, "operation": operation, "workspaceId": workspace, **fields}


def call(
    http: httpx.Client, account: Any, body: Any, headers: dict[str, str] | None = None
) -> httpx.Response:
    """POST one call to the execute endpoint as `account`, naming its own worker."""
    sent = account.auth | {"X-LibreChat-Code-Worker-ID": account.worker_id} | (headers or {})
    return http.post(EXECUTE, headers=sent, json=body)


def admission_redis() -> redis.Redis:
    # An explicit socket timeout: redis-py 8 defaults to 5 s, shorter than some waits here.
    return redis.Redis.from_url(
        settings.ADMISSION_REDIS_URL, decode_responses=True, socket_timeout=30
    )


def ticket_counter(worker_id: str) -> int:
    """The worker's ticket counter: every call that entered its queue took one.

    A refusal that leaves it unmoved never reached the queue, so never reached the worker.
    """
    with admission_redis() as client:
        return int(client.hget(worker_keys(settings.REDIS_KEY_PREFIX, worker_id).reg, "seq") or 0)


def worker_stats(worker_id: str) -> dict[str, str]:
    with admission_redis() as client:
        return dict(client.hgetall(worker_keys(settings.REDIS_KEY_PREFIX, worker_id).stats))


def running_entry(worker_id: str, timeout_s: float = 10.0) -> tuple[str, dict[str, Any]]:
    """The one running entry of this worker's queue (id, entry), as soon as it is granted."""
    keys = worker_keys(settings.REDIS_KEY_PREFIX, worker_id)
    deadline = time.monotonic() + timeout_s
    with admission_redis() as client:
        while time.monotonic() < deadline:
            running = [
                (entry_id, json.loads(raw))
                for entry_id, raw in client.hgetall(keys.entries).items()
            ]
            running = [(i, e) for i, e in running if e.get("st") == "r"]
            if running:
                assert len(running) == 1, running
                return running[0]
            time.sleep(0.005)
    raise AssertionError(f"no running entry for worker {worker_id} within {timeout_s} s")


def settle(
    worker_id: str,
    entry_id: str,
    *,
    incarnation: str,
    ticket: int,
    payload: dict[str, Any],
    token: str,
) -> bool:
    """Settle an entry exactly as the worker holding `token` does (signed with its key)."""
    payload = dict(payload)
    payload["sig"] = sign(
        signing_key_for_token(token), "settlement", {"entry": entry_id, "payload": payload}
    )
    with admission_redis() as client:
        return SyncQueue(client, settings.REDIS_KEY_PREFIX).settle(
            worker_id=worker_id,
            entry_id=entry_id,
            incarnation=incarnation,
            ticket=ticket,
            payload=payload,
        )


def admit(
    worker_id: str, body: dict[str, Any], *, exec_budget_ms: int = 10_000
) -> tuple[str, Grant]:
    """Enter a call into the worker's real queue, as an API process does, and return its grant.

    The entry gets a genuine ticket under the worker's current incarnation, so an assignment
    built from it is one the worker must accept exactly once.
    """
    entry_id = uuid.uuid4().hex
    validated = validate_request(body)

    async def enter() -> Any:
        client = aioredis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
        try:
            return await AsyncQueue(client, settings.REDIS_KEY_PREFIX).enter(
                worker_id=worker_id,
                entry_id=entry_id,
                key=isolation_key(validated),
                queue_budget_ms=5_000,
                exec_budget_ms=exec_budget_ms,
                queue_limit=32,
                slot_ceiling=8,
                operation=str(validated["operation"]),
            )
        finally:
            await client.aclose()

    entered = asyncio.run(enter())
    assert entered.status == "granted" and entered.grant is not None, entered
    return entry_id, entered.grant


def release(worker_id: str, entry_id: str, ticket: int) -> bool:
    """Give up on an entry as the API does once its exec deadline passes (frees its key)."""

    async def go() -> bool:
        client = aioredis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
        try:
            queue = AsyncQueue(client, settings.REDIS_KEY_PREFIX)
            return await queue.release(
                worker_id=worker_id, entry_id=entry_id, ticket=ticket, slot_ceiling=8
            )
        finally:
            await client.aclose()

    return asyncio.run(go())


def assignment(
    worker_id: str,
    entry_id: str,
    grant: Grant,
    body: dict[str, Any],
    *,
    token: str,
    **overrides: Any,
) -> dict[str, Any]:
    """The message the API hands to Celery (admission/services.py `_assignment`), signed with
    the key of the worker holding `token` as the API signs it."""
    validated = validate_request(body)
    message = {
        "assignmentId": entry_id,
        "workerId": worker_id,
        "incarnation": grant.incarnation,
        "ticket": grant.ticket,
        "slot": grant.slot,
        "request": validated,
        "execDeadlineMs": grant.exec_deadline_ms,
        "remainingMs": grant.exec_deadline_ms - grant.admitted_ms,
        "commandTimeoutMs": validated.get("timeoutMs", 30_000),
    }
    message.update(overrides)
    message["sig"] = sign(signing_key_for_token(token), "assignment", message)
    return message


def publish(worker_id: str, message: dict[str, Any], *, task_id: str | None = None) -> None:
    """Put an assignment on the worker's own Celery queue, as dispatch does. No message expiry:
    the worker's own checks are what is under test. The same `task_id` twice is what a broker
    redelivery looks like."""
    from workspaces.tasks import run_assignment

    run_assignment.apply_async(args=[message], queue=worker_queue_name(worker_id), task_id=task_id)


def wait_for_settlement(worker_id: str, entry_id: str, timeout_s: float) -> dict[str, Any] | None:
    """What the worker pushed to this entry's wake list (its settlement), or None in time."""
    key = worker_keys(settings.REDIS_KEY_PREFIX, worker_id).wake(entry_id)
    with admission_redis() as client:
        popped = client.blpop([key], timeout=timeout_s)
    return None if popped is None else dict(json.loads(popped[1]))
