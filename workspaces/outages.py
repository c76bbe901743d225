"""Telling an outage of Redis or Postgres from a fault: an outage is expected in the field (a
restart, a failover) and is logged as one line with its error, a fault with its traceback."""

from __future__ import annotations

from typing import Any


def expected_outage(exc: BaseException) -> bool:
    """Whether `exc` (or what it wraps, as django-redis wraps redis-py's errors) says Redis or
    Postgres is down, restarting or overloaded."""
    from django.db import InterfaceError, OperationalError
    from redis.exceptions import BusyLoadingError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    outage = (
        RedisConnectionError,
        RedisTimeoutError,
        BusyLoadingError,
        OperationalError,
        InterfaceError,
        OSError,
    )
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, outage):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def warn(log: Any, message: str, exc: BaseException, **extra: Any) -> None:
    """`message` at warning level: one line naming the error for an outage, else with the
    traceback."""
    log.warning(
        message, exc_info=None if expected_outage(exc) else exc, extra={**extra, "error": str(exc)}
    )
