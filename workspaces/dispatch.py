"""Hands an admitted call to the Celery queue of the one worker that must run it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

# Publishing is retried briefly on a broken broker connection. A message published twice
# is harmless: the worker runs a ticket at most once.
PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.05, "interval_max": 0.1}


def worker_queue_name(worker_id: str) -> str:
    return f"sluice.worker.{worker_id}"


def assignment_dispatch(*, assignment: dict[str, Any], expires: datetime) -> None:
    from workspaces.tasks import run_assignment

    run_assignment.apply_async(
        args=[assignment],
        queue=worker_queue_name(str(assignment["workerId"])),
        expires=expires,
        retry=True,
        retry_policy=PUBLISH_RETRY,
        # Celery logs a task's arguments when it fails; they hold file content and commands.
        argsrepr=f"(<assignment {assignment['assignmentId']}>,)",
        kwargsrepr="{}",
    )
