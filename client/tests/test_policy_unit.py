"""The pure pieces on their own: hint parsing, body limits, and the policy state machine
driven by hand with explicit times (no HTTP at all).
"""

from __future__ import annotations

import json

import pytest
from sluice_client.policy import AttemptPlan, Budgets, CallPolicy, Fail, Retry, plan_attempt
from sluice_client.responses import (
    BodyBuffer,
    RawResponse,
    clamp_wait_ms,
    parse_retry_after,
    read_limit,
)

NOW_S = 1_793_000_000.0  # some fixed wall time


def answer(status: int, payload: object, **headers: str) -> RawResponse:
    return RawResponse(status, headers, json.dumps(payload).encode(), truncated=False)


def policy(**budgets: object) -> CallPolicy:
    request = {
        "protocolVersion": 1,
        "operation": "read_file",
        "workspaceId": "ws",
        "path": "a",
        "startLine": 1,
        "maxLines": 200,
    }
    return CallPolicy(
        request=request,
        budgets=Budgets(**budgets),  # type: ignore[arg-type]
        start_ms=0,
        deadline_ms=None,
        request_id="r" * 16,
    )


@pytest.mark.parametrize(
    ("value", "expected_ms"),
    [
        ("0", 0),
        ("7", 7000),
        (" 7 ", 7000),
        ("1.5", None),
        ("-1", None),
        ("soon", None),
        ("", None),
        (None, None),
        ("Thu, 01 Jan 1970 00:00:10 GMT", 10_000),
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0),
    ],
)
def test_retry_after_parses_seconds_and_http_dates(
    value: str | None, expected_ms: int | None
) -> None:
    assert parse_retry_after(value, now_s=0.0) == expected_ms


def test_a_retry_after_date_in_the_past_means_now() -> None:
    assert parse_retry_after("Thu, 01 Jan 1970 00:00:01 GMT", now_s=100.0) == 0


@pytest.mark.parametrize(
    ("hint", "wait"),
    [(None, 1000), (0, 100), (99, 100), (100, 100), (30_000, 30_000), (30_001, 30_000)],
)
def test_waits_are_clamped_to_100_ms_and_30_s(hint: int | None, wait: int) -> None:
    assert clamp_wait_ms(hint) == wait


def test_an_error_body_is_read_one_byte_past_4096_to_see_it_is_too_long() -> None:
    buffer = BodyBuffer(read_limit(503))
    assert buffer.feed(b"x" * 4096) is True
    assert buffer.feed(b"yy") is False
    response = buffer.response(503, {})
    assert (len(response.body), response.truncated) == (4096, True)


def test_a_body_of_exactly_4096_bytes_is_whole() -> None:
    buffer = BodyBuffer(read_limit(503))
    buffer.feed(b"x" * 4096)
    assert buffer.response(503, {}).truncated is False


def test_the_policy_is_a_state_machine_over_answers_and_times() -> None:
    call = policy(max_queue_wait_ms=5000, max_rate_limit_wait_ms=3000)
    assert call.plan(attempt_start_ms=0, now_ms=0) == AttemptPlan(
        queue_wait_ms=30_000, timeout_ms=65_000
    )
    call.sent()
    busy = answer(503, {"error": "busy", "code": "WORKSPACE_QUEUE_TIMEOUT"}, **{"retry-after": "2"})
    assert call.on_response(busy, now_ms=1000, wall_now_s=NOW_S) == Retry(2000)
    call.wait_over(now_ms=3000)
    call.sent()
    limited = answer(429, {"error": "rate_limited", "message": "m", "retry_after_seconds": 3})
    assert call.on_response(limited, now_ms=3000, wall_now_s=NOW_S) == Retry(3000)
    call.wait_over(now_ms=6500)  # a late timer: 3500 ms charged to the 429 budget
    call.sent()
    # The queue horizon has used 6500 - 3500 = 3000 ms, so a 2000 ms wait still fits...
    assert call.on_response(busy, now_ms=6500, wall_now_s=NOW_S) == Retry(2000)
    call.wait_over(now_ms=8500)
    call.sent()
    # ...but the 429 budget is spent.
    outcome = call.on_response(limited, now_ms=8500, wall_now_s=NOW_S)
    assert isinstance(outcome, Fail) and outcome.error.attempts == 4


def test_a_header_is_never_below_1_ms() -> None:
    request = {"operation": "execute_command", "timeoutMs": 1000}
    assert plan_attempt(request=request, remaining_ms=11_001, mint_ms=0) == AttemptPlan(1, 11_001)
    assert plan_attempt(request=request, remaining_ms=11_000, mint_ms=0) is None


def test_budgets_refuse_values_outside_their_range() -> None:
    Budgets(max_queue_wait_ms=0, max_rate_limit_wait_ms=0, max_request_timeout_ms=610_000)
    for bad in (
        {"max_queue_wait_ms": 300_001},
        {"max_request_timeout_ms": 610_001},
        {"max_rate_limit_wait_ms": True},
    ):
        with pytest.raises(ValueError):
            Budgets(**bad)
