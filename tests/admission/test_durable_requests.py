"""Durable requests (contract §2.7) on real uvicorn processes and a real worker."""

from __future__ import annotations

import signal
import time
import uuid
from typing import Any

import httpx
import redis
from callhelpers import Caller, command, read, wait_until
from django.conf import settings
from livesupport import git_workspace, start_api
from test_admission_capacity import held

from admission.models import CompletionLog
from admission.queue import durable_index_key, worker_keys

REQUESTS = "/v1/workspace-tools/requests"


def _rid() -> str:
    return "durable-" + uuid.uuid4().hex[:20]


def _headers(owner: Any, request_id: str | None = None) -> dict[str, str]:
    h = owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id}
    if request_id is not None:
        h["X-LibreChat-Workspace-Request-Id"] = request_id
    return h


def _poll(url: str, owner: Any, rid: str, until: set[str], timeout_s: float = 30) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=10) as http:
        deadline = time.monotonic() + timeout_s
        while True:
            r = http.get(f"{REQUESTS}/{rid}", headers=_headers(owner))
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            if body["state"] in until:
                return body
            assert time.monotonic() < deadline, body
            time.sleep(0.05)


def _rows(rid: str) -> list[tuple[int, str]]:
    return list(CompletionLog.objects.filter(request_id=rid).values_list("http_status", "code"))


def test_capabilities_offer_durable_requests(api, account_factory):
    owner = account_factory()
    with api.client() as http:
        r = http.get("/v1/workspace-tools/capabilities", headers=owner.auth)
        assert r.status_code == 200 and r.json() == {"durableWorkspaceRequests": 1}
        assert http.get("/v1/workspace-tools/capabilities").status_code == 401


