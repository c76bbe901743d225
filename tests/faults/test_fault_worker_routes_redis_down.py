"""The worker routes around a Redis outage, in this process, on a throwaway Redis of the test's
own (faultkit): while Redis is down, register, heartbeat and deregister answer a typed 503 the
worker retries, never a 500; once it is back empty, the heartbeat's 410 has set the worker's
Redis user up again, so its Celery consumer can log in and the worker can register again
(the whole round trip with real workers: test_fault_redis_restart.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import Client
from faultkit import ThrowawayRedis
from livesupport import unique

from admission import connections
from admission.credentials import acl_user_name
from admission.management.commands.bootstrap import bootstrap

REGISTER = {
    "workspaces": [{"workspaceId": "repo", "operations": ["read_file"]}],
    "slots": 1,
}


@pytest.fixture
def redis_server(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[ThrowawayRedis]:
    """Every Redis this process uses is the throwaway one, with a sync queue made for it."""
    server = ThrowawayRedis().start()
    settings.REDIS_URL = settings.CELERY_BROKER_URL = settings.ADMISSION_REDIS_URL = server.url
    monkeypatch.setattr(connections, "_sync", None)
    yield server
    server.kill()
    if connections._sync is not None:
        connections._sync.client.close()


def post(worker: Any, route: str, body: dict[str, Any]) -> Any:
    return Client().post(
        f"/v1/workers/{route}",
        {"workerId": worker.worker_id, **body},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {worker.worker_token}",
    )


def test_worker_routes_answer_a_typed_503_while_redis_is_down(
    redis_server: ThrowawayRedis, account_factory: Any
) -> None:
    owner = account_factory()
    registered = post(owner, "register", REGISTER)
    assert registered.status_code == 200, registered.content
    incarnation = {"incarnationId": registered.json()["incarnationId"]}
    redis_server.kill()
    for route, body in (
        ("heartbeat", incarnation),
        ("register", REGISTER),
        ("deregister", incarnation),
    ):
        answer = post(owner, route, body)
        assert answer.status_code == 503, (route, answer.content)
        assert answer["Content-Type"] == "application/json"
        assert answer.json()["code"] == "ADMISSION_UNAVAILABLE", route
    redis_server.start()  # same port, empty
    lost = post(owner, "heartbeat", incarnation)
    assert lost.status_code == 410, lost.content
    assert json.loads(lost.content)["code"] == "WORKER_REGISTRATION_LOST"


def test_a_lost_heartbeat_sets_the_workers_redis_user_up_again_after_redis_restarts_empty(
    redis_server: ThrowawayRedis, transactional_db: None, settings: Any
) -> None:
    settings.SLUICE_WORKER_REDIS_ACL = True
    # The worker's ACL user, issued on the throwaway Redis.
    owner = SimpleNamespace(**bootstrap(tenant=unique("tenant"), user="o", worker_id=unique("w")))
    registered = post(owner, "register", REGISTER)
    assert registered.status_code == 200, registered.content
    user = acl_user_name(owner.worker_id)

    def user_exists() -> bool:
        with redis_server.client() as admin:
            return admin.execute_command("ACL", "GETUSER", user) is not None

    assert user_exists()
    redis_server.kill()
    redis_server.start()  # same port, empty: the user is gone
    assert not user_exists()
    # The worker's consumer cannot log in, so the worker does not register yet; its heartbeat
    # is what reaches the API, and the answer that its registration is lost restores the user.
    lost = post(owner, "heartbeat", {"incarnationId": registered.json()["incarnationId"]})
    assert lost.status_code == 410, lost.content
    assert user_exists()
