"""Tenant isolation, told as a story about owner, member and outsider.

The owner's tenant has a worker with a workspace `repo`; the member is a second principal of
the same tenant; the outsider is a principal of another tenant with a worker of its own. The
outsider must not be able to run anything on the owner's worker, cancel the owner's calls, or
learn that the owner's worker, workspace or request exists: every answer it gets about them is
byte for byte the answer it gets about things that do not exist.

Everything goes through the live API (uvicorn) and real `runworker` processes.
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings
from livesupport import git_workspace
from secsupport import CANCEL, EXECUTE, body, fingerprint

from admission.queue import worker_keys
from workspaces.models import Worker

pytestmark = pytest.mark.e2e


def post(
    http: httpx.Client, account: Any, worker_id: str | None, payload: Any, **headers: str
) -> httpx.Response:
    sent = dict(account.auth)
    if worker_id is not None:
        sent["X-LibreChat-Code-Worker-ID"] = worker_id
    sent.update(headers)
    return http.post(EXECUTE, headers=sent, json=payload)


def entries(worker_id: str) -> list[dict[str, Any]]:
    """The worker's admission queue in Redis: waiting ('w') and running ('r') entries."""
    with redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True) as client:
        raw = client.hgetall(worker_keys(settings.REDIS_KEY_PREFIX, worker_id).entries)
    return [json.loads(v) for v in raw.values()]


def ticket_counter(worker_id: str) -> int:
    with redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True) as client:
        return int(client.hget(worker_keys(settings.REDIS_KEY_PREFIX, worker_id).reg, "seq") or 0)


def wait_until(predicate: Any, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"condition not met within {timeout_s} s")


def request_id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:16]}"


def test_outsider_cannot_tell_the_owners_worker_or_workspace_from_ones_that_do_not_exist(
    api: Any, account_factory: Any, worker_factory: Any, tmp_path: Path
) -> None:
    owner = account_factory()
    outsider = account_factory()
    worker_factory(owner, {"repo": git_workspace(tmp_path / "repo")})
    marker = tmp_path / "outsider-ran"
    probes = {
        "read": body("read_file", path="README.md"),
        "run": body("execute_command", command=f"touch {marker}"),
        "write": body("write_file", path="planted.txt", content="x", overwrite=True),
    }
    with api.client() as http:
        # The owner's call works: the worker and its workspace really exist.
        assert post(http, owner, owner.worker_id, probes["read"]).status_code == 200
        seq_before = ticket_counter(owner.worker_id)
        foreign = {
            (name, workspace): fingerprint(
                post(http, outsider, owner.worker_id, dict(probe, workspaceId=workspace))
            )
            for name, probe in probes.items()
            for workspace in ("repo", "no-such-workspace")
        }
        assert ticket_counter(owner.worker_id) == seq_before, "an outsider's call was queued"
        # The same calls once the owner's worker is gone: a worker that does not exist.
        Worker.objects.filter(worker_id=owner.worker_id).delete()
        missing = fingerprint(post(http, outsider, owner.worker_id, probes["read"]))
    assert missing[0] == 404
    assert json.loads(missing[1])["code"] == "WORKER_NOT_FOUND"
    for probe, answer in foreign.items():
        assert answer == missing, probe
    assert not marker.exists()
    assert not (tmp_path / "repo" / "planted.txt").exists()


