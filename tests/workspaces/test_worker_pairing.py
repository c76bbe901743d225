"""Attaching a worker the LibreChat way (contract §4.5), end to end with real processes: pair
through the API, `runworker --pairing-code` redeems and starts, a read goes through, a revoke
tells the waiting call WORKER_OFFLINE and the worker process exits on its own."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from livesupport import PYTHON, ROOT, Process, git_workspace, unique, wait_until
from workerkit import EXECUTE, admission_redis, request

from admission.queue import worker_keys
from workspaces.models import Worker

pytestmark = pytest.mark.e2e


def test_a_paired_worker_serves_calls_and_a_revoke_stops_it_and_its_waiting_call(
    api: Any, live_env: dict[str, str], account_factory: Any, tmp_path: Path
) -> None:
    owner = account_factory()
    worker_id = unique("env")
    with api.client() as http:
        pairing = http.post(
            "/v1/bridge/pairings", headers=owner.auth, json={"workerId": worker_id}
        ).json()
        assert pairing["workerId"] == worker_id
        credentials = tmp_path / "creds" / "worker.json"
        repo = git_workspace(tmp_path / "repo")
        worker = Process(
            [
                PYTHON,
                "manage.py",
                "runworker",
                "--pairing-code",
                pairing["code"],
                "--api",
                api.url,
                "--workspace",
                f"repo={repo}",
                "--credentials",
                str(credentials),
                "--slots",
                "1",
                "--allow-unsandboxed-commands",
            ],
            live_env,
            "paired-worker",
        )
        try:
            worker.wait_for("registered: incarnation", timeout_s=60)
            worker.wait_for("ready", timeout_s=60)
            assert stat.S_IMODE(os.stat(credentials).st_mode) == 0o600
            saved = json.loads(credentials.read_text())
            assert saved["worker_id"] == worker_id
            assert Worker.objects.get(worker_id=worker_id).token_hash != ""

            headers = owner.auth | {"X-LibreChat-Code-Worker-ID": worker_id}
            read = http.post(EXECUTE, headers=headers, json=request("read_file", path="README.md"))
            assert read.status_code == 200 and read.json()["content"] == "# demo", read.text
            status = http.get(f"/v1/bridge/workers/{worker_id}/status", headers=owner.auth).json()
            assert status["online"] is True and status["ready"] is True

            with ThreadPoolExecutor(2) as pool:
                # One slot, one key: the command runs, the read behind it waits.
                running = pool.submit(
                    http.post,
                    EXECUTE,
                    headers=headers,
                    json=request("execute_command", command="sleep 2"),
                )
                wait_until(lambda: _running(worker_id), timeout_s=20)
                waiting = pool.submit(
                    http.post, EXECUTE, headers=headers, json=request("read_file", path="README.md")
                )
                wait_until(lambda: _waiting(worker_id), timeout_s=20)
                revoked = http.post(f"/v1/bridge/workers/{worker_id}/revoke", headers=owner.auth)
                assert revoked.status_code == 200
                assert revoked.json() == {"protocolVersion": 1, "revoked": True}
                told = waiting.result(timeout=30)
                assert told.status_code == 503 and told.json()["code"] == "WORKER_OFFLINE"
                # The command may have run: its answer says the outcome is unknown.
                assert running.result(timeout=30).status_code in (200, 504)

            again = http.post(EXECUTE, headers=headers, json=request("read_file", path="README.md"))
            assert again.status_code == 503 and again.json()["code"] == "WORKER_OFFLINE"
            # Its next heartbeat (every 5 s) is refused; it drains and exits with one line.
            started = time.monotonic()
            code = worker.proc.wait(timeout=30)
            assert time.monotonic() - started < 25
            assert code != 0
            assert "token is no longer accepted" in worker.output()
            assert "Traceback" not in worker.output()
        finally:
            if worker.alive():
                worker.kill_group()


def test_runworker_says_in_one_line_why_a_pairing_code_is_refused(
    api: Any, live_env: dict[str, str], account_factory: Any, tmp_path: Path
) -> None:
    owner = account_factory()
    with api.client() as http:
        code = http.post(
            "/v1/bridge/pairings", headers=owner.auth, json={"workerId": unique("env")}
        ).json()["code"]
        assert http.post("/v1/bridge/pairings/redeem", json={"code": code}).status_code == 200
    repo = git_workspace(tmp_path / "repo")
    for given, says in ((code, "PAIRING_CODE_USED"), ("B" * 32, "PAIRING_CODE_UNKNOWN")):
        proc = subprocess.run(
            [
                PYTHON,
                "manage.py",
                "runworker",
                "--pairing-code",
                given,
                "--api",
                api.url,
                "--workspace",
                f"repo={repo}",
                "--credentials",
                str(tmp_path / "never.json"),
            ],
            cwd=ROOT,
            env=live_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        # stdout holds the worker's JSON log (its HTTP requests); the refusal is one line.
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode != 0 and len(lines) == 1 and says in lines[0], proc.stderr
    assert not (tmp_path / "never.json").exists()


def _entries(worker_id: str) -> list[dict[str, Any]]:
    with admission_redis() as client:
        raw = client.hgetall(worker_keys(settings.REDIS_KEY_PREFIX, worker_id).entries)
    return [json.loads(v) for v in raw.values()]


def _running(worker_id: str) -> bool:
    return any(e.get("st") == "r" for e in _entries(worker_id))


def _waiting(worker_id: str) -> bool:
    return any(e.get("st") != "r" for e in _entries(worker_id))
