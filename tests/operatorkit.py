"""Calls entered straight into a worker's queue under the suite's own key prefix (what the
API's settings use), for tests of operators' actions: the commands and the dashboard."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

from admission.queue import AsyncQueue, SyncQueue
from workspaces.models import Tenant, Worker


def sync_queue() -> SyncQueue:
    client = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
    return SyncQueue(client, settings.REDIS_KEY_PREFIX)


def registered_worker(*, slots: int = 1, tenant: Tenant | None = None) -> Worker:
    tenant = tenant or Tenant.objects.create(name=f"acme-{uuid.uuid4().hex[:6]}")
    worker = Worker.objects.create(worker_id=f"ops-{uuid.uuid4().hex[:8]}", tenant=tenant)
    sync_queue().register_incarnation(
        worker_id=worker.worker_id, incarnation="inc1", slots=slots, ttl_ms=60_000
    )
    return worker


def forget_worker(worker: Worker) -> None:
    client = sync_queue().client
    keys = client.keys(f"{settings.REDIS_KEY_PREFIX}adm:{{w:{worker.worker_id}}}*")
    if keys:
        client.delete(*keys)


def enter_call(
    worker: Worker,
    entry_id: str,
    *,
    workspace: str = "ws",
    lane: str = "",
    key_id: int | None = None,
    request_id: str = "",
    scope: str = "",
) -> str:
    """One execute_command call enters the queue as the execute service enters it (its
    request id bound first, when it has one); returns "granted" or "waiting"."""

    async def main() -> str:
        client = aioredis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
        q = AsyncQueue(client, settings.REDIS_KEY_PREFIX)
        try:
            if request_id:
                assert await q.claim_request_id(
                    scope=scope,
                    request_id=request_id,
                    worker_id=worker.worker_id,
                    entry_id=entry_id,
                    ttl_ms=60_000,
                )
            args: dict[str, Any] = {"key_id": key_id} if key_id is not None else {}
            entered = await q.enter(
                worker_id=worker.worker_id,
                entry_id=entry_id,
                key=(workspace, lane),
                queue_budget_ms=60_000,
                exec_budget_ms=60_000,
                queue_limit=32,
                slot_ceiling=8,
                operation="execute_command",
                workspace_id=workspace,
                **args,
            )
            return entered.status
        finally:
            await client.aclose()

    return asyncio.run(main())
