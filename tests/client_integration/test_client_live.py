"""sluice_client against a real Sluice (issue 7, "Done when"): uvicorn API processes, real
`runworker` workers, real Redis and Postgres.

Every command here appends a marker of its own (a uuid, or its pid) to a file outside the
workspace, so "ran exactly once" and "never ran" are read from what the worker really did,
and every HTTP attempt is recorded below the client, at its transport (see conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from livesupport import PYTHON, ROOT, base_env, git_workspace, start_api
from sluice_client import AsyncClient, Client, WorkspaceToolError

from admission.models import CompletionLog

pytestmark = pytest.mark.e2e

NOT_STARTED = "The operation was not started"


def marked(log: Path, mark: str, seconds: float = 0.0) -> str:
    """A command that records its own run: one line with `mark`, then an optional sleep."""
    text = f"echo {mark} >> {shlex.quote(str(log))}"
    return f"{text}; sleep {seconds}" if seconds else text


def runs(log: Path) -> Counter[str]:
    return Counter(log.read_text().split()) if log.exists() else Counter()


def outcome(call: Any, *args: Any, **kwargs: Any) -> Any:
    """The call's result, or the WorkspaceToolError it raised."""
    try:
        return call(*args, **kwargs)
    except WorkspaceToolError as exc:
        return exc


# ---------------------------------------------------------------------------------------
# 40 calls on one workspace: capacity windows are waited out, nothing runs twice.

# The client names a call once and sends that X-LibreChat-Workspace-Request-Id on every
# attempt (so cancel_request(id) reaches whichever attempt is waiting). Sluice binds the id
# before queueing (admission/services.py, claim_request_id: SET NX) and, however the call
# ends, even with a "not started" 503/429, leaves it as "done" for 10 minutes
# (admission/queue.py, finish_request_id). The retry is then refused.
REQUEST_ID_REUSE_BUG = (
    "BUG: a retry after 503 WORKSPACE_QUEUE_TIMEOUT or 429 WORKER_QUEUE_FULL is refused with "
    "400 INVALID_REQUEST_ID ('This request id already names another call'): the server keeps "
    "the request id of a call that was never started as 'done' for 10 min, and the client "
    "resends the same id, so capacity retries never succeed"
)


