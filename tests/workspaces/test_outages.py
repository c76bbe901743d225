"""An outage of Redis or Postgres is logged as one line; anything else keeps its traceback."""

from __future__ import annotations

import logging

import pytest
import redis
from django.db import OperationalError

from workspaces import outages


def raised(exc: BaseException, wrapped_in: type[Exception] | None = None) -> BaseException:
    try:
        try:
            raise exc
        except BaseException as inner:
            if wrapped_in is None:
                raise
            raise wrapped_in("wrapped") from inner
    except BaseException as outer:
        return outer


@pytest.mark.parametrize(
    "exc",
    [
        raised(redis.ConnectionError("Error 111 connecting")),
        raised(redis.TimeoutError("timed out")),
        raised(redis.BusyLoadingError("loading")),
        raised(OperationalError("server closed the connection")),
        raised(ConnectionRefusedError(111, "refused")),
        # django-redis's ConnectionInterrupted wraps redis-py's error.
        raised(redis.ConnectionError("Error 111"), wrapped_in=RuntimeError),
    ],
)
def test_an_outage_is_one_line(exc: BaseException, caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.outages")
    with caplog.at_level(logging.WARNING, logger="test.outages"):
        outages.warn(log, "sample failed", exc)
    (record,) = caplog.records
    assert not record.exc_info
    assert record.error == str(exc)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "exc", [raised(ValueError("bad")), raised(redis.ResponseError("WRONGTYPE"))]
)
def test_a_fault_keeps_its_traceback(exc: BaseException, caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.outages")
    with caplog.at_level(logging.WARNING, logger="test.outages"):
        outages.warn(log, "sample failed", exc)
    (record,) = caplog.records
    assert record.exc_info is not None and record.exc_info[1] is exc
