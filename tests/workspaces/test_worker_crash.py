"""A worker that dies or restarts (§2.5, §4.1, §4.2): the call it held is answered 504
ASSIGNMENT_EXPIRED (outcome unknown), never re-run, and the restarted worker is a new
incarnation.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from livesupport import Worker, git_workspace
from workerkit import call, request, ticket_counter

from workspaces.models import Worker as WorkerRow

pytestmark = pytest.mark.e2e

# The command appends its pid (= its process group: commands lead their own group), then
# outlives any deadline in these tests; the test kills the group when it is done.
LONG_COMMAND = "echo $$ >> ../marker; exec sleep 30"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return git_workspace(tmp_path / "repo")


@pytest.fixture
def marker(repo: Path) -> Iterator[Path]:
    path = repo.parent / "marker"
    yield path
    # A worker killed with SIGKILL leaves its command orphaned; don't leave it to the next test.
    if path.exists():
        for pid in path.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid), signal.SIGKILL)


def wait_until_exists(path: Path, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} was never created"
        time.sleep(0.01)


def sigkill(worker: Worker) -> None:
    assert worker.process is not None
    worker.process.proc.send_signal(signal.SIGKILL)
    worker.process.proc.wait(timeout=10)


def incarnation_row(worker_id: str) -> str:
    return WorkerRow.objects.get(worker_id=worker_id).incarnation_id


def test_a_worker_killed_mid_command_gives_504_at_the_deadline_and_never_runs_it_again(
    http, owner, worker, repo, marker
):
    # timeoutMs 2000: the exec budget is 2000 + 5000 ms from admission (§2.3).
    body = request("execute_command", command=LONG_COMMAND, timeoutMs=2000)
    with ThreadPoolExecutor(1) as pool:
        sent = time.monotonic()
        pending = pool.submit(call, http, owner, body)
        wait_until_exists(marker)
        sigkill(worker)
        response = pending.result(timeout=30)
        answered = time.monotonic() - sent
    assert (response.status_code, response.json()["code"]) == (504, "ASSIGNMENT_EXPIRED")
    assert "may or may not have run" in response.json()["error"]
    # Admission came after `sent`, so the deadline is at least 7 s after it: never earlier.
    assert answered >= 7.0

    old = worker.incarnation
    worker.start()
    assert worker.incarnation != old
    assert incarnation_row(owner.worker_id) == worker.incarnation
    # The new incarnation takes work (a full round trip), and the killed call is not among it.
    after = call(http, owner, request("read_file", path="README.md"))
    assert after.status_code == 200, after.text
    assert len(marker.read_text().split()) == 1
    # Checked last so the checks above still run while this bound fails: the API waits for the
    # deadline plus a 0.5 s grace for a settlement in flight, then answers promptly.
    assert answered < 9.5, f"answered {answered:.2f} s after the call was sent"


def test_a_running_call_gets_504_at_once_when_its_worker_re_registers(
    http, owner, worker, repo, marker
):
    body = request("execute_command", command=LONG_COMMAND, timeoutMs=20_000)
    with ThreadPoolExecutor(1) as pool:
        sent = time.monotonic()
        pending = pool.submit(call, http, owner, body)
        wait_until_exists(marker)
        sigkill(worker)
        # The replacement registers long before the call's 25 s deadline: the API learns the
        # old incarnation is gone and need not wait the deadline out.
        worker.start()
        response = pending.result(timeout=30)
        answered = time.monotonic() - sent
    assert (response.status_code, response.json()["code"]) == (504, "ASSIGNMENT_EXPIRED")
    assert answered < 10.0
    # The new incarnation takes work (a full round trip), and the killed call is not among it:
    # its message was acknowledged when the old incarnation took it, so nothing redelivers it.
    after = call(http, owner, request("read_file", path="README.md"))
    assert after.status_code == 200, after.text
    assert len(marker.read_text().split()) == 1


def test_a_restarted_worker_gets_a_new_incarnation(http, owner, worker, repo):
    first = worker.incarnation
    assert len(first) == 32
    assert incarnation_row(owner.worker_id) == first
    worker.stop()
    assert worker.process is not None and worker.process.proc.returncode == 0
    # Deregistered on the way out: the server no longer counts it as registered.
    assert incarnation_row(owner.worker_id) == ""
    offline = call(http, owner, request("read_file", path="README.md"))
    assert (offline.status_code, offline.json()["code"]) == (503, "WORKER_OFFLINE")

    worker.start()
    assert worker.incarnation != first
    assert incarnation_row(owner.worker_id) == worker.incarnation
    assert call(http, owner, request("read_file", path="README.md")).status_code == 200


def test_sigterm_finishes_the_running_call_and_tells_waiting_calls_offline(
    http, owner, repo, worker_factory
):
    worker = worker_factory(owner, {"repo": repo}, slots=1)
    running = request("execute_command", command="echo started > ../started; sleep 1.5; echo done")
    waiting = request("read_file", path="README.md")
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(call, http, owner, running)
        wait_until_exists(repo.parent / "started")
        # Same workspace, one slot: this call waits in the worker's queue.
        second = pool.submit(call, http, owner, waiting)
        deadline = time.monotonic() + 5
        while ticket_counter(owner.worker_id) < 2:
            assert time.monotonic() < deadline, "the second call never entered the queue"
            time.sleep(0.01)
        assert worker.process is not None
        worker.process.signal(signal.SIGTERM)
        finished, refused = first.result(timeout=30), second.result(timeout=30)
    assert worker.process.proc.wait(timeout=30) == 0
    assert (finished.status_code, finished.json()["stdout"]) == (200, "done\n")
    assert (refused.status_code, refused.json()["code"]) == (503, "WORKER_OFFLINE")
    assert "not started" in refused.json()["error"]
    assert incarnation_row(owner.worker_id) == ""