def test_a_burst_of_40_calls_on_one_workspace_completes_through_retries_and_runs_each_once(
    api, account_factory, worker_factory, apply_policy, attempts, held, until, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"ws": git_workspace(tmp_path / "ws")}, slots=2)
    # A 1.5 s queue budget against 39 commands of ~0.2 s each on one isolation key: most calls
    # see WORKSPACE_QUEUE_TIMEOUT at least once. The client sends no HTTP budget (header
    # 30000), so it is the server's ceiling that cuts every wait short. The rate limit is
    # lifted so that the many retries are never refused for it.
    apply_policy({"WORKSPACE_QUEUE_CEILING_MS": "1500", "WORKSPACE_TOOLS_RATE_LIMIT": "1000/30s"})
    log = tmp_path / "ran"
    marks = [uuid.uuid4().hex for _ in range(40)]

    async def burst() -> list[dict[str, Any]]:
        transport = attempts.async_transport()
        async with AsyncClient(
            api.url,
            api_key=owner.api_key,
            worker_id=owner.worker_id,
            retry_queue_full=True,
            transport=transport,
        ) as sluice:
            # The first call holds the workspace while the other 39 arrive together: 31 of them
            # fill the worker's queue to WORKER_QUEUE_LIMIT (32, the running call included),
            # and exactly 8 get WORKER_QUEUE_FULL.
            first = asyncio.create_task(sluice.execute_command("ws", marked(log, marks[0], 1.5)))
            await asyncio.to_thread(until, lambda: len(held(owner.worker_id)) == 1)
            rest = [sluice.execute_command("ws", marked(log, m, 0.2)) for m in marks[1:]]
            return await asyncio.gather(first, *rest)

    started = time.monotonic()
    results = asyncio.run(burst())
    elapsed = time.monotonic() - started

    assert [(r["exitCode"], r["timedOut"]) for r in results] == [(0, False)] * 40
    assert runs(log) == Counter(marks)  # every command ran, and exactly once
    calls = attempts.by_call()
    assert len(calls) == 40
    for tries in calls.values():
        assert len({t.body for t in tries}) == 1  # the same bytes on every attempt
        # 30000 less the client's own time from the attempt's start to its plan (minting
        # credentials: nothing to mint for a static key, but the 40 calls share one event loop,
        # and on a loaded machine that time passed 10 ms: a fresh-clone run beside stress-ng).
        # Never more than the default, and never a budget computed otherwise.
        assert all(29_000 <= int(t.queue_wait_header or 0) <= 30_000 for t in tries)
        assert tries[-1].status == 200
        assert {(t.status, t.code) for t in tries[:-1]} <= {
            (503, "WORKSPACE_QUEUE_TIMEOUT"),
            (429, "WORKER_QUEUE_FULL"),
        }
    firsts = Counter((t[0].status, t[0].code) for t in calls.values())
    assert firsts[(429, "WORKER_QUEUE_FULL")] == 8
    retried_after_503 = [c for c in calls.values() if any(t.status == 503 for t in c)]
    assert len(retried_after_503) >= 10, "the burst never really hit the queue budget"
    # Serial work is ~1.5 + 39 * 0.2 s; the retries' waits (2 s hints) must not add a multiple.
    assert elapsed < 40, f"the burst took {elapsed:.1f} s"


def test_without_the_opt_in_the_calls_over_the_queue_limit_fail_as_not_started_and_never_run(
    api, account_factory, worker_factory, attempts, held, until, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"ws": git_workspace(tmp_path / "ws")}, slots=2)
    log = tmp_path / "ran"
    marks = [uuid.uuid4().hex for _ in range(40)]
    together = threading.Barrier(39)

    with (
        Client(
            api.url,
            api_key=owner.api_key,
            worker_id=owner.worker_id,
            transport=attempts.transport(),
        ) as sluice,
        ThreadPoolExecutor(max_workers=40) as pool,
    ):

        def call(mark: str) -> Any:
            together.wait(timeout=10)
            return outcome(sluice.execute_command, "ws", marked(log, mark))

        first = pool.submit(outcome, sluice.execute_command, "ws", marked(log, marks[0], 1.5))
        until(lambda: len(held(owner.worker_id)) == 1)
        answers = dict(zip(marks[1:], pool.map(call, marks[1:]), strict=True))
        answers[marks[0]] = first.result()

    refused = {m: a for m, a in answers.items() if isinstance(a, WorkspaceToolError)}
    assert len(refused) == 8
    for error in refused.values():
        assert (error.reason, error.status, error.code) == ("rejected", 429, "WORKER_QUEUE_FULL")
        assert error.not_started is True
        assert error.attempts == 1
        assert NOT_STARTED in error.message
        assert "retry_queue_full" in error.message  # says why it was not retried
    assert all(a["exitCode"] == 0 for m, a in answers.items() if m not in refused)
    # Nothing was resent: one attempt per call.
    assert len(attempts.all) == 40 and len(attempts.by_call()) == 40
    # The 32 admitted calls ran once each; the 8 refused never ran (the queue is empty now).
    until(lambda: held(owner.worker_id) == [])
    assert runs(log) == Counter(m for m in marks if m not in refused)


