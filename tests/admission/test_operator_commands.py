"""`manage.py cancel_call` and `manage.py drain_worker` end to end: the command line, the queue
in the real Redis, the audit trail in the real Postgres."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from livesupport import run_command
from operatorkit import enter_call, forget_worker, registered_worker, sync_queue

from admission.models import OperatorAction
from workspaces.access import principal_hash
from workspaces.models import Principal, Worker

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker() -> Iterator[Worker]:
    made = registered_worker()
    yield made
    forget_worker(made)


def enter_with_request_id(worker: Worker, entry_id: str, request_id: str) -> str:
    """A call of a principal of the worker's tenant, named by `request_id`, enters the queue."""
    principal = Principal.objects.create(tenant=worker.tenant, name=f"p-{entry_id}")
    scope = principal_hash(tenant_id=worker.tenant_id, principal_id=principal.pk)
    return enter_call(worker, entry_id, request_id=request_id, scope=scope)


def audit() -> list[tuple[str, str, str]]:
    return [(a.action, a.target, a.via) for a in OperatorAction.objects.order_by("pk")]


def test_cancel_call_cancels_a_waiting_call_and_leaves_a_running_one(worker: Worker) -> None:
    running_rid, waiting_rid = "running-" + uuid.uuid4().hex, "waiting-" + uuid.uuid4().hex
    assert enter_with_request_id(worker, "e-run", running_rid) == "granted"
    assert enter_with_request_id(worker, "e-wait", waiting_rid) == "waiting"

    running = run_command("cancel_call", running_rid)
    assert running.returncode == 2
    assert running.stdout.strip().splitlines() == [
        f"call {running_rid} is running; it was not cancelled (a running call is never touched)"
    ]
    cancelled = run_command("cancel_call", waiting_rid)
    assert cancelled.returncode == 0 and len(cancelled.stdout.strip().splitlines()) == 1
    assert "cancelled the waiting call" in cancelled.stdout
    _, entries, _ = sync_queue().snapshot(worker.worker_id)
    assert [e["id"] for e in entries] == ["e-run"]
    assert audit() == [("cancel", f"call request {waiting_rid} on {worker.worker_id}", "command")]
    assert OperatorAction.objects.get().actor.startswith("shell:")


@pytest.mark.parametrize("request_id", ["never-seen-" + "x" * 8, "bad id!"])
def test_cancel_call_of_an_unknown_request_id_is_one_line_and_fails(
    request_id: str, worker: Worker
) -> None:
    result = run_command("cancel_call", request_id)
    assert result.returncode != 0 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "no " in result.stderr
    assert audit() == []


def test_drain_worker_and_resume_it_from_the_command_line(worker: Worker) -> None:
    drained = run_command("drain_worker", worker.worker_id)
    assert drained.returncode == 0 and "drained worker" in drained.stdout
    assert enter_with_request_id(worker, "e-1", "first-" + uuid.uuid4().hex) == "waiting"
    again = run_command("drain_worker", worker.worker_id)
    assert again.returncode == 0 and "drained already" in again.stdout
    resumed = run_command("drain_worker", worker.worker_id, "--resume")
    assert resumed.stdout.strip() == f"resumed worker {worker.worker_id}; 1 waiting call(s) granted"
    target = f"worker {worker.worker_id}"
    assert audit() == [("drain", target, "command"), ("resume", target, "command")]
    missing: Any = run_command("drain_worker", "no-such-worker")
    assert missing.returncode == 1 and "no worker no-such-worker" in missing.stderr
