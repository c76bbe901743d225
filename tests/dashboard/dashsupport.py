"""Helpers for the dashboard's end-to-end tests: calls from threads, queue peeks, landed rows."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import livesupport
import redis
from django.conf import settings

from admission.queue import SyncQueue

EXECUTE = "/v1/workspace-tools/execute"


def command(workspace: str, text: str, *, timeout_ms: int = 30_000) -> dict[str, Any]:
    return {
        "protocolVersion": 1,
        "operation": "execute_command",
        "workspaceId": workspace,
        "command": text,
        "timeoutMs": timeout_ms,
    }


def read(workspace: str, path: str = "README.md") -> dict[str, Any]:
    return {"protocolVersion": 1, "operation": "read_file", "workspaceId": workspace, "path": path}


def request_id(name: str) -> str:
    """A caller-chosen request id (16..128 of [A-Za-z0-9_-]) that names the call in its row."""
    return f"{name}-{uuid.uuid4().hex[:12]}"


class Calls:
    """Sends calls from their own threads, one HTTP client each, and keeps the futures."""

    def __init__(self, base_url: str, headers: dict[str, str]) -> None:
        self.base_url, self.headers = base_url, headers
        self.pool = ThreadPoolExecutor(max_workers=32)

    def send(self, body: dict[str, Any], *, rid: str, wait_ms: int | None = None) -> httpx.Response:
        headers = self.headers | {"X-LibreChat-Workspace-Request-Id": rid}
        if wait_ms is not None:
            headers["X-LibreChat-Workspace-Queue-Wait-Ms"] = str(wait_ms)
        with httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(60.0, connect=5.0)) as http:
            return http.post(EXECUTE, json=body, headers=headers)

    def submit(
        self, body: dict[str, Any], *, rid: str, wait_ms: int | None = None
    ) -> Future[httpx.Response]:
        return self.pool.submit(self.send, body, rid=rid, wait_ms=wait_ms)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def queue_entries(worker_id: str, prefix: str | None = None) -> list[dict[str, Any]]:
    """The worker's live queue entries (waiting and running), as the admission scripts keep them."""
    client = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
    try:
        _, entries, _ = SyncQueue(client, prefix or settings.REDIS_KEY_PREFIX).snapshot(worker_id)
    finally:
        client.close()
    return entries


def wait_until(
    predicate: Callable[[], Any], timeout_s: float = 15.0, interval_s: float = 0.05
) -> Any:
    return livesupport.wait_until(predicate, timeout_s=timeout_s, interval_s=interval_s)


def landed_rows(request_ids: Iterable[str], timeout_s: float = 15.0) -> dict[str, Any]:
    """Wait until every named call's completion row is in Postgres; {request id: row}."""
    from admission.models import CompletionLog

    wanted = set(request_ids)

    def rows() -> dict[str, Any] | None:
        found = {r.request_id: r for r in CompletionLog.objects.filter(request_id__in=wanted)}
        return found if set(found) == wanted else None

    return dict(wait_until(rows, timeout_s=timeout_s, interval_s=0.1))
