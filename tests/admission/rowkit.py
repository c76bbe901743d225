"""What the completion-row tests of durable and synchronous calls share
(test_durable_rows.py, test_sync_rows.py): one registered worker's workspace "ws", fixed
clocks, and the edge's status table for the endings they produce. Real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

from admission.completion import _decode, stream_key
from admission.queue import AsyncQueue, SyncQueue, offer_tokens
from admission.refusals import Refusal
from workspaces.signing import sign, signing_key_for_token

T0 = 1_000_000
WALL0 = 1_700_000_000_000
OFFER = {
    "ws": offer_tokens(
        operations=["execute_command"], lanes=False, edit_features=frozenset(), instruction_files=[]
    )
}
REQUEST = {
    "protocolVersion": 1,
    "operation": "execute_command",
    "workspaceId": "ws",
    "command": "true",
    "cwd": "",
    "timeoutMs": 1000,
    "maxOutputBytes": 262144,
}
RESULT = {
    "protocolVersion": 1,
    "operation": "execute_command",
    "workspaceId": "ws",
    "exitCode": 0,
    "stdout": "ok",
    "stderr": "",
    "timedOut": False,
    "truncated": False,
}
STATUSES = {"WORKSPACE_QUEUE_TIMEOUT": 503, "REQUEST_CANCELLED": 409, "ASSIGNMENT_EXPIRED": 504}


def status_of(refusal: Refusal) -> int:
    """The edge's table for the endings these tests produce (api/errors.py is a layer up)."""
    return STATUSES.get(refusal.code, 500)


def registered_worker(account: Any, sync_redis: redis.Redis, prefix: str) -> Any:
    """`account`'s worker registered as incarnation "inc1" with one slot, offering OFFER."""
    SyncQueue(sync_redis, prefix).register_incarnation(
        worker_id=account.worker_id, incarnation="inc1", slots=1, ttl_ms=60_000, offer=OFFER
    )
    return account


def run(prefix: str, scenario: Callable[..., Awaitable[Any]], clients: int = 1) -> Any:
    """`scenario(*queues)`, each queue on a client of its own (as separate processes are)."""

    async def main() -> Any:
        made = [
            aioredis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
            for _ in range(clients)
        ]
        try:
            return await scenario(*[AsyncQueue(c, prefix) for c in made])
        finally:
            for c in made:
                await c.aclose()

    return asyncio.run(main())


def settle(
    sync_redis: redis.Redis, prefix: str, account: Any, entry_id: str, ticket: int, now: int
) -> None:
    payload: dict[str, Any] = {"ok": True, "result": RESULT}
    key = signing_key_for_token(account.worker_token)
    payload["sig"] = sign(key, "settlement", {"entry": entry_id, "payload": dict(payload)})
    assert SyncQueue(sync_redis, prefix).settle(
        worker_id=account.worker_id,
        entry_id=entry_id,
        incarnation="inc1",
        ticket=ticket,
        payload=payload,
        now_ms=now,
    )


def rows(sync_redis: redis.Redis) -> dict[str, list[dict[str, str]]]:
    """Rows written to the completion stream, by request id."""
    found: dict[str, list[dict[str, str]]] = {}
    entries: Any = sync_redis.xrange(stream_key())
    for _id, fields in entries:
        # As strings ("" for None), as the assertions below read them.
        row = {k: "" if v is None else str(v) for k, v in _decode(fields).items()}
        found.setdefault(row["request_id"], []).append(row)
    return found
