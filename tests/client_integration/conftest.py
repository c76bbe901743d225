"""Fixtures for running sluice_client against a real Sluice: what each attempt sent and got
back (recorded below the client, at its HTTP transport), the worker's live queue in Redis, and
policy changes that every API process sees before the test goes on.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings
from livesupport import wait_until

from admission.models import AdmissionPolicy
from admission.policy import policy_update
from admission.queue import SyncQueue

REQUEST_ID_HEADER = "X-LibreChat-Workspace-Request-Id"
QUEUE_WAIT_HEADER = "X-LibreChat-Workspace-Queue-Wait-Ms"


@dataclass
class Attempt:
    """One HTTP request the client really sent, and the answer as the client read it."""

    request_id: str
    body: bytes
    queue_wait_header: str | None
    status: int | None = None  # None: no answer came (e.g. the attempt was aborted)
    chunks: list[bytes] = field(default_factory=list)

    @property
    def code(self) -> str | None:
        """The typed code (`rate_limited` for the rate limit's 429), None for a result."""
        try:
            payload = json.loads(b"".join(self.chunks))
        except ValueError:
            return "<not json>"
        if self.status == 200:
            return None
        if payload.get("error") == "rate_limited":
            return "rate_limited"
        return payload.get("code")


class Attempts:
    """Every attempt of every call through one recording transport, in the order sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.all: list[Attempt] = []

    def add(self, request: httpx.Request) -> Attempt:
        """Recorded as it is sent, so an attempt that never gets an answer still counts."""
        attempt = Attempt(
            request_id=request.headers.get(REQUEST_ID_HEADER, ""),
            body=request.content,
            queue_wait_header=request.headers.get(QUEUE_WAIT_HEADER),
        )
        with self._lock:
            self.all.append(attempt)
        return attempt

    def transport(self) -> RecordingTransport:
        """A real transport for the sync Client that records into this list."""
        return RecordingTransport(self)

    def async_transport(self) -> AsyncRecordingTransport:
        return AsyncRecordingTransport(self)

    def by_call(self) -> dict[str, list[Attempt]]:
        calls: dict[str, list[Attempt]] = {}
        with self._lock:
            for attempt in self.all:
                calls.setdefault(attempt.request_id, []).append(attempt)
        return calls


class _TeeStream(httpx.SyncByteStream):
    # Hands the body on chunk by chunk, so the client still reads (and limits) a stream.
    def __init__(self, inner: httpx.SyncByteStream, attempt: Attempt) -> None:
        self._inner, self._attempt = inner, attempt

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            self._attempt.chunks.append(chunk)
            yield chunk

    def close(self) -> None:
        self._inner.close()


class _AsyncTeeStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, attempt: Attempt) -> None:
        self._inner, self._attempt = inner, attempt

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._attempt.chunks.append(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class RecordingTransport(httpx.BaseTransport):
    """A real HTTP transport that also records each attempt (for the sync Client)."""

    def __init__(self, attempts: Attempts) -> None:
        self.attempts = attempts
        self._inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        attempt = self.attempts.add(request)
        response = self._inner.handle_request(request)
        attempt.status = response.status_code
        assert isinstance(response.stream, httpx.SyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_TeeStream(response.stream, attempt),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._inner.close()


class AsyncRecordingTransport(httpx.AsyncBaseTransport):
    """The same for the AsyncClient."""

    def __init__(self, attempts: Attempts) -> None:
        self.attempts = attempts
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        attempt = self.attempts.add(request)
        response = await self._inner.handle_async_request(request)
        attempt.status = response.status_code
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_AsyncTeeStream(response.stream, attempt),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


@pytest.fixture
def attempts() -> Attempts:
    return Attempts()


@pytest.fixture
def held() -> Callable[[str], list[dict[str, Any]]]:
    """The worker's live queue in Redis (waiting and running entries), in arrival order."""

    def entries(worker_id: str) -> list[dict[str, Any]]:
        client = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
        try:
            _, found, _ = SyncQueue(client, settings.REDIS_KEY_PREFIX).snapshot(worker_id)
        finally:
            client.close()
        return found

    return entries


@pytest.fixture
def apply_policy(transactional_db: None) -> Iterator[Callable[[dict[str, str]], None]]:
    """Change the admission policy; every API process has it from its next call (the save
    bumps the policy version).

    On teardown the row goes (the next reader recreates it from the environment; the delete
    bumps the version again), so the next test never meets this test's limits in an API's
    cache. Requesting transactional_db first makes this teardown run before the database flush.
    """
    changed = False

    def apply(changes: dict[str, str]) -> None:
        nonlocal changed
        policy_update(changes)
        changed = True

    yield apply
    if changed:
        AdmissionPolicy.objects.all().delete()


@pytest.fixture
def until() -> Callable[..., Any]:
    """`until(predicate, timeout_s)`: poll until true, or fail the test at the bound."""
    return wait_until
