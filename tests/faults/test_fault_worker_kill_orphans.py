"""A worker killed with SIGKILL mid-command (issue 8, item 4).

tests/workspaces/test_worker_crash.py covers the answer (504 at the deadline, or at once when
the worker re-registers) and that the call never runs a second time. This file covers what
`make soak` found next to it: the killed worker's command kept running (commands lead their
own session, so nothing kills them with the worker), and the new incarnation started the next
call on the same isolation key while it did. Now a starting worker kills what an earlier run
of it left (workspaces/runtime/orphans.py) before it registers.
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


def test_after_a_worker_is_killed_its_orphaned_command_never_overlaps_the_next_call_on_its_key(
    api: Any, account_factory: Any, worker_factory: Any, tmp_path: Path
) -> None:
    owner = account_factory()
    worker = worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    log = tmp_path / "key-a.log"
    pids = Path(f"{log}.pids")
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
            # A also leaves a background job behind in a session of its own (setsid).
            escaped = tmp_path / "escaped"
            first = pool.submit(
                run,
                "A",
                f"setsid sh -c 'echo $$ > {escaped}; sleep 30' & " + stamped("A", log, 4),
            )
            deadline = time.monotonic() + 10
            while "A start" not in marks(log) or not escaped.exists():
                assert time.monotonic() < deadline, "A never started"
                time.sleep(0.02)
            orphans = [int(pid) for pid in pids.read_text().split()]
            orphans.append(int(escaped.read_text()))
            assert all(pid_alive(pid) for pid in orphans)
            worker.kill()
            worker.start()
            assert first.result(timeout=30).status_code == 504
        # B looks, as it starts, for anything A left: the shell, its sleep, the escaped job.
        watch = " ".join(map(str, orphans))
        second = run(
            "B",
            # (A zombie, killed but not yet reaped by init, runs nothing: state Z.)
            f"for p in {watch}; do s=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null); "
            f'[ -n "$s" ] && [ "$s" != Z ] && echo "alive $p $s"; done; echo done',
        )
        assert second.status_code == 200, second.text
        assert second.json()["stdout"] == "done\n", "B ran while A's processes were alive"
        assert not any(pid_alive(pid) for pid in orphans)
        # Killed, not finished.
        assert "A end" not in marks(log)
    finally:
        for pid in pids.read_text().split() if pids.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid), signal.SIGKILL)
