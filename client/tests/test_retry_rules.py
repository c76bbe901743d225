"""Rules 1-3: what is retried, on which budget, after how long. Each scenario runs through
both clients (the `runner` fixture), with a fake clock and a scripted transport.
"""

from __future__ import annotations

import httpx
import pytest
from scripted import (
    READ_RESULT,
    BrokenStream,
    Runner,
    ok,
    queue_full,
    queue_timeout,
    rate_limited,
    typed,
)
from sluice_client import WorkspaceToolError


def fails(runner: Runner, **kwargs: object) -> WorkspaceToolError:
    with pytest.raises(WorkspaceToolError) as caught:
        runner.execute(**kwargs)  # type: ignore[arg-type]
    return caught.value


# -- rule 1: only typed "not started" rejections are retried ----------------------------------


def test_queue_timeout_is_retried_until_the_result_arrives(runner: Runner) -> None:
    runner.script.then(queue_timeout()).then(queue_timeout()).then(ok())
    assert runner.execute() == READ_RESULT
    assert len(runner.script.sent) == 3
    assert runner.time.slept_ms == [1000, 1000]


def test_a_4096_byte_queue_timeout_body_is_still_trusted(runner: Runner) -> None:
    runner.script.then(queue_timeout(pad_to=4096)).then(ok())
    assert runner.execute() == READ_RESULT


def test_a_4097_byte_queue_timeout_body_fails_once_as_may_have_run(runner: Runner) -> None:
    runner.script.then(queue_timeout(pad_to=4097))
    error = fails(runner)
    assert (error.reason, error.not_started, error.truncated) == ("failed", False, True)
    assert error.status == 503 and len(error.body) == 4096
    assert len(runner.script.sent) == 1


def test_an_html_503_fails_once_as_may_have_run(runner: Runner) -> None:
    runner.script.then(httpx.Response(503, html="<html>Service Unavailable</html>"))
    error = fails(runner)
    assert (error.reason, error.not_started, error.status) == ("failed", False, 503)
    assert error.body == b"<html>Service Unavailable</html>"
    assert len(runner.script.sent) == 1


def test_a_body_cut_off_mid_answer_fails_once_as_may_have_run(runner: Runner) -> None:
    broken = httpx.Response(503, stream=BrokenStream(b'{"error": "x", "code": "WORKSPACE_QU'))
    runner.script.then(broken)
    error = fails(runner)
    assert (error.reason, error.not_started, error.truncated) == ("failed", False, True)
    assert len(runner.script.sent) == 1


def test_a_504_fails_once_as_a_timeout_that_may_have_run(runner: Runner) -> None:
    runner.script.then(typed(504, "ASSIGNMENT_EXPIRED"))
    error = fails(runner)
    assert (error.reason, error.not_started, error.code) == ("timeout", False, "ASSIGNMENT_EXPIRED")
    assert len(runner.script.sent) == 1


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (httpx.ReadTimeout("timed out"), "timeout"),
        (httpx.RemoteProtocolError("server disconnected"), "failed"),
        (httpx.ReadError("connection reset"), "failed"),
    ],
)
def test_a_transport_error_after_sending_fails_once_as_may_have_run(
    runner: Runner, exc: Exception, reason: str
) -> None:
    runner.script.then(exc)
    error = fails(runner)
    assert (error.reason, error.not_started) == (reason, False)
    assert len(runner.script.sent) == 1


def test_a_connect_error_fails_once_and_is_known_not_to_have_run(runner: Runner) -> None:
    runner.script.then(httpx.ConnectError("connection refused"))
    error = fails(runner)
    assert (error.reason, error.not_started) == ("failed", True)
    assert len(runner.script.sent) == 1


def test_a_typed_rejection_that_is_not_retryable_fails_once_as_not_started(runner: Runner) -> None:
    runner.script.then(typed(503, "WORKER_OFFLINE"))
    error = fails(runner)
    assert (error.reason, error.not_started, error.code) == ("rejected", True, "WORKER_OFFLINE")
    assert len(runner.script.sent) == 1


def test_a_known_code_under_the_wrong_status_is_not_trusted(runner: Runner) -> None:
    runner.script.then(typed(500, "WORKSPACE_QUEUE_TIMEOUT"))
    error = fails(runner)
    assert (error.reason, error.not_started) == ("failed", False)


def test_worker_queue_full_fails_once_without_the_opt_in(runner: Runner) -> None:
    runner.script.then(queue_full())
    error = fails(runner)
    assert (error.reason, error.code, error.not_started) == ("rejected", "WORKER_QUEUE_FULL", True)
    assert "retry_queue_full" in error.message
    assert len(runner.script.sent) == 1


def test_worker_queue_full_is_retried_on_the_queue_horizon_with_the_opt_in(runner: Runner) -> None:
    runner.script.then(queue_full()).then(queue_full()).then(queue_full())
    error = fails(runner, client={"retry_queue_full": True, "max_queue_wait_ms": 2000})
    assert runner.time.slept_ms == [1000, 1000]
    assert error.code == "WORKER_QUEUE_FULL" and len(runner.script.sent) == 3