def test_outsider_and_member_cannot_cancel_the_owners_request_nor_learn_that_it_exists(
    api: Any, account_factory: Any, worker_factory: Any, tmp_path: Path
) -> None:
    owner = account_factory(user="owner")
    member = account_factory(tenant=owner.tenant, user="member", worker=owner.worker_id)
    outsider = account_factory(user="outsider")
    # The member's bootstrap rotated the worker token: the worker runs with the latest one.
    worker_factory(member, {"repo": git_workspace(tmp_path / "repo")}, slots=1)
    worker_factory(outsider, {"repo": git_workspace(tmp_path / "outsider-repo")})
    ran = tmp_path / "waiting-call-ran"
    running_id, waiting_id = request_id("owner-running"), request_id("owner-waiting")
    unknown_id = request_id("never-used")
    pool = ThreadPoolExecutor(max_workers=2)

    def owner_call(payload: dict[str, Any], rid: str) -> httpx.Response:
        with api.client() as own:
            return post(
                own, owner, owner.worker_id, payload, **{"X-LibreChat-Workspace-Request-Id": rid}
            )

    try:
        running = pool.submit(owner_call, body("execute_command", command="sleep 2"), running_id)
        wait_until(lambda: [e["st"] for e in entries(owner.worker_id)] == ["r"])
        waiting = pool.submit(
            owner_call, body("execute_command", command=f"touch {ran}"), waiting_id
        )
        wait_until(lambda: len(entries(owner.worker_id)) == 2)
        with api.client() as http:

            def delete(account: Any, rid: str) -> Any:
                return fingerprint(http.delete(CANCEL.format(rid), headers=account.auth))

            for someone in (outsider, member):
                unknown = delete(someone, unknown_id)
                assert unknown[0] == 404
                assert json.loads(unknown[1])["code"] == "REQUEST_NOT_FOUND"
                # Waiting, running or unknown: the same 404, and the waiting call stays queued.
                assert delete(someone, waiting_id) == unknown
                assert delete(someone, running_id) == unknown
                assert len(entries(owner.worker_id)) == 2
            # Request ids are the principal's own: the owner's ids are free for anyone else,
            # so reusing one tells the outsider (or the member) nothing either.
            reused = post(
                http,
                outsider,
                outsider.worker_id,
                body("read_file", path="README.md"),
                **{"X-LibreChat-Workspace-Request-Id": waiting_id},
            )
            assert reused.status_code == 200, reused.text
            member_reuse = post(
                http,
                member,
                owner.worker_id,
                body("read_file", path="README.md"),
                **{
                    "X-LibreChat-Workspace-Request-Id": running_id,
                    "X-LibreChat-Workspace-Queue-Wait-Ms": "200",
                },
            )
            assert member_reuse.json()["code"] == "WORKSPACE_QUEUE_TIMEOUT", member_reuse.text
            # Neither cancelled anything: both of the owner's calls run to the end.
            assert running.result(timeout=30).status_code == 200
            assert waiting.result(timeout=30).status_code == 200
            assert ran.exists()
            # Finished calls are just as invisible to others ...
            assert delete(outsider, running_id) == delete(outsider, unknown_id)
            assert delete(member, waiting_id) == delete(member, unknown_id)
            # ... while the owner, the same principal, sees them.
            mine = http.delete(CANCEL.format(running_id), headers=owner.auth)
            assert mine.json() == {"state": "finished"}
            # And the member does use the tenant's worker.
            assert post(http, member, owner.worker_id, body("read_file", path="README.md")).json()[
                "content"
            ] == ("# demo")
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def test_a_member_cannot_cancel_the_owners_waiting_call_but_the_owner_can(
    api: Any, account_factory: Any, worker_factory: Any, tmp_path: Path
) -> None:
    owner = account_factory(user="owner")
    member = account_factory(tenant=owner.tenant, user="member", worker=owner.worker_id)
    worker_factory(member, {"repo": git_workspace(tmp_path / "repo")}, slots=1)
    never = tmp_path / "cancelled-call-ran"
    waiting_id = request_id("owner-cancel")
    pool = ThreadPoolExecutor(max_workers=2)

    def owner_call(payload: dict[str, Any], rid: str | None = None) -> httpx.Response:
        extra = {"X-LibreChat-Workspace-Request-Id": rid} if rid else {}
        with api.client() as own:
            return post(own, owner, owner.worker_id, payload, **extra)

    try:
        running = pool.submit(owner_call, body("execute_command", command="sleep 1"))
        wait_until(lambda: [e["st"] for e in entries(owner.worker_id)] == ["r"])
        waiting = pool.submit(
            owner_call, body("execute_command", command=f"touch {never}"), waiting_id
        )
        wait_until(lambda: len(entries(owner.worker_id)) == 2)
        with api.client() as http:
            by_member = http.delete(CANCEL.format(waiting_id), headers=member.auth)
            assert by_member.status_code == 404
            assert by_member.json()["code"] == "REQUEST_NOT_FOUND"
            by_owner = http.delete(CANCEL.format(waiting_id), headers=owner.auth)
            assert by_owner.json() == {"state": "cancelled"}
        cancelled = waiting.result(timeout=30)
        assert cancelled.status_code == 409
        assert cancelled.json()["code"] == "REQUEST_CANCELLED"
        assert running.result(timeout=30).status_code == 200
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    assert not never.exists()
