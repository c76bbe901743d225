"""The one table from a refusal to an HTTP answer, and DRF's exception handler around it.

Every API answer that is not a result is `{"error": <text>, "code": <CODE>}` (the rate limit's
429 keeps the body the protocol gives it), never HTML. Services raise `admission.refusals`
types and know nothing of statuses; this module is the only place that does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, InterfaceError
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from sluice_protocol import worker_error_status

from admission.refusals import Refusal


@dataclass(frozen=True)
class Answer:
    """How a refusal is answered: its status, when it happens, what the caller may conclude
    (`started`), and whether it comes with Retry-After. The OpenAPI document is generated from
    this table (api/schema/answers.py), so a code added here is documented there."""

    status: int
    when: str
    started: str = "no"
    retry_after: bool = False
    # The body repeats Retry-After as `retry_after_seconds` (a client that reads only bodies,
    # as the §3 rate limit's does, sees the same wait).
    retry_in_body: bool = False


# Refusals of admission and of the API edge itself. A worker's own codes take their status
# from the protocol (`worker_error_status`), since the worker names them.
ANSWERS: dict[str, Answer] = {
    "INVALID_WORKSPACE_TOOL_REQUEST": Answer(400, "the body breaks the protocol (§2.2)"),
    "INVALID_WORKSPACE_QUEUE_WAIT": Answer(400, "queue-wait header malformed or over 300000"),
    "INVALID_WORKER_ID": Answer(400, "a worker id (header or path) breaks the worker-id pattern"),
    "INVALID_REQUEST_ID": Answer(
        400, "request-id header malformed, missing, or names another call"
    ),
    "INVALID_REQUEST": Answer(400, "the body is not JSON, or breaks the route's schema"),
    "INVALID_PAIRING_CODE": Answer(400, "not 32 characters of [A-Za-z0-9_-]"),
    "UNAUTHENTICATED": Answer(401, "missing, unknown or revoked API key or worker token"),
    "FORBIDDEN": Answer(403, "the worker token belongs to another worker"),
    "WORKER_NOT_FOUND": Answer(404, "unknown worker, or another tenant's"),
    "REQUEST_NOT_FOUND": Answer(404, "unknown id, malformed id, or another principal's call"),
    "NOT_FOUND": Answer(404, "no such route, or durable requests are not offered here"),
    "PAIRING_CODE_UNKNOWN": Answer(404, "no such pairing code (or it was revoked)"),
    "METHOD_NOT_ALLOWED": Answer(405, "the route does not take this method (Allow)"),
    "WORKER_MISMATCH": Answer(
        409, "workspace, operation, lane, edit feature or instruction file not offered"
    ),
    "WORKSPACE_QUARANTINED": Answer(409, "the isolation key is quarantined"),
    "REQUEST_CANCELLED": Answer(409, "cancelled by DELETE or an operator while it waited"),
    "WORKER_SUPERSEDED": Answer(409, "this incarnation was replaced or expired"),
    "WORKER_ID_TAKEN": Answer(409, "another tenant holds the worker id; the code is spent"),
    "PAIRING_CODE_USED": Answer(409, "the pairing code was already redeemed"),
    "WORKER_REGISTRATION_LOST": Answer(410, "the registration is gone; register again"),
    "PAIRING_CODE_EXPIRED": Answer(410, "the pairing code is past its expiry"),
    "REQUEST_TOO_LARGE": Answer(413, "body over the limit"),
    "REQUEST_BODY_TIMEOUT": Answer(
        408, "the body did not arrive whole within SLUICE_REQUEST_BODY_TIMEOUT_S"
    ),
    "UNSUPPORTED_MEDIA_TYPE": Answer(415, "body is not application/json"),
    "WORKER_QUEUE_FULL": Answer(
        429, "the worker's queue is full", retry_after=True, retry_in_body=True
    ),
    "RATE_LIMITED": Answer(
        429, "principal over its rate (§3: the RateLimited body)", retry_after=True
    ),
    "THROTTLED": Answer(429, "a DRF throttle refused the call", retry_after=True),
    "BRIDGE_RATE_LIMITED": Answer(
        429, "the key (redeem: the client address) over its bridge rate", retry_after=True
    ),
    "REQUEST_HEADERS_TOO_LARGE": Answer(
        431, "the request line and headers pass SLUICE_MAX_HEADER_BYTES"
    ),
    "INTERNAL_ERROR": Answer(500, "an unforeseen error", started="unknown"),
    "RESULT_INVALID": Answer(502, "the worker's answer broke §2.2", started="unknown"),
    "WORKSPACE_QUEUE_TIMEOUT": Answer(
        503, "not admitted within the queue budget", retry_after=True, retry_in_body=True
    ),
    "WORKER_OFFLINE": Answer(503, "worker offline, restarted or replaced"),
    "NO_WORKER_SELECTED": Answer(503, "no worker header and no default worker"),
    "SERVICE_SHUTTING_DOWN": Answer(503, "the API process is stopping", retry_after=True),
    "SERVICE_OVERLOADED": Answer(
        503, "the API process carries its limit of calls", retry_after=True
    ),
    "ADMISSION_UNAVAILABLE": Answer(503, "admission Redis unavailable"),
    "DATABASE_UNAVAILABLE": Answer(
        503, "Postgres unavailable", started="no, unless it ran", retry_after=True
    ),
    "ASSIGNMENT_EXPIRED": Answer(
        504, "exec deadline passed, or the worker vanished", started="unknown"
    ),
}
STATUS: dict[str, int] = {code: answer.status for code, answer in ANSWERS.items()}
# What a worker's own code (the protocol's WORKER_ERROR_STATUS) tells the caller.
WORKER_ANSWER = Answer(
    0, "the worker refused the call, or could not run or finish it", "yes/refused"
)
# A worker's codes that tell the caller more than WORKER_ANSWER does.
WORKER_ANSWERS: dict[str, Answer] = {
    "EDIT_NOT_STARTED": Answer(
        503, "the edit could not be planned before its deadline; nothing was written"
    ),
}


def status_of(refusal: Refusal) -> int:
    if refusal.started is True:
        return worker_error_status(refusal.code) or 502
    return STATUS[refusal.code]


def refusal_headers(refusal: Refusal) -> dict[str, str]:
    headers = dict(refusal.headers)
    if refusal.retry_after_s is not None:
        headers.setdefault("Retry-After", str(refusal.retry_after_s))
    if refusal.code == "UNAUTHENTICATED":
        headers["WWW-Authenticate"] = "Bearer"
    return headers


def refusal_body(refusal: Refusal) -> dict[str, Any]:
    if refusal.body is not None:
        return refusal.body
    body: dict[str, Any] = {"error": refusal.message, "code": refusal.code}
    answer = ANSWERS.get(refusal.code)
    if answer is not None and answer.retry_in_body and refusal.retry_after_s is not None:
        body["retry_after_seconds"] = refusal.retry_after_s
    return body


def refusal_response(refusal: Refusal) -> Response:
    return Response(
        refusal_body(refusal), status=status_of(refusal), headers=refusal_headers(refusal)
    )


def invalid(code: str, message: str) -> Refusal:
    """A request the protocol refuses: 400 with its own code, nothing queued."""
    return Refusal(code, message)


def unauthenticated() -> Refusal:
    return Refusal("UNAUTHENTICATED", "A valid API key is required (Authorization: Bearer <key>).")


def body_timeout() -> Refusal:
    return Refusal(
        "REQUEST_BODY_TIMEOUT",
        "The request body did not arrive in time; the operation was not started.",
    )


def too_large() -> Refusal:
    return Refusal("REQUEST_TOO_LARGE", "The request body is too large.")


def method_not_allowed(allowed: str) -> Refusal:
    return Refusal("METHOD_NOT_ALLOWED", f"Use {allowed}.", headers={"Allow": allowed})


_DRF_CODES = {
    exceptions.NotAuthenticated: "UNAUTHENTICATED",
    exceptions.AuthenticationFailed: "UNAUTHENTICATED",
    exceptions.PermissionDenied: "FORBIDDEN",
    exceptions.NotFound: "NOT_FOUND",
    exceptions.UnsupportedMediaType: "UNSUPPORTED_MEDIA_TYPE",
    exceptions.ParseError: "INVALID_REQUEST",
    exceptions.MethodNotAllowed: "METHOD_NOT_ALLOWED",
    exceptions.Throttled: "THROTTLED",
    exceptions.ValidationError: "INVALID_REQUEST",
}


def as_refusal(exc: Exception) -> Refusal | None:
    """The refusal an exception stands for at the API edge, or None for DRF's own kinds."""
    if isinstance(exc, Refusal):
        return exc
    if isinstance(exc, exceptions.AuthenticationFailed | exceptions.NotAuthenticated):
        return unauthenticated()
    if isinstance(exc, RecursionError):
        # JSON nested past Python's limit: not a request (DRF's parser only maps ValueError).
        return invalid("INVALID_REQUEST", "The body is not valid JSON.")
    if isinstance(exc, DatabaseError | InterfaceError):
        # Postgres is away: a typed, retryable answer instead of Django's HTML 500.
        return Refusal(
            "DATABASE_UNAVAILABLE", "The service's database is unavailable.", retry_after_s=5
        )
    return None


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, reshaped so every DRF view answers in the typed error shape."""
    refusal = as_refusal(exc)
    if refusal is not None:
        return refusal_response(refusal)
    handled = drf_exception_handler(exc, context)
    if handled is None:
        return None
    response: Response = handled
    code = next((c for kind, c in _DRF_CODES.items() if isinstance(exc, kind)), "INVALID_REQUEST")
    response.data = {"error": plain_text(getattr(exc, "detail", str(exc))), "code": code}
    response.status_code = STATUS[code]
    return response


def plain_text(detail: Any, field: str = "") -> str:
    """A DRF error detail (a string, or lists and dicts of them by field) as one line of
    text: `field: message` for each, never the repr of DRF's ErrorDetail objects."""
    if isinstance(detail, dict):
        return "; ".join(
            plain_text(value, f"{field}.{key}" if field else str(key))
            for key, value in detail.items()
        )
    if isinstance(detail, list | tuple):
        return "; ".join(plain_text(value, field) for value in detail)
    return f"{field}: {detail}" if field and field != "non_field_errors" else str(detail)