# -- rule 2: two budgets ----------------------------------------------------------------------


def test_a_zero_queue_budget_still_sends_the_first_attempt_but_never_retries(
    runner: Runner,
) -> None:
    runner.script.then(queue_timeout())
    error = fails(runner, max_queue_wait_ms=0)
    assert (error.reason, error.not_started) == ("rejected", True)
    assert len(runner.script.sent) == 1 and runner.time.slept_ms == []


def test_a_zero_rate_limit_budget_never_waits_out_a_429(runner: Runner) -> None:
    runner.script.then(rate_limited("1"))
    error = fails(runner, max_rate_limit_wait_ms=0)
    assert (error.reason, error.code, error.status) == ("rejected", "rate_limited", 429)
    assert len(runner.script.sent) == 1


def test_a_429_hint_equal_to_what_is_left_of_its_budget_is_waited_out(runner: Runner) -> None:
    runner.script.then(rate_limited("5")).then(ok())
    assert runner.execute(max_rate_limit_wait_ms=5000) == READ_RESULT
    assert runner.time.slept_ms == [5000]


def test_a_429_hint_one_ms_over_what_is_left_fails_at_once(runner: Runner) -> None:
    runner.script.then(rate_limited(body_seconds=5.001))
    error = fails(runner, max_rate_limit_wait_ms=5000)
    assert error.reason == "rejected" and runner.time.slept_ms == []


def test_429_waits_add_up_against_their_budget(runner: Runner) -> None:
    runner.script.then(rate_limited("3")).then(rate_limited("2")).then(
        rate_limited(body_seconds=0.1)
    )
    fails(runner, max_rate_limit_wait_ms=5000)
    assert runner.time.slept_ms == [3000, 2000]
    assert len(runner.script.sent) == 3


def test_the_queue_horizon_allows_a_retry_that_ends_exactly_on_it(runner: Runner) -> None:
    runner.script.then(queue_timeout("1"), takes_ms=4000).then(queue_timeout("1"), takes_ms=4000)
    runner.script.then(ok())
    assert runner.execute(max_queue_wait_ms=10_000) == READ_RESULT
    assert runner.time.slept_ms == [1000, 1000]


def test_the_queue_horizon_refuses_a_retry_one_ms_past_it(runner: Runner) -> None:
    runner.script.then(queue_timeout("1"), takes_ms=4000).then(queue_timeout("1"), takes_ms=4001)
    error = fails(runner, max_queue_wait_ms=10_000)
    assert runner.time.slept_ms == [1000] and len(runner.script.sent) == 2
    assert "max_queue_wait_ms=10000" in error.message


def test_429_waits_are_not_charged_to_the_queue_horizon(runner: Runner) -> None:
    runner.script.then(rate_limited("10")).then(queue_timeout("2")).then(ok())
    assert runner.execute(max_queue_wait_ms=2000) == READ_RESULT
    assert runner.time.slept_ms == [10_000, 2000]


def test_503_waits_are_not_charged_to_the_rate_limit_budget(runner: Runner) -> None:
    runner.script.then(queue_timeout("30")).then(rate_limited("2")).then(ok())
    assert runner.execute(max_rate_limit_wait_ms=2000) == READ_RESULT
    assert runner.time.slept_ms == [30_000, 2000]


def test_a_mixed_429_503_sequence_completes_within_both_budgets(runner: Runner) -> None:
    runner.script.then(queue_timeout("1")).then(rate_limited("2")).then(queue_timeout("3"))
    runner.script.then(rate_limited(body_seconds=4)).then(ok())
    assert runner.execute(max_rate_limit_wait_ms=6000, max_queue_wait_ms=4000) == READ_RESULT
    assert runner.time.slept_ms == [1000, 2000, 3000, 4000]


def test_a_mixed_sequence_stops_on_the_budget_of_the_answer_that_exhausts_it(
    runner: Runner,
) -> None:
    runner.script.then(rate_limited("2")).then(queue_timeout("3")).then(rate_limited("2"))
    error = fails(runner, max_rate_limit_wait_ms=3000)
    assert error.status == 429 and "max_rate_limit_wait_ms=3000" in error.message
    assert runner.time.slept_ms == [2000, 3000]


def test_a_late_timer_still_earns_its_retry(runner: Runner) -> None:
    runner.time.overrun_ms = 500
    runner.script.then(rate_limited("5")).then(ok())
    assert runner.execute(max_rate_limit_wait_ms=5000) == READ_RESULT
    assert runner.time.elapsed_ms() == 5500


def test_a_late_timer_overrun_is_charged_to_the_rate_limit_budget(runner: Runner) -> None:
    runner.time.overrun_ms = 500
    runner.script.then(rate_limited("3")).then(rate_limited("2"))
    fails(runner, max_rate_limit_wait_ms=5000)  # 3500 charged + 2000 > 5000
    assert runner.time.slept_ms == [3000]


