"""A worker killed with SIGKILL mid-command (issue 8, item 4).

tests/workspaces/test_worker_crash.py covers the answer (504 at the deadline, or at once when
the worker re-registers) and that the call never runs a second time. This file covers what
`make soak` found next to it: the killed worker's command kept running (commands lead their
own session, so nothing kills them with the worker), and the new incarnation started the next
call on the same isolation key while it did. Now a starting worker kills what an earlier run
of it left (workspaces/runtime/orphans.py) before it registers, and a sandboxed command
(bwrap --die-with-parent) dies with its worker anyway.

Commands run in their own PID namespace, so the pids they could write mean nothing on the
host and B cannot see A's processes: the host finds them by their owner mark, and an escaped
job of A's writes a heartbeat into the workspace that must stop before B starts.
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
from livesupport import git_workspace, pid_alive

from workspaces.runtime.orphans import orphaned_pids

pytestmark = pytest.mark.e2e

EXECUTE = "/v1/workspace-tools/execute"


def stamped(name: str, log: Path, seconds: float) -> str:
    return (
        f'echo "{name} start $(date +%s%N)" >> {log}; '
        f'sleep {seconds}; echo "{name} end $(date +%s%N)" >> {log}'
    )


def marks(log: Path) -> dict[str, int]:
    found = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        name, what, ns = line.split()
        found[f"{name} {what}"] = int(ns)
    return found


def test_after_a_worker_is_killed_its_orphaned_command_never_overlaps_the_next_call_on_its_key(
    api: Any, account_factory: Any, worker_factory: Any, tmp_path: Path
) -> None:
    owner = account_factory()
    workspace = git_workspace(tmp_path / "a")
    worker = worker_factory(owner, {"a": workspace}, slots=2)
    # Inside the workspace: the only place a sandboxed command may write.
    log = workspace / "key-a.log"
    beat = workspace / "escaped.beat"
    orphans: list[int] = []
    headers = owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id}

    def run(name: str, command: str) -> httpx.Response:
        body = {
            "protocolVersion": 1,
            "operation": "execute_command",
            "workspaceId": "a",
            "command": command,
            "timeoutMs": 10_000,
        }
        with httpx.Client(base_url=api.url, timeout=60) as http:
            return http.post(EXECUTE, json=body, headers=headers)

    try:
        with ThreadPoolExecutor(1) as pool:
            # A also leaves a job behind in a session of its own (setsid), beating until killed.
            first = pool.submit(
                run,
                "A",
                f"setsid sh -c 'while :; do date +%s%N >> {beat}; sleep 0.05; done' & "
                + stamped("A", log, 4),
            )
            deadline = time.monotonic() + 10
            while "A start" not in marks(log) or not beat.exists():
                assert time.monotonic() < deadline, "A never started"
                time.sleep(0.02)
            orphans = orphaned_pids(owner.worker_id)
            # bwrap, its PID 1, the shell, its sleep, the escaped loop.
            assert len(orphans) >= 4 and all(pid_alive(pid) for pid in orphans)
            worker.kill()
            worker.start()
            assert first.result(timeout=30).status_code == 504
        second = run("B", stamped("B", log, 0))
        assert second.status_code == 200, second.text
        b_started = marks(log)["B start"]
        beats = [int(line) for line in beat.read_text().split()]
        assert beats and max(beats) < b_started, "A's escaped job ran while B did"
        assert not any(pid_alive(pid) for pid in orphans)
        # Killed, not finished.
        assert "A end" not in marks(log)
    finally:
        for pid in orphaned_pids(owner.worker_id) if orphans else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
