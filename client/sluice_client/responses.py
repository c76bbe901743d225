"""What an answer from Sluice means: a result, a typed rejection, or an unknown outcome.

Pure functions over bytes and headers, shared by the sync and async clients. The rule they
enforce: only a complete JSON body (at most 4096 bytes) whose status and code name a
pre-enqueue rejection proves the operation was not started. Anything else that arrives after
the request went out (HTML from a proxy, a cut-off body, a 504, an unknown code) leaves the
outcome unknown.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Literal

from sluice_client.errors import MAX_ERROR_BODY_BYTES, WorkspaceToolError, may_have_run_message

# A result carries file content or command output (each up to 1 MiB, JSON-escaped); anything
# far beyond that is not a result this protocol can produce.
MAX_RESULT_BODY_BYTES = 64 * 1024 * 1024

MIN_WAIT_MS = 100
MAX_WAIT_MS = 30_000
DEFAULT_WAIT_MS = 1_000

RetryKind = Literal["queue", "queue_full", "rate"]

# (status, code) pairs the contract answers before anything is enqueued. A code arriving with
# another status is not trusted: a mismatch suggests something other than Sluice answered.
_NOT_STARTED: dict[tuple[int, str], RetryKind | None] = {
    (503, "WORKSPACE_QUEUE_TIMEOUT"): "queue",
    (429, "WORKER_QUEUE_FULL"): "queue_full",
    (503, "WORKER_OFFLINE"): None,
    (503, "NO_WORKER_SELECTED"): None,
    (503, "SERVICE_SHUTTING_DOWN"): None,
    (503, "COMMAND_UNAVAILABLE"): None,
    (503, "EDIT_NOT_STARTED"): None,
    (401, "UNAUTHENTICATED"): None,
    (403, "WORKER_UNAUTHORIZED"): None,
    (404, "WORKER_NOT_FOUND"): None,
    (409, "WORKER_MISMATCH"): None,
    (409, "WORKSPACE_QUARANTINED"): None,
    (409, "REQUEST_CANCELLED"): None,
}
# Rejections of the request itself: also not started, but resending the same bytes is futile.
_INVALID: frozenset[tuple[int, str]] = frozenset(
    {
        (400, "INVALID_WORKSPACE_TOOL_REQUEST"),
        (400, "INVALID_WORKSPACE_QUEUE_WAIT"),
        (400, "INVALID_WORKER_ID"),
        (400, "INVALID_REQUEST_ID"),
        (400, "INVALID_REQUEST"),
        (413, "REQUEST_TOO_LARGE"),
        (415, "UNSUPPORTED_MEDIA_TYPE"),
    }
)
_DELAY_SECONDS = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class RawResponse:
    """An answer as read off the wire: the body is already cut to its read limit."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    truncated: bool


@dataclass(frozen=True)
class Rejection:
    """A typed "not started" answer. `kind` is None when it must not be retried."""

    status: int
    code: str
    kind: RetryKind | None
    hint_ms: int | None
    body: bytes


def read_limit(status: int) -> int:
    """How many body bytes to read: one past the error limit, so an overlong body shows.

    A 202 is a durable request's status, which carries the result once it is completed.
    """
    return MAX_RESULT_BODY_BYTES + 1 if status in (200, 202) else MAX_ERROR_BODY_BYTES + 1


