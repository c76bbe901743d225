"""Typed error answers: `{"error": <text>, "code": <CODE>}` and nothing else, never HTML."""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError
from django.http import JsonResponse
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


class ApiError(Exception):
    """An answer that ends a call. `not_started` is what the contract's table says of it."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}
        self.body = body

    def response(self) -> JsonResponse:
        body = self.body if self.body is not None else {"error": self.message, "code": self.code}
        response = JsonResponse(body, status=self.status)
        for name, value in self.headers.items():
            response[name] = value
        return response


def unauthenticated() -> ApiError:
    return ApiError(
        401, "UNAUTHENTICATED", "A valid API key is required (Authorization: Bearer <key>)."
    )


_DRF_CODES = {
    exceptions.NotAuthenticated: (401, "UNAUTHENTICATED"),
    exceptions.AuthenticationFailed: (401, "UNAUTHENTICATED"),
    exceptions.PermissionDenied: (403, "FORBIDDEN"),
    exceptions.NotFound: (404, "NOT_FOUND"),
    exceptions.UnsupportedMediaType: (415, "UNSUPPORTED_MEDIA_TYPE"),
    exceptions.ParseError: (400, "INVALID_REQUEST"),
    exceptions.MethodNotAllowed: (405, "METHOD_NOT_ALLOWED"),
    exceptions.Throttled: (429, "THROTTLED"),
    exceptions.ValidationError: (400, "INVALID_REQUEST"),
}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, reshaped so every DRF view answers in the typed error shape."""
    if isinstance(exc, RecursionError):
        # JSON nested past Python's limit: not a request (DRF's parser only maps ValueError).
        return Response(
            {"error": "The body is not valid JSON.", "code": "INVALID_REQUEST"}, status=400
        )
    if isinstance(exc, DatabaseError):
        # Postgres is away: a typed, retryable answer instead of Django's HTML 500.
        return Response(
            {"error": "The service's database is unavailable.", "code": "DATABASE_UNAVAILABLE"},
            status=503,
            headers={"Retry-After": "5"},
        )
    if isinstance(exc, ApiError):
        typed = Response({"error": exc.message, "code": exc.code}, status=exc.status)
        for name, value in exc.headers.items():
            typed[name] = value
        return typed
    handled = drf_exception_handler(exc, context)
    if handled is None:
        return None
    response: Response = handled
    status, code = next(
        ((s, c) for kind, (s, c) in _DRF_CODES.items() if isinstance(exc, kind)),
        (response.status_code, "INVALID_REQUEST"),
    )
    detail = getattr(exc, "detail", str(exc))
    response.data = {"error": detail if isinstance(detail, str) else str(detail), "code": code}
    response.status_code = status
    if status == 401:
        response["WWW-Authenticate"] = "Bearer"
    return response
