"""Durable requests (contract §2.7): probe once, submit once, look up until the call ends.

Every scenario runs through both clients (the `runner` fixture) with a fake clock and a
scripted HTTP layer, and asserts the exact sequence of requests: the point of durable mode is
what it does *not* send (a second POST after a lost 202, a fallback after acceptance).
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from scripted import (
    COMMAND,
    COMMAND_RESULT,
    READ,
    READ_RESULT,
    START_MS,
    Runner,
    rate_limited,
    typed,
)
from sluice_client import WorkspaceToolError
from sluice_client.cli import EXIT_MAY_HAVE_RUN, EXIT_NOT_STARTED, EXIT_OK, main

RID = "durable-request-000001"
CAPS = ("GET", "/v1/workspace-tools/capabilities")
SUBMIT = ("POST", "/v1/workspace-tools/requests")
LOOKUP = ("GET", f"/v1/workspace-tools/requests/{RID}")
DELETE = ("DELETE", f"/v1/workspace-tools/requests/{RID}")
EXECUTE = ("POST", "/v1/workspace-tools/execute")


def capabilities(version: object = 1) -> httpx.Response:
    return httpx.Response(200, json={"durableWorkspaceRequests": version})


def status(
    state: str,
    *,
    result: dict[str, Any] | None = None,
    code: str | None = None,
    http: int = 200,
    request_id: str = RID,
) -> httpx.Response:
    body: dict[str, Any] = {"requestId": request_id, "state": state}
    if state == "completed":
        body["result"] = READ_RESULT if result is None else result
    if code is not None:
        body["error"] = {"code": code, "message": f"{code} from the script"}
    return httpx.Response(http, json=body)


def accepted(state: str = "queued", **kwargs: Any) -> httpx.Response:
    return status(state, http=202, **kwargs)


def deleted(state: str) -> httpx.Response:
    return httpx.Response(200, json={"state": state})


def sequence(runner: Runner) -> list[tuple[str, str]]:
    return [(s.request.method, s.request.url.path) for s in runner.script.sent]


def durable_call(
    runner: Runner, request: dict[str, Any] | None = None, *, client: Any = None, **call: Any
) -> dict[str, Any]:
    call.setdefault("request_id", RID)
    call.setdefault("durable", True)
    return runner.execute(request, client=client, **call)


def durable_fails(runner: Runner, **kwargs: Any) -> WorkspaceToolError:
    with pytest.raises(WorkspaceToolError) as caught:
        durable_call(runner, **kwargs)
    return caught.value


def calls_twice(runner: Runner, **client: Any) -> list[dict[str, Any]]:
    """Two calls on one client, so the probe cache is what the second one sees."""
    ids = [RID, "durable-request-000002"]
    if runner.mode == "sync":
        return runner.run(lambda c: [c.execute(READ, request_id=i) for i in ids], **client)

    async def both(c: Any) -> list[dict[str, Any]]:
        return [await c.execute(READ, request_id=i) for i in ids]

    return runner.run(both, **client)


# -- the capability probe ---------------------------------------------------------------------


def test_the_probe_is_asked_once_per_client(runner: Runner) -> None:
    runner.script.then(capabilities()).then(accepted("completed"))
    runner.script.then(accepted("completed", request_id="durable-request-000002"))
    assert calls_twice(runner, durable="auto") == [READ_RESULT, READ_RESULT]
    assert sequence(runner) == [CAPS, SUBMIT, SUBMIT]


@pytest.mark.parametrize(
    "unsupported",
    [httpx.Response(404, json={"code": "NOT_FOUND"}), capabilities(0)],
    ids=["404", "version-0"],
)
def test_auto_falls_back_to_execute_and_remembers_it(
    runner: Runner, unsupported: httpx.Response
) -> None:
    runner.script.then(unsupported).then(httpx.Response(200, json=READ_RESULT))
    runner.script.then(httpx.Response(200, json=READ_RESULT))
    assert calls_twice(runner, durable="auto") == [READ_RESULT, READ_RESULT]
    assert sequence(runner) == [CAPS, EXECUTE, EXECUTE]


def test_durable_true_refuses_a_sluice_without_durable_requests(runner: Runner) -> None:
    runner.script.then(capabilities(0))
    error = durable_fails(runner)
    assert (error.reason, error.not_started) == ("invalid", True)
    assert "does not offer durable requests" in error.message
    assert sequence(runner) == [CAPS]


@pytest.mark.parametrize(
    "answer",
    [
        capabilities(2),
        capabilities(True),
        httpx.Response(200, json={"unsupported": True}),
        httpx.Response(200, html="<html>login</html>"),
        httpx.Response(500, text="oops"),
    ],
    ids=["version-2", "bool", "no-key", "html", "500"],
)
def test_a_malformed_probe_fails_closed_instead_of_falling_back(
    runner: Runner, answer: httpx.Response
) -> None:
    runner.script.then(answer)
    error = durable_fails(runner, durable="auto")
    assert (error.reason, error.not_started) == ("failed", True)
    assert sequence(runner) == [CAPS]


def test_a_typed_refusal_of_the_probe_is_that_rejection(runner: Runner) -> None:
    runner.script.then(typed(401, "UNAUTHENTICATED"))
    error = durable_fails(runner)
    assert (error.reason, error.not_started, error.code) == ("rejected", True, "UNAUTHENTICATED")


def test_the_default_mode_never_probes(runner: Runner) -> None:
    runner.script.then(httpx.Response(200, json=READ_RESULT))
    assert runner.execute() == READ_RESULT
    assert sequence(runner) == [EXECUTE]


# -- submit and poll --------------------------------------------------------------------------


def test_a_202_is_polled_until_completed_with_one_submission(runner: Runner) -> None:
    minted: list[int] = []

    def key() -> str:
        minted.append(1)
        return f"token-{len(minted)}"

    runner.script.then(capabilities()).then(accepted("queued"))
    runner.script.then(status("admitted")).then(status("completed"))
    assert durable_call(runner, client={"api_key": key, "worker_id": "w1"}) == READ_RESULT
    assert sequence(runner) == [CAPS, SUBMIT, LOOKUP, LOOKUP]
    assert runner.time.slept_ms == [500, 500]
    post = runner.script.sent[1]
    assert post.headers["X-LibreChat-Workspace-Request-Id"] == RID
    assert post.headers["X-LibreChat-Code-Worker-ID"] == "w1"
    # One submission gets the whole horizon: no retries spread it over 30 s attempts.
    assert post.queue_wait_ms == 300_000
    assert json.loads(post.body) == {**READ, "startLine": 1, "maxLines": 200}
    # Every request is short, however long the call may take.
    assert post.read_timeout_s == 10.0
    assert [s.headers["Authorization"] for s in runner.script.sent] == [
        f"Bearer token-{n}" for n in range(1, 5)
    ]
    assert "X-LibreChat-Workspace-Request-Id" not in runner.script.sent[2].headers


def test_the_submission_body_is_the_execute_body(runner: Runner) -> None:
    runner.script.then(capabilities()).then(accepted("completed"))
    durable_call(runner)
    sync = Runner(runner.mode)
    sync.script.then(httpx.Response(200, json=READ_RESULT))
    sync.execute(request_id=RID)
    assert runner.script.sent[1].body == sync.script.sent[0].body


def test_a_lost_submission_answer_is_recovered_by_lookup_not_a_second_post(
    runner: Runner,
) -> None:
    runner.script.then(capabilities())
    runner.script.then(httpx.ReadError("connection reset after the request was sent"))
    runner.script.then(status("completed"))
    assert durable_call(runner) == READ_RESULT
    assert sequence(runner) == [CAPS, SUBMIT, LOOKUP]


def test_a_timed_out_submission_is_looked_up_too(runner: Runner) -> None:
    runner.script.then(capabilities()).then(httpx.ReadTimeout("no answer"))
    runner.script.then(status("queued")).then(status("completed"))
    assert durable_call(runner) == READ_RESULT
    assert sequence(runner) == [CAPS, SUBMIT, LOOKUP, LOOKUP]


def test_a_lost_submission_unknown_to_lookup_is_resubmitted_identically_once(
    runner: Runner,
) -> None:
    runner.script.then(capabilities()).then(httpx.ReadError("lost"))
    runner.script.then(httpx.Response(404, json={"code": "REQUEST_NOT_FOUND"}))
    runner.script.then(accepted("completed"))
    assert durable_call(runner) == READ_RESULT
    assert sequence(runner) == [CAPS, SUBMIT, LOOKUP, SUBMIT]
    first, second = runner.script.sent[1], runner.script.sent[3]
    assert first.body == second.body
    for header in ("X-LibreChat-Workspace-Request-Id", "X-LibreChat-Workspace-Queue-Wait-Ms"):
        assert first.headers[header] == second.headers[header]


def test_a_handle_seen_once_is_never_resubmitted_after_a_404(runner: Runner) -> None:
    runner.script.then(capabilities()).then(accepted("queued"))
    runner.script.then(httpx.Response(404, json={"code": "REQUEST_NOT_FOUND"}))
    error = durable_fails(runner)
    assert (error.reason, error.not_started) == ("failed", False)
    assert "may have run" in error.message
    assert sequence(runner) == [CAPS, SUBMIT, LOOKUP]


def test_lookups_survive_transport_errors_and_busy_answers(runner: Runner) -> None:
    runner.script.then(capabilities()).then(accepted("queued"))
    runner.script.then(httpx.ConnectError("refused")).then(rate_limited("3"))
    runner.script.then(httpx.Response(502, html="<html>bad gateway</html>"))
    runner.script.then(status("completed"))
    assert durable_call(runner) == READ_RESULT
    assert sequence(runner) == [CAPS, SUBMIT, LOOKUP, LOOKUP, LOOKUP, LOOKUP]
    assert runner.time.slept_ms == [500, 500, 3000, 500]


def test_a_connection_refused_before_the_first_post_is_not_started(runner: Runner) -> None:
    runner.script.then(capabilities()).then(httpx.ConnectError("refused"))
    error = durable_fails(runner)
    assert (error.reason, error.not_started) == ("failed", True)
    assert sequence(runner) == [CAPS, SUBMIT]


def test_a_status_for_another_request_is_withdrawn_as_may_have_run(runner: Runner) -> None:
    runner.script.then(capabilities()).then(accepted("queued", request_id="someone-else-000001"))
    runner.script.then(deleted("running"))
    error = durable_fails(runner)
    assert (error.reason, error.not_started) == ("failed", False)
    assert sequence(runner) == [CAPS, SUBMIT, DELETE]


# -- refusals and failures: the same errors as the synchronous endpoint ----------------------


def test_a_typed_refusal_of_the_submission_is_the_synchronous_rejection(runner: Runner) -> None:
    runner.script.then(capabilities()).then(typed(429, "WORKER_QUEUE_FULL"))
    error = durable_fails(runner)
    assert (error.reason, error.not_started, error.status, error.code) == (
        "rejected",
        True,
        429,
        "WORKER_QUEUE_FULL",
    )
    assert sequence(runner) == [CAPS, SUBMIT]


def test_a_rate_limited_submission_waits_and_submits_again(runner: Runner) -> None:
    runner.script.then(capabilities()).then(rate_limited("2")).then(accepted("completed"))
    assert durable_call(runner) == READ_RESULT
    assert sequence(runner) == [CAPS, SUBMIT, SUBMIT]
    assert runner.time.slept_ms == [2000]


# (status the synchronous endpoint answers, code, not_started)
FAILURES = [
    (503, "WORKSPACE_QUEUE_TIMEOUT", True),
    (503, "WORKER_OFFLINE", True),
    (503, "COMMAND_UNAVAILABLE", True),
    (503, "EDIT_NOT_STARTED", True),
    (409, "WORKER_MISMATCH", True),
    (409, "WORKSPACE_QUARANTINED", True),
    (401, "UNAUTHENTICATED", True),
    # A durable call's key revoked while it waited: its status's code (admission/durable.py).
    (403, "WORKER_UNAUTHORIZED", True),
    (504, "ASSIGNMENT_EXPIRED", False),
    (502, "RESULT_INVALID", False),
    (422, "NOT_FOUND", False),
    (422, "INVALID_REQUEST", False),
    (409, "EDIT_CONFLICT", False),
    (403, "WRITE_DISABLED", False),
    (504, "COMMAND_TIMEOUT", False),
]


@pytest.mark.parametrize(("http", "code", "not_started"), FAILURES)
def test_a_failed_status_raises_what_the_synchronous_answer_raises(
    runner: Runner, http: int, code: str, not_started: bool
) -> None:
    sync = Runner(runner.mode)
    sync.script.then(typed(http, code))
    with pytest.raises(WorkspaceToolError) as caught:
        sync.execute(max_queue_wait_ms=0, request_id=RID)  # one answer, no retry
    expected = caught.value

    runner.script.then(capabilities()).then(accepted("queued"))
    runner.script.then(status("failed", code=code))
    error = durable_fails(runner)
    assert error.not_started is not_started
    assert (error.reason, error.not_started, error.status, error.code) == (
        expected.reason,
        expected.not_started,
        expected.status,
        expected.code,
    )
    assert ("The operation was not started" in error.message) is not_started
    assert sequence(runner) == [CAPS, SUBMIT, LOOKUP]  # terminal: no DELETE


def test_a_failed_queue_timeout_is_final_and_says_so(runner: Runner) -> None:
    runner.script.then(capabilities()).then(accepted("failed", code="WORKSPACE_QUEUE_TIMEOUT"))
    error = durable_fails(runner)
    assert "Stopped retrying: a durable request's failure is final." in error.message
    assert sequence(runner) == [CAPS, SUBMIT]  # no second submission, no new request id


def test_a_failed_status_with_an_unknown_code_may_have_run(runner: Runner) -> None:
    runner.script.then(capabilities()).then(accepted("failed", code="SOMETHING_NEW"))
    error = durable_fails(runner)
    assert (error.reason, error.not_started, error.code) == ("failed", False, "SOMETHING_NEW")


def test_a_cancelled_status_is_the_synchronous_request_cancelled(runner: Runner) -> None:
    runner.script.then(capabilities()).then(accepted("queued")).then(status("cancelled"))
    error = durable_fails(runner)
    assert (error.reason, error.not_started, error.status, error.code) == (
        "rejected",
        True,
        409,
        "REQUEST_CANCELLED",
    )


@pytest.mark.parametrize(
    "result",
    [
        {**READ_RESULT, "hostPath": "/srv/ws/a.txt"},
        {**READ_RESULT, "endLine": 7},
        {**READ_RESULT, "workspaceId": "other"},
    ],
    ids=["unknown-key", "line-window", "other-workspace"],
)
def test_a_completed_result_is_checked_by_validate_result(
    runner: Runner, result: dict[str, Any]
) -> None:
    runner.script.then(capabilities()).then(accepted("queued"))
    runner.script.then(status("completed", result=result))
    error = durable_fails(runner)
    assert (error.reason, error.not_started, error.code, error.status) == (
        "invalid",
        False,
        "RESULT_INVALID",
        200,
    )
    assert sequence(runner) == [CAPS, SUBMIT, LOOKUP]


def test_a_completed_status_without_a_result_is_result_invalid(runner: Runner) -> None:
    body = {"requestId": RID, "state": "completed"}
    runner.script.then(capabilities()).then(httpx.Response(202, json=body))
    error = durable_fails(runner)
    assert (error.reason, error.code) == ("invalid", "RESULT_INVALID")


# -- cancel and time ----------------------------------------------------------------------------


def _cancel_event(runner: Runner) -> threading.Event | asyncio.Event:
    return threading.Event() if runner.mode == "sync" else asyncio.Event()


def _setting(event: threading.Event | asyncio.Event, answer: httpx.Response) -> Callable[..., Any]:
    def step(request: httpx.Request) -> httpx.Response:
        event.set()
        return answer

    return step


@pytest.mark.parametrize(("delete_state", "not_started"), [("cancelled", True), ("running", False)])
def test_cancel_withdraws_the_accepted_call_with_delete(
    runner: Runner, delete_state: str, not_started: bool
) -> None:
    cancel = _cancel_event(runner)
    runner.script.then(capabilities()).then(accepted("queued"))
    runner.script.then(_setting(cancel, status("queued"))).then(deleted(delete_state))
    error = durable_fails(runner, cancel=cancel)
    assert (error.reason, error.not_started) == ("cancelled", not_started)
    assert sequence(runner) == [CAPS, SUBMIT, LOOKUP, DELETE]
    assert "X-LibreChat-Workspace-Request-Id" not in runner.script.sent[3].headers


def test_a_failed_delete_leaves_a_cancelled_call_may_have_run(runner: Runner) -> None:
    cancel = _cancel_event(runner)
    runner.script.then(capabilities()).then(_setting(cancel, accepted("queued")))
    runner.script.then(httpx.ReadError("gone"))
    error = durable_fails(runner, cancel=cancel)
    assert (error.reason, error.not_started) == ("cancelled", False)
    assert sequence(runner) == [CAPS, SUBMIT, DELETE]


def test_cancel_before_submission_sends_nothing_more(runner: Runner) -> None:
    cancel = _cancel_event(runner)
    runner.script.then(_setting(cancel, capabilities()))
    error = durable_fails(runner, cancel=cancel)
    assert (error.reason, error.not_started) == ("cancelled", True)
    assert sequence(runner) == [CAPS]


@pytest.mark.parametrize(
    ("delete_state", "not_started"), [("cancelled", True), ("finished", False)]
)
def test_the_poll_budget_ends_in_a_timeout_and_a_delete(
    runner: Runner, delete_state: str, not_started: bool
) -> None:
    # read_file reserves 35 s (30 s execution + 5 s delivery): 1 s is left to queue.
    deadline_s = (START_MS + 36_000) / 1000
    runner.script.then(capabilities()).then(accepted("queued"))
    runner.script.then(status("queued")).then(deleted(delete_state))
    error = durable_fails(runner, deadline=deadline_s, client={"poll_interval_ms": 30_000})
    assert (error.reason, error.not_started) == ("timeout", not_started)
    assert ("may have run" in error.message) is not not_started
    assert runner.script.sent[1].queue_wait_ms == 1_000
    assert runner.time.slept_ms == [30_000, 6_000]  # the last wait ends at the deadline
    assert sequence(runner) == [CAPS, SUBMIT, LOOKUP, DELETE]


def test_a_deadline_without_room_to_run_submits_nothing(runner: Runner) -> None:
    runner.script.then(capabilities())
    error = durable_fails(runner, deadline=(START_MS + 35_000) / 1000)
    assert (error.reason, error.not_started) == ("insufficient_time", True)
    assert sequence(runner) == [CAPS]


def test_a_short_http_ceiling_does_not_block_a_long_durable_command(runner: Runner) -> None:
    # Synchronously, 60 s cannot hold a 120 s command: insufficient_time, nothing sent.
    sync = Runner(runner.mode)
    with pytest.raises(WorkspaceToolError) as caught:
        sync.execute({**COMMAND, "timeoutMs": 120_000}, max_request_timeout_ms=60_000)
    assert caught.value.reason == "insufficient_time"
    # Durable requests never hold a connection that long, so the ceiling caps each request.
    runner.script.then(capabilities()).then(accepted("queued"))
    runner.script.then(status("completed", result=COMMAND_RESULT))
    command = {**COMMAND, "timeoutMs": 120_000}
    assert durable_call(runner, command, max_request_timeout_ms=8_000) == COMMAND_RESULT
    assert [s.read_timeout_s for s in runner.script.sent[1:]] == [8.0, 8.0]


def test_a_bad_durable_option_is_refused(runner: Runner) -> None:
    error = durable_fails(runner, durable="sometimes")
    assert (error.reason, error.not_started) == ("invalid", True)
    assert runner.script.sent == []
    with pytest.raises(ValueError, match="poll_interval_ms"):
        runner.run(lambda c: None, poll_interval_ms=10)


# -- CLI ------------------------------------------------------------------------------------------


def _cli(runner: Runner, *argv: str) -> tuple[int, Any]:
    out, err = io.StringIO(), io.StringIO()
    code = main(
        ["--url", "http://sluice.test", "--key", "k", "--request-id", RID, *argv],
        transport=runner.script.transport(),
        stdout=out,
        stderr=err,
        clock=runner.time.clock,
        sleep=runner.time.sleep,
        wall_clock=runner.time.wall_clock,
    )
    text = out.getvalue() or err.getvalue()
    return code, json.loads(text)


def test_cli_durable_flag_submits_and_polls(sync_runner: Runner) -> None:
    sync_runner.script.then(capabilities()).then(accepted("queued")).then(status("completed"))
    code, printed = _cli(
        sync_runner, "--durable", "read_file", "--workspace", "ws", "--path", "a.txt"
    )
    assert (code, printed) == (EXIT_OK, READ_RESULT)
    assert sequence(sync_runner) == [CAPS, SUBMIT, LOOKUP]


def test_cli_durable_auto_falls_back(sync_runner: Runner) -> None:
    sync_runner.script.then(httpx.Response(404)).then(httpx.Response(200, json=READ_RESULT))
    code, printed = _cli(
        sync_runner, "--durable-auto", "read_file", "--workspace", "ws", "--path", "a.txt"
    )
    assert (code, printed) == (EXIT_OK, READ_RESULT)
    assert sequence(sync_runner) == [CAPS, EXECUTE]


@pytest.mark.parametrize(
    ("code", "exit_code"), [("WORKER_OFFLINE", EXIT_NOT_STARTED), ("ASSIGNMENT_EXPIRED", 3)]
)
def test_cli_exit_code_of_a_failed_durable_call(
    sync_runner: Runner, code: str, exit_code: int
) -> None:
    assert EXIT_MAY_HAVE_RUN == 3
    sync_runner.script.then(capabilities()).then(accepted("failed", code=code))
    got, printed = _cli(
        sync_runner, "--durable", "read_file", "--workspace", "ws", "--path", "a.txt"
    )
    assert (got, printed["code"]) == (exit_code, code)


def test_cli_refuses_a_bad_durable_environment_value(
    sync_runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_DURABLE", "maybe")
    got, printed = _cli(sync_runner, "read_file", "--workspace", "ws", "--path", "a.txt")
    assert got == 4 and "SLUICE_DURABLE" in printed["error"]
    assert sync_runner.script.sent == []


def test_a_refused_resubmission_after_a_lost_answer_is_not_called_not_started(
    runner: Runner,
) -> None:
    # The first POST's answer was lost; a late copy of it may still be accepted, so the
    # refusal of the second cannot prove the call never ran.
    runner.script.then(capabilities()).then(httpx.ReadError("lost"))
    runner.script.then(httpx.Response(404, json={"code": "REQUEST_NOT_FOUND"}))
    runner.script.then(typed(429, "WORKER_QUEUE_FULL"))
    runner.script.then(httpx.Response(404, json={"code": "REQUEST_NOT_FOUND"}))
    error = durable_fails(runner)
    assert (error.reason, error.not_started, error.code) == ("failed", False, "WORKER_QUEUE_FULL")
    assert "The operation was not started" not in error.message
    assert sequence(runner) == [CAPS, SUBMIT, LOOKUP, SUBMIT, DELETE]


def _accept_by_header(request: httpx.Request) -> httpx.Response:
    request_id = request.headers["X-LibreChat-Workspace-Request-Id"]
    return accepted("completed", request_id=request_id)


def test_concurrent_first_async_calls_share_one_probe() -> None:
    runner = Runner("async")
    runner.script.then(capabilities()).then(_accept_by_header).then(_accept_by_header)

    async def both(c: Any) -> list[dict[str, Any]]:
        return list(
            await asyncio.gather(
                c.execute(READ, request_id=RID), c.execute(READ, request_id="durable-request-2222")
            )
        )

    assert runner.run(both, durable="auto") == [READ_RESULT, READ_RESULT]
    assert sequence(runner) == [CAPS, SUBMIT, SUBMIT]


def test_a_cancelled_async_task_still_withdraws_the_call() -> None:
    runner = Runner("async")

    def cancel_task(request: httpx.Request) -> httpx.Response:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        return status("queued")

    async def yielding_sleep(seconds: float) -> None:
        runner.time.sleep(seconds)
        await asyncio.sleep(0)  # the scripted transport never yields; a real wait does

    runner.script.then(capabilities()).then(accepted("queued")).then(cancel_task)
    runner.script.then(deleted("cancelled"))
    with pytest.raises(asyncio.CancelledError):
        durable_call(runner, client={"sleep": yielding_sleep})
    assert sequence(runner) == [CAPS, SUBMIT, LOOKUP, DELETE]
