"""The asyncio client: the same I/O shell as `Client`, awaiting instead of blocking.

Cancelling the task that awaits `execute` stops a wait at once and aborts an in-flight
request (httpx closes the connection, so Sluice drops the waiting call); the task then ends
with `asyncio.CancelledError` as asyncio expects, never with a swallowed cancellation. For
callers that prefer a flag, `cancel=` also takes an `asyncio.Event`, which ends the call
with `WorkspaceToolError(reason="cancelled")` instead; it first asks Sluice to drop the call
(DELETE by its request id), so a call that only waited is reported as not started.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

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
    user_agent,
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
    DEFAULT_POLL_INTERVAL_MS,
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
from sluice_client.errors import WorkspaceToolError
from sluice_client.operations import OperationHelpers
from sluice_client.policy import AttemptPlan, Budgets, CallPolicy, Fail, Retry
from sluice_client.responses import BodyBuffer, RawResponse, cancel_state, read_limit

T = TypeVar("T")


class _Aborted(Exception):
    """The cancel event fired while the call was waiting or in flight; `withdrawn` is Sluice's
    answer to the DELETE sent for it first, if one was."""

    def __init__(self, withdrawn: str | None = None) -> None:
        super().__init__(withdrawn)
        self.withdrawn = withdrawn


async def _unless_cancelled(
    work: Awaitable[T],
    cancel: asyncio.Event | None,
    withdraw: Callable[[], Awaitable[str | None]] | None = None,
) -> T:
    """Await `work`, or abort it as soon as `cancel` is set (then raise _Aborted). `withdraw`
    runs before the abort, so a call Sluice drops unstarted is known as such."""
    if cancel is None:
        return await work
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(cancel.wait())
    withdrawn, aborted = None, False
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if withdraw is not None and not task.done():
            # Once asked, the call counts as cancelled even if its answer lands meanwhile.
            withdrawn, aborted = await withdraw(), True
    finally:
        watcher.cancel()
        if not task.done():
            aborted = True
            task.cancel()
            # Let the attempt close its connection before the caller hears of the cancel;
            # whatever it raises while being torn down is moot.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    if aborted:
        raise _Aborted(withdrawn)
    return task.result()


class AsyncClient(OperationHelpers[Awaitable[dict[str, Any]]]):
    """Asyncio Sluice client; the arguments are those of `Client`, with an async `sleep`."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: Credentials,
        worker_id: str | None = None,
        max_queue_wait_ms: int = 300_000,
        max_rate_limit_wait_ms: int = 20_000,
        max_request_timeout_ms: int | None = None,
        retry_queue_full: bool = False,
        durable: DurableMode = False,
        poll_interval_ms: int = DEFAULT_POLL_INTERVAL_MS,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        wall_clock: Callable[[], float] | None = None,
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
        # Whether Sluice offers durable requests: asked once per client, on first need; the
        # lock makes concurrent first calls share one probe.
        self._durable_offered: bool | None = None
        self._probe_lock = asyncio.Lock()
        self._api_key = api_key
        self.worker_id = worker_id
        self._clock = clock or time.monotonic
        self._sleep = sleep or asyncio.sleep
        self._wall_clock = wall_clock or time.time
        self._http = httpx.AsyncClient(
            base_url=base_url, transport=transport, headers={"User-Agent": user_agent()}
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def execute(
        self,
        request: Mapping[str, Any],
        *,
        deadline: float | None = None,
        cancel: asyncio.Event | None = None,
        request_id: str | None = None,
        durable: DurableMode | None = None,
        **budgets: Any,
    ) -> dict[str, Any]:
        """Run one operation; see `Client.execute`."""
        call = prepare_call(
            request, budgets=self._budgets, overrides=budgets, request_id=request_id
        )
        mode = call_durable_mode(self._durable, durable, call.request_id)
        if mode is not False:
            if cancel is not None and cancel.is_set():
                raise cancelled_before_submit(call.request_id)
            if await self._offers_durable(call, cancel):
                return await self._execute_durable(call, deadline, cancel)
            if mode is True:
                raise not_offered_error(call.request_id)
        return await self._execute_sync(call, deadline, cancel)

    async def _execute_sync(
        self, call: PreparedCall, deadline: float | None, cancel: asyncio.Event | None
    ) -> dict[str, Any]:
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
            headers, plan = await self._plan(policy, call)
            policy.sent()
            try:
                response = await _unless_cancelled(
                    self._send("POST", EXECUTE_PATH, call.body, headers, plan.timeout_ms),
                    cancel,
                    lambda: self._withdraw(call.request_id, WITHDRAW_TIMEOUT_MS),
                )
            except _Aborted as aborted:
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
            try:
                await _unless_cancelled(self._sleep(decision.wait_ms / 1000), cancel)
            except _Aborted:
                raise policy.cancelled(in_flight=False).error from None
            policy.wait_over(now_ms=self._now_ms())

    # -- durable requests (contract §2.7) ----------------------------------------------------

    async def _offers_durable(self, call: PreparedCall, cancel: asyncio.Event | None) -> bool:
        async with self._probe_lock:
            if self._durable_offered is not None:
                return self._durable_offered
            headers = lookup_headers(await self._mint(call.request_id))
            try:
                response = await _unless_cancelled(
                    self._send("GET", CAPABILITIES_PATH, None, headers, TRANSPORT_TIMEOUT_MS),
                    cancel,
                )
            except _Aborted:
                raise cancelled_before_submit(call.request_id) from None
            except httpx.HTTPError as exc:
                raise probe_transport_error(exc, call.request_id) from exc
            outcome = probe_outcome(
                response, wall_now_s=self._wall_clock(), request_id=call.request_id
            )
            if isinstance(outcome, WorkspaceToolError):
                raise outcome
            self._durable_offered = outcome
            return outcome

    async def _execute_durable(
        self, call: PreparedCall, deadline: float | None, cancel: asyncio.Event | None
    ) -> dict[str, Any]:
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
                    raise policy.settle(step, await self._withdraw(call.request_id))
                if cancel is not None and cancel.is_set():
                    step = policy.cancelled(in_flight=False)
                elif isinstance(step, Wait):
                    try:
                        await _unless_cancelled(self._sleep(step.wait_ms / 1000), cancel)
                        step = policy.wait_over(now_ms=self._now_ms())
                    except _Aborted:
                        step = policy.cancelled(in_flight=False)
                else:
                    step = await self._durable_request(policy, call, step, cancel)
        except asyncio.CancelledError:
            # The task was cancelled: still withdraw a call Sluice may hold, then let the
            # cancellation go on as asyncio expects.
            if policy.maybe_accepted:
                await self._withdraw(call.request_id)
            raise

    async def _durable_request(
        self,
        policy: DurablePolicy,
        call: PreparedCall,
        step: Submit | Lookup,
        cancel: asyncio.Event | None,
    ) -> Step:
        try:
            credentials = await self._mint(call.request_id)
        except WorkspaceToolError as exc:
            return policy.credentials_failed(exc)
        try:
            if isinstance(step, Submit):
                headers = attempt_headers(
                    credentials=credentials, worker_id=self.worker_id, call=call, plan=step.plan
                )
                policy.sent()
                sending = self._send("POST", SUBMIT_PATH, call.body, headers, step.plan.timeout_ms)
            else:
                headers = lookup_headers(credentials)
                path = lookup_path(call.request_id)
                sending = self._send("GET", path, None, headers, step.timeout_ms)
            response = await _unless_cancelled(sending, cancel)
        except _Aborted:
            return policy.cancelled(in_flight=True)
        except httpx.HTTPError as exc:
            return policy.on_transport_error(exc, now_ms=self._now_ms())
        return policy.on_answer(response, now_ms=self._now_ms(), wall_now_s=self._wall_clock())

    async def _withdraw(
        self, request_id: str, timeout_ms: int = TRANSPORT_TIMEOUT_MS
    ) -> str | None:
        """DELETE a call nobody will wait for; its answer, or None when that failed."""
        try:
            return await self.cancel_request(request_id, timeout_ms=timeout_ms)
        except WorkspaceToolError:
            return None

    async def cancel_request(self, request_id: str, *, timeout_ms: int = 30_000) -> str:
        """Ask Sluice to drop a waiting call; returns "cancelled", "running" or "finished"."""
        url = cancel_url(request_id)
        headers = await self._mint(request_id)
        try:
            response = await self._exchange(
                self._http.build_request("DELETE", url, headers=headers, timeout=timeout_ms / 1000)
            )
        except httpx.HTTPError as exc:
            raise cancel_transport_error(exc, request_id) from exc
        outcome = cancel_state(response, request_id=request_id)
        if isinstance(outcome, str):
            return outcome
        raise outcome

    # -- I/O ---------------------------------------------------------------------------------

    def _now_ms(self) -> int:
        return to_ms(self._clock())

    async def _mint(self, request_id: str) -> dict[str, str]:
        try:
            minted: Any = self._api_key() if callable(self._api_key) else self._api_key
            if inspect.isawaitable(minted):
                minted = await minted
            return credential_headers(minted)
        except Exception as exc:
            raise credential_failure(exc, request_id) from exc

    async def _plan(
        self, policy: CallPolicy, call: PreparedCall
    ) -> tuple[dict[str, str], AttemptPlan]:
        attempt_start_ms = self._now_ms()
        early = policy.plan(attempt_start_ms=attempt_start_ms, now_ms=attempt_start_ms)
        if isinstance(early, Fail):
            raise early.error
        credentials = await self._mint(call.request_id)
        plan = policy.plan(attempt_start_ms=attempt_start_ms, now_ms=self._now_ms())
        if isinstance(plan, Fail):
            raise plan.error
        headers = attempt_headers(
            credentials=credentials, worker_id=self.worker_id, call=call, plan=plan
        )
        return headers, plan

    async def _send(
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        timeout_ms: int,
    ) -> RawResponse:
        total_s = timeout_ms / 1000
        timeout = httpx.Timeout(total_s, connect=min(10.0, total_s))
        request = self._http.build_request(
            method, path, content=body, headers=headers, timeout=timeout
        )
        return await self._exchange(request)

    async def _exchange(self, request: httpx.Request) -> RawResponse:
        response = await self._http.send(request, stream=True)
        try:
            buffer = BodyBuffer(read_limit(response.status_code))
            try:
                async for chunk in response.aiter_bytes():
                    if not buffer.feed(chunk):
                        break
            except httpx.HTTPError:
                buffer.cut_off = True
            return buffer.response(response.status_code, response.headers)
        finally:
            await response.aclose()
