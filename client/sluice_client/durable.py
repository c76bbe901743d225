"""Durable requests (contract §2.7): the decisions for one call, with no I/O.

A durable call is submitted once (`POST /v1/workspace-tools/requests`, answered 202 as soon
as it is in its queue) and then looked up (`GET .../requests/<id>`) until it is completed,
failed or cancelled, so no HTTP request has to live as long as the call. The sync and async
clients feed `DurablePolicy` the clock and every answer; it says "submit", "look up",
"wait N ms", "done", "fail", or "abandon" (cancel the accepted call with DELETE, then fail).

The rule taken from LibreChat's durable transport (`packages/api/src/code/requests.ts`): a
submission whose answer is lost is recovered by looking its request id up, never by a blind
second submission. Only when the lookup answers 404 *and* no status was ever seen for that id
is the same request, with the same id, body and queue-wait header, submitted again; Sluice
answers a repeated id with the existing handle, so that cannot create a second call. A handle
that was seen and then answers 404 is never recreated: the call fails as "may have run".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias

from sluice_protocol import MAX_QUEUE_WAIT_MS, ProtocolError, validate_result

from sluice_client.durable_answers import (
    SUBMIT_PATH,
    TRANSPORT_TIMEOUT_MS,
    States,
    Status,
    cancelled_before_submit,
    failure_error,
    parse_status,
)
from sluice_client.errors import MAY_HAVE_RUN_TAIL, WorkspaceToolError, may_have_run_message
from sluice_client.policy import (
    DEFAULT_QUEUE_WAIT_HEADER_MS,
    DELIVERY_MS,
    NOT_SENT,
    AttemptPlan,
    Budgets,
    CallPolicy,
    Fail,
    Retry,
    execution_reserve_ms,
)
from sluice_client.responses import RawResponse, Rejection, clamp_wait_ms, classify

# Lookup answers that mean "ask again later" from Sluice or a proxy in front of it. A lookup
# is read-only, so asking again is always safe.
_TRANSIENT_LOOKUP = frozenset({429, 502, 503, 504})


# -- steps ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submit:
    """POST the call; `plan` holds the queue-wait header and this request's timeout."""

    plan: AttemptPlan


@dataclass(frozen=True)
class Lookup:
    timeout_ms: int


@dataclass(frozen=True)
class Wait:
    wait_ms: int


@dataclass(frozen=True)
class Done:
    result: dict[str, Any]


@dataclass(frozen=True)
class Abandon:
    """Sluice may hold the call: DELETE it (best effort), then raise `settle(...)`."""

    error: WorkspaceToolError


Step: TypeAlias = Submit | Lookup | Wait | Done | Fail | Abandon


