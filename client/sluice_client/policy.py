"""Retry and budget decisions for one call: the only place the client's rules live.

`CallPolicy` is a state machine with no I/O. The sync and async clients feed it the clock
and each answer, and it says "send with these headers", "wait N ms, then retry" or "fail
with this error". All times are integer milliseconds on the client's clock.

Two budgets never charge each other (rule 2): 503/queue-full retries stop at a horizon
measured from the call's start, *minus* the time spent waiting out 429s; 429 retries stop
when the waits spent on them (timer overruns included) would pass their own budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import httpx
from sluice_protocol import (
    DEFAULT_COMMAND_TIMEOUT_MS,
    MAX_QUEUE_WAIT_MS,
    ProtocolError,
    validate_result,
)

from sluice_client.errors import WorkspaceToolError, may_have_run_message, rejected_message
from sluice_client.responses import RawResponse, Rejection, clamp_wait_ms, classify

DEFAULT_QUEUE_WAIT_HEADER_MS = 30_000
MAX_REQUEST_TIMEOUT_MS = 610_000
# Execution reserved for anything but a command: the server's exec budget min(JOB_TIMEOUT, 30 s).
OPERATION_RESERVE_MS = 30_000
# A command's worker gets 5 s past its timeout to settle and report.
COMMAND_SETTLE_MS = 5_000
# Time for the answer to travel back once the worker is done.
DELIVERY_MS = 5_000
# Transport failures that happen before any byte of the request leaves this process.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


@dataclass(frozen=True)
class Budgets:
    """How long a call may keep trying; see the README's retry table."""

    max_queue_wait_ms: int = MAX_QUEUE_WAIT_MS
    max_rate_limit_wait_ms: int = 20_000
    max_request_timeout_ms: int | None = None
    retry_queue_full: bool = False

    def __post_init__(self) -> None:
        _check_ms("max_queue_wait_ms", self.max_queue_wait_ms, 0, MAX_QUEUE_WAIT_MS)
        _check_ms("max_rate_limit_wait_ms", self.max_rate_limit_wait_ms, 0, None)
        if self.max_request_timeout_ms is not None:
            _check_ms(
                "max_request_timeout_ms", self.max_request_timeout_ms, 1, MAX_REQUEST_TIMEOUT_MS
            )
        if not isinstance(self.retry_queue_full, bool):
            raise ValueError("retry_queue_full must be a bool")

    def with_overrides(self, overrides: Mapping[str, Any]) -> Budgets:
        """Per-call budgets; an unknown name is a TypeError, like any bad keyword."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"unknown per-call budget(s): {', '.join(unknown)}")
        return replace(self, **overrides) if overrides else self


def _check_ms(name: str, value: object, low: int, high: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer number of milliseconds")
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {value}")


def execution_reserve_ms(request: Mapping[str, Any]) -> int:
    """The execution time an attempt must keep free after admission."""
    if request.get("operation") == "execute_command":
        timeout_ms = request.get("timeoutMs")
        if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool):
            timeout_ms = DEFAULT_COMMAND_TIMEOUT_MS
        return timeout_ms + COMMAND_SETTLE_MS
    return OPERATION_RESERVE_MS


@dataclass(frozen=True)
class AttemptPlan:
    queue_wait_ms: int  # the X-LibreChat-Workspace-Queue-Wait-Ms header
    timeout_ms: int  # the HTTP timeout of this attempt, counted from the send


def plan_attempt(
    *, request: Mapping[str, Any], remaining_ms: int | None, mint_ms: int
) -> AttemptPlan | None:
    """Rule 4. None when the execution reserve leaves no queue time (insufficient_time).

    With an HTTP budget the header is what is left after reserving execution and delivery,
    capped at 300000; without one it is 30000. Minting credentials happens inside the
    attempt, so its time comes off the header in both cases.
    """
    reserve_ms = execution_reserve_ms(request) + DELIVERY_MS
    if remaining_ms is None:
        queue_wait_ms = DEFAULT_QUEUE_WAIT_HEADER_MS - mint_ms
    else:
        queue_wait_ms = min(remaining_ms - reserve_ms, MAX_QUEUE_WAIT_MS)
    if queue_wait_ms < 1:
        return None
    return AttemptPlan(queue_wait_ms=queue_wait_ms, timeout_ms=queue_wait_ms + reserve_ms)


@dataclass(frozen=True)
class Retry:
    wait_ms: int


@dataclass(frozen=True)
class Fail:
    error: WorkspaceToolError


class CallPolicy:
    """Decisions for one call, across all its attempts."""

    def __init__(
        self,
        *,
        request: Mapping[str, Any],
        budgets: Budgets,
        start_ms: int,
        deadline_ms: int | None,
        request_id: str,
    ) -> None:
        self._request = request
        self._budgets = budgets
        self._start_ms = start_ms
        self._request_id = request_id
        limits = [deadline_ms] if deadline_ms is not None else []
        if budgets.max_request_timeout_ms is not None:
            limits.append(start_ms + budgets.max_request_timeout_ms)
        self._deadline_ms = min(limits) if limits else None
        self._rate_spent_ms = 0
        self._wait: tuple[int, bool] | None = None  # (started_ms, charged to the 429 budget)
        self._last_rejection: WorkspaceToolError | None = None
        self.attempts = 0

    # -- before an attempt -------------------------------------------------------------------

    def plan(self, *, attempt_start_ms: int, now_ms: int) -> AttemptPlan | Fail:
        """Headers and timeout for the next attempt, or why it must not be sent."""
        remaining = None if self._deadline_ms is None else self._deadline_ms - now_ms
        plan = plan_attempt(
            request=self._request, remaining_ms=remaining, mint_ms=now_ms - attempt_start_ms
        )
        if plan is not None:
            return plan
        if self._last_rejection is not None:
            # A late timer or slow minting ate the time a retry was promised: report what
            # Sluice last said rather than a budget error for an attempt that never went out.
            return Fail(self._last_rejection)
        reserve = execution_reserve_ms(self._request) + DELIVERY_MS
        return Fail(
            WorkspaceToolError(
                f"Not enough time left to send the call: {remaining} ms remain, and {reserve} ms "
                "are reserved for execution and delivery. Nothing was sent; give the call a "
                "longer deadline or a shorter command timeout.",
                reason="insufficient_time",
                not_started=True,
                request_id=self._request_id,
            )
        )

    def sent(self) -> None:
        self.attempts += 1

    @property
    def last_rejection(self) -> WorkspaceToolError | None:
        """The typed rejection that earned the wait just taken, if any."""
        return self._last_rejection

    # -- after an attempt --------------------------------------------------------------------

    def on_response(
        self, response: RawResponse, *, now_ms: int, wall_now_s: float
    ) -> dict[str, Any] | Retry | Fail:
        outcome = classify(response, wall_now_s=wall_now_s, request_id=self._request_id)
        if isinstance(outcome, WorkspaceToolError):
            outcome.attempts = self.attempts
            return Fail(outcome)
        if isinstance(outcome, Rejection):
            return self._on_rejection(outcome, now_ms=now_ms)
        try:
            validate_result(self._request, outcome)  # rule 8: exact keys, relative paths
        except ProtocolError as exc:
            return self.invalid_result(exc.message)
        return outcome

    def on_transport_error(self, exc: Exception) -> Fail:
        """An exception from the HTTP layer: fail once, never retry (rule 1)."""
        not_sent = isinstance(exc, NOT_SENT)
        is_timeout = isinstance(exc, httpx.TimeoutException)
        if not_sent:
            what = f"Could not reach Sluice ({type(exc).__name__}: {exc}); nothing was sent"
            message = f"{what}. Check the URL and the network before resending."
        else:
            kind = "timed out" if is_timeout else "broke"
            message = may_have_run_message(
                f"The HTTP request to Sluice {kind} after it was sent ({type(exc).__name__}: {exc})"
            )
        return Fail(
            WorkspaceToolError(
                message,
                reason="timeout" if is_timeout else "failed",
                not_started=not_sent,
                request_id=self._request_id,
                attempts=self.attempts,
            )
        )

    def invalid_result(self, problem: str) -> Fail:
        return Fail(
            WorkspaceToolError(
                may_have_run_message(
                    f"Sluice returned a result that breaks the protocol ({problem})"
                ),
                reason="invalid",
                not_started=False,
                status=200,
                code="RESULT_INVALID",
                request_id=self._request_id,
                attempts=self.attempts,
            )
        )

    def cancelled(self, *, in_flight: bool, withdrawn: str | None = None) -> Fail:
        """`withdrawn`: Sluice's answer to the DELETE sent for an in-flight call, if any."""
        # Sluice only answers "cancelled" for a call it dropped from its queue unstarted.
        dropped = in_flight and withdrawn == "cancelled"
        if dropped:
            message = (
                "The call was cancelled while it waited in the worker's queue; it was not started."
            )
        elif in_flight:
            message = may_have_run_message("The call was cancelled while its request was in flight")
        else:
            message = "The call was cancelled before its next request; no request was in flight."
        return Fail(
            WorkspaceToolError(
                message,
                reason="cancelled",
                # Every earlier attempt was a typed rejection, so only an aborted send that
                # Sluice did not confirm as dropped leaves the outcome open.
                not_started=dropped or not in_flight,
                request_id=self._request_id,
                attempts=self.attempts,
            )
        )

    def wait_over(self, *, now_ms: int) -> None:
        """Charge the wait just finished, as it really lasted (a late timer's overrun too)."""
        if self._wait is None:
            return
        started_ms, is_rate = self._wait
        self._wait = None
        if is_rate:
            self._rate_spent_ms += max(0, now_ms - started_ms)

    # -- internals ---------------------------------------------------------------------------

    def _on_rejection(self, rejection: Rejection, *, now_ms: int) -> Retry | Fail:
        wait_ms = clamp_wait_ms(rejection.hint_ms)
        why_stopped = self._why_not_retry(rejection, wait_ms, now_ms)
        error = WorkspaceToolError(
            rejected_message(
                status=rejection.status,
                code=rejection.code,
                attempts=self.attempts,
                why_stopped=why_stopped if rejection.kind is not None else None,
                retry_after_ms=rejection.hint_ms,
            ),
            reason="rejected",
            not_started=True,
            status=rejection.status,
            code=rejection.code,
            body=rejection.body,
            request_id=self._request_id,
            attempts=self.attempts,
        )
        self._last_rejection = error
        if why_stopped is not None:
            return Fail(error)
        self._wait = (now_ms, rejection.kind == "rate")
        return Retry(wait_ms)

    def _why_not_retry(self, rejection: Rejection, wait_ms: int, now_ms: int) -> str | None:
        budgets = self._budgets
        if rejection.kind is None:
            return "not retryable"
        if rejection.kind == "queue_full" and not budgets.retry_queue_full:
            return "WORKER_QUEUE_FULL is retried only with retry_queue_full"
        if rejection.kind == "rate":
            budget, spent = budgets.max_rate_limit_wait_ms, self._rate_spent_ms
            name = "max_rate_limit_wait_ms"
        else:
            # The queue horizon runs from the call's start but is not charged for 429 waits.
            budget, spent = budgets.max_queue_wait_ms, now_ms - self._start_ms - self._rate_spent_ms
            name = "max_queue_wait_ms"
        if budget == 0:
            return f"{name} is 0"
        if spent + wait_ms > budget:
            return f"waiting {wait_ms} ms more would pass {name}={budget} ({spent} ms used)"
        if self._deadline_ms is not None:
            remaining_after = self._deadline_ms - (now_ms + wait_ms)
            if plan_attempt(request=self._request, remaining_ms=remaining_after, mint_ms=0) is None:
                return f"after a {wait_ms} ms wait the deadline would leave no time to run it"
        return None
