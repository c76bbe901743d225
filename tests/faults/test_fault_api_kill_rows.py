"""An API process killed (SIGKILL) while its synchronous calls run and wait: every command
that ran still gets exactly one completion row, from the drainer's sweep, and the calls of
the process that lives get theirs from that process alone. Real uvicorn processes, a real
worker and drainer, real Redis and Postgres."""

from __future__ import annotations

import signal
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from livesupport import ApiServer, git_workspace, start_api, wait_until

from admission.models import CompletionLog

pytestmark = pytest.mark.e2e
EXECUTE = "/v1/workspace-tools/execute"
WORKSPACES = ("a", "b", "c", "d")


def test_every_command_a_killed_process_started_has_exactly_one_row(
    live_env: dict[str, str],
    api: ApiServer,
    account_factory: Any,
    worker_factory: Any,
    tmp_path: Path,
) -> None:
    owner = account_factory()
    worker_factory(owner, {w: git_workspace(tmp_path / w) for w in WORKSPACES}, slots=4)
    doomed = start_api(live_env)
    marks = tmp_path / "ran"
    marks.mkdir()
    suffix = uuid.uuid4().hex[:12]

    def send(server: ApiServer, name: str, workspace: str, seconds: float) -> None:
        body = {
            "protocolVersion": 1,
            "operation": "execute_command",
            "workspaceId": workspace,
            # Marks that it ran before anything else, so "ran" never depends on an answer.
            "command": f"touch {marks / name}; sleep {seconds}",
            "timeoutMs": 20_000,
        }
        headers = owner.auth | {
            "X-LibreChat-Code-Worker-ID": owner.worker_id,
            "X-LibreChat-Workspace-Request-Id": name,
        }
        try:
            with httpx.Client(base_url=server.url, timeout=60) as http:
                http.post(EXECUTE, json=body, headers=headers)
        except httpx.TransportError:
            pass  # its process died under it: no answer, by design

    # Two calls per workspace to the doomed process (one runs, one waits behind it on the same
    # workspace), and one to the process that lives, waiting behind those.
    cut = [f"cut-{w}-{n}-{suffix}" for n in (1, 2) for w in WORKSPACES]
    kept = [f"kept-{w}-{suffix}" for w in WORKSPACES]
    try:
        with ThreadPoolExecutor(len(cut) + len(kept)) as pool:
            for name in cut[:4]:
                pool.submit(send, doomed, name, name.split("-")[1], 4)
            wait_until(lambda: len(list(marks.iterdir())) == 4, timeout_s=30)
            for name in cut[4:]:
                pool.submit(send, doomed, name, name.split("-")[1], 1)
            # Every call of the doomed process is in its queue before the process goes, and
            # so are the living process's, behind them.
            wait_until(lambda: _in_queue(owner.worker_id) >= len(cut), timeout_s=30)
            for name in kept:
                pool.submit(send, api, name, name.split("-")[1], 0.2)
            wait_until(lambda: _in_queue(owner.worker_id) >= len(cut) + len(kept), timeout_s=30)
            doomed.process.signal(signal.SIGKILL)
    finally:
        doomed.process.kill_group()

    everyone = cut + kept
    wait_until(lambda: len(list(marks.iterdir())) == len(everyone), timeout_s=60)

    def rows() -> dict[str, list[tuple[str, int, str]]]:
        found: dict[str, list[tuple[str, int, str]]] = {}
        for row in CompletionLog.objects.filter(request_id__in=everyone):
            found.setdefault(row.request_id, []).append((row.outcome, row.http_status, row.code))
        return found

    # Those cut off are written once they are over and past the sweep's grace.
    wait_until(lambda: len(rows()) == len(everyone), timeout_s=90)
    written = rows()
    ran = sorted(p.name for p in marks.iterdir())
    assert ran == sorted(everyone)
    assert {name: len(found) for name, found in written.items()} == dict.fromkeys(everyone, 1)
    # Each one's answer reached nobody; what the endpoint would have answered is the worker's.
    assert {written[name][0] for name in cut} == {("disconnected", 200, "")}
    # The living process wrote its own rows, not the sweep.
    assert {written[name][0] for name in kept} == {("completed", 200, "")}


def _in_queue(worker_id: str) -> int:
    """Calls the worker's queue has taken so far (its ticket counter)."""
    import redis
    from django.conf import settings

    from admission.queue import SyncQueue

    with redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True) as client:
        registration, _, _ = SyncQueue(client, settings.REDIS_KEY_PREFIX).snapshot(worker_id)
    return int(registration.get("seq") or 0)
