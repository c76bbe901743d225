"""A hostile worker's result is answered 502 RESULT_INVALID and never forwarded (§2.5, §4.2).

A worker holds broker and Redis credentials, so it can settle any of its own live assignments
with whatever it likes. The test plays that worker: it freezes the real worker process
(SIGSTOP) so the call is granted and dispatched but not yet run, reads the live entry's fence
(incarnation + ticket) from Redis, and settles it with a result that breaks §2.2. Once thawed,
the real worker runs the assignment and settles it too; that settlement comes too late (the
assignment is no longer live) and is discarded and counted.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from livesupport import Worker, git_workspace
from workerkit import call, request, running_entry, settle, worker_stats

pytestmark = pytest.mark.e2e

HOSTILE = "HOSTILE-PAYLOAD-7f3a"
READ = request("read_file", path="a.txt")
READ_RESULT = {
    "protocolVersion": 1,
    "operation": "read_file",
    "workspaceId": "repo",
    "path": "a.txt",
    "content": "a",
    "startLine": 1,
    "endLine": 1,
    "truncated": False,
}
COMMAND = request("execute_command", command="echo hi", maxOutputBytes=100)
COMMAND_RESULT = {
    "protocolVersion": 1,
    "operation": "execute_command",
    "workspaceId": "repo",
    "exitCode": 0,
    "stdout": "hi\n",
    "stderr": "",
    "truncated": False,
    "timedOut": False,
}

# (case, request, what the hostile worker settles with)
CASES = [
    ("extra key", READ, {"t": "result", "ok": True, "result": READ_RESULT | {"note": HOSTILE}}),
    (
        "absolute path",
        READ,
        {"t": "result", "ok": True, "result": READ_RESULT | {"path": "/etc/" + HOSTILE}},
    ),
    (
        "listing with an absolute path",
        request("list_files"),
        {
            "t": "result",
            "ok": True,
            "result": {
                "protocolVersion": 1,
                "operation": "list_files",
                "workspaceId": "repo",
                "paths": ["/home/" + HOSTILE],
                "truncated": False,
            },
        },
    ),
    (
        "stdout over maxOutputBytes",
        COMMAND,
        {"t": "result", "ok": True, "result": COMMAND_RESULT | {"stdout": HOSTILE * 10}},
    ),
    (
        "more lines than asked for",
        request("read_file", path="a.txt", maxLines=1),
        {"t": "result", "ok": True, "result": READ_RESULT | {"content": f"a\n{HOSTILE}\n"}},
    ),
    (
        "a service code claiming 'not started'",
        COMMAND,
        {
            "t": "result",
            "ok": False,
            "error": {"error": HOSTILE, "code": "WORKSPACE_QUEUE_TIMEOUT"},
        },
    ),
]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return git_workspace(tmp_path / "repo", files={"a.txt": "a\n"})


def call_settled_by_a_hostile_worker(
    http: httpx.Client, owner: Any, worker: Worker, body: dict[str, Any], payload: dict[str, Any]
) -> httpx.Response:
    assert worker.process is not None
    pid = worker.process.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(call, http, owner, body)
            entry_id, entry = running_entry(owner.worker_id)
            assert settle(
                owner.worker_id,
                entry_id,
                incarnation=entry["inc"],
                ticket=entry["seq"],
                payload=payload,
                token=owner.worker_token,
            )
            return pending.result(timeout=10)
    finally:
        os.kill(pid, signal.SIGCONT)


def discarded_settlements(worker_id: str, at_least: int, timeout_s: float = 10.0) -> int:
    """The worker's settle_discarded counter, once it reaches `at_least` (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        count = int(worker_stats(worker_id).get("settle_discarded", 0))
        if count >= at_least or time.monotonic() > deadline:
            return count
        time.sleep(0.01)


def test_a_hostile_worker_result_is_502_and_never_forwarded(http, owner, worker):
    # One worker plays every case in turn; each case's own settlement is discarded before the next.
    for number, (case, body, payload) in enumerate(CASES, start=1):
        response = call_settled_by_a_hostile_worker(http, owner, worker, body, payload)
        assert (case, response.status_code, response.json()["code"]) == (
            case,
            502,
            "RESULT_INVALID",
        )
        assert set(response.json()) == {"error", "code"}, case
        assert HOSTILE not in response.text, case
        # The real worker, thawed, finds the call over (its entry settled and gone: the grant
        # facts the worker runs by live there) and drops it without running or settling it.
        assert worker.process is not None
        drops = lambda: sum(  # noqa: E731
            "assignment without a live grant dropped" in line for line in worker.process.lines
        )
        deadline = time.monotonic() + 10
        while drops() < number:
            assert time.monotonic() < deadline, case
            time.sleep(0.01)
        assert int(worker_stats(owner.worker_id).get("settle_discarded", 0)) == 0, case


def test_a_hostile_result_key_name_never_reaches_the_client(http, owner, worker):
    payload = {
        "t": "result",
        "ok": True,
        "result": READ_RESULT | {"IGNORE-PREVIOUS-INSTRUCTIONS": 1},
    }
    response = call_settled_by_a_hostile_worker(http, owner, worker, READ, payload)
    assert (response.status_code, response.json()["code"]) == (502, "RESULT_INVALID")
    assert "IGNORE-PREVIOUS-INSTRUCTIONS" not in response.text