class DurablePolicy:
    """Decisions for one durable call. Start with `first`; feed back every outcome."""

    def __init__(
        self,
        *,
        request: Mapping[str, Any],
        budgets: Budgets,
        start_ms: int,
        deadline_ms: int | None,
        request_id: str,
        poll_interval_ms: int,
    ) -> None:
        self._request = request
        self._request_id = request_id
        self._poll_ms = poll_interval_ms
        self._caller_deadline_ms = deadline_ms
        # A ceiling on each HTTP request, not on the call: the call outlives its requests,
        # which is the point of durable requests (LibreChat treats it the same way).
        self._transport_ms = min(TRANSPORT_TIMEOUT_MS, budgets.max_request_timeout_ms or 10**9)
        self._reserve_ms = execution_reserve_ms(request) + DELIVERY_MS
        # Durable admission has no retries to spread the horizon over, so one submission
        # gets all of it, and never less than a synchronous first attempt would.
        self._horizon_ms = min(
            max(budgets.max_queue_wait_ms, DEFAULT_QUEUE_WAIT_HEADER_MS), MAX_QUEUE_WAIT_MS
        )
        self._budgets = replace(budgets, max_request_timeout_ms=None)
        self._start_ms = start_ms
        self._call: CallPolicy | None = None
        self._queue_wait_ms = 0
        self._deadline_ms = 0  # set by `first`: the end of polling
        self._outstanding: Literal["submit", "lookup"] | None = None
        self._after_wait: Literal["submit", "lookup"] = "lookup"
        self._maybe_accepted = False  # a POST went out that Sluice may have accepted
        self._seen = False  # Sluice has shown a status for this id
        self._state: States | None = None

    @property
    def maybe_accepted(self) -> bool:
        """True once Sluice may hold the call; abandoning it then owes a DELETE."""
        return self._maybe_accepted

    @property
    def attempts(self) -> int:
        return self._call.attempts if self._call is not None else 0

    def first(self, *, now_ms: int) -> Submit | Fail | Abandon:
        remaining = None if self._caller_deadline_ms is None else self._caller_deadline_ms - now_ms
        queue_wait_ms = self._horizon_ms
        if remaining is not None:
            queue_wait_ms = min(queue_wait_ms, remaining - self._reserve_ms)
        if queue_wait_ms < 1:
            return Fail(self._insufficient(remaining_ms=remaining))
        # Every submission of this call sends the same header: a repeated id must not ask
        # for a longer admission than the one Sluice may already hold.
        self._queue_wait_ms = queue_wait_ms
        self._deadline_ms = now_ms + queue_wait_ms + self._reserve_ms
        if self._caller_deadline_ms is not None:
            self._deadline_ms = min(self._deadline_ms, self._caller_deadline_ms)
        self._call = CallPolicy(
            request=self._request,
            budgets=self._budgets,
            start_ms=self._start_ms,
            deadline_ms=self._deadline_ms,
            request_id=self._request_id,
        )
        return self._submit(now_ms)

    def sent(self) -> None:
        """The driver is about to send the POST it was told to (credentials are minted)."""
        assert self._call is not None
        self._call.sent()

    # -- outcomes of a request -----------------------------------------------------------------

    def on_answer(self, response: RawResponse, *, now_ms: int, wall_now_s: float) -> Step:
        if self._outstanding == "submit":
            return self._on_submit_answer(response, now_ms=now_ms, wall_now_s=wall_now_s)
        return self._on_lookup_answer(response, now_ms=now_ms, wall_now_s=wall_now_s)

    def on_transport_error(self, exc: Exception, *, now_ms: int) -> Step:
        if self._outstanding == "submit":
            if isinstance(exc, NOT_SENT) and not self._maybe_accepted:
                assert self._call is not None
                return self._call.on_transport_error(exc)
            # The POST left this process and its answer is lost: Sluice may hold the call.
            # Look it up; a blind second POST is what this whole module exists to avoid.
            self._maybe_accepted = True
        return self._wait(self._poll_ms, then="lookup", now_ms=now_ms)

    def credentials_failed(self, error: WorkspaceToolError) -> Fail | Abandon:
        if not self._maybe_accepted:
            return Fail(error)
        return Abandon(
            self._may_have_run(f"Could not get credentials to follow the call up ({error})")
        )

    def cancelled(self, *, in_flight: bool) -> Fail | Abandon:
        submitting = in_flight and self._outstanding == "submit"
        if self._maybe_accepted or submitting:
            self._maybe_accepted = True
            error = self._may_have_run("The call was cancelled after it was submitted")
            error.reason = "cancelled"
            return Abandon(error)
        return Fail(cancelled_before_submit(self._request_id, attempts=self.attempts))

    def wait_over(self, *, now_ms: int) -> Step:
        assert self._call is not None
        self._call.wait_over(now_ms=now_ms)
        if self._after_wait == "submit" and not self._maybe_accepted:
            # A wait on a typed rejection: nothing is held, so a late timer that ate the
            # deadline ends with what Sluice last said, as in the synchronous client.
            last = self._call.last_rejection
            if now_ms + self._reserve_ms >= self._deadline_ms and last is not None:
                return Fail(last)
            return self._submit(now_ms)
        if now_ms >= self._deadline_ms:
            return self._timed_out()
        return self._submit(now_ms) if self._after_wait == "submit" else self._lookup(now_ms)

    def settle(self, abandon: Abandon, cancel_state: str | None) -> WorkspaceToolError:
        """The error to raise once the DELETE for an abandoned call has been tried.

        `cancel_state` is the DELETE's answer (None when it failed). Only "cancelled" proves
        the call never reached a worker: Sluice removed it from its queue, and a late copy of
        the POST would now only see that cancelled handle.
        """
        error = abandon.error
        error.attempts = self.attempts
        if cancel_state == "cancelled":
            error.not_started = True
            # The may-have-run advice no longer holds; say what does instead.
            error.message = error.message.removesuffix(MAY_HAVE_RUN_TAIL) + (
                " Sluice then removed it from its queue before it reached a worker, so "
                "resending it is safe."
            )
            error.args = (error.message,)
        return error

    # -- internals -----------------------------------------------------------------------------

    def _on_submit_answer(self, response: RawResponse, *, now_ms: int, wall_now_s: float) -> Step:
        assert self._call is not None
        if response.status == 202:
            self._maybe_accepted = True
            if response.truncated:  # cut off in transit: as good as lost, so look it up
                return self._wait(self._poll_ms, then="lookup", now_ms=now_ms)
            return self._on_status(parse_status(response, self._request_id), now_ms=now_ms)
        if 200 <= response.status < 300:
            self._maybe_accepted = True
            return Abandon(
                self._may_have_run(f"Sluice answered the submission with HTTP {response.status}")
            )
        decision = self._call.on_response(response, now_ms=now_ms, wall_now_s=wall_now_s)
        if isinstance(decision, Retry):
            if self._maybe_accepted:
                # An earlier POST of this id may still commit; keep watching for it instead.
                return self._wait(decision.wait_ms, then="lookup", now_ms=now_ms)
            return self._wait(decision.wait_ms, then="submit", now_ms=now_ms)
        assert isinstance(decision, Fail)
        if not self._maybe_accepted:
            return decision
        error = decision.error
        if error.not_started:
            # This answer refuses this POST only: an earlier one whose answer was lost may
            # still be accepted, so the call cannot be called "not started" yet.
            error = WorkspaceToolError(
                may_have_run_message(
                    f"Sluice refused a resubmission with {error.code} (HTTP {error.status}), "
                    "but an earlier submission of the same request id may still be accepted"
                ),
                reason="failed",
                not_started=False,
                status=error.status,
                code=error.code,
                body=error.body,
                request_id=self._request_id,
            )
        return Abandon(error)

    def _on_lookup_answer(self, response: RawResponse, *, now_ms: int, wall_now_s: float) -> Step:
        if response.status == 200 and not response.truncated:
            return self._on_status(parse_status(response, self._request_id), now_ms=now_ms)
        if response.status == 404:
            if self._seen:
                # LibreChat's rule: a handle once observed is never recreated after a 404.
                return Fail(
                    self._may_have_run(
                        f"Sluice no longer knows request {self._request_id} (HTTP 404), "
                        "though it showed its status before"
                    )
                )
            # The lost POST never reached the queue (or has not yet): the same id, body and
            # header again. If the first one does commit late, Sluice answers this one with
            # its handle instead of creating a second call.
            return self._submit(now_ms)
        if response.status == 200 or response.status in _TRANSIENT_LOOKUP:
            hint = classify(response, wall_now_s=wall_now_s, request_id=self._request_id)
            wait_ms = self._poll_ms
            if isinstance(hint, Rejection) and hint.hint_ms is not None:
                wait_ms = max(wait_ms, clamp_wait_ms(hint.hint_ms))
            return self._wait(wait_ms, then="lookup", now_ms=now_ms)
        return Abandon(
            self._may_have_run(f"Looking up the durable request answered HTTP {response.status}")
        )

    def _on_status(self, status: Status | None, *, now_ms: int) -> Step:
        assert self._call is not None
        if status is None:
            return Abandon(
                self._may_have_run("Sluice answered with a status that is not this request's")
            )
        self._seen = True
        self._state = status.state
        if status.state == "completed":
            if not status.has_result or not isinstance(status.result, dict):
                return self._call.invalid_result("a completed status without a result object")
            try:
                validate_result(self._request, status.result)
            except ProtocolError as exc:
                return self._call.invalid_result(exc.message)
            return Done(status.result)
        if status.state == "failed":
            return Fail(
                failure_error(
                    status.code,
                    status.message,
                    request_id=self._request_id,
                    attempts=self.attempts,
                )
            )
        if status.state == "cancelled":
            # Someone cancelled it while it waited: what the synchronous call answers then.
            return Fail(
                failure_error(
                    "REQUEST_CANCELLED",
                    status.message,
                    request_id=self._request_id,
                    attempts=self.attempts,
                )
            )
        return self._wait(self._poll_ms, then="lookup", now_ms=now_ms)

    def _submit(self, now_ms: int) -> Submit | Fail | Abandon:
        timeout_ms = self._timeout(now_ms)
        if timeout_ms is None:
            return self._timed_out()
        self._outstanding = "submit"
        return Submit(AttemptPlan(queue_wait_ms=self._queue_wait_ms, timeout_ms=timeout_ms))

    def _lookup(self, now_ms: int) -> Lookup | Fail | Abandon:
        timeout_ms = self._timeout(now_ms)
        if timeout_ms is None:
            return self._timed_out()
        self._outstanding = "lookup"
        return Lookup(timeout_ms)

    def _timeout(self, now_ms: int) -> int | None:
        remaining = self._deadline_ms - now_ms
        return None if remaining < 1 else min(self._transport_ms, remaining)

    def _wait(
        self, wait_ms: int, *, then: Literal["submit", "lookup"], now_ms: int
    ) -> Wait | Fail | Abandon:
        if now_ms >= self._deadline_ms:
            return self._timed_out()
        self._outstanding = None
        self._after_wait = then
        return Wait(min(wait_ms, self._deadline_ms - now_ms))

    def _timed_out(self) -> Fail | Abandon:
        if not self._maybe_accepted:
            # Nothing is held by Sluice: only typed rejections were answered so far.
            assert self._call is not None
            last = self._call.last_rejection
            return Fail(last if last is not None else self._insufficient(remaining_ms=0))
        where = f"still {self._state}" if self._state else "not yet confirmed as accepted"
        return Abandon(
            WorkspaceToolError(
                may_have_run_message(
                    f"The durable request was {where} when the call's time ran out"
                ),
                reason="timeout",
                not_started=False,
                request_id=self._request_id,
                attempts=self.attempts,
            )
        )

    def _insufficient(self, *, remaining_ms: int | None) -> WorkspaceToolError:
        return WorkspaceToolError(
            f"Not enough time left to submit the call: {remaining_ms} ms remain, and "
            f"{self._reserve_ms} ms are reserved for execution and delivery. Nothing was "
            "sent; give the call a longer deadline or a shorter command timeout.",
            reason="insufficient_time",
            not_started=True,
            request_id=self._request_id,
        )

    def _may_have_run(self, what: str) -> WorkspaceToolError:
        return WorkspaceToolError(
            may_have_run_message(what),
            reason="failed",
            not_started=False,
            request_id=self._request_id,
            attempts=self.attempts,
        )


def lookup_path(request_id: str) -> str:
    # The id was validated when the call was prepared, so it is a safe path segment.
    return f"{SUBMIT_PATH}/{request_id}"
