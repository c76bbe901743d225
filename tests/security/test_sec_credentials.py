"""API keys and worker tokens: stored only as hashes, looked up by hash, and a worker token acts
only as its own worker.

The owner bootstraps a tenant and a worker, the member joins (a second key, and the worker's
token is rotated), an operator makes one more key in the admin, the worker registers and calls
run; then every column of every table, and every Redis key of this run, is searched for the
raw secrets.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from livesupport import PYTHON, Process, git_workspace
from secsupport import CANCEL, EXECUTE, body, redis_dump, tables_containing

from admission.queue import worker_keys
from workspaces.access import caller_for_api_key
from workspaces.models import Principal

pytestmark = pytest.mark.e2e

REGISTER = "/v1/workers/register"
HEARTBEAT = "/v1/workers/heartbeat"
DEREGISTER = "/v1/workers/deregister"


def secret_parts(raw: str) -> list[str]:
    """The whole secret and its random part (after the visible `slk_xxxxxxxx_` prefix)."""
    return [raw, raw.split("_", 2)[2]]


def test_raw_keys_and_tokens_appear_in_no_table_and_no_redis_key_after_a_run(
    api: Any, account_factory: Any, worker_factory: Any, tmp_path: Path
) -> None:
    owner = account_factory(user="owner")
    old_token = owner.worker_token
    member = account_factory(tenant=owner.tenant, user="member", worker=owner.worker_id)
    # An operator makes a third key in the admin; it is shown once, in a message.
    User.objects.create_superuser("operator", password="correct horse battery")
    admin = Client()
    admin.force_login(User.objects.get(username="operator"))
    principal = Principal.objects.get(tenant__name=owner.tenant, name="owner")
    shown = admin.post(
        "/admin/workspaces/principal/",
        {"action": "create_api_key", "_selected_action": [str(principal.pk)], "index": "0"},
        follow=True,
    )
    admin_key = next(
        word
        for message in shown.context["messages"]
        for word in str(message).split()
        if word.startswith("slk_")
    )
    worker_factory(member, {"repo": git_workspace(tmp_path / "repo")})
    with api.client() as http:
        for n, key in enumerate((owner.api_key, member.api_key, admin_key)):
            auth = {"Authorization": f"Bearer {key}"}
            rid = f"credential-scan-{n:04d}"
            answer = http.post(
                EXECUTE,
                headers=auth | {"X-LibreChat-Workspace-Request-Id": rid},
                json=body("read_file", path="README.md"),
            )
            assert answer.status_code == 200, answer.text
            assert http.delete(CANCEL.format(rid), headers=auth).json() == {"state": "finished"}
        # A mistyped key, and a worker token used as an API key, are refused and kept nowhere.
        for wrong in (owner.api_key + "x", member.worker_token):
            refused = http.post(EXECUTE, headers={"Authorization": f"Bearer {wrong}"}, json={})
            assert refused.status_code == 401
    secrets = {
        "owner's API key": owner.api_key,
        "member's API key": member.api_key,
        "admin-made API key": admin_key,
        "current worker token": member.worker_token,
        "rotated-out worker token": old_token,
    }
    with redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True) as client:
        in_redis = redis_dump(client, settings.REDIS_KEY_PREFIX)
    assert in_redis, "the scan saw no Redis keys at all"
    for name, raw in secrets.items():
        for part in secret_parts(raw):
            assert tables_containing(part) == [], name
            assert part not in in_redis, name
    # What is stored is the SHA-256 of the whole secret.
    assert tables_containing(hashlib.sha256(owner.api_key.encode()).hexdigest()) == [
        "workspaces_apikey"
    ]


def test_keys_and_tokens_are_looked_up_by_their_hash_so_the_raw_value_never_reaches_sql(
    account_factory: Any,
) -> None:
    owner = account_factory()
    with CaptureQueriesContext(connection) as queries:
        assert caller_for_api_key(owner.api_key) is not None
        altered = owner.api_key[:-1] + ("B" if owner.api_key.endswith("A") else "A")
        assert caller_for_api_key(altered) is None
        # The worker endpoints authenticate the same way (in-process, through DRF).
        answer = Client().post(
            HEARTBEAT,
            {"workerId": owner.worker_id, "incarnationId": "0" * 32},
            content_type="application/json",
            headers={"Authorization": f"Bearer {owner.worker_token}"},
        )
        assert answer.status_code == 409  # authenticated; this incarnation never registered
    sql = "\n".join(q["sql"] for q in queries.captured_queries)
    for raw in (owner.api_key, owner.worker_token):
        for part in secret_parts(raw):
            assert part not in sql
        assert hashlib.sha256(raw.encode()).hexdigest() in sql


def worker_post(client: Client, path: str, token: str, payload: dict[str, Any]) -> Any:
    return client.post(
        path, payload, content_type="application/json", headers={"Authorization": f"Bearer {token}"}
    )


def offer(worker_id: str) -> dict[str, Any]:
    return {
        "workerId": worker_id,
        "workspaces": [{"workspaceId": "repo", "operations": ["read_file"]}],
        "slots": 1,
    }


def test_a_worker_token_registers_heartbeats_and_deregisters_only_its_own_worker(
    account_factory: Any,
) -> None:
    owner = account_factory()
    outsider = account_factory()
    client = Client()
    # The outsider's worker registers with its own token.
    mine = worker_post(client, REGISTER, outsider.worker_token, offer(outsider.worker_id))
    assert mine.status_code == 200, mine.content
    incarnation = mine.json()["incarnationId"]
    # The owner's token cannot register, heartbeat or deregister the outsider's worker, and the
    # refusal is the same as for a worker that does not exist.
    ghost = f"ghost-{owner.worker_id}"
    refusals = []
    for path, payload in (
        (REGISTER, offer),
        (HEARTBEAT, lambda w: {"workerId": w, "incarnationId": incarnation}),
        (DEREGISTER, lambda w: {"workerId": w, "incarnationId": incarnation}),
    ):
        foreign = worker_post(client, path, owner.worker_token, payload(outsider.worker_id))
        missing = worker_post(client, path, owner.worker_token, payload(ghost))
        assert foreign.status_code == 403, (path, foreign.content)
        assert foreign.json()["code"] == "FORBIDDEN"
        assert foreign.content == missing.content
        refusals.append(foreign)
    # The outsider's registration is untouched: same incarnation, still heartbeating.
    with redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True) as r:
        reg = r.hgetall(worker_keys(settings.REDIS_KEY_PREFIX, outsider.worker_id).reg)
    assert reg["inc"] == incarnation
    beat = worker_post(
        client,
        HEARTBEAT,
        outsider.worker_token,
        {"workerId": outsider.worker_id, "incarnationId": incarnation},
    )
    assert beat.status_code == 200, beat.content
    # An API key is not a worker token.
    as_key = worker_post(client, REGISTER, owner.api_key, offer(owner.worker_id))
    assert as_key.status_code == 401


def test_a_worker_can_start_without_its_token_on_the_command_line(
    api: Any, live_env: dict[str, str], account_factory: Any, tmp_path: Path
) -> None:
    owner = account_factory()
    args = [
        PYTHON,
        "manage.py",
        "runworker",
        "--worker-id",
        owner.worker_id,
        "--api",
        api.url,
        "--workspace",
        f"repo={git_workspace(tmp_path / 'repo')}",
    ]
    worker = Process(args, live_env | {"SLUICE_WORKER_TOKEN": owner.worker_token}, "worker")
    try:
        worker.wait_for("registered: incarnation", timeout_s=30)
        with open(f"/proc/{worker.proc.pid}/cmdline", "rb") as cmdline:
            assert owner.worker_token.encode() not in cmdline.read()
    finally:
        worker.kill_group()
