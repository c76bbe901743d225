"""The shared flows of `core.py`, driven by hand: each test plays the client's part, answering
every effect a flow yields, with no HTTP and no event loop. These are the rules both clients
get from one place: what is sent and in which order, what a cancel means, when a call is
withdrawn.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

import httpx
import pytest
from sluice_client._base import CANCEL_PATH, EXECUTE_PATH, QUEUE_WAIT_HEADER, REQUEST_ID_HEADER
from sluice_client.core import ClientCore
from sluice_client.durable_answers import (
    CAPABILITIES_PATH,
    SUBMIT_PATH,
    TRANSPORT_TIMEOUT_MS,
    WITHDRAW_TIMEOUT_MS,
)
from sluice_client.effects import Aborted, Effect, Flow, Locked, Mint, Send, Sleep, Steps
from sluice_client.errors import WorkspaceToolError
from sluice_client.responses import RawResponse

READ = {"protocolVersion": 1, "operation": "read_file", "workspaceId": "ws", "path": "a.txt"}
READ_RESULT = {
    **READ,
    "content": "hello",
    "startLine": 1,
    "endLine": 1,
    "truncated": False,
}
REQUEST_ID = "call-0123456789abcdef"
E = TypeVar("E", bound=Effect)


class Flag:
    """A cancel flag the test sets by hand."""

    def __init__(self) -> None:
        self.set = False

    def is_set(self) -> bool:
        return self.set


class Hand:
    """Plays the client: checks each effect the flow yields and answers it."""

    def __init__(self, flow: Flow[Any]) -> None:
        self.steps = Steps(flow)

    def expect(self, kind: type[E]) -> E:
        effect = self.steps.effect
        assert isinstance(effect, kind), f"expected {kind.__name__}, the flow yielded {effect!r}"
        return effect

    def reply(self, value: object) -> None:
        self.steps.resume(value, None)

    def throw(self, error: BaseException) -> None:
        self.steps.resume(None, error)

    def minted(self) -> None:
        self.expect(Mint)
        self.reply("test-key")

    @property
    def done(self) -> bool:
        return self.steps.effect is None


def what(send: Send) -> tuple[str, str, bytes | None, str | None, bool]:
    return (send.method, send.path, send.body, send.withdraw, send.cancellable)


def answer(status: int, payload: object, **headers: str) -> RawResponse:
    return RawResponse(status, headers, json.dumps(payload).encode(), truncated=False)


def core(now_ms: list[int] | None = None, **settings: Any) -> ClientCore:
    clock_ms = now_ms if now_ms is not None else [1_000_000]
    options: dict[str, Any] = {
        "api_key": "test-key",
        "worker_id": None,
        "max_queue_wait_ms": 300_000,
        "max_rate_limit_wait_ms": 20_000,
        "max_request_timeout_ms": None,
        "retry_queue_full": False,
        "durable": False,
        "poll_interval_ms": 500,
        "clock": lambda: clock_ms[0] / 1000,
        "wall_clock": lambda: 1_700_000_000.0,
    }
    options.update(settings)
    return ClientCore(**options)


def execute(
    client: ClientCore,
    cancel: Flag | None = None,
    *,
    deadline: float | None = None,
    request_id: str | None = REQUEST_ID,
) -> Hand:
    return Hand(client._execute(READ, deadline, cancel, request_id, None, {}))


def test_a_retry_sleeps_then_mints_again_and_resends_the_same_bytes_and_request_id() -> None:
    hand = execute(core())
    hand.minted()
    first = hand.expect(Send)
    assert what(first) == ("POST", EXECUTE_PATH, first.body, REQUEST_ID, True)
    assert json.loads(first.body or b"")["protocolVersion"] == 1
    assert first.headers[REQUEST_ID_HEADER] == REQUEST_ID
    assert first.headers["Authorization"] == "Bearer test-key"
    hand.reply(
        answer(503, {"error": "busy", "code": "WORKSPACE_QUEUE_TIMEOUT"}, **{"retry-after": "2"})
    )
    assert hand.expect(Sleep) == Sleep(2.0)
    hand.reply(True)
    hand.minted()
    second = hand.expect(Send)
    assert (second.body, second.headers[REQUEST_ID_HEADER]) == (first.body, REQUEST_ID)
    hand.reply(answer(200, READ_RESULT))
    assert hand.done and hand.steps.result == READ_RESULT


def test_an_attempt_that_cannot_fit_its_deadline_fails_before_credentials_are_minted() -> None:
    now_ms = [1_000_000]
    # 30 s execution reserve + 5 s delivery leave nothing of a 20 s deadline.
    with pytest.raises(WorkspaceToolError) as raised:
        execute(core(now_ms), deadline=now_ms[0] / 1000 + 20)
    assert (raised.value.reason, raised.value.not_started) == ("insufficient_time", True)


def test_an_attempt_is_timed_from_its_queue_wait_with_at_most_10_s_to_connect() -> None:
    hand = execute(core())
    hand.minted()
    send = hand.expect(Send)
    queue_wait_ms = int(send.headers[QUEUE_WAIT_HEADER])
    assert send.timeout == httpx.Timeout((queue_wait_ms + 35_000) / 1000, connect=10.0)


@pytest.mark.parametrize(
    ("withdrawn", "not_started"),
    [("cancelled", True), ("running", False), ("finished", False), (None, False)],
)
def test_an_aborted_send_is_not_started_only_when_sluice_confirms_it_dropped_the_call(
    withdrawn: str | None, not_started: bool
) -> None:
    hand = execute(core())
    hand.minted()
    hand.expect(Send)
    with pytest.raises(WorkspaceToolError) as raised:
        hand.throw(Aborted(withdrawn))
    assert (raised.value.reason, raised.value.not_started) == ("cancelled", not_started)
    assert raised.value.attempts == 1


def test_a_cancel_during_a_retry_wait_ends_the_call_as_not_started_without_sending() -> None:
    hand = execute(core())
    hand.minted()
    hand.expect(Send)
    hand.reply(answer(503, {"error": "busy", "code": "WORKSPACE_QUEUE_TIMEOUT"}))
    hand.expect(Sleep)
    with pytest.raises(WorkspaceToolError) as raised:
        hand.reply(False)
    assert (raised.value.reason, raised.value.not_started) == ("cancelled", True)


def test_a_flag_set_before_the_next_attempt_sends_nothing_more() -> None:
    flag = Flag()
    hand = execute(core(), cancel=flag)
    hand.minted()
    hand.expect(Send)
    hand.reply(answer(503, {"error": "busy", "code": "WORKSPACE_QUEUE_TIMEOUT"}))
    hand.expect(Sleep)
    flag.set = True
    with pytest.raises(WorkspaceToolError) as raised:
        hand.reply(True)
    assert (raised.value.reason, raised.value.not_started) == ("cancelled", True)


@pytest.mark.parametrize(
    ("error", "reason", "not_started"),
    [
        (httpx.ConnectError("refused"), "failed", True),
        (httpx.ReadTimeout("slow"), "timeout", False),
        (httpx.RemoteProtocolError("cut"), "failed", False),
    ],
)
def test_a_transport_error_ends_the_call_at_once_and_says_whether_anything_was_sent(
    error: Exception, reason: str, not_started: bool
) -> None:
    hand = execute(core())
    hand.minted()
    hand.expect(Send)
    with pytest.raises(WorkspaceToolError) as raised:
        hand.throw(error)
    assert (raised.value.reason, raised.value.not_started) == (reason, not_started)
    assert raised.value.__cause__ is error


def test_a_credentials_source_that_fails_ends_the_call_as_not_started() -> None:
    hand = execute(core())
    hand.expect(Mint)
    failure = RuntimeError("vault down")
    with pytest.raises(WorkspaceToolError) as raised:
        hand.throw(failure)
    assert (raised.value.reason, raised.value.not_started) == ("failed", True)
    assert raised.value.__cause__ is failure


def test_the_durable_probe_runs_under_the_lock_and_is_asked_once_per_client() -> None:
    client = core(durable="auto")
    hand = execute(client)
    probe = Hand(hand.expect(Locked).flow)
    probe.minted()
    send = probe.expect(Send)
    assert what(send) == ("GET", CAPABILITIES_PATH, None, None, True)
    probe.reply(answer(200, {"durableWorkspaceRequests": 0}))
    assert probe.done and probe.steps.result is False
    hand.reply(False)
    hand.minted()
    assert hand.expect(Send).path == EXECUTE_PATH  # "auto" fell back to the synchronous call

    again = execute(client, request_id=None)
    remembered = Hand(again.expect(Locked).flow)
    assert remembered.done and remembered.steps.result is False


def test_a_cancelled_task_withdraws_an_accepted_durable_call_then_stays_cancelled() -> None:
    client = core(durable=True)
    hand = execute(client)
    probe = Hand(hand.expect(Locked).flow)
    probe.minted()
    probe.expect(Send)
    probe.reply(answer(200, {"durableWorkspaceRequests": 1}))
    hand.reply(probe.steps.result)
    hand.minted()
    submit = hand.expect(Send)
    assert (submit.method, submit.path) == ("POST", SUBMIT_PATH)
    hand.reply(answer(202, {"requestId": REQUEST_ID, "state": "queued"}))
    assert hand.expect(Sleep) == Sleep(0.5)

    hand.throw(asyncio.CancelledError())
    hand.minted()
    withdraw = hand.expect(Send)
    assert what(withdraw) == (
        "DELETE",
        CANCEL_PATH.format(request_id=REQUEST_ID),
        None,
        None,
        False,
    )
    assert withdraw.timeout == httpx.Timeout(TRANSPORT_TIMEOUT_MS / 1000)
    with pytest.raises(asyncio.CancelledError):
        hand.reply(answer(200, {"state": "cancelled"}))


def test_a_cancelled_task_before_a_durable_submission_withdraws_nothing() -> None:
    client = core(durable=True)
    client._durable_offered = True
    hand = execute(client)
    Hand(hand.expect(Locked).flow)  # remembered: no probe
    hand.reply(True)
    hand.expect(Mint)
    with pytest.raises(asyncio.CancelledError):
        hand.throw(asyncio.CancelledError())


def test_cancel_request_is_a_delete_the_cancel_flag_never_aborts() -> None:
    hand = Hand(core()._cancel_request(REQUEST_ID, 30_000))
    hand.minted()
    send = hand.expect(Send)
    assert what(send) == ("DELETE", CANCEL_PATH.format(request_id=REQUEST_ID), None, None, False)
    assert send.timeout == httpx.Timeout(30.0)
    hand.reply(answer(200, {"state": "running"}))
    assert hand.steps.result == "running"


def test_only_a_send_that_names_its_call_is_withdrawn_before_the_abort() -> None:
    client = core()
    plain = Send("GET", CAPABILITIES_PATH, None, {}, httpx.Timeout(1.0))
    assert client._withdraw_before_abort(plain) is None
    named = Send("POST", EXECUTE_PATH, b"{}", {}, httpx.Timeout(1.0), withdraw=REQUEST_ID)
    withdraw = client._withdraw_before_abort(named)
    assert withdraw is not None
    hand = Hand(withdraw)
    hand.minted()
    send = hand.expect(Send)
    assert send.method == "DELETE"
    assert send.timeout == httpx.Timeout(WITHDRAW_TIMEOUT_MS / 1000)
    # A DELETE that fails leaves the outcome open: None, never an error in the caller's way.
    hand.throw(httpx.ConnectError("refused"))
    assert hand.done and hand.steps.result is None


def test_steps_hand_a_flow_its_replies_and_errors_and_keep_its_result() -> None:
    def flow() -> Flow[str]:
        first: bool = yield Sleep(1.0)
        try:
            yield Mint()
        except KeyError:
            return f"slept={first}, then KeyError"
        return "unreachable"

    steps = Steps(flow())
    assert steps.effect == Sleep(1.0)
    steps.resume(True, None)
    assert steps.effect == Mint()
    steps.resume(None, KeyError("x"))
    assert steps.effect is None and steps.result == "slept=True, then KeyError"
