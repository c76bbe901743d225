"""The asyncio client: the same I/O shell as `Client`, awaiting instead of blocking.

Cancelling the task that awaits `execute` stops a wait at once and aborts an in-flight
request (httpx closes the connection, so Sluice drops the waiting call); the task then ends
with `asyncio.CancelledError` as asyncio expects, never with a swallowed cancellation. For
callers that prefer a flag, `cancel=` also takes an `asyncio.Event`, which ends the call
with `WorkspaceToolError(reason="cancelled")` instead.
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
    cancel_transport_error,
    cancel_url,
    check_credentials,
    check_worker_id,
    credential_failure,
    credential_headers,
    prepare_call,
    to_ms,
    user_agent,
)
from sluice_client.operations import OperationHelpers
from sluice_client.policy import AttemptPlan, Budgets, CallPolicy, Fail, Retry
from sluice_client.responses import BodyBuffer, RawResponse, cancel_state, read_limit

T = TypeVar("T")


class _Aborted(Exception):
    """The cancel event fired while the call was waiting or in flight."""


async def _unless_cancelled(work: Awaitable[T], cancel: asyncio.Event | None) -> T:
    """Await `work`, or abort it as soon as `cancel` is set (then raise _Aborted)."""
    if cancel is None:
        return await work
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        aborted = not task.done()
        if aborted:
            task.cancel()
            # Let the attempt close its connection before the caller hears of the cancel;
            # whatever it raises while being torn down is moot.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    if aborted:
        raise _Aborted
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
        **budgets: Any,
    ) -> dict[str, Any]:
        """Run one operation; see `Client.execute`."""
        call = prepare_call(
            request, budgets=self._budgets, overrides=budgets, request_id=request_id
        )
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
                response = await _unless_cancelled(self._send(call.body, headers, plan), cancel)
            except _Aborted:
                raise policy.cancelled(in_flight=True).error from None
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

    async def cancel_request(self, request_id: str) -> str:
        """Ask Sluice to drop a waiting call; returns "cancelled", "running" or "finished"."""
        url = cancel_url(request_id)
        headers = await self._mint(request_id)
        try:
            response = await self._exchange(
                self._http.build_request("DELETE", url, headers=headers, timeout=30.0)
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

    async def _send(self, body: bytes, headers: dict[str, str], plan: AttemptPlan) -> RawResponse:
        total_s = plan.timeout_ms / 1000
        timeout = httpx.Timeout(total_s, connect=min(10.0, total_s))
        request = self._http.build_request(
            "POST", EXECUTE_PATH, content=body, headers=headers, timeout=timeout
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
