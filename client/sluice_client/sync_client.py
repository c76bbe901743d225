"""The blocking client: carries out the I/O of the flows in `core.py`, and nothing else.

Cancellation uses a `threading.Event`. A wait stops the moment it is set. An in-flight
request is aborted like this: when a cancel event is given, the attempt runs on a helper
thread while the caller's thread watches the event (every 10 ms). On cancel, the client first
asks Sluice to drop the call (DELETE by its request id, at most 2 s), so that a call that only
waited is reported as not started; then the attempt's socket is shut down
(`shutdown(SHUT_RDWR)`, which, unlike `close()`, wakes a thread blocked in `recv`) and the
caller gets the `cancelled` error. The socket is captured through httpx's `trace`
extension when the connection is made; to make sure every attempt makes one, this client
sends `Connection: close` and never reuses a connection. That costs a TCP (and TLS)
handshake per attempt, small next to the waits this client exists for.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Mapping
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
_CANCEL_POLL_S = 0.01
# Connection events whose stream holds the socket this attempt reads from. TLS wraps (and
# detaches) the TCP socket, so the TLS stream's socket is captured too.
_SOCKET_EVENTS = frozenset(
    {
        "connection.connect_tcp.complete",
        "connection.connect_unix_socket.complete",
        "connection.start_tls.complete",
    }
)


class _SocketAbort:
    """Collects the sockets of one attempt so that a cancel can shut them down."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._fired = False

    def trace(self, event: str, info: Mapping[str, Any]) -> None:
        if event not in _SOCKET_EVENTS or info.get("return_value") is None:
            return
        sock = info["return_value"].get_extra_info("socket")
        if not isinstance(sock, socket.socket):
            return
        with self._lock:
            if not self._fired:
                self._sockets.append(sock)
                return
        _shutdown(sock)  # the cancel came while this connection was being made

    def fire(self) -> None:
        with self._lock:
            self._fired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    # socket.socket.shutdown, not SSLSocket.shutdown: the latter also drops the TLS object
    # under the feet of the thread still reading from it. OSError: already closed, or
    # detached by the TLS wrap.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class Client(ClientCore, OperationHelpers[dict[str, Any]]):
    """Blocking Sluice client. See README.md for the retry rules."""

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
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
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
        self._probe_lock = threading.Lock()
        self._sleep = sleep
        self._http = httpx.Client(
            base_url=base_url,
            transport=transport,
            headers={"User-Agent": user_agent(), "Connection": "close"},
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def execute(
        self,
        request: Mapping[str, Any],
        *,
        deadline: float | None = None,
        cancel: threading.Event | None = None,
        request_id: str | None = None,
        durable: DurableMode | None = None,
        **budgets: Any,
    ) -> dict[str, Any]:
        """Run one operation; return its result or raise WorkspaceToolError.

        `deadline` is an absolute time on the client's clock (seconds); `budgets` override the
        client's for this call (`max_queue_wait_ms`, `max_rate_limit_wait_ms`,
        `max_request_timeout_ms`, `retry_queue_full`). `request_id` names the call for
        `cancel_request`; one is generated when absent. `durable` overrides the client's
        mode for this call (True, False or "auto").
        """
        flow = self._execute(request, deadline, cancel, request_id, durable, budgets)
        return self._drive(flow, cancel)

    def cancel_request(self, request_id: str, *, timeout_ms: int = 30_000) -> str:
        """Ask Sluice to drop a waiting call; returns "cancelled", "running" or "finished"."""
        return self._drive(self._cancel_request(request_id, timeout_ms), None)

    # -- I/O ---------------------------------------------------------------------------------

    def _drive(self, flow: Flow[T], cancel: threading.Event | None) -> T:
        steps = Steps(flow)
        while (effect := steps.effect) is not None:
            value, error = None, None
            try:
                value = self._perform(effect, cancel)
            except BaseException as exc:  # thrown into the flow, which decides what it means
                error = exc
            steps.resume(value, error)
        return steps.result

    def _perform(self, effect: Effect, cancel: threading.Event | None) -> Any:
        if isinstance(effect, Send):
            return self._send(effect, cancel if effect.cancellable else None)
        if isinstance(effect, Sleep):
            return self._wait(effect.seconds, cancel)
        if isinstance(effect, Mint):
            return self._credentials_source()
        assert isinstance(effect, Locked)
        with self._probe_lock:
            return self._drive(effect.flow, cancel)

    def _wait(self, seconds: float, cancel: threading.Event | None) -> bool:
        """Sleep; False when the cancel event fired (the wait then ends at once)."""
        if self._sleep is not None:
            self._sleep(seconds)
        elif cancel is not None:
            return not cancel.wait(seconds)
        else:
            time.sleep(seconds)
        return cancel is None or not cancel.is_set()

    def _send(self, send: Send, cancel: threading.Event | None) -> RawResponse:
        """One exchange; with `cancel`, aborted when it fires."""
        request = self._http.build_request(
            send.method, send.path, content=send.body, headers=send.headers, timeout=send.timeout
        )
        if cancel is None:
            return self._exchange(request)
        abort = _SocketAbort()
        request.extensions["trace"] = abort.trace
        outcome: list[RawResponse | BaseException] = []
        done = threading.Event()

        def attempt() -> None:
            try:
                outcome.append(self._exchange(request))
            except BaseException as exc:  # handed to the caller's thread
                outcome.append(exc)
            finally:
                done.set()

        threading.Thread(target=attempt, name="sluice-client-attempt", daemon=True).start()
        while not done.wait(_CANCEL_POLL_S):
            if cancel.is_set():
                withdraw = self._withdraw_before_abort(send)
                withdrawn = None if withdraw is None else self._drive(withdraw, None)
                abort.fire()
                raise Aborted(withdrawn)
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    def _exchange(self, request: httpx.Request) -> RawResponse:
        response = self._http.send(request, stream=True)
        try:
            buffer = BodyBuffer(read_limit(response.status_code))
            try:
                for chunk in response.iter_bytes():
                    if not buffer.feed(chunk):
                        break
            except httpx.HTTPError:
                buffer.cut_off = True  # the status is real, the body is not whole
            return buffer.response(response.status_code, response.headers)
        finally:
            response.close()
