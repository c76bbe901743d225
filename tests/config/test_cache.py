"""Django's cache is Redis through django-redis, under the run's own key prefix."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.contrib.sessions.backends.cached_db import KEY_PREFIX as SESSION_PREFIX
from django.core.cache import cache
from django_redis import get_redis_connection


@pytest.mark.django_db
def test_an_admin_session_is_kept_in_redis_under_the_runs_prefix(
    client: Any, admin_user: Any
) -> None:
    client.force_login(admin_user)
    session_key = client.session.session_key
    assert cache.get(SESSION_PREFIX + session_key) is not None
    raw = get_redis_connection("default")
    stored = [k.decode() for k in raw.scan_iter(match=f"{settings.REDIS_KEY_PREFIX}cache:*")]
    assert any(k.endswith(SESSION_PREFIX + session_key) for k in stored), stored
