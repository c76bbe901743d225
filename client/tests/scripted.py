"""Test helpers: a fake clock, a scripted HTTP layer, and typed Sluice answers.

The scripted transport is httpx.MockTransport: it replaces the network, not Sluice's rules,
which live in the client under test.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from sluice_client import AsyncClient, Client

BASE_URL = "http://sluice.test"
START_MS = 1_000_000

READ = {"protocolVersion": 1, "operation": "read_file", "workspaceId": "ws", "path": "a.txt"}
READ_RESULT = {
    "protocolVersion": 1,
    "operation": "read_file",
    "workspaceId": "ws",
    "path": "a.txt",
    "content": "hello",
    "startLine": 1,
    "endLine": 1,
    "truncated": False,
}
COMMAND = {
    "protocolVersion": 1,
    "operation": "execute_command",
    "workspaceId": "ws",
    "command": "true",
}
COMMAND_RESULT = {
    "protocolVersion": 1,
    "operation": "execute_command",
    "workspaceId": "ws",
    "exitCode": 0,
    "stdout": "",
    "stderr": "",
    "truncated": False,
    "timedOut": False,
}


class FakeTime:
    """A clock that only moves when told to; `sleep` moves it by the wait plus `overrun_ms`."""

    def __init__(self) -> None:
        self.now_ms = START_MS
        self.overrun_ms = 0
        self.slept_ms: list[int] = []
        self.wall_s = 1_700_000_000.0

    def clock(self) -> float:
        return self.now_ms / 1000

    def wall_clock(self) -> float:
        return self.wall_s

    def sleep(self, seconds: float) -> None:
        wait_ms = round(seconds * 1000)
        self.slept_ms.append(wait_ms)
        self.now_ms += wait_ms + self.overrun_ms

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)

    def elapsed_ms(self) -> int:
        return self.now_ms - START_MS


@dataclass
class Sent:
    request: httpx.Request
    at_ms: int

    @property
    def body(self) -> bytes:
        return self.request.content

    @property
    def headers(self) -> httpx.Headers:
        return self.request.headers

    @property
    def queue_wait_ms(self) -> int:
        return int(self.request.headers["X-LibreChat-Workspace-Queue-Wait-Ms"])

    @property
    def read_timeout_s(self) -> float:
        return float(self.request.extensions["timeout"]["read"])


Step = httpx.Response | Callable[[httpx.Request], httpx.Response] | Exception


@dataclass
class Script:
    """Answers requests in order; each step may first spend `takes_ms` of server time."""

    time: FakeTime
    steps: list[tuple[int, Step]] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)

    def then(self, step: Step, *, takes_ms: int = 0) -> Script:
        self.steps.append((takes_ms, step))
        return self

    def handler(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.sent.append(Sent(request, self.time.now_ms))
        if not self.steps:
            raise AssertionError(
                f"unexpected request #{len(self.sent)}: {request.method} {request.url}"
            )
        takes_ms, step = self.steps.pop(0)
        self.time.now_ms += takes_ms
        if isinstance(step, Exception):
            raise step
        if callable(step):
            return step(request)
        if isinstance(step.stream, httpx.ByteStream):
            # A fresh copy: one scripted answer may be served to the sync and async runs.
            return httpx.Response(step.status_code, headers=step.headers, content=step.read())
        return step

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handler)


def typed(
    status: int, code: str, *, retry_after: str | None = None, pad_to: int | None = None
) -> httpx.Response:
    payload: dict[str, Any] = {"error": f"{code} from the script", "code": code}
    body = json.dumps(payload, separators=(",", ":"))
    if pad_to is not None:  # pad inside the JSON so the body stays valid at any size
        payload["error"] += " " * (pad_to - len(body))
        body = json.dumps(payload, separators=(",", ":"))
        assert len(body) == pad_to
    headers = {"Content-Type": "application/json"}
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    return httpx.Response(status, content=body.encode(), headers=headers)


def queue_timeout(retry_after: str | None = None, **kwargs: Any) -> httpx.Response:
    return typed(503, "WORKSPACE_QUEUE_TIMEOUT", retry_after=retry_after, **kwargs)


def queue_full() -> httpx.Response:
    return typed(429, "WORKER_QUEUE_FULL")


def rate_limited(
    retry_after: str | None = None, *, body_seconds: Any = None, date: str | None = None
) -> httpx.Response:
    payload: dict[str, Any] = {"error": "rate_limited", "message": "Too many requests."}
    if body_seconds is not None:
        payload["retry_after_seconds"] = body_seconds
    headers = {}
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    if date is not None:
        headers["Date"] = date
    return httpx.Response(429, json=payload, headers=headers)


def ok(result: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.Response(200, json=READ_RESULT if result is None else result)


class BrokenStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body that stops halfway: the connection dropped mid-answer."""

    def __init__(self, first: bytes) -> None:
        self._first = first

    def __iter__(self) -> Iterator[bytes]:
        yield self._first
        raise httpx.RemoteProtocolError(
            "peer closed connection without sending complete message body"
        )

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._first
        raise httpx.RemoteProtocolError(
            "peer closed connection without sending complete message body"
        )


class Runner:
    """Runs one call through the sync or the async client against a script."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.time = FakeTime()
        self.script = Script(self.time)

    def client_options(self, **options: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "api_key": "test-key",
            "clock": self.time.clock,
            "wall_clock": self.time.wall_clock,
            "sleep": self.time.sleep if self.mode == "sync" else self.time.async_sleep,
        }
        base.update(options)
        return base

    def execute(
        self,
        request: dict[str, Any] | None = None,
        *,
        client: dict[str, Any] | None = None,
        **call: Any,
    ) -> dict[str, Any]:
        return self.run(
            lambda c: c.execute(READ if request is None else request, **call), **(client or {})
        )

    def run(self, action: Callable[[Any], Any], **client_options: Any) -> Any:
        options = self.client_options(**client_options)
        if self.mode == "sync":
            with Client(BASE_URL, transport=self.script.transport(), **options) as client:
                return action(client)

        async def main() -> Any:
            async with AsyncClient(
                BASE_URL, transport=self.script.transport(), **options
            ) as client:
                result = action(client)
                return await result if inspect.isawaitable(result) else result

        return asyncio.run(main())
