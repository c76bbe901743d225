"""Small helpers for end-to-end admission tests: bodies, calls, timestamps written by commands."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from livesupport import wait_until  # noqa: F401  (re-exported for the tests here)

EXECUTE = "/v1/workspace-tools/execute"


def command(workspace: str, text: str, *, timeout_ms: int = 30_000, **extra: Any) -> dict[str, Any]:
    return {
        "protocolVersion": 1,
        "operation": "execute_command",
        "workspaceId": workspace,
        "command": text,
        "timeoutMs": timeout_ms,
        **extra,
    }


def read(workspace: str, path: str = "README.md", **extra: Any) -> dict[str, Any]:
    return {
        "protocolVersion": 1,
        "operation": "read_file",
        "workspaceId": workspace,
        "path": path,
        **extra,
    }


def stamped(log: Path, name: str, seconds: float) -> str:
    """A command that records when it really started and ended (ns), by its own clock."""
    return (
        f'echo "{name} start $(date +%s%N)" >> {log}; sleep {seconds}; '
        f'echo "{name} end $(date +%s%N)" >> {log}'
    )


def intervals(log: Path) -> dict[str, tuple[int, int]]:
    marks: dict[str, dict[str, int]] = {}
    for line in log.read_text().splitlines():
        name, what, ns = line.split()
        marks.setdefault(name, {})[what] = int(ns)
    return {name: (m["start"], m["end"]) for name, m in marks.items()}


def overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


class Caller:
    """Sends calls from their own threads (one HTTP connection each) and keeps the futures."""

    def __init__(self, base_url: str, headers: dict[str, str], workers: int = 64) -> None:
        self.base_url = base_url
        self.headers = headers
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.local = threading.local()

    def _client(self) -> httpx.Client:
        client = getattr(self.local, "client", None)
        if client is None:
            client = self.local.client = httpx.Client(
                base_url=self.base_url, timeout=httpx.Timeout(400.0, connect=5.0)
            )
        return client

    def send(
        self,
        body: dict[str, Any],
        *,
        wait_ms: int | None = None,
        headers: dict[str, str] | None = None,
        base_url: str | None = None,
    ) -> httpx.Response:
        h = dict(self.headers)
        if wait_ms is not None:
            h["X-LibreChat-Workspace-Queue-Wait-Ms"] = str(wait_ms)
        h.update(headers or {})
        if base_url is not None:
            with httpx.Client(
                base_url=base_url, timeout=httpx.Timeout(400.0, connect=5.0)
            ) as other:
                return other.post(EXECUTE, json=body, headers=h)
        return self._client().post(EXECUTE, json=body, headers=h)

    def submit(self, body: dict[str, Any], **kw: Any) -> Future[httpx.Response]:
        return self.pool.submit(self.send, body, **kw)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
