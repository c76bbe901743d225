"""A worker killed with SIGKILL mid-command (issue 8, item 4).

tests/workspaces/test_worker_crash.py covers the answer (504 at the deadline, or at once when
the worker re-registers) and that the call never runs a second time. This file covers what
`make soak` found next to it: the killed worker's command keeps running (commands lead their
own session, so nothing kills them with the worker), and the new incarnation starts the next
call on the same isolation key while it does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from livesupport import git_workspace

pytestmark = pytest.mark.e2e

EXECUTE = "/v1/workspace-tools/execute"


def stamped(name: str, log: Path, seconds: float) -> str:
    return (
        f'echo $$ >> {log}.pids; echo "{name} start $(date +%s%N)" >> {log}; '
        f'sleep {seconds}; echo "{name} end $(date +%s%N)" >> {log}'
    )


def marks(log: Path) -> dict[str, int]:
    found = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        name, what, ns = line.split()
        found[f"{name} {what}"] = int(ns)
    return found


@pytest.mark.xfail(
    strict=True,
    reason="BUG: a command of a worker killed with SIGKILL keeps running (it leads its own "
    "session; workspaces/operations command runner), and the restarted worker runs the next "
    "call on the same isolation key beside it: one key, two commands at once",
)
def test_after_a_worker_is_killed_its_orphaned_command_never_overlaps_the_next_call_on_its_key(
    api: Any, account_factory: Any, worker_factory: Any, tmp_path: Path
) -> None:
    owner = account_factory()
    worker = worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    log = tmp_path / "key-a.log"
    headers = owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id}

    def run(name: str, seconds: float) -> httpx.Response:
        body = {
            "protocolVersion": 1,
            "operation": "execute_command",
            "workspaceId": "a",
            "command": stamped(name, log, seconds),
            "timeoutMs": 10_000,
        }
        with httpx.Client(base_url=api.url, timeout=60) as http:
            return http.post(EXECUTE, json=body, headers=headers)

    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(run, "A", 4)
            deadline = time.monotonic() + 10
            while "A start" not in marks(log):
                assert time.monotonic() < deadline, "A never started"
                time.sleep(0.02)
            worker.kill()
            worker.start()
            assert first.result(timeout=30).status_code == 504
        second = run("B", 0)
        assert second.status_code == 200, second.text
        deadline = time.monotonic() + 10
        while "A end" not in marks(log):
            assert time.monotonic() < deadline, "the orphaned command never ended"
            time.sleep(0.05)
        seen = marks(log)
        assert seen["B start"] > seen["A end"], "B ran on key a while A was still running"
    finally:
        pids = Path(f"{log}.pids")
        for pid in pids.read_text().split() if pids.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid), signal.SIGKILL)
