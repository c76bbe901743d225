"""The asyncio client: carries out the flows of `core.py` like `Client`, awaiting instead of
blocking.

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
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

import httpx

from sluice_client._base import Credentials, user_agent
from sluice_client.core import ClientCore
from sluice_client.durable_answers import DEFAULT_POLL_INTERVAL_MS, DurableMode
from sluice_client.effects import (
    Aborted,
    Effect,
    Flow,
    Locked,
    Mint,
    Send,
    Sleep,
    Steps,
)
from sluice_client.operations import OperationHelpers
from sluice_client.responses import BodyBuffer, RawResponse, read_limit

T = TypeVar("T")


async def _unless_cancelled(
    work: Awaitable[T],
    cancel: asyncio.Event | None,
    withdraw: Callable[[], Awaitable[str | None]] | None = None,
) -> T:
    """Await `work`, or abort it as soon as `cancel` is set (then raise Aborted). `withdraw`
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
        raise Aborted(withdrawn)
    return task.result()


class AsyncClient(ClientCore, OperationHelpers[Coroutine[Any, Any, dict[str, Any]]]):
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
        super().__init__(
            api_key=api_key,
            worker_id=worker_id,
            max_queue_wait_ms=max_queue_wait_ms,
            max_rate_limit_wait_ms=max_rate_limit_wait_ms,
            max_request_timeout_ms=max_request_timeout_ms,
            retry_queue_full=retry_queue_full,
            durable=durable,
            poll_interval_ms=poll_interval_ms,
            clock=clock,
            wall_clock=wall_clock,
        )
        self._probe_lock = asyncio.Lock()
        self._sleep = sleep or asyncio.sleep
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
        flow = self._execute(request, deadline, cancel, request_id, durable, budgets)
        return await self._drive(flow, cancel)

    async def cancel_request(self, request_id: str, *, timeout_ms: int = 30_000) -> str:
        """Ask Sluice to drop a waiting call; returns "cancelled", "running" or "finished"."""
        return await self._drive(self._cancel_request(request_id, timeout_ms), None)

    # -- I/O ---------------------------------------------------------------------------------

    async def _drive(self, flow: Flow[T], cancel: asyncio.Event | None) -> T:
        steps = Steps(flow)
        while (effect := steps.effect) is not None:
            value, error = None, None
            try:
                value = await self._perform(effect, cancel)
            except BaseException as exc:  # a task's cancellation too: the flow may withdraw
                error = exc
            steps.resume(value, error)
        return steps.result

    async def _perform(self, effect: Effect, cancel: asyncio.Event | None) -> Any:
        if isinstance(effect, Send):
            withdraw = self._withdraw_before_abort(effect)
            return await _unless_cancelled(
                self._send(effect),
                cancel if effect.cancellable else None,
                None if withdraw is None else lambda: self._drive(withdraw, None),
            )
        if isinstance(effect, Sleep):
            try:
                await _unless_cancelled(self._sleep(effect.seconds), cancel)
            except Aborted:
                return False
            return True
        if isinstance(effect, Mint):
            minted = self._credentials_source()
            return await minted if inspect.isawaitable(minted) else minted
        assert isinstance(effect, Locked)
        async with self._probe_lock:
            return await self._drive(effect.flow, cancel)

    async def _send(self, send: Send) -> RawResponse:
        request = self._http.build_request(
            send.method, send.path, content=send.body, headers=send.headers, timeout=send.timeout
        )
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
