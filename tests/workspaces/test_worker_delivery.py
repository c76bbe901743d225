"""At most once (§4.2): a duplicate, stale or late Celery delivery of an assignment never runs.

These tests play the broker's part: they enter a call into the worker's real queue (so it
holds a genuine ticket under the worker's current incarnation, as an API process would), then
publish the assignment message to the worker's own Celery queue themselves, once or twice or
in a stale form, exactly as a redelivering broker or a confused API process could. The worker
under test is a real `runworker` process; its command appends a line to a marker file each
time it runs.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from livesupport import Worker, git_workspace, wait_until
from workerkit import (
    admission_redis,
    admit,
    assignment,
    publish,
    release,
    request,
    wait_for_settlement,
    worker_stats,
)

from admission.queue import worker_keys

pytestmark = pytest.mark.e2e

RUN_ONCE = request("execute_command", command="echo ran >> ../marker", timeoutMs=10_000)
# What the API gives execute_command: its timeout plus 5 s to settle (§2.3).
EXEC_BUDGET_MS = 15_000


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    # The marker lives next to the workspace, so no operation's own output lands in it.
    return git_workspace(tmp_path / "repo")


@pytest.fixture
def marker(repo: Path) -> Path:
    return repo.parent / "marker"


def logged(worker: Worker, message: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The worker's structured log line with this message (waits for it to be written)."""
    assert worker.process is not None
    line = worker.process.wait_for(f'"message": "{message}"', timeout_s=timeout_s)
    record: dict[str, Any] = json.loads(line)
    return record


def _dropped_as_late(lines: list[str], entry_id: str) -> bool:
    return any("past its deadline dropped" in line and entry_id in line for line in lines)


def set_exec_deadline(worker_id: str, entry_id: str, deadline_ms: int) -> None:
    """Move a granted entry's exec deadline: the worker takes it from the entry alone."""
    key = worker_keys(settings.REDIS_KEY_PREFIX, worker_id).entries
    with admission_redis() as client:
        entry = json.loads(client.hget(key, entry_id))
        client.hset(key, entry_id, json.dumps({**entry, "dl": deadline_ms}))


def admission_redis_time() -> tuple[int, int]:
    with admission_redis() as client:
        seconds, micros = client.time()
    return int(seconds), int(micros)


def run_a_fresh_assignment(owner: Any, marker: Path) -> None:
    """Proves the worker consumes and runs assignments: whatever it dropped, it dropped on purpose."""
    entry_id, grant = admit(owner.worker_id, RUN_ONCE, exec_budget_ms=EXEC_BUDGET_MS)
    publish(
        owner.worker_id,
        assignment(owner.worker_id, entry_id, grant, RUN_ONCE, token=owner.worker_token),
    )
    settled = wait_for_settlement(owner.worker_id, entry_id, timeout_s=10)
    assert settled is not None and settled["ok"] is True, settled


def test_duplicate_delivery_of_one_assignment_runs_it_once(owner, worker, marker):
    entry_id, grant = admit(owner.worker_id, RUN_ONCE, exec_budget_ms=EXEC_BUDGET_MS)
    message = assignment(owner.worker_id, entry_id, grant, RUN_ONCE, token=owner.worker_token)
    # The same message twice, task id included: what a broker redelivery looks like.
    publish(owner.worker_id, message, task_id=entry_id)
    publish(owner.worker_id, message, task_id=entry_id)

    settled = wait_for_settlement(owner.worker_id, entry_id, timeout_s=10)
    assert settled is not None
    assert (settled["ok"], settled["result"]["exitCode"]) == (True, 0)
    # The copy is dropped unrun: as a duplicate while the first still holds its grant, or, when
    # the first settled before the copy was read (a loaded machine), as an assignment whose
    # grant is gone. Either way the worker names the entry.
    assert worker.process is not None
    process = worker.process
    drops = ('"message": "duplicate delivery dropped"', "assignment without a live grant dropped")
    line = wait_until(
        lambda: next(
            (
                line
                for line in list(process.lines)
                if entry_id in line and any(d in line for d in drops)
            ),
            None,
        )
    )
    dropped = json.loads(line)
    assert (dropped["entry"], dropped["worker_id"]) == (entry_id, owner.worker_id)
    if dropped["message"] == "duplicate delivery dropped":
        assert dropped["ticket"] == grant.ticket
    assert marker.read_text() == "ran\n"
    # The duplicate was dropped before running, so it never tried to settle either.
    assert "settle_discarded" not in worker_stats(owner.worker_id)