def test_without_overrun_the_same_429_sequence_fits(runner: Runner) -> None:
    runner.script.then(rate_limited("3")).then(rate_limited("2")).then(ok())
    assert runner.execute(max_rate_limit_wait_ms=5000) == READ_RESULT


def test_a_late_timer_overrun_is_charged_to_the_queue_horizon(runner: Runner) -> None:
    runner.time.overrun_ms = 500
    runner.script.then(queue_timeout("2")).then(queue_timeout("2"))
    fails(runner, max_queue_wait_ms=4000)  # 2500 used + 2000 > 4000
    assert runner.time.slept_ms == [2000]


def test_a_retry_whose_deadline_leaves_exactly_no_queue_time_is_not_sent(runner: Runner) -> None:
    # Read: 30 s execution + 5 s delivery reserved. After the 1 s wait, 35 000 ms remain.
    runner.script.then(queue_timeout("1"), takes_ms=4000)
    error = fails(runner, max_request_timeout_ms=40_000)
    assert (error.reason, error.code, error.not_started) == (
        "rejected",
        "WORKSPACE_QUEUE_TIMEOUT",
        True,
    )
    assert runner.time.slept_ms == [] and len(runner.script.sent) == 1


def test_a_retry_whose_deadline_leaves_one_ms_of_queue_time_is_sent(runner: Runner) -> None:
    runner.script.then(queue_timeout("1"), takes_ms=4000).then(ok())
    assert runner.execute(max_request_timeout_ms=40_001) == READ_RESULT
    assert [sent.queue_wait_ms for sent in runner.script.sent] == [5001, 1]


def test_a_late_timer_past_the_deadline_fails_with_the_last_rejection(runner: Runner) -> None:
    runner.time.overrun_ms = 2
    runner.script.then(queue_timeout("1"), takes_ms=4000)
    error = fails(runner, max_request_timeout_ms=40_001)
    assert (error.reason, error.code) == ("rejected", "WORKSPACE_QUEUE_TIMEOUT")
    assert len(runner.script.sent) == 1


# -- rule 3: hints ------------------------------------------------------------------------------


def test_retry_after_as_an_http_date_is_measured_from_the_response_date(runner: Runner) -> None:
    runner.script.then(
        rate_limited("Wed, 21 Oct 2026 07:28:05 GMT", date="Wed, 21 Oct 2026 07:28:00 GMT")
    ).then(ok())
    runner.execute()
    assert runner.time.slept_ms == [5000]


def test_retry_after_as_an_http_date_without_a_date_header_uses_the_wall_clock(
    runner: Runner,
) -> None:
    runner.time.wall_s = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    runner.script.then(queue_timeout("Fri, 15 Jan 2027 08:00:07 GMT")).then(ok())
    runner.execute()
    assert runner.time.slept_ms == [7000]


def test_the_body_hint_is_used_for_a_429_without_a_retry_after(runner: Runner) -> None:
    runner.script.then(rate_limited(body_seconds=3)).then(ok())
    runner.execute()
    assert runner.time.slept_ms == [3000]


def test_the_body_hint_is_used_for_a_429_whose_retry_after_is_unusable(runner: Runner) -> None:
    runner.script.then(rate_limited("soon", body_seconds=4)).then(ok())
    runner.execute()
    assert runner.time.slept_ms == [4000]


def test_the_header_wins_over_the_body_hint_on_a_429(runner: Runner) -> None:
    runner.script.then(rate_limited("2", body_seconds=9)).then(ok())
    runner.execute()
    assert runner.time.slept_ms == [2000]


def test_a_body_hint_on_a_503_is_ignored(runner: Runner) -> None:
    body = {"error": "busy", "code": "WORKSPACE_QUEUE_TIMEOUT", "retry_after_seconds": 9}
    runner.script.then(httpx.Response(503, json=body)).then(ok())
    runner.execute()
    assert runner.time.slept_ms == [1000]


@pytest.mark.parametrize(
    ("retry_after", "wait_ms"),
    [(None, 1000), ("0", 100), ("1", 1000), ("30", 30_000), ("31", 30_000), ("later", 1000)],
)
def test_a_503_wait_is_clamped_between_100_ms_and_30_s_with_1_s_by_default(
    runner: Runner, retry_after: str | None, wait_ms: int
) -> None:
    runner.script.then(queue_timeout(retry_after)).then(ok())
    runner.execute()
    assert runner.time.slept_ms == [wait_ms]


@pytest.mark.parametrize(
    ("seconds", "wait_ms"), [(0.05, 100), (0.1, 100), (0.25, 250), (45, 30_000)]
)
def test_a_429_body_hint_is_clamped_too(runner: Runner, seconds: float, wait_ms: int) -> None:
    runner.script.then(rate_limited(body_seconds=seconds)).then(ok())
    runner.execute(max_rate_limit_wait_ms=60_000)
    assert runner.time.slept_ms == [wait_ms]


def test_a_429_without_any_hint_waits_1_s(runner: Runner) -> None:
    runner.script.then(rate_limited()).then(ok())
    runner.execute()
    assert runner.time.slept_ms == [1000]
