"""The blocking client: an I/O shell around `CallPolicy`.

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


class _Aborted(Exception):
    """The cancel event fired while a request was in flight; `withdrawn` is Sluice's answer
    to the DELETE sent for it first, if one was."""

    def __init__(self, withdrawn: str | None = None) -> None:
        super().__init__(withdrawn)
        self.withdrawn = withdrawn


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


class Client(OperationHelpers[dict[str, Any]]):
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
        self._probe_lock = threading.Lock()
        self._api_key = api_key
        self.worker_id = worker_id
        # `clock` is in seconds like time.monotonic; a `deadline` is a point on it.
        self._clock = clock or time.monotonic
        self._sleep = sleep
        self._wall_clock = wall_clock or time.time
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
        call = prepare_call(
            request, budgets=self._budgets, overrides=budgets, request_id=request_id
        )
        mode = call_durable_mode(self._durable, durable, call.request_id)
        if mode is not False:
            if cancel is not None and cancel.is_set():
                raise cancelled_before_submit(call.request_id)
            if self._offers_durable(call, cancel):
                return self._execute_durable(call, deadline, cancel)
            if mode is True:
                raise not_offered_error(call.request_id)
        return self._execute_sync(call, deadline, cancel)

    def _execute_sync(
        self, call: PreparedCall, deadline: float | None, cancel: threading.Event | None
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
            headers, plan = self._plan(policy, call)
            policy.sent()
            try:
                response = self._send(
                    "POST",
                    EXECUTE_PATH,
                    call.body,
                    headers,
                    plan.timeout_ms,
                    cancel,
                    withdraw=call.request_id,
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
            if not self._wait(decision.wait_ms / 1000, cancel):
                raise policy.cancelled(in_flight=False).error
            policy.wait_over(now_ms=self._now_ms())

    # -- durable requests (contract §2.7) ----------------------------------------------------

    def _offers_durable(self, call: PreparedCall, cancel: threading.Event | None) -> bool:
        """Ask Sluice once per client; only a definite answer is remembered."""
        with self._probe_lock:
            if self._durable_offered is not None:
                return self._durable_offered
            headers = lookup_headers(self._mint(call.request_id))
            try:
                response = self._send(
                    "GET", CAPABILITIES_PATH, None, headers, TRANSPORT_TIMEOUT_MS, cancel
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

    def _execute_durable(
        self, call: PreparedCall, deadline: float | None, cancel: threading.Event | None
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
        while True:
            if isinstance(step, Done):
                return step.result
            if isinstance(step, Fail):
                raise step.error
            if isinstance(step, Abandon):
                raise policy.settle(step, self._withdraw(call.request_id))
            if cancel is not None and cancel.is_set():
                step = policy.cancelled(in_flight=False)
            elif isinstance(step, Wait):
                if self._wait(step.wait_ms / 1000, cancel):
                    step = policy.wait_over(now_ms=self._now_ms())
                else:
                    step = policy.cancelled(in_flight=False)
            else:
                step = self._durable_request(policy, call, step, cancel)

    def _durable_request(
        self,
        policy: DurablePolicy,
        call: PreparedCall,
        step: Submit | Lookup,
        cancel: threading.Event | None,
    ) -> Step:
        try:
            credentials = self._mint(call.request_id)
        except WorkspaceToolError as exc:
            return policy.credentials_failed(exc)
        try:
            if isinstance(step, Submit):
                headers = attempt_headers(
                    credentials=credentials, worker_id=self.worker_id, call=call, plan=step.plan
                )
                policy.sent()
                response = self._send(
                    "POST", SUBMIT_PATH, call.body, headers, step.plan.timeout_ms, cancel
                )
            else:
                path = lookup_path(call.request_id)
                headers = lookup_headers(credentials)
                response = self._send("GET", path, None, headers, step.timeout_ms, cancel)
        except _Aborted:
            return policy.cancelled(in_flight=True)
        except httpx.HTTPError as exc:
            return policy.on_transport_error(exc, now_ms=self._now_ms())
        return policy.on_answer(response, now_ms=self._now_ms(), wall_now_s=self._wall_clock())

    def _withdraw(self, request_id: str, timeout_ms: int = TRANSPORT_TIMEOUT_MS) -> str | None:
        """DELETE a call nobody will wait for; its answer, or None when that failed.

        Not tied to the cancel event: a cancelled call is exactly the one to withdraw.
        """
        try:
            return self.cancel_request(request_id, timeout_ms=timeout_ms)
        except WorkspaceToolError:
            return None

    def cancel_request(self, request_id: str, *, timeout_ms: int = 30_000) -> str:
        """Ask Sluice to drop a waiting call; returns "cancelled", "running" or "finished"."""
        url = cancel_url(request_id)
        headers = self._mint(request_id)
        try:
            response = self._exchange(
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

    def _mint(self, request_id: str) -> dict[str, str]:
        """Call the credentials source once (rule 5)."""
        try:
            minted = self._api_key() if callable(self._api_key) else self._api_key
            return credential_headers(minted)
        except Exception as exc:
            raise credential_failure(exc, request_id) from exc

    def _plan(self, policy: CallPolicy, call: PreparedCall) -> tuple[dict[str, str], AttemptPlan]:
        attempt_start_ms = self._now_ms()
        # Checked before minting too, so a call that cannot fit does not mint a token.
        early = policy.plan(attempt_start_ms=attempt_start_ms, now_ms=attempt_start_ms)
        if isinstance(early, Fail):
            raise early.error
        credentials = self._mint(call.request_id)
        plan = policy.plan(attempt_start_ms=attempt_start_ms, now_ms=self._now_ms())
        if isinstance(plan, Fail):
            raise plan.error
        headers = attempt_headers(
            credentials=credentials, worker_id=self.worker_id, call=call, plan=plan
        )
        return headers, plan

    def _wait(self, seconds: float, cancel: threading.Event | None) -> bool:
        """Sleep; False when the cancel event fired (the wait then ends at once)."""
        if self._sleep is not None:
            self._sleep(seconds)
        elif cancel is not None:
            return not cancel.wait(seconds)
        else:
            time.sleep(seconds)
        return cancel is None or not cancel.is_set()

    def _send(
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        timeout_ms: int,
        cancel: threading.Event | None,
        *,
        withdraw: str | None = None,
    ) -> RawResponse:
        """One exchange; with `cancel`, aborted when it fires. `withdraw` names a request id
        to DELETE before the socket is shut, so a call Sluice drops unstarted is known as such."""
        total_s = timeout_ms / 1000
        timeout = httpx.Timeout(total_s, connect=min(10.0, total_s))
        request = self._http.build_request(
            method, path, content=body, headers=headers, timeout=timeout
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
                withdrawn = self._withdraw(withdraw, WITHDRAW_TIMEOUT_MS) if withdraw else None
                abort.fire()
                raise _Aborted(withdrawn)
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