def test_a_call_whose_api_process_stalls_past_its_queue_deadline_still_gets_a_queue_timeout(
    live_env, api, account_factory, worker_factory, held, until, tmp_path
):
    owner = account_factory()
    worker_factory(
        owner, {"a": git_workspace(tmp_path / "a"), "b": git_workspace(tmp_path / "b")}, slots=2
    )
    stalled = start_api(live_env)
    options = {"api_key": owner.api_key, "worker_id": owner.worker_id}
    try:
        with (
            Client(api.url, **options) as sluice,
            # No capacity retries: the first answer is the one under test. 36 s for a read
            # leaves a 1000 ms queue-wait header (35 s are reserved for execution).
            Client(
                stalled.url, max_queue_wait_ms=0, max_request_timeout_ms=36_000, **options
            ) as late,
            ThreadPoolExecutor(max_workers=2) as pool,
        ):
            blocker = pool.submit(sluice.execute_command, "a", "sleep 3")
            until(lambda: len(held(owner.worker_id)) == 1)
            waiting = pool.submit(outcome, late.read_file, "a", "README.md")
            until(lambda: len(held(owner.worker_id)) == 2)
            # Freeze the waiter's API process past the waiter's deadline (a long GC pause, a
            # busy host), while calls through the other process prune the expired entry.
            stalled.process.signal(signal.SIGSTOP)
            try:
                until(
                    lambda: sluice.read_file("b", "README.md") and len(held(owner.worker_id)) == 1,
                    timeout_s=5.0,
                    interval_s=0.1,
                )
            finally:
                stalled.process.signal(signal.SIGCONT)
            error = waiting.result(timeout=10)
            assert blocker.result()["exitCode"] == 0
    finally:
        stalled.process.kill_group()

    assert isinstance(error, WorkspaceToolError), error
    assert (error.reason, error.not_started) == ("rejected", True)
    assert (error.status, error.code) == (503, "WORKSPACE_QUEUE_TIMEOUT")


# ---------------------------------------------------------------------------------------
# The rate limit: waited out within its own budget, across both API processes.


def test_a_rate_limited_burst_completes_within_the_limiters_refill_time(
    api_servers, api, account_factory, worker_factory, apply_policy, attempts, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"ws": git_workspace(tmp_path / "ws")}, slots=2)
    # 10 units at once, then one every 0.5 s: 20 calls need 5 s of refill for the last 10.
    apply_policy({"WORKSPACE_TOOLS_RATE_LIMIT": "10/5s"})
    log = tmp_path / "ran"
    marks = [uuid.uuid4().hex for _ in range(20)]

    async def burst() -> list[dict[str, Any]]:
        # Half the calls go through each API process: they share one limiter in Redis.
        clients = [
            AsyncClient(
                server.url,
                api_key=owner.api_key,
                worker_id=owner.worker_id,
                max_rate_limit_wait_ms=10_000,
                transport=attempts.async_transport(),
            )
            for server in api_servers
        ]
        try:
            calls = [
                clients[i % 2].execute_command("ws", marked(log, mark))
                for i, mark in enumerate(marks)
            ]
            return await asyncio.gather(*calls)
        finally:
            for client in clients:
                await client.aclose()

    started = time.monotonic()
    results = asyncio.run(burst())
    elapsed = time.monotonic() - started

    assert [r["exitCode"] for r in results] == [0] * 20
    assert runs(log) == Counter(marks)
    calls = attempts.by_call()
    assert len(calls) == 20
    for tries in calls.values():
        assert len({t.body for t in tries}) == 1
        assert tries[-1].status == 200
        assert {(t.status, t.code) for t in tries[:-1]} <= {(429, "rate_limited")}
    # The burst allowance is exactly the limit; the other 10 calls waited for refills.
    assert sum(len(tries) == 1 for tries in calls.values()) == 10
    # Not faster than the limiter allows, and no slower than its refill time plus one
    # Retry-After step (whole seconds) and the commands themselves.
    assert 4.5 <= elapsed <= 8.0, f"the burst took {elapsed:.2f} s"


# ---------------------------------------------------------------------------------------
# A worker killed mid-command: the outcome is unknown, so the call fails once.