class BodyBuffer:
    """Collects streamed chunks up to a limit; both clients feed it the same way."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        self.cut_off = False  # set by the caller when the stream broke before its end

    def feed(self, chunk: bytes) -> bool:
        """Add a chunk; False means the limit is reached and reading should stop."""
        self._chunks.append(chunk)
        self._size += len(chunk)
        return self._size < self._limit

    def response(self, status: int, headers: Mapping[str, str]) -> RawResponse:
        body = b"".join(self._chunks)
        cap = self._limit - 1
        truncated = self.cut_off or len(body) > cap
        return RawResponse(status=status, headers=headers, body=body[:cap], truncated=truncated)


def clamp_wait_ms(hint_ms: int | None) -> int:
    if hint_ms is None:
        return DEFAULT_WAIT_MS
    return max(MIN_WAIT_MS, min(MAX_WAIT_MS, hint_ms))


def parse_retry_after(value: str | None, *, now_s: float) -> int | None:
    """`Retry-After` as ms: delay-seconds or an HTTP-date; None when absent or unusable.

    `now_s` is the reference for a date: the response's own `Date` header when it has one,
    which cancels out any skew between the client's clock and the server's.
    """
    if value is None:
        return None
    value = value.strip()
    if _DELAY_SECONDS.fullmatch(value):
        return int(value) * 1000
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a naive one is read as such.
        return None
    return max(0, math.ceil((when.timestamp() - now_s) * 1000))


def _date_header_s(headers: Mapping[str, str], wall_now_s: float) -> float:
    try:
        date = parsedate_to_datetime(headers.get("date", ""))
    except (TypeError, ValueError, IndexError):
        return wall_now_s
    return date.timestamp() if date.tzinfo is not None else wall_now_s


def _body_retry_after_ms(payload: Mapping[str, Any]) -> int | None:
    seconds = payload.get("retry_after_seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return math.ceil(seconds * 1000)


def json_object(response: RawResponse) -> dict[str, Any] | None:
    """The body as a JSON object; None when it is cut off, not JSON, or not an object."""
    if response.truncated:
        return None
    try:
        payload = json.loads(response.body)
    except (ValueError, UnicodeDecodeError):
        return None
    return payload if isinstance(payload, dict) else None


def classify(
    response: RawResponse, *, wall_now_s: float, request_id: str | None
) -> dict[str, Any] | Rejection | WorkspaceToolError:
    """Turn an answer into a result (unvalidated), a typed rejection, or a final error."""
    payload = json_object(response)
    status = response.status
    if status == 200:
        if payload is None:
            return _unknown(
                response, "Sluice answered 200 with a body that is not a JSON object", request_id
            )
        return payload
    code = payload.get("code") if payload is not None else None
    code = code if isinstance(code, str) else None
    if payload is not None and status == 429 and payload.get("error") == "rate_limited":
        reference_s = _date_header_s(response.headers, wall_now_s)
        hint = parse_retry_after(response.headers.get("retry-after"), now_s=reference_s)
        if hint is None:
            hint = _body_retry_after_ms(payload)
        return Rejection(status, "rate_limited", "rate", hint, response.body)
    if code is not None and (status, code) in _NOT_STARTED:
        reference_s = _date_header_s(response.headers, wall_now_s)
        hint = parse_retry_after(response.headers.get("retry-after"), now_s=reference_s)
        return Rejection(status, code, _NOT_STARTED[(status, code)], hint, response.body)
    if code is not None and (status, code) in _INVALID:
        error = payload.get("error") if payload is not None else None
        return WorkspaceToolError(
            f"Sluice refused the request as invalid ({code}, HTTP {status}): {error}",
            reason="invalid",
            not_started=True,
            status=status,
            code=code,
            body=response.body,
            request_id=request_id,
        )
    if status == 504:
        what = f"Sluice gave up waiting for the worker ({code or 'HTTP 504'})"
        return _unknown(response, what, request_id, reason="timeout", code=code)
    what = f"Sluice answered HTTP {status}" + (f" with {code}" if code else "")
    if payload is None:
        what += " and a body that is not complete JSON" if response.body else " and no body"
    return _unknown(response, what, request_id, code=code)


def _unknown(
    response: RawResponse,
    what: str,
    request_id: str | None,
    *,
    reason: Literal["timeout", "failed"] = "failed",
    code: str | None = None,
) -> WorkspaceToolError:
    return WorkspaceToolError(
        may_have_run_message(what),
        reason=reason,
        not_started=False,
        status=response.status,
        code=code,
        body=response.body,
        truncated=response.truncated,
        request_id=request_id,
    )


def cancel_state(response: RawResponse, *, request_id: str) -> str | WorkspaceToolError:
    """The answer to DELETE .../requests/<id>: "cancelled", "running" or "finished"."""
    payload = json_object(response)
    state = payload.get("state") if payload is not None else None
    if response.status == 200 and state in ("cancelled", "running", "finished"):
        return str(state)
    code = payload.get("code") if payload is not None else None
    return WorkspaceToolError(
        f"Sluice did not cancel request {request_id} (HTTP {response.status}"
        + (f", {code})" if isinstance(code, str) else ")"),
        reason="failed",
        # Whether the call itself ran is unknown here; only its own answer can tell.
        not_started=False,
        status=response.status,
        code=code if isinstance(code, str) else None,
        body=response.body,
        truncated=response.truncated,
        request_id=request_id,
    )
