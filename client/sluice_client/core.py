"""One call's whole course, written once for `Client` and `AsyncClient`.

Each flow here is a generator. It yields the I/O it needs as an effect (`Mint`, `Send`,
`Sleep`, `Locked`) and is resumed with that I/O's outcome, or has its exception thrown in at
the `yield`. The two clients only carry effects out, one blocking and one awaiting, so every
decision (what to send, when to retry, what a cancel means, when to withdraw a call) is made
once, here and in the policies this module drives.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from sluice_client._base import (
    EXECUTE_PATH,
    Credentials,
    PreparedCall,
    attempt_headers,
    call_durable_mode,
    cancel_transport_error,
    cancel_url,
    check_credentials,
    check_worker_id,
    credential_failure,
    credential_headers,
    lookup_headers,
    prepare_call,
    to_ms,
)
from sluice_client.durable import (
    Abandon,
    Done,
    DurablePolicy,
    Lookup,
    Step,
    Submit,
    Wait,
    lookup_path,
)
from sluice_client.durable_answers import (
    CAPABILITIES_PATH,
    SUBMIT_PATH,
    TRANSPORT_TIMEOUT_MS,
    WITHDRAW_TIMEOUT_MS,
    DurableMode,
    cancelled_before_submit,
    check_durable_mode,
    check_poll_interval_ms,
    not_offered_error,
    probe_outcome,
    probe_transport_error,
)
from sluice_client.effects import (
    Aborted,
    CancelFlag,
    Flow,
    Locked,
    Mint,
    Send,
    Sleep,
    request_timeout,
)
from sluice_client.errors import WorkspaceToolError
from sluice_client.policy import AttemptPlan, Budgets, CallPolicy, Fail, Retry
from sluice_client.responses import RawResponse, cancel_state


class ClientCore:
    """The settings and flows both clients share. It does no I/O itself."""

    def __init__(
        self,
        *,
        api_key: Credentials,
        worker_id: str | None,
        max_queue_wait_ms: int,
        max_rate_limit_wait_ms: int,
        max_request_timeout_ms: int | None,
        retry_queue_full: bool,
        durable: DurableMode,
        poll_interval_ms: int,
        clock: Callable[[], float] | None,
        wall_clock: Callable[[], float] | None,
    ) -> None:
        check_credentials(api_key)
        check_worker_id(worker_id)
        self._budgets = Budgets(
            max_queue_wait_ms=max_queue_wait_ms,
            max_rate_limit_wait_ms=max_rate_limit_wait_ms,
            max_request_timeout_ms=max_request_timeout_ms,
            retry_queue_full=retry_queue_full,
        )
        self._durable = check_durable_mode(durable)
        self._poll_interval_ms = check_poll_interval_ms(poll_interval_ms)
        # Whether Sluice offers durable requests: asked once per client, on first need.
        self._durable_offered: bool | None = None
        self._api_key = api_key
        self.worker_id = worker_id
        # `clock` is in seconds like time.monotonic; a `deadline` is a point on it.
        self._clock = clock or time.monotonic
        self._wall_clock = wall_clock or time.time

    # -- one call ----------------------------------------------------------------------------

    def _execute(
        self,
        request: Mapping[str, Any],
        deadline: float | None,
        cancel: CancelFlag | None,
        request_id: str | None,
        durable: DurableMode | None,
        budgets: Mapping[str, Any],
    ) -> Flow[dict[str, Any]]:
        """The arguments of `Client.execute`, with `budgets` the per-call overrides."""
        call = prepare_call(
            request, budgets=self._budgets, overrides=budgets, request_id=request_id
        )
        mode = call_durable_mode(self._durable, durable, call.request_id)
        if mode is not False:
            if cancel is not None and cancel.is_set():
                raise cancelled_before_submit(call.request_id)
            offered: bool = yield Locked(self._probe(call))
            if offered:
                return (yield from self._execute_durable(call, deadline, cancel))
            if mode is True:
                raise not_offered_error(call.request_id)
        return (yield from self._execute_sync(call, deadline, cancel))

    def _execute_sync(
        self, call: PreparedCall, deadline: float | None, cancel: CancelFlag | None
    ) -> Flow[dict[str, Any]]:
        policy = CallPolicy(
            request=call.request,
            budgets=call.budgets,
            start_ms=self._now_ms(),
            deadline_ms=None if deadline is None else to_ms(deadline),
            request_id=call.request_id,
        )
        while True:
            if cancel is not None and cancel.is_set():
                raise policy.cancelled(in_flight=False).error
            headers, plan = yield from self._plan(policy, call)
            policy.sent()
            send = Send(
                "POST",
                EXECUTE_PATH,
                call.body,
                headers,
                request_timeout(plan.timeout_ms),
                withdraw=call.request_id,
            )
            try:
                response: RawResponse = yield send
            except Aborted as aborted:
                raise policy.cancelled(in_flight=True, withdrawn=aborted.withdrawn).error from None
            except httpx.HTTPError as exc:
                raise policy.on_transport_error(exc).error from exc
            decision = policy.on_response(
                response, now_ms=self._now_ms(), wall_now_s=self._wall_clock()
            )
            if isinstance(decision, Fail):
                raise decision.error
            if not isinstance(decision, Retry):
                return decision
            waited: bool = yield Sleep(decision.wait_ms / 1000)
            if not waited:
                raise policy.cancelled(in_flight=False).error
            policy.wait_over(now_ms=self._now_ms())

    def _plan(
        self, policy: CallPolicy, call: PreparedCall
    ) -> Flow[tuple[dict[str, str], AttemptPlan]]:
        attempt_start_ms = self._now_ms()
        # Checked before minting too, so a call that cannot fit does not mint a token.
        early = policy.plan(attempt_start_ms=attempt_start_ms, now_ms=attempt_start_ms)
        if isinstance(early, Fail):
            raise early.error
        credentials = yield from self._mint(call.request_id)
        plan = policy.plan(attempt_start_ms=attempt_start_ms, now_ms=self._now_ms())
        if isinstance(plan, Fail):
            raise plan.error
        headers = attempt_headers(
            credentials=credentials, worker_id=self.worker_id, call=call, plan=plan
        )
        return headers, plan

    # -- durable requests (contract §2.7) ----------------------------------------------------

    def _probe(self, call: PreparedCall) -> Flow[bool]:
        """Whether Sluice offers durable requests; only a definite answer is remembered."""
        if self._durable_offered is not None:
            return self._durable_offered
        headers = lookup_headers((yield from self._mint(call.request_id)))
        send = Send("GET", CAPABILITIES_PATH, None, headers, request_timeout(TRANSPORT_TIMEOUT_MS))
        try:
            response: RawResponse = yield send
        except Aborted:
            raise cancelled_before_submit(call.request_id) from None
        except httpx.HTTPError as exc:
            raise probe_transport_error(exc, call.request_id) from exc
        outcome = probe_outcome(response, wall_now_s=self._wall_clock(), request_id=call.request_id)
        if isinstance(outcome, WorkspaceToolError):
            raise outcome
        self._durable_offered = outcome
        return outcome

    def _execute_durable(
        self, call: PreparedCall, deadline: float | None, cancel: CancelFlag | None
    ) -> Flow[dict[str, Any]]:
        policy = DurablePolicy(
            request=call.request,
            budgets=call.budgets,
            start_ms=self._now_ms(),
            deadline_ms=None if deadline is None else to_ms(deadline),
            request_id=call.request_id,
            poll_interval_ms=self._poll_interval_ms,
        )
        step: Step = policy.first(now_ms=self._now_ms())
        try:
            while True:
                if isinstance(step, Done):
                    return step.result
                if isinstance(step, Fail):
                    raise step.error
                if isinstance(step, Abandon):
                    raise policy.settle(step, (yield from self._withdraw(call.request_id)))
                if cancel is not None and cancel.is_set():
                    step = policy.cancelled(in_flight=False)
                elif isinstance(step, Wait):
                    waited: bool = yield Sleep(step.wait_ms / 1000)
                    if waited:
                        step = policy.wait_over(now_ms=self._now_ms())
                    else:
                        step = policy.cancelled(in_flight=False)
                else:
                    step = yield from self._durable_request(policy, call, step)
        except asyncio.CancelledError:
            # The async client's task was cancelled: still withdraw a call Sluice may hold,
            # then let the cancellation go on as asyncio expects.
            if policy.maybe_accepted:
                yield from self._withdraw(call.request_id)
            raise

    def _durable_request(
        self, policy: DurablePolicy, call: PreparedCall, step: Submit | Lookup
    ) -> Flow[Step]:
        try:
            credentials = yield from self._mint(call.request_id)
        except WorkspaceToolError as exc:
            return policy.credentials_failed(exc)
        if isinstance(step, Submit):
            headers = attempt_headers(
                credentials=credentials, worker_id=self.worker_id, call=call, plan=step.plan
            )
            policy.sent()
            timeout = request_timeout(step.plan.timeout_ms)
            send = Send("POST", SUBMIT_PATH, call.body, headers, timeout)
        else:
            timeout = request_timeout(step.timeout_ms)
            send = Send(
                "GET", lookup_path(call.request_id), None, lookup_headers(credentials), timeout
            )
        try:
            response: RawResponse = yield send
        except Aborted:
            return policy.cancelled(in_flight=True)
        except httpx.HTTPError as exc:
            return policy.on_transport_error(exc, now_ms=self._now_ms())
        return policy.on_answer(response, now_ms=self._now_ms(), wall_now_s=self._wall_clock())

    # -- cancelling by request id ------------------------------------------------------------

    def _cancel_request(self, request_id: str, timeout_ms: int) -> Flow[str]:
        """DELETE a call: "cancelled", "running" or "finished". Never aborted by a cancel flag."""
        url = cancel_url(request_id)
        headers = yield from self._mint(request_id)
        send = Send(
            "DELETE", url, None, headers, httpx.Timeout(timeout_ms / 1000), cancellable=False
        )
        try:
            response: RawResponse = yield send
        except httpx.HTTPError as exc:
            raise cancel_transport_error(exc, request_id) from exc
        outcome = cancel_state(response, request_id=request_id)
        if isinstance(outcome, str):
            return outcome
        raise outcome

    def _withdraw(
        self, request_id: str, timeout_ms: int = TRANSPORT_TIMEOUT_MS
    ) -> Flow[str | None]:
        """DELETE a call nobody will wait for; its answer, or None when that failed.

        Not tied to the cancel flag: a cancelled call is exactly the one to withdraw.
        """
        try:
            return (yield from self._cancel_request(request_id, timeout_ms))
        except WorkspaceToolError:
            return None

    def _withdraw_before_abort(self, send: Send) -> Flow[str | None] | None:
        """What a client runs when the cancel flag fires during `send`, before it drops the
        connection: a short DELETE, so that a call Sluice drops unstarted is known as such."""
        return None if send.withdraw is None else self._withdraw(send.withdraw, WITHDRAW_TIMEOUT_MS)

    # -- helpers -----------------------------------------------------------------------------

    def _mint(self, request_id: str) -> Flow[dict[str, str]]:
        """Call the credentials source once (rule 5); any failure means nothing was sent."""
        try:
            return credential_headers((yield Mint()))
        except Exception as exc:
            raise credential_failure(exc, request_id) from exc

    def _credentials_source(self) -> object:
        """What the client performs for `Mint` (the async one awaits an awaitable result)."""
        return self._api_key() if callable(self._api_key) else self._api_key

    def _now_ms(self) -> int:
        return to_ms(self._clock())
