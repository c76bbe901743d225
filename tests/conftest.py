"""Suite-wide fixtures. The suite runs against real Postgres and real Redis only."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings


def _check_services() -> None:
    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        pytest.exit(f"Redis is not answering at {settings.REDIS_URL}: {exc}", returncode=3)
    import psycopg

    db = settings.DATABASES["default"]
    try:
        psycopg.connect(
            host=db["HOST"], port=db["PORT"] or None, user=db["USER"], password=db["PASSWORD"],
            dbname=db["NAME"], connect_timeout=3,
        ).close()
    except psycopg.Error as exc:
        pytest.exit(f"Postgres is not answering at {settings.DATABASE_URL}: {exc}", returncode=3)


def pytest_sessionstart(session: pytest.Session) -> None:
    _check_services()


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix of this test's own, so tests never see each other's queues."""
    return f"t:{uuid.uuid4().hex[:12]}:"


@pytest.fixture
def sync_redis(redis_prefix: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
    yield client
    for key in client.scan_iter(match=f"{redis_prefix}*", count=1000):
        client.delete(key)
    client.close()
