"""`GET /healthz`: 200 when Postgres and Redis answer, 503 naming what is down."""

from __future__ import annotations

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse


def _database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return "ok"
    except Exception as exc:
        return f"down: {type(exc).__name__}"


def _redis() -> str:
    try:
        client = redis.Redis.from_url(
            settings.ADMISSION_REDIS_URL, socket_connect_timeout=1, socket_timeout=1
        )
        try:
            client.ping()
        finally:
            client.close()
        return "ok"
    except Exception as exc:
        return f"down: {type(exc).__name__}"


def healthz(request: HttpRequest) -> JsonResponse:
    checks = {"database": _database(), "redis": _redis()}
    healthy = all(v == "ok" for v in checks.values())
    return JsonResponse(checks, status=200 if healthy else 503)
