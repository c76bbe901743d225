"""execute_command end to end: the timeout kills the command's whole process tree, output is
capped per stream, and the exit code or signal comes back as the contract spells it.

The worker sandboxes its commands (bwrap): pids a command writes are those of its own PID
namespace, so the host-side checks look for the processes by the owner mark in their
environment instead (workspaces/runtime/orphans.py).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from livesupport import git_workspace
from workerkit import call, request, ticket_counter

from workspaces.runtime.orphans import orphaned_pids

pytestmark = pytest.mark.e2e

RESULT_KEYS = {
    "protocolVersion",
    "operation",
    "workspaceId",
    "exitCode",
    "stdout",
    "stderr",
    "truncated",
    "timedOut",
}

# The leader, a child and a grandchild each append their pid, then sleep far past the timeout.
# The grandchild is started from inside the child, so only a kill of the whole process group
# (not of the leader, not of its direct children) reaches it.
TREE = """
echo $$ >> pids
sh -c 'echo $$ >> pids; sh -c "echo \\$\\$ >> pids; exec sleep 60" & exec sleep 60' &
sleep 60
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return git_workspace(tmp_path / "repo")


def none_left(worker_id: str, within_s: float = 2.0) -> bool:
    """Whether every process the worker's commands started is gone (the kernel tears a PID
    namespace down just after its init exits)."""
    end = time.monotonic() + within_s
    while orphaned_pids(worker_id):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def wait_for_tickets(worker_id: str, count: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while ticket_counter(worker_id) < count:
        assert time.monotonic() < deadline, f"fewer than {count} calls entered the queue"
        time.sleep(0.01)


def run(http: httpx.Client, owner: Any, command: str, **fields: Any) -> dict[str, Any]:
    response = call(http, owner, request("execute_command", command=command, **fields))
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_a_timeout_kills_the_whole_process_tree(http, owner, worker, repo):
    started = time.monotonic()
    result = run(http, owner, TREE, timeoutMs=1500)
    elapsed = time.monotonic() - started
    assert result == {
        "protocolVersion": 1,
        "operation": "execute_command",
        "workspaceId": "repo",
        "exitCode": None,
        "signal": "SIGKILL",
        "stdout": "",
        "stderr": "",
        "truncated": False,
        "timedOut": True,
    }
    # Killed at its timeout, not at the exec deadline (timeout + 5 s) and not before.
    assert 1.5 <= elapsed < 4.0
    pids = [int(line) for line in (repo / "pids").read_text().split()]
    assert len(pids) == 3
    assert none_left(owner.worker_id)


def test_a_background_job_left_behind_is_killed_when_the_command_ends(http, owner, worker, repo):
    started = time.monotonic()
    result = run(
        http,
        owner,
        # The command ends only once its job is running (it has written its pid file).
        "sh -c 'echo $$ > bg.pid; exec sleep 60' & "
        "while [ ! -s bg.pid ]; do sleep 0.01; done; echo done",
        timeoutMs=30_000,
    )
    elapsed = time.monotonic() - started
    assert (result["exitCode"], result["stdout"], result["timedOut"]) == (0, "done\n", False)
    # The job holds stdout open; the worker does not wait for it, it kills it.
    assert elapsed < 5.0
    assert (repo / "bg.pid").exists()
    assert none_left(owner.worker_id)


def test_output_is_capped_at_max_output_bytes_for_both_streams_together(http, owner, worker, repo):
    noisy = "head -c 3000 /dev/zero | tr '\\0' o; head -c 3000 /dev/zero | tr '\\0' e >&2"
    cut = run(http, owner, noisy, maxOutputBytes=4000)
    assert set(cut) == RESULT_KEYS
    # One budget, as LibreChat counts it: stdout came first and took 3000 of the 4000 bytes.
    assert (cut["stdout"], cut["stderr"], cut["truncated"], cut["exitCode"]) == (
        "o" * 3000,
        "e" * 1000,
        True,
        0,
    )

    exact = run(http, owner, noisy, maxOutputBytes=6000)
    assert (exact["stdout"], exact["stderr"], exact["truncated"]) == ("o" * 3000, "e" * 3000, False)


def test_a_cut_never_splits_a_character(http, owner, worker, repo):
    # Three 2-byte characters cut at 3 bytes: the half character is dropped, not replaced.
    result = run(http, owner, "printf 'ééé'", maxOutputBytes=3)
    assert (result["stdout"], result["truncated"]) == ("é", True)


def test_an_endless_producer_is_capped_and_stopped_at_its_timeout(http, owner, worker, repo):
    result = run(http, owner, "yes", maxOutputBytes=10, timeoutMs=1000)
    assert (result["stdout"], result["truncated"], result["timedOut"], result["signal"]) == (
        "y\n" * 5,
        True,
        True,
        "SIGKILL",
    )


def test_exit_code_and_signal_are_reported_as_the_contract_spells_them(http, owner, worker, repo):
    exited = run(http, owner, "exit 7")
    assert set(exited) == RESULT_KEYS
    assert (exited["exitCode"], exited["timedOut"]) == (7, False)

    # Sandboxed, a signal comes back folded into the exit status as a shell shows it (bwrap
    # cannot report it otherwise); an unconfined run reports "signal" (test_op_command.py).
    signalled = run(http, owner, "kill -TERM $$")
    assert set(signalled) == RESULT_KEYS
    assert (signalled["exitCode"], signalled["timedOut"]) == (128 + 15, False)


def test_calls_longer_than_10_s_get_their_results(http, owner, worker, repo):
    long_command = request("execute_command", command="sleep 10.3; echo done", timeoutMs=20_000)
    # Same workspace, so this one waits in the queue until the command is done.
    behind_it = request("read_file", path="README.md")
    with ThreadPoolExecutor(2) as pool:
        started = time.monotonic()
        running = pool.submit(call, http, owner, long_command)
        wait_for_tickets(owner.worker_id, 1)  # the command is queued first
        waiting = pool.submit(
            call, http, owner, behind_it, {"X-LibreChat-Workspace-Queue-Wait-Ms": "30000"}
        )
        answers = [running.result(timeout=30), waiting.result(timeout=30)]
    elapsed = round(time.monotonic() - started, 1)
    # Today, both after 10 s: 504 ASSIGNMENT_EXPIRED "Lost track of the call after it was admitted"
    # and 503 ADMISSION_UNAVAILABLE.
    assert [(a.status_code, a.json().get("code")) for a in answers] == [(200, None), (200, None)], (
        elapsed,
        [a.text for a in answers],
    )
    assert answers[0].json()["stdout"] == "done\n"


def test_a_command_sees_none_of_the_workers_configuration_but_its_owner(
    http, owner, repo, worker_factory
):
    worker = worker_factory(owner, {"repo": repo}, start=False)
    # Everything a worker may be configured with, token included, as its environment.
    worker.env = worker.env | {
        "SLUICE_WORKER_TOKEN": owner.worker_token,
        "SECRET_KEY": "not-for-commands",
        "ISOLATION_KEY_SECRET": "not-for-commands",
        "CELERY_BROKER_URL": worker.env.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        "METRICS_TOKEN": "not-for-commands",
        "AGENT_TOOL_SETTING": "kept",
    }
    worker.start()
    names = dict(
        line.split("=", 1) for line in run(http, owner, "env")["stdout"].splitlines() if "=" in line
    )
    worker_only = {
        "DATABASE_URL",
        "REDIS_URL",
        "ADMISSION_REDIS_URL",
        "SECRET_KEY",
        "ISOLATION_KEY_SECRET",
        "METRICS_TOKEN",
    }
    leaked = {
        name
        for name in names
        if name in worker_only or name.startswith(("SLUICE_", "DJANGO_", "CELERY_"))
    }
    assert leaked == {"SLUICE_COMMAND_OF"}
    assert names["SLUICE_COMMAND_OF"] == owner.worker_id
    assert owner.worker_token not in "".join(names.values())
    assert names["AGENT_TOOL_SETTING"] == "kept" and names["PATH"]
