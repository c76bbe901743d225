"""Fixtures shared by the admission tests."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from rowkit import registered_worker


@pytest.fixture
def worker(account_factory: Any, sync_redis: redis.Redis, redis_prefix: str, settings: Any) -> Any:
    """An account whose worker is registered with the workspace "ws" (rowkit.OFFER). Rows go
    to a stream under this test's prefix, so nothing else drains or sees them."""
    settings.REDIS_KEY_PREFIX = redis_prefix
    return registered_worker(account_factory(), sync_redis, redis_prefix)
