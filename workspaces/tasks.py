"""Celery tasks. They take plain dicts, call one service, and own retries (there are none:
an assignment runs at most once)."""

from __future__ import annotations

from typing import Any

from celery import shared_task


@shared_task(name="sluice.run_assignment", ignore_result=True, acks_late=False)
def run_assignment(assignment: dict[str, Any]) -> None:
    from workspaces.runtime.assignments import assignment_run

    assignment_run(assignment)
