"""Rules 7, 8 and 10: the error's fields and wording, validation on both ends of a call,
and the per-operation helpers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from scripted import (
    COMMAND_RESULT,
    READ,
    READ_RESULT,
    Runner,
    ok,
    queue_full,
    queue_timeout,
    rate_limited,
    typed,
)
from sluice_client import WorkspaceToolError
from sluice_client.errors import NOT_STARTED_PHRASE


def error_of(runner: Runner, **kwargs: Any) -> WorkspaceToolError:
    with pytest.raises(WorkspaceToolError) as caught:
        runner.execute(**kwargs)
    return caught.value


# -- rule 7 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "advice"),
    [
        (queue_timeout(), "independent workspace"),
        (queue_full(), "independent workspace"),
        (rate_limited("3"), "slow down"),
        (typed(503, "WORKER_OFFLINE"), "wait"),
        (typed(409, "WORKSPACE_QUARANTINED"), "independent workspace"),
        (typed(401, "UNAUTHENTICATED"), "API key"),
        (typed(503, "EDIT_NOT_STARTED"), "fewer or more specific edits"),
    ],
)
def test_a_typed_rejection_says_it_was_not_started_and_what_to_do(
    runner: Runner, answer: httpx.Response, advice: str
) -> None:
    runner.script.then(answer)
    error = error_of(runner, max_queue_wait_ms=0, max_rate_limit_wait_ms=0)
    assert (error.reason, error.not_started) == ("rejected", True)
    assert NOT_STARTED_PHRASE in error.message
    assert advice.lower() in error.message.lower()
    assert error.body == answer.content and not error.truncated


@pytest.mark.parametrize(
    "answer",
    [
        typed(504, "ASSIGNMENT_EXPIRED"),
        typed(502, "RESULT_INVALID"),
        typed(409, "EDIT_CONFLICT"),
        httpx.Response(500, text="oops"),
        httpx.ReadTimeout("slow"),
        httpx.ConnectError("refused"),
        ok({**READ_RESULT, "hostPath": "/srv/ws/a.txt"}),
        typed(400, "INVALID_WORKSPACE_TOOL_REQUEST"),
    ],
)
def test_no_other_error_says_not_started(runner: Runner, answer: Any) -> None:
    runner.script.then(answer)
    error = error_of(runner)
    assert error.reason != "rejected"
    assert "not started" not in error.message.lower()


def test_an_error_body_is_kept_up_to_4096_bytes(runner: Runner) -> None:
    runner.script.then(httpx.Response(500, content=b"x" * 4096))
    error = error_of(runner)
    assert (len(error.body), error.truncated) == (4096, False)


def test_an_error_body_over_4096_bytes_is_cut_and_marked_truncated(runner: Runner) -> None:
    runner.script.then(httpx.Response(500, content=b"x" * 10_000))
    error = error_of(runner)
    assert (len(error.body), error.truncated, error.status) == (4096, True, 500)


def test_the_error_carries_status_code_request_id_and_attempts(runner: Runner) -> None:
    runner.script.then(queue_timeout()).then(typed(409, "WORKER_MISMATCH"))
    error = error_of(runner, request_id="call-0000000000000001")
    assert (error.status, error.code, error.request_id, error.attempts) == (
        409,
        "WORKER_MISMATCH",
        "call-0000000000000001",
        2,
    )
    view = error.to_dict()
    assert view["reason"] == "rejected" and json.loads(view["body"])["code"] == "WORKER_MISMATCH"


def test_a_server_validation_refusal_is_invalid_and_not_started(runner: Runner) -> None:
    runner.script.then(typed(400, "INVALID_WORKSPACE_TOOL_REQUEST"))
    error = error_of(runner)
    assert (error.reason, error.not_started, error.code) == (
        "invalid",
        True,
        "INVALID_WORKSPACE_TOOL_REQUEST",
    )


# -- rule 8 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_body",
    [
        {**READ, "maxLines": 501},
        {**READ, "maxLines": 0},
        {**READ, "path": "../etc/passwd"},
        {**READ, "path": "/etc/passwd"},
        {**READ, "unknownKey": 1},
        {**READ, "operation": "delete_everything"},
        {"operation": "execute_command", "workspaceId": "ws", "command": "   "},
        {
            "operation": "execute_command",
            "workspaceId": "ws",
            "command": "ls",
            "timeoutMs": 300_001,
        },
    ],
)
def test_an_invalid_request_is_refused_before_anything_is_sent(
    runner: Runner, request_body: dict[str, Any]
) -> None:
    error = error_of(runner, request=request_body)
    assert (error.reason, error.not_started) == ("invalid", True)
    assert runner.script.sent == []


def test_the_bounds_themselves_are_accepted(runner: Runner) -> None:
    runner.script.then(ok({**READ_RESULT, "startLine": 1}))
    runner.execute({**READ, "maxLines": 500})
    assert json.loads(runner.script.sent[0].body)["maxLines"] == 500


def test_protocol_version_defaults_to_1(runner: Runner) -> None:
    runner.script.then(ok())
    request = {key: value for key, value in READ.items() if key != "protocolVersion"}
    runner.execute(request)
    assert json.loads(runner.script.sent[0].body)["protocolVersion"] == 1


@pytest.mark.parametrize(
    "result",
    [
        {**READ_RESULT, "hostPath": "/srv/ws/a.txt"},  # a key the contract does not have
        {**READ_RESULT, "path": "/srv/ws/a.txt"},  # a host path
        {key: value for key, value in READ_RESULT.items() if key != "truncated"},
        {**READ_RESULT, "workspaceId": "other"},
    ],
)
def test_an_invalid_result_is_invalid_and_may_have_run(
    runner: Runner, result: dict[str, Any]
) -> None:
    runner.script.then(ok(result))
    error = error_of(runner)
    assert (error.reason, error.not_started, error.code) == ("invalid", False, "RESULT_INVALID")
    assert len(runner.script.sent) == 1


def test_a_200_that_is_not_json_may_have_run(runner: Runner) -> None:
    runner.script.then(httpx.Response(200, text="<html>proxy login</html>"))
    error = error_of(runner)
    assert (error.reason, error.not_started) == ("failed", False)


@pytest.mark.parametrize(
    "options",
    [
        {"max_queue_wait_ms": 300_001},
        {"max_queue_wait_ms": -1},
        {"max_rate_limit_wait_ms": -1},
        {"max_request_timeout_ms": 0},
        {"retry_queue_full": "yes"},
    ],
)
def test_out_of_range_budgets_are_invalid(runner: Runner, options: dict[str, Any]) -> None:
    error = error_of(runner, **options)
    assert error.reason == "invalid" and runner.script.sent == []
    with pytest.raises(ValueError):
        runner.run(lambda client: None, **options)


def test_an_unknown_per_call_option_is_a_type_error(sync_runner: Runner) -> None:
    with pytest.raises(TypeError):
        sync_runner.execute(max_queue_wait=5)


def test_a_bad_worker_id_or_empty_key_is_refused_when_the_client_is_built(runner: Runner) -> None:
    with pytest.raises(ValueError):
        runner.run(lambda client: None, worker_id="bad worker")
    with pytest.raises(ValueError):
        runner.run(lambda client: None, api_key=" ")


# -- rule 10: helpers -----------------------------------------------------------------------------


SHA = "a" * 64
EDIT = {"oldText": "a", "newText": "b"}
HELPERS: list[tuple[Callable[[Any], Any], dict[str, Any], dict[str, Any]]] = [
    (
        lambda c: c.read_file("ws", "a.txt", start_line=3, max_lines=2),
        {"operation": "read_file", "path": "a.txt", "startLine": 3, "maxLines": 2},
        {"path": "a.txt", "content": "x", "startLine": 3, "endLine": 3, "truncated": False},
    ),
    (
        lambda c: c.list_files("ws", "src", max_results=5, after_path="src/a"),
        {"operation": "list_files", "path": "src", "maxResults": 5, "afterPath": "src/a"},
        {"paths": ["src/b"], "truncated": False},
    ),
    (
        lambda c: c.search_text("ws", "needle", path="src"),
        {"operation": "search_text", "query": "needle", "path": "src", "maxResults": 50},
        {
            "matches": [{"path": "src/b", "line": 1, "column": 2, "text": "a needle"}],
            "truncated": False,
        },
    ),
    (
        lambda c: c.write_file("ws", "new.txt", "hi", overwrite=True),
        {"operation": "write_file", "path": "new.txt", "content": "hi", "overwrite": True},
        {"path": "new.txt", "created": True, "bytesWritten": 2},
    ),
    (
        lambda c: c.preview_edit("ws", "a.txt", [EDIT]),
        {"operation": "preview_edit", "path": "a.txt", "edits": [EDIT]},
        {
            "path": "a.txt",
            "content": "b",
            "hasUtf8Bom": False,
            "baseSha256": SHA,
            "replacements": 1,
            "bytesWritten": 1,
        },
    ),
    (
        lambda c: c.edit_file("ws", "a.txt", [EDIT], expected_base_sha256=SHA, worktree="lane-1"),
        {
            "operation": "edit_file",
            "path": "a.txt",
            "edits": [EDIT],
            "expectedBaseSha256": SHA,
            "worktree": "lane-1",
        },
        {"path": "a.txt", "replacements": 1, "bytesWritten": 1},
    ),
    (
        lambda c: c.execute_command("ws", "make test", cwd="src", timeout_ms=1000),
        {
            "operation": "execute_command",
            "command": "make test",
            "cwd": "src",
            "timeoutMs": 1000,
            "maxOutputBytes": 256 * 1024,
        },
        {
            key: value
            for key, value in COMMAND_RESULT.items()
            if key not in ("protocolVersion", "operation", "workspaceId")
        },
    ),
]


@pytest.mark.parametrize(("call", "expected", "result"), HELPERS)
def test_each_helper_builds_its_request_and_returns_the_result(
    runner: Runner, call: Callable[[Any], Any], expected: dict[str, Any], result: dict[str, Any]
) -> None:
    full = {"protocolVersion": 1, "operation": expected["operation"], "workspaceId": "ws", **result}
    runner.script.then(ok(full))
    assert runner.run(call) == full
    sent = json.loads(runner.script.sent[0].body)
    assert {key: sent[key] for key in expected} == expected
    assert sent["workspaceId"] == "ws" and sent["protocolVersion"] == 1


def test_helpers_pass_per_call_budgets_through(runner: Runner) -> None:
    runner.script.then(queue_timeout())
    with pytest.raises(WorkspaceToolError):
        runner.run(lambda c: c.read_file("ws", "a.txt", max_queue_wait_ms=0))
    assert len(runner.script.sent) == 1


def test_cancel_request_deletes_the_named_call(runner: Runner) -> None:
    runner.script.then(httpx.Response(200, json={"state": "cancelled"}))
    assert runner.run(lambda c: c.cancel_request("call-0000000000000001")) == "cancelled"
    sent = runner.script.sent[0].request
    assert sent.method == "DELETE"
    assert sent.url.path == "/v1/workspace-tools/requests/call-0000000000000001"
    assert sent.headers["Authorization"] == "Bearer test-key"


def test_cancel_request_of_an_unknown_call_raises(runner: Runner) -> None:
    runner.script.then(typed(404, "NOT_FOUND"))
    with pytest.raises(WorkspaceToolError) as caught:
        runner.run(lambda c: c.cancel_request("call-0000000000000001"))
    assert (caught.value.status, caught.value.reason) == (404, "failed")


def test_cancel_request_refuses_an_id_that_would_change_the_path(runner: Runner) -> None:
    with pytest.raises(WorkspaceToolError) as caught:
        runner.run(lambda c: c.cancel_request("../../admin/xxxxxxxxxxxxx"))
    assert caught.value.reason == "invalid" and runner.script.sent == []
