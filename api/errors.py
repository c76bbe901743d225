"""The one table from a refusal to an HTTP answer, and DRF's exception handler around it.

Every API answer that is not a result is `{"error": <text>, "code": <CODE>}` (the rate limit's
429 keeps the body the protocol gives it), never HTML. Services raise `admission.refusals`
types and know nothing of statuses; this module is the only place that does.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, InterfaceError
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from sluice_protocol import worker_error_status

from admission.refusals import Refusal

# Refusals of admission and of the API edge itself. A worker's own codes take their status
# from the protocol (`worker_error_status`), since the worker names them.
STATUS: dict[str, int] = {
    "INVALID_WORKSPACE_TOOL_REQUEST": 400,
    "INVALID_WORKSPACE_QUEUE_WAIT": 400,
    "INVALID_WORKER_ID": 400,
    "INVALID_REQUEST_ID": 400,
    "INVALID_REQUEST": 400,
    "INVALID_PAIRING_CODE": 400,
    "UNAUTHENTICATED": 401,
    "FORBIDDEN": 403,
    "WORKER_NOT_FOUND": 404,
    "REQUEST_NOT_FOUND": 404,
    "NOT_FOUND": 404,
    "PAIRING_CODE_UNKNOWN": 404,
    "METHOD_NOT_ALLOWED": 405,
    "WORKER_MISMATCH": 409,
    "WORKSPACE_QUARANTINED": 409,
    "REQUEST_CANCELLED": 409,
    "WORKER_SUPERSEDED": 409,
    "WORKER_ID_TAKEN": 409,
    "PAIRING_CODE_USED": 409,
    "WORKER_REGISTRATION_LOST": 410,
    "PAIRING_CODE_EXPIRED": 410,
    "REQUEST_TOO_LARGE": 413,
    "UNSUPPORTED_MEDIA_TYPE": 415,
    "WORKER_QUEUE_FULL": 429,
    "RATE_LIMITED": 429,
    "THROTTLED": 429,
    "INTERNAL_ERROR": 500,
    "RESULT_INVALID": 502,
    "WORKSPACE_QUEUE_TIMEOUT": 503,
    "WORKER_OFFLINE": 503,
    "NO_WORKER_SELECTED": 503,
    "SERVICE_SHUTTING_DOWN": 503,
    "SERVICE_OVERLOADED": 503,
    "ADMISSION_UNAVAILABLE": 503,
    "DATABASE_UNAVAILABLE": 503,
    "ASSIGNMENT_EXPIRED": 504,
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
    return (
        refusal.body
        if refusal.body is not None
        else {"error": refusal.message, "code": refusal.code}
    )


def refusal_response(refusal: Refusal) -> Response:
    return Response(
        refusal_body(refusal), status=status_of(refusal), headers=refusal_headers(refusal)
    )


def invalid(code: str, message: str) -> Refusal:
    """A request the protocol refuses: 400 with its own code, nothing queued."""
    return Refusal(code, message)


def unauthenticated() -> Refusal:
    return Refusal("UNAUTHENTICATED", "A valid API key is required (Authorization: Bearer <key>).")


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
    detail = getattr(exc, "detail", str(exc))
    response.data = {"error": detail if isinstance(detail, str) else str(detail), "code": code}
    response.status_code = STATUS[code]
    return response