@pytest.fixture
def pid_file(tmp_path: Path) -> Any:
    path = tmp_path / "pids"
    yield path
    # Commands lead their own process group, so SIGKILL to the worker leaves them orphaned.
    if path.exists():
        for pid in path.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid), signal.SIGKILL)


def test_a_worker_killed_mid_command_gives_one_timeout_that_says_it_may_have_run(
    api, account_factory, worker_factory, attempts, until, pid_file, tmp_path
):
    owner = account_factory()
    worker = worker_factory(owner, {"ws": git_workspace(tmp_path / "ws")}, slots=2)
    request_id = f"killed-{uuid.uuid4().hex}"
    # timeoutMs 3000: the exec budget is 3000 + 5000 ms from admission.
    command = f"echo $$ >> {shlex.quote(str(pid_file))}; exec sleep 30"

    with (
        Client(
            api.url,
            api_key=owner.api_key,
            worker_id=owner.worker_id,
            transport=attempts.transport(),
        ) as sluice,
        ThreadPoolExecutor(max_workers=1) as pool,
    ):
        sent = time.monotonic()
        pending = pool.submit(
            outcome, sluice.execute_command, "ws", command, timeout_ms=3000, request_id=request_id
        )
        # Its pid written, not only the file created: a kill between the two leaves it empty.
        until(lambda: pid_file.exists() and pid_file.read_text().strip())
        worker.kill()
        error = pending.result(timeout=30)
        answered = time.monotonic() - sent

    assert isinstance(error, WorkspaceToolError), error
    assert (error.reason, error.status, error.code) == ("timeout", 504, "ASSIGNMENT_EXPIRED")
    assert error.not_started is False
    assert "may have run" in error.message
    assert "not started" not in error.message.lower()
    assert error.attempts == 1 and error.request_id == request_id
    assert [(a.request_id, a.status) for a in attempts.all] == [(request_id, 504)]
    # Sluice saw one POST for it too: exactly one completion row (rows land asynchronously).
    row = until(lambda: CompletionLog.objects.filter(request_id=request_id).first())
    assert (row.http_status, row.code) == (504, "ASSIGNMENT_EXPIRED")
    assert CompletionLog.objects.filter(request_id=request_id).count() == 1
    assert len(pid_file.read_text().split()) == 1
    # Not before the exec deadline (admission came after `sent`).
    assert 8.0 <= answered < 15.0, f"answered after {answered:.2f} s"


# ---------------------------------------------------------------------------------------
# The CLI as an agent runs it: a separate process, JSON out, the exit code says what to do.


def cli(*args: str, **kwargs: Any) -> subprocess.Popen[str]:
    env = {k: v for k, v in base_env().items() if not k.startswith("SLUICE_")}
    return subprocess.Popen(
        [PYTHON, "-m", "sluice_client", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def finish(process: subprocess.Popen[str], timeout_s: float = 30.0) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout_s)
    return process.returncode, out, err


def test_the_cli_prints_the_result_and_exits_0_and_a_missing_worker_exits_2(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"ws": git_workspace(tmp_path / "ws")}, slots=2)
    common = ["--url", api.url, "--key", owner.api_key]
    read = ["read_file", "--workspace", "ws", "--path", "README.md"]

    code, out, err = finish(cli(*common, "--worker", owner.worker_id, *read))
    assert (code, err) == (0, ""), err
    assert json.loads(out) == {
        "protocolVersion": 1,
        "operation": "read_file",
        "workspaceId": "ws",
        "path": "README.md",
        "content": "# demo",
        "startLine": 1,
        "endLine": 1,
        "truncated": False,
    }

    code, out, err = finish(cli(*common, "--worker", "no-such-worker-0001", *read))
    assert (code, out) == (2, "")
    error = json.loads(err)
    assert (error["reason"], error["status"], error["code"]) == (
        "rejected",
        404,
        "WORKER_NOT_FOUND",
    )
    assert error["not_started"] is True and error["attempts"] == 1
    assert NOT_STARTED in error["error"]