def test_a_durable_call_survives_the_death_of_the_process_that_accepted_it(
    live_env, api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    doomed = start_api(live_env)
    caller = Caller(doomed.url, _headers(owner))
    rid = _rid()
    marker = tmp_path / "a" / "ran.txt"
    try:
        long = caller.submit(command("a", "sleep 1.5"))
        wait_until(lambda: len(held(owner.worker_id)) == 1)
        with httpx.Client(base_url=doomed.url, timeout=10) as http:
            r = http.post(
                REQUESTS, json=command("a", "echo once >> ran.txt"), headers=_headers(owner, rid)
            )
        assert r.status_code == 202, r.text
        assert r.json() == {"requestId": rid, "state": "queued"}
        # It waits behind the long call; the process that took it dies.
        doomed.process.signal(signal.SIGKILL)
    finally:
        caller.close()
        doomed.process.kill_group()
    del long
    done = _poll(api.url, owner, rid, {"completed", "failed"})
    assert done["state"] == "completed", done
    assert done["result"]["exitCode"] == 0
    assert marker.read_text() == "once\n"
    wait_until(lambda: len(_rows(rid)) == 1, timeout_s=10)
    # More lookups (from any process) write no second row: the draft is spent. (The
    # synchronous call cut off with the process owes its row too: the drainer's sweep writes
    # it once that call is over.)
    _poll(api.url, owner, rid, {"completed"})
    wait_until(lambda: _owed(owner.worker_id) == ([], ["done", "done"]), timeout_s=30)
    assert _rows(rid) == [(200, "")]


def test_a_repeated_id_creates_nothing_and_answers_the_existing_status(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    rid = _rid()
    marker = tmp_path / "a" / "count.txt"
    body = command("a", "echo x >> count.txt")
    with api.client() as http:
        first = http.post(REQUESTS, json=body, headers=_headers(owner, rid))
        assert first.status_code == 202, first.text
        _poll(api.url, owner, rid, {"completed"})
        again = http.post(REQUESTS, json=body, headers=_headers(owner, rid))
        assert again.status_code == 202, again.text
        assert again.json()["state"] == "completed"
        # Another principal's lookup of the same id: the same 404 as an unknown id.
        other = account_factory()
        theirs = http.get(f"{REQUESTS}/{rid}", headers=_headers(other))
        unknown = http.get(f"{REQUESTS}/{_rid()}", headers=_headers(owner))
        assert theirs.status_code == unknown.status_code == 404
        assert theirs.content == unknown.content
        # The id header is required.
        r = http.post(REQUESTS, json=body, headers=_headers(owner))
        assert r.status_code == 400 and r.json()["code"] == "INVALID_REQUEST_ID"
    assert marker.read_text() == "x\n"
    wait_until(lambda: len(_rows(rid)) == 1, timeout_s=10)


def test_delete_cancels_a_queued_call_and_leaves_a_running_one_alone(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    running, queued = _rid(), _rid()
    never = tmp_path / "a" / "never.txt"
    with api.client() as http:
        r = http.post(REQUESTS, json=command("a", "sleep 1"), headers=_headers(owner, running))
        assert r.status_code == 202 and r.json()["state"] == "admitted", r.text
        r = http.post(
            REQUESTS, json=command("a", "touch never.txt"), headers=_headers(owner, queued)
        )
        assert r.status_code == 202 and r.json()["state"] == "queued", r.text
        assert http.delete(f"{REQUESTS}/{running}", headers=_headers(owner)).json() == {
            "state": "running"
        }
        assert http.delete(f"{REQUESTS}/{queued}", headers=_headers(owner)).json() == {
            "state": "cancelled"
        }
    assert _poll(api.url, owner, queued, {"cancelled"})["state"] == "cancelled"
    assert _poll(api.url, owner, running, {"completed", "failed"})["state"] == "completed"
    assert not never.exists()
    wait_until(lambda: len(_rows(queued)) == 1 and len(_rows(running)) == 1, timeout_s=10)
    assert _rows(queued) == [(409, "REQUEST_CANCELLED")]


def test_a_completed_status_is_kept_at_least_ten_minutes_and_not_for_ever(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    rid = _rid()
    with api.client() as http:
        assert http.post(REQUESTS, json=read("a"), headers=_headers(owner, rid)).status_code == 202
    _poll(api.url, owner, rid, {"completed"})
    client = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
    try:
        prefix = worker_keys(settings.REDIS_KEY_PREFIX, owner.worker_id).status_prefix
        keys = list(client.scan_iter(match=prefix + "*"))
        assert len(keys) == 1
        assert 10 * 60 * 1000 <= client.pttl(keys[0]) <= 16 * 60 * 1000
    finally:
        client.close()


def _owed(worker_id: str) -> tuple[list[str], list[str]]:
    """(index members of this worker's durable calls owing a row, its row keys' values)."""
    client = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
    try:
        prefix = settings.REDIS_KEY_PREFIX
        listed: Any = client.zrange(durable_index_key(prefix), 0, -1)
        members = [str(m) for m in listed if str(m).startswith(worker_id + " ")]
        row_prefix = worker_keys(prefix, worker_id).row_prefix
        values = [
            str(client.get(k) or "")
            for k in client.scan_iter(match=row_prefix + "*")
            if not k.endswith((":req", ":claim"))
        ]
        return members, values
    finally:
        client.close()


def test_a_call_nobody_asks_about_leaves_one_row_after_its_process_is_killed(
    live_env, api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    doomed = start_api(live_env)
    rid = _rid()
    marker = tmp_path / "a" / "ran.txt"
    try:
        with httpx.Client(base_url=doomed.url, timeout=10) as http:
            r = http.post(
                REQUESTS,
                json=command("a", "sleep 1; echo once >> ran.txt"),
                headers=_headers(owner, rid),
            )
            assert r.status_code == 202, r.text
            doomed.process.signal(signal.SIGKILL)
        assert r.json() == {"requestId": rid, "state": "admitted"}
    finally:
        doomed.process.kill_group()
    # Nobody reads its status: the drainer's sweep writes its row once it has ended.
    wait_until(lambda: marker.exists() and len(_rows(rid)) >= 1, timeout_s=30)
    wait_until(lambda: _owed(owner.worker_id) == ([], ["done"]), timeout_s=10)
    assert marker.read_text() == "once\n"
    row = CompletionLog.objects.get(request_id=rid)
    assert (row.http_status, row.code, row.outcome) == (200, "", "completed")
    assert (row.worker_id, row.operation, row.workspace_id) == (
        owner.worker_id,
        "execute_command",
        "a",
    )
    assert row.admission_outcome == "admitted" and row.slot_index == 0
    assert row.queue_wait_ms is not None and 0 <= row.queue_wait_ms < 1000
    assert row.exec_ms is not None and row.exec_ms >= 1000
    assert row.fencing_ticket is not None and row.duration_ms >= row.exec_ms


def test_a_queued_call_outlives_the_graceful_stop_of_the_process_that_accepted_it(
    live_env, api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=1)
    leaving = start_api(live_env)
    first, second = _rid(), _rid()
    marker = tmp_path / "a" / "ran.txt"
    try:
        with httpx.Client(base_url=leaving.url, timeout=10) as http:
            r = http.post(REQUESTS, json=command("a", "sleep 1"), headers=_headers(owner, first))
            assert r.status_code == 202 and r.json()["state"] == "admitted", r.text
            r = http.post(
                REQUESTS, json=command("a", "echo once >> ran.txt"), headers=_headers(owner, second)
            )
            assert r.status_code == 202 and r.json()["state"] == "queued", r.text
        # A deploy stops the process (SIGTERM): the queued call must not leave its queue.
        assert leaving.process.stop() in (0, -signal.SIGTERM)
    finally:
        leaving.process.kill_group()
    wait_until(lambda: len(_rows(first)) == 1 and len(_rows(second)) == 1, timeout_s=30)
    assert _rows(second) == [(200, "")] and _rows(first) == [(200, "")]
    assert marker.read_text() == "once\n"
