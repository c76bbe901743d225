"""Retry-After from the backlog, end to end: a real API process and a real worker."""

from __future__ import annotations

import redis
from callhelpers import command, wait_until
from django.conf import settings
from livesupport import git_workspace
from test_admission_capacity import held
from test_admission_deadlines import _caller

from admission.queue import worker_keys

SECOND = "sleep 1"


def _paced(worker_id: str) -> int:
    client = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
    try:
        return int(client.llen(worker_keys(settings.REDIS_KEY_PREFIX, worker_id).pace))
    finally:
        client.close()


def test_a_timeout_behind_a_backlog_is_told_the_backlog_in_header_and_body(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    caller = _caller(api, owner)
    try:
        # The worker's pace: one 1 s command, whose row puts it in the pace list.
        assert caller.send(command("a", SECOND)).status_code == 200
        wait_until(lambda: _paced(owner.worker_id) >= 1)
        backlog = [caller.submit(command("a", SECOND)) for _ in range(8)]
        wait_until(lambda: len(held(owner.worker_id)) == 8)
        r = caller.send(command("a", "true"), wait_ms=1_000)
        assert r.status_code == 503, r.text
        body = r.json()
        assert body["code"] == "WORKSPACE_QUEUE_TIMEOUT"
        told = r.headers["Retry-After"]
        assert told.isdigit() and body["retry_after_seconds"] == int(told)
        # Seven of the eight seconds are still ahead of it (a constant said 2); the exact
        # figure depends on the machine's pace, so only its order is checked here.
        assert 4 <= int(told) <= 30, told
        assert all(f.result().status_code == 200 for f in backlog)
    finally:
        caller.close()