def test_a_cli_call_waiting_in_the_queue_is_cancelled_by_the_cli_and_exits_2(
    api, account_factory, worker_factory, held, until, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"ws": git_workspace(tmp_path / "ws")}, slots=2)
    common = ["--url", api.url, "--key", owner.api_key, "--worker", owner.worker_id]
    marker = tmp_path / "never"
    request_id = f"cli-{uuid.uuid4().hex}"
    # The blocker holds the slot until the test lets it go, however slowly the second CLI
    # process starts on a loaded machine.
    release = tmp_path / "release"
    hold = f"while [ ! -e {shlex.quote(str(release))} ]; do sleep 0.05; done"

    blocker = cli(*common, "execute_command", "--workspace", "ws", "--command", hold)
    until(lambda: len(held(owner.worker_id)) == 1)
    waiting = cli(
        *common, "--request-id", request_id,
        "execute_command", "--workspace", "ws", "--command", f"touch {shlex.quote(str(marker))}",
    )  # fmt: skip
    until(lambda: len(held(owner.worker_id)) == 2)

    code, out, err = finish(cli(*common, "cancel", request_id))
    assert (code, json.loads(out), err) == (0, {"state": "cancelled"}, "")
    code, out, err = finish(waiting)
    assert (code, out) == (2, "")
    error = json.loads(err)
    assert (error["reason"], error["status"], error["code"]) == (
        "rejected",
        409,
        "REQUEST_CANCELLED",
    )
    assert error["attempts"] == 1 and error["not_started"] is True

    release.touch()
    code, out, err = finish(blocker)
    assert code == 0 and json.loads(out)["exitCode"] == 0, err
    until(lambda: held(owner.worker_id) == [])
    assert not marker.exists()


# ---------------------------------------------------------------------------------------
# Cancellation: the server lets go of a waiting call at once, and it never runs.


def test_setting_the_cancel_event_frees_the_calls_place_within_a_second_and_it_never_runs(
    api, account_factory, worker_factory, attempts, held, until, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"ws": git_workspace(tmp_path / "ws")}, slots=2)
    marker = tmp_path / "never"
    request_id = f"event-{uuid.uuid4().hex}"
    cancel = threading.Event()

    with (
        Client(
            api.url,
            api_key=owner.api_key,
            worker_id=owner.worker_id,
            transport=attempts.transport(),
        ) as sluice,
        ThreadPoolExecutor(max_workers=2) as pool,
    ):
        blocker = pool.submit(sluice.execute_command, "ws", "sleep 2.5; echo ran")
        until(lambda: len(held(owner.worker_id)) == 1)
        waiting = pool.submit(
            outcome,
            sluice.execute_command,
            "ws",
            f"touch {shlex.quote(str(marker))}",
            cancel=cancel,
            request_id=request_id,
        )
        until(lambda: len(held(owner.worker_id)) == 2)
        cancel.set()
        cancelled_at = time.monotonic()
        error = waiting.result(timeout=1.0)
        until(lambda: len(held(owner.worker_id)) == 1, timeout_s=1.0)
        dropped_after = time.monotonic() - cancelled_at
        assert blocker.result()["stdout"] == "ran\n"

    assert isinstance(error, WorkspaceToolError), error
    # Withdrawn before its socket went: Sluice said it dropped the call unstarted.
    assert (error.reason, error.not_started, error.attempts) == ("cancelled", True, 1)
    assert "not started" in error.message and "may have run" not in error.message
    assert dropped_after <= 1.0
    # One attempt: aborted, or answered REQUEST_CANCELLED as the withdrawal landed first.
    assert [a.status for a in attempts.all if a.request_id == request_id] in ([None], [409])
    until(lambda: held(owner.worker_id) == [])
    assert not marker.exists()
    row = until(lambda: CompletionLog.objects.filter(request_id=request_id).first())
    assert row.outcome == "cancelled" and row.slot_index is None


