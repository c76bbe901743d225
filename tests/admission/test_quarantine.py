"""A mutation whose outcome the worker cannot tell quarantines its isolation key (contract §4.3)."""

from __future__ import annotations

import json

import redis
from callhelpers import Caller, command, read, wait_until
from django.conf import settings
from livesupport import git_workspace
from test_admission_capacity import held

from admission.models import Quarantine
from admission.queue import SyncQueue, worker_keys
from workspaces.signing import sign, signing_key_for_token


def _settle_running(worker_id: str, token: str, payload: dict) -> bool:
    """Settle the one running call exactly as its worker would (signed with its token's key)."""
    client = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
    keys = worker_keys(settings.REDIS_KEY_PREFIX, worker_id)
    (entry,) = [json.loads(v) for v in client.hgetall(keys.entries).values()]
    body = {"entry": entry["id"], "payload": payload}
    signed = dict(payload, sig=sign(signing_key_for_token(token), "settlement", body))
    return SyncQueue(client, settings.REDIS_KEY_PREFIX).settle(
        worker_id=worker_id,
        entry_id=entry["id"],
        incarnation=entry["inc"],
        ticket=entry["seq"],
        payload=signed,
    )


def test_an_unknown_outcome_quarantines_the_key_until_an_operator_releases_it(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(
        owner, {"a": git_workspace(tmp_path / "a"), "b": git_workspace(tmp_path / "b")}, slots=2
    )
    caller = Caller(api.url, owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id})
    try:
        # The settlement a worker sends when a write it started may or may not have landed.
        pending = caller.submit(command("a", "sleep 3"))
        wait_until(lambda: len(held(owner.worker_id)) == 1)
        unknown = {
            "t": "result",
            "ok": False,
            "error": {
                "error": "The write may or may not have happened.",
                "code": "WRITE_UNAVAILABLE",
            },
            "quarantine": True,
        }
        assert _settle_running(owner.worker_id, owner.worker_token, unknown)
        r = pending.result()
        assert r.status_code == 503 and r.json()["code"] == "WRITE_UNAVAILABLE"
        (q,) = Quarantine.objects.filter(worker_id=owner.worker_id, released_at__isnull=True)
        assert (q.workspace_id, q.operation) == ("a", "execute_command")
        refused = caller.send(read("a"))
        assert refused.status_code == 409 and refused.json()["code"] == "WORKSPACE_QUARANTINED"
        # Another workspace of the same worker is another key.
        assert caller.send(read("b")).status_code == 200
        q.released_at = q.created_at
        q.save()
        # A release reaches every API process within the caller cache's second.
        wait_until(lambda: caller.send(read("a")).status_code == 200, timeout_s=3, interval_s=0.2)
    finally:
        caller.close()
