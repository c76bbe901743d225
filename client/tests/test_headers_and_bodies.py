"""Rules 4 and 5: the queue-wait header arithmetic, identical bytes on every attempt, one
credential call per attempt, and the other headers a call carries.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from scripted import (
    COMMAND,
    COMMAND_RESULT,
    READ,
    READ_RESULT,
    Runner,
    ok,
    queue_timeout,
    rate_limited,
)
from sluice_client import WorkspaceToolError
from sluice_client.policy import plan_attempt

SLOW_COMMAND = {**COMMAND, "timeoutMs": 120_000}
LONGEST_COMMAND = {**COMMAND, "timeoutMs": 300_000}


@pytest.mark.parametrize(
    ("request_body", "budget_ms", "header_ms", "timeout_s"),
    [
        (READ, 60_000, 25_000, 60),  # 60 s - 30 s execution - 5 s delivery
        (READ, 125_000, 90_000, 125),
        (READ, 610_000, 300_000, 335),  # capped; the attempt waits no longer than it needs
        (COMMAND, 60_000, 20_000, 60),  # 60 s - (30 s timeout + 5 s settle) - 5 s delivery
        (COMMAND, 125_000, 85_000, 125),
        (COMMAND, 610_000, 300_000, 340),
        (SLOW_COMMAND, 610_000, 300_000, 430),
        (LONGEST_COMMAND, 610_000, 300_000, 610),  # exactly: 610 - 305 - 5
    ],
)
def test_the_queue_wait_header_is_what_the_http_budget_leaves_after_the_reserve(
    runner: Runner, request_body: dict[str, Any], budget_ms: int, header_ms: int, timeout_s: int
) -> None:
    result = READ_RESULT if request_body["operation"] == "read_file" else COMMAND_RESULT
    runner.script.then(ok(result))
    runner.execute(request_body, max_request_timeout_ms=budget_ms)
    sent = runner.script.sent[0]
    assert (sent.queue_wait_ms, sent.read_timeout_s) == (header_ms, timeout_s)


@pytest.mark.parametrize(
    ("request_body", "budget_ms"),
    [(SLOW_COMMAND, 60_000), (SLOW_COMMAND, 125_000), (READ, 35_000), (COMMAND, 40_000)],
)
def test_a_budget_that_cannot_hold_the_reserve_fails_before_sending(
    runner: Runner, request_body: dict[str, Any], budget_ms: int
) -> None:
    with pytest.raises(WorkspaceToolError) as caught:
        runner.execute(request_body, max_request_timeout_ms=budget_ms)
    error = caught.value
    assert (error.reason, error.not_started) == ("insufficient_time", True)
    assert "not started" not in error.message.lower()
    assert runner.script.sent == []


def test_one_ms_of_queue_time_is_enough_to_send(runner: Runner) -> None:
    runner.script.then(ok())
    runner.execute(max_request_timeout_ms=35_001)
    assert runner.script.sent[0].queue_wait_ms == 1


def test_without_an_http_budget_the_header_is_30_s_and_the_attempt_timeout_covers_execution(
    runner: Runner,
) -> None:
    runner.script.then(ok()).then(ok(COMMAND_RESULT))
    runner.run(lambda client: client.execute(READ))
    runner.run(lambda client: client.execute(COMMAND))
    read, command = runner.script.sent
    assert (read.queue_wait_ms, read.read_timeout_s) == (30_000, 65.0)  # 30 + 30 + 5
    assert (command.queue_wait_ms, command.read_timeout_s) == (30_000, 70.0)  # 30 + 35 + 5


def test_an_absolute_deadline_is_an_http_budget(runner: Runner) -> None:
    runner.script.then(ok())
    runner.execute(deadline=runner.time.clock() + 60)
    assert runner.script.sent[0].queue_wait_ms == 25_000


def test_the_earlier_of_deadline_and_request_timeout_wins(runner: Runner) -> None:
    runner.script.then(ok())
    runner.execute(deadline=runner.time.clock() + 125, max_request_timeout_ms=60_000)
    assert runner.script.sent[0].queue_wait_ms == 25_000


def test_the_header_shrinks_with_the_time_spent_on_earlier_attempts(runner: Runner) -> None:
    runner.script.then(queue_timeout("2"), takes_ms=3000).then(ok())
    runner.execute(max_request_timeout_ms=125_000)
    assert [sent.queue_wait_ms for sent in runner.script.sent] == [90_000, 85_000]


def test_a_request_timeout_over_610_s_is_invalid(runner: Runner) -> None:
    with pytest.raises(WorkspaceToolError) as caught:
        runner.execute(max_request_timeout_ms=610_001)
    assert caught.value.reason == "invalid" and runner.script.sent == []


def test_the_header_arithmetic_is_a_pure_function() -> None:
    assert plan_attempt(request=READ, remaining_ms=None, mint_ms=0).queue_wait_ms == 30_000  # type: ignore[union-attr]
    assert plan_attempt(request=READ, remaining_ms=35_000, mint_ms=0) is None
    assert plan_attempt(request=READ, remaining_ms=None, mint_ms=30_000) is None


# -- rule 5 ---------------------------------------------------------------------------------


def test_every_attempt_sends_the_same_body_bytes(runner: Runner) -> None:
    result = {**READ_RESULT, "path": "dir/é.txt"}
    runner.script.then(rate_limited("1")).then(queue_timeout()).then(ok(result))
    runner.execute({**READ, "maxLines": 7, "path": "dir/é.txt"})
    bodies = {sent.body for sent in runner.script.sent}
    assert len(bodies) == 1
    assert json.loads(bodies.pop()) == {**READ, "path": "dir/é.txt", "maxLines": 7, "startLine": 1}


def test_the_credentials_callable_is_called_once_per_attempt(runner: Runner) -> None:
    tokens = iter(["t1", "t2", "t3"])
    calls: list[str] = []

    def mint() -> str:
        calls.append(token := next(tokens))
        return token

    runner.script.then(queue_timeout()).then(rate_limited()).then(ok())
    runner.execute(client={"api_key": mint})
    assert calls == ["t1", "t2", "t3"]
    assert [sent.headers["Authorization"] for sent in runner.script.sent] == [
        "Bearer t1",
        "Bearer t2",
        "Bearer t3",
    ]


def test_the_credentials_may_be_a_headers_dict_from_a_callable(runner: Runner) -> None:
    runner.script.then(ok())
    runner.execute(client={"api_key": lambda: {"Authorization": "Bearer minted", "X-Tenant": "a"}})
    assert runner.script.sent[0].headers["Authorization"] == "Bearer minted"
    assert runner.script.sent[0].headers["X-Tenant"] == "a"


def test_an_async_client_awaits_a_coroutine_credentials_callable() -> None:
    runner = Runner("async")

    async def mint() -> str:
        return "async-token"

    runner.script.then(ok())
    runner.execute(client={"api_key": mint})
    assert runner.script.sent[0].headers["Authorization"] == "Bearer async-token"


def test_time_spent_minting_is_taken_off_the_header(runner: Runner) -> None:
    def slow_mint() -> str:
        runner.time.now_ms += 250
        return "token"

    runner.script.then(ok()).then(ok())
    runner.execute(client={"api_key": slow_mint})
    runner.execute(client={"api_key": slow_mint}, max_request_timeout_ms=60_000)
    assert [sent.queue_wait_ms for sent in runner.script.sent] == [29_750, 24_750]


def test_a_failing_credentials_callable_sends_nothing(runner: Runner) -> None:
    def broken() -> str:
        raise RuntimeError("vault unreachable")

    with pytest.raises(WorkspaceToolError) as caught:
        runner.execute(client={"api_key": broken})
    assert (caught.value.reason, caught.value.not_started) == ("failed", True)
    assert runner.script.sent == []


def test_a_call_sends_its_headers_and_keeps_one_request_id_across_attempts(runner: Runner) -> None:
    runner.script.then(queue_timeout()).then(ok())
    runner.execute(client={"worker_id": "worker-1"})
    first, second = runner.script.sent
    assert first.request.method == "POST"
    assert str(first.request.url) == "http://sluice.test/v1/workspace-tools/execute"
    assert first.headers["Authorization"] == "Bearer test-key"
    assert first.headers["Content-Type"] == "application/json"
    assert first.headers["X-LibreChat-Code-Worker-ID"] == "worker-1"
    request_id = first.headers["X-LibreChat-Workspace-Request-Id"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{16,128}", request_id)
    assert second.headers["X-LibreChat-Workspace-Request-Id"] == request_id


def test_each_call_gets_its_own_request_id_and_no_worker_header_by_default(runner: Runner) -> None:
    runner.script.then(ok()).then(ok())
    runner.run(lambda client: client.execute(READ))
    runner.run(lambda client: client.execute(READ))
    assert "X-LibreChat-Code-Worker-ID" not in runner.script.sent[0].headers
    ids = {sent.headers["X-LibreChat-Workspace-Request-Id"] for sent in runner.script.sent}
    assert len(ids) == 2


def test_a_caller_chosen_request_id_is_sent(runner: Runner) -> None:
    runner.script.then(ok())
    runner.execute(request_id="agent-7-call-0001")
    assert runner.script.sent[0].headers["X-LibreChat-Workspace-Request-Id"] == "agent-7-call-0001"


def test_a_base_url_with_a_path_prefix_is_kept(sync_runner: Runner) -> None:
    from sluice_client import Client

    sync_runner.script.then(ok())
    with Client(
        "http://gw.test/sluice/",
        transport=sync_runner.script.transport(),
        **sync_runner.client_options(),
    ) as client:
        client.execute(READ)
    assert (
        str(sync_runner.script.sent[0].request.url)
        == "http://gw.test/sluice/v1/workspace-tools/execute"
    )