def test_an_assignment_past_its_exec_deadline_is_dropped_and_never_runs(owner, worker, marker):
    entry_id, grant = admit(owner.worker_id, RUN_ONCE, exec_budget_ms=EXEC_BUDGET_MS)
    # A message the broker hands over late: its grant's deadline (in the entry, where the
    # worker reads it; the message's own claim counts for nothing) has passed.
    set_exec_deadline(owner.worker_id, entry_id, grant.admitted_ms - 1)
    late = assignment(
        owner.worker_id,
        entry_id,
        grant,
        RUN_ONCE,
        token=owner.worker_token,
        execDeadlineMs=grant.exec_deadline_ms,
    )
    publish(owner.worker_id, late)

    dropped = logged(worker, "assignment past its deadline dropped")
    assert dropped["ticket"] == grant.ticket
    assert not marker.exists()
    # Nobody settles a dropped assignment; the API frees its key when it gives up on it.
    assert release(owner.worker_id, entry_id, grant.ticket)
    run_a_fresh_assignment(owner, marker)
    assert marker.read_text() == "ran\n"


def test_an_assignment_for_the_previous_incarnation_is_dropped_by_the_new_one(
    owner, worker, marker
):
    entry_id, grant = admit(owner.worker_id, RUN_ONCE, exec_budget_ms=EXEC_BUDGET_MS)
    stale = assignment(owner.worker_id, entry_id, grant, RUN_ONCE, token=owner.worker_token)
    assert stale["incarnation"] == worker.incarnation
    worker.stop()
    # The message waits in the worker's queue (same name across incarnations) until the worker
    # is back, as a message restored by the broker after a crash would.
    publish(owner.worker_id, stale)
    worker.start()
    assert worker.incarnations[0] != worker.incarnations[1]

    dropped = logged(worker, "assignment for another incarnation dropped")
    assert dropped["entry"] == entry_id
    assert not marker.exists()
    run_a_fresh_assignment(owner, marker)
    assert marker.read_text() == "ran\n"


def test_an_assignment_naming_another_worker_is_dropped(owner, worker, marker):
    entry_id, grant = admit(owner.worker_id, RUN_ONCE, exec_budget_ms=EXEC_BUDGET_MS)
    publish(
        owner.worker_id,
        assignment(
            owner.worker_id,
            entry_id,
            grant,
            RUN_ONCE,
            token=owner.worker_token,
            workerId="someone-else",
        ),
    )
    logged(worker, "assignment for another incarnation dropped")
    assert not marker.exists()


def test_an_assignment_that_cannot_start_before_its_deadline_is_refused_unstarted(
    owner, worker, marker
):
    # Less than the worker's settle margin (500 ms) left when it arrives: too late to start,
    # still early enough to say so. One that takes over 450 ms to reach the worker (a busy
    # machine) arrives past its deadline and is dropped unanswered, as it must be: then the
    # window was missed, not the rule, and a fresh call tries again.
    settled = None
    for _attempt in range(5):
        entry_id, grant = admit(owner.worker_id, RUN_ONCE, exec_budget_ms=EXEC_BUDGET_MS)
        seconds, micros = admission_redis_time()
        set_exec_deadline(owner.worker_id, entry_id, seconds * 1000 + micros // 1000 + 450)
        tight = assignment(owner.worker_id, entry_id, grant, RUN_ONCE, token=owner.worker_token)
        publish(owner.worker_id, tight)
        settled = wait_for_settlement(owner.worker_id, entry_id, timeout_s=3)
        if settled is not None:
            break
        assert worker.process is not None
        wait_until(partial(_dropped_as_late, worker.process.lines, entry_id), timeout_s=5)
    assert settled is not None
    assert (settled["ok"], settled["error"]["code"], settled["quarantine"]) == (
        False,
        "COMMAND_UNAVAILABLE",
        False,
    )
    assert "not started" in settled["error"]["error"]
    assert not marker.exists()
