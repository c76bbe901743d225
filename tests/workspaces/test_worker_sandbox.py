"""The sandbox through a real `runworker` (contract §4.4): what it registers, what its commands
reach, and what a worker that cannot sandbox offers. The attacks one by one are proven at the
operation level (tests/workspaces/operations/test_op_sandbox.py).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
from livesupport import git_workspace
from workerkit import call, request

from workspaces.models import Worker as WorkerRow
from workspaces.models import WorkerWorkspace

pytestmark = pytest.mark.e2e


def test_a_sandboxing_worker_says_bwrap_and_hides_itself_and_the_network_where_asked(
    http: Any, account_factory: Any, worker_factory: Any, tmp_path: Path
) -> None:
    owner = account_factory()
    online, offline = git_workspace(tmp_path / "online"), git_workspace(tmp_path / "offline")
    worker = worker_factory(owner, {"online": online, "offline": offline}, start=False)
    worker.extra_args = ["--workspace-no-network", "offline"]
    worker.shared_dirs = []
    worker.start()
    assert WorkerRow.objects.get(worker_id=owner.worker_id).sandbox_profile == "bwrap"
    assert worker.process is not None
    pid = worker.process.proc.pid
    # The host can read the worker's environment (its token and Redis URL are in it) ...
    assert b"REDIS_URL=" in Path(f"/proc/{pid}/environ").read_bytes()
    # ... its command cannot: the worker's pid does not exist in the command's namespace.
    probe = call(
        http, owner, request("execute_command", "online", command=f"cat /proc/{pid}/environ")
    )
    assert probe.status_code == 200, probe.text
    assert (probe.json()["stdout"], "No such file" in probe.json()["stderr"]) == ("", True)

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        port = server.getsockname()[1]
        # The API's own interpreter is not in the sandbox (the code base is hidden), so the
        # probe is git's: it connects, then fails the HTTP exchange, or cannot connect at all.
        connect = f"git ls-remote http://127.0.0.1:{port}/x.git 2>&1 | head -c 300; true"
        answers = {
            ws: call(http, owner, request("execute_command", ws, command=connect, timeoutMs=5000))
            for ws in ("online", "offline")
        }
    texts = {ws: a.json()["stdout"] for ws, a in answers.items()}
    assert (
        "Connection refused" not in texts["online"] and "Failed to connect" not in texts["online"]
    )
    assert "Failed to connect" in texts["offline"] or "Connection refused" in texts["offline"]


@pytest.mark.parametrize("allowed", [False, True])
def test_a_worker_that_cannot_sandbox_offers_no_command_unless_allowed(
    http: Any, account_factory: Any, worker_factory: Any, tmp_path: Path, allowed: bool
) -> None:
    owner = account_factory()
    worker = worker_factory(owner, {"repo": git_workspace(tmp_path / "repo")}, start=False)
    # No bwrap on this worker's PATH: exactly what a host without bubblewrap looks like.
    empty = tmp_path / "no-bwrap"
    empty.mkdir()
    worker.env = worker.env | {"PATH": str(empty)}
    worker.extra_args = ["--allow-unsandboxed-commands"] if allowed else []
    worker.shared_dirs = []
    worker.start()
    assert worker.process is not None
    warning = worker.process.wait_for("bwrap is not installed")
    assert '"level": "WARNING"' in warning
    assert ("UNSANDBOXED" in warning) is allowed
    assert WorkerRow.objects.get(worker_id=owner.worker_id).sandbox_profile == "none"
    offered = WorkerWorkspace.objects.get(worker__worker_id=owner.worker_id).operations
    assert ("execute_command" in offered) is allowed
    answer = call(http, owner, request("execute_command", command="echo ran"))
    if allowed:
        assert (answer.status_code, answer.json()["stdout"]) == (200, "ran\n")
    else:
        assert answer.status_code in (403, 409), answer.text
    assert os.path.exists(tmp_path / "repo")