@pytest.mark.parametrize("how", ["task", "event"])
def test_cancelling_an_async_call_frees_its_place_within_a_second_and_it_never_runs(
    api, account_factory, worker_factory, held, until, tmp_path, how
):
    owner = account_factory()
    worker_factory(owner, {"ws": git_workspace(tmp_path / "ws")}, slots=2)
    marker = tmp_path / "never"

    def queued(n: int) -> Any:
        return asyncio.to_thread(until, lambda: len(held(owner.worker_id)) == n)

    async def scenario() -> tuple[dict[str, Any] | BaseException, float, dict[str, Any]]:
        async with AsyncClient(api.url, api_key=owner.api_key, worker_id=owner.worker_id) as sluice:
            blocker = asyncio.create_task(sluice.execute_command("ws", "sleep 2.5; echo ran"))
            await queued(1)
            cancel = asyncio.Event() if how == "event" else None
            waiting = asyncio.create_task(
                sluice.execute_command("ws", f"touch {shlex.quote(str(marker))}", cancel=cancel)
            )
            await queued(2)
            if cancel is not None:
                cancel.set()
            else:
                waiting.cancel()
            cancelled_at = time.monotonic()
            ended = await asyncio.wait_for(asyncio.gather(waiting, return_exceptions=True), 1.0)
            await asyncio.to_thread(until, lambda: len(held(owner.worker_id)) == 1, 1.0)
            return ended[0], time.monotonic() - cancelled_at, await blocker

    error, dropped_after, blocked = asyncio.run(scenario())

    if how == "task":
        assert isinstance(error, asyncio.CancelledError), error
    else:
        assert isinstance(error, WorkspaceToolError), error
        # Withdrawn before its connection went: Sluice said it dropped the call unstarted.
        assert (error.reason, error.not_started, error.attempts) == ("cancelled", True, 1)
    assert dropped_after <= 1.0
    assert blocked["stdout"] == "ran\n"
    until(lambda: held(owner.worker_id) == [])
    assert not marker.exists()


def test_cancel_request_answers_the_waiting_call_with_request_cancelled_and_it_is_not_resent(
    api, account_factory, worker_factory, attempts, held, until, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"ws": git_workspace(tmp_path / "ws")}, slots=2)
    marker = tmp_path / "never"
    running_id, waiting_id = f"running-{uuid.uuid4().hex}", f"waiting-{uuid.uuid4().hex}"

    with (
        Client(
            api.url,
            api_key=owner.api_key,
            worker_id=owner.worker_id,
            transport=attempts.transport(),
        ) as sluice,
        ThreadPoolExecutor(max_workers=2) as pool,
    ):
        blocker = pool.submit(
            sluice.execute_command, "ws", "sleep 2; echo ran", request_id=running_id
        )
        until(lambda: len(held(owner.worker_id)) == 1)
        waiting = pool.submit(
            outcome,
            sluice.execute_command,
            "ws",
            f"touch {shlex.quote(str(marker))}",
            request_id=waiting_id,
        )
        until(lambda: len(held(owner.worker_id)) == 2)
        assert sluice.cancel_request(running_id) == "running"
        assert sluice.cancel_request(waiting_id) == "cancelled"
        error = waiting.result(timeout=5)
        assert blocker.result()["stdout"] == "ran\n"
        assert sluice.cancel_request(running_id) == "finished"

    assert isinstance(error, WorkspaceToolError), error
    assert (error.reason, error.status, error.code) == ("rejected", 409, "REQUEST_CANCELLED")
    assert error.not_started is True and error.attempts == 1
    posts = [a.request_id for a in attempts.all if a.body]
    assert posts.count(waiting_id) == 1
    until(lambda: held(owner.worker_id) == [])
    assert not marker.exists()
