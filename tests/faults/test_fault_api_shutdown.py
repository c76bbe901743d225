"""An API process stopped with SIGTERM (a deploy) while it has calls running and waiting.

The waiting call is answered 503 SERVICE_SHUTTING_DOWN ("not started") before the running one
finishes, leaves the queue and never runs; the running call finishes with its result; both
leave a completion row. Real uvicorn, real worker, real Redis and Postgres.
"""

from __future__ import annotations

import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings
from livesupport import git_workspace, start_api, wait_until

from admission.models import CompletionLog
from admission.queue import SyncQueue

pytestmark = pytest.mark.e2e
EXECUTE = "/v1/workspace-tools/execute"


def queue_of(worker_id: str) -> tuple[int, list[dict[str, Any]]]:
    """(tickets taken so far, entries now in the worker's queue)."""
    with redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True) as client:
        registration, entries, _ = SyncQueue(client, settings.REDIS_KEY_PREFIX).snapshot(worker_id)
    return int(registration.get("seq") or 0), entries


def test_sigterm_answers_waiting_calls_not_started_and_lets_running_ones_finish(
    live_env: dict[str, str], account_factory: Any, worker_factory: Any, tmp_path: Path
) -> None:
    owner = account_factory()
    repo = git_workspace(tmp_path / "repo")
    worker_factory(owner, {"repo": repo}, slots=1)
    api = start_api(live_env)
    started, waiter_ran = tmp_path / "started", tmp_path / "waiter-ran"
    suffix = uuid.uuid4().hex
    running_id, waiting_id = f"sd-running-{suffix}", f"sd-waiting-{suffix}"
    answers: dict[str, tuple[float, httpx.Response]] = {}

    def send(name: str, command: str, request_id: str) -> None:
        body = {
            "protocolVersion": 1,
            "operation": "execute_command",
            "workspaceId": "repo",
            "command": command,
            "timeoutMs": 10_000,
        }
        headers = owner.auth | {
            "X-LibreChat-Code-Worker-ID": owner.worker_id,
            "X-LibreChat-Workspace-Request-Id": request_id,
        }
        with httpx.Client(base_url=api.url, timeout=30) as http:
            response = http.post(EXECUTE, json=body, headers=headers)
        answers[name] = (time.monotonic(), response)

    before, _ = queue_of(owner.worker_id)
    try:
        with ThreadPoolExecutor(2) as pool:
            pool.submit(send, "running", f"touch {started}; sleep 1; echo finished", running_id)
            wait_until(lambda: started.exists() or answers, timeout_s=15)
            assert started.exists(), {k: v[1].text for k, v in answers.items()}
            pool.submit(send, "waiting", f"touch {waiter_ran}", waiting_id)
            # Both calls are in the worker's queue: one running, one waiting behind it.
            wait_until(lambda: queue_of(owner.worker_id)[0] == before + 2, timeout_s=10)
            api.process.signal(signal.SIGTERM)
        # uvicorn ends by re-raising the signal it caught, once it has shut down cleanly.
        assert api.process.proc.wait(timeout=20) in (0, -signal.SIGTERM)
    finally:
        api.process.stop()

    waited_at, waited = answers["waiting"]
    ran_at, ran = answers["running"]
    assert waited.status_code == 503, waited.text
    assert waited.json()["code"] == "SERVICE_SHUTTING_DOWN"
    assert "not started" in waited.json()["error"]
    assert waited_at < ran_at  # answered at once, not after the running call
    assert ran.status_code == 200, ran.text
    assert ran.json()["stdout"] == "finished\n"
    assert not waiter_ran.exists()
    assert queue_of(owner.worker_id)[1] == []

    def rows() -> dict[str, str]:
        found = CompletionLog.objects.filter(request_id__in=[running_id, waiting_id])
        return {row.request_id: row.code for row in found}

    wait_until(lambda: len(rows()) == 2, timeout_s=15)
    assert rows() == {running_id: "", waiting_id: "SERVICE_SHUTTING_DOWN"}
