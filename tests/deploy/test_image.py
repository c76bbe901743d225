"""`make image` and the image it builds: its default command migrates and serves the API, its
operator commands and its drainer run, all against the test Postgres (a throwaway database)
and Redis (this run's key prefix), the containers on the host's network.

Skipped only where neither podman nor docker is installed; CI installs podman (.ci/run). The
first build on a machine that reaches no registry builds its Debian base (a minute); later
builds reuse it and their layers.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import quote

import httpx
import psycopg
import pytest
import redis
from django.conf import settings
from imagesupport import ENGINE, build_image, engine
from livesupport import free_port, wait_until
from psycopg.conninfo import make_conninfo

pytestmark = [
    pytest.mark.e2e,
    # A cold build (Debian base, then PyPI) on a busy 2-core machine.
    pytest.mark.timeout(1200),
    pytest.mark.skipif(not ENGINE, reason="neither podman nor docker is installed"),
]


@pytest.fixture(scope="module")
def image() -> str:
    return build_image()


@pytest.fixture
def database_url() -> Iterator[str]:
    db = settings.DATABASES["default"]
    name = f"test_image_{uuid.uuid4().hex[:8]}"
    admin = make_conninfo(
        host=db["HOST"],
        port=db["PORT"] or "5432",
        user=db["USER"],
        password=db["PASSWORD"],
        dbname="postgres",
    )
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    auth = quote(db["USER"], safe="") + (
        f":{quote(db['PASSWORD'], safe='')}" if db["PASSWORD"] else ""
    )
    yield f"postgres://{auth}@{db['HOST']}:{db['PORT'] or 5432}/{name}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def server_env(database_url: str) -> list[str]:
    """The settings an operator gives every container: `-e` options."""
    env = {
        "DATABASE_URL": database_url,
        "REDIS_URL": settings.REDIS_URL,
        # This run's namespace, which the session empties at its end.
        "SLUICE_REDIS_PREFIX": f"{settings.REDIS_KEY_PREFIX}image:",
        "SECRET_KEY": uuid.uuid4().hex * 2,
        # The machine's shared Redis gets no ACL users (tests/conftest.py).
        "SLUICE_WORKER_REDIS_ACL": "0",
    }
    return [arg for k, v in env.items() for arg in ("-e", f"{k}={v}")]


class Container:
    def __init__(self, name: str) -> None:
        self.name = name

    def running(self) -> bool:
        state = engine("inspect", "--format", "{{.State.Running}}", self.name, check=False)
        return state.stdout.strip() == "true"

    def logs(self) -> str:
        out = engine("logs", self.name, check=False)
        return (out.stdout + out.stderr)[-4000:]


@pytest.fixture
def run_container(image: str) -> Iterator[Callable[..., Container]]:
    started: list[Container] = []

    def run(*args: str) -> Container:
        name = f"sluice-test-{uuid.uuid4().hex[:8]}"
        engine("run", "-d", "--name", name, "--hostname", name, "--network=host", *args)
        started.append(Container(name))
        return started[-1]

    yield run
    for container in started:
        engine("rm", "-f", "-t", "5", container.name, check=False)


def wait_for_health(base: str, api: Container) -> None:
    def healthy() -> bool:
        assert api.running(), f"the API container exited:\n{api.logs()}"
        try:
            return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(healthy, timeout_s=120, interval_s=0.5)
    except AssertionError:
        raise AssertionError(f"/healthz did not answer 200:\n{api.logs()}") from None


def test_the_image_serves_typed_answers_runs_operator_commands_and_drains(
    image: str, server_env: list[str], run_container: Callable[..., Container]
) -> None:
    port = free_port()
    api = run_container(*server_env, "-e", f"PORT={port}", "-e", "API_PROCESSES=1", image)
    base = f"http://127.0.0.1:{port}"
    # Its default command migrated the empty database, then served.
    wait_for_health(base, api)

    call = {"protocolVersion": 1, "operation": "read_file", "workspaceId": "app", "path": "a"}
    refused = httpx.post(
        f"{base}/v1/workspace-tools/execute",
        json=call,
        headers={"Authorization": "Bearer sk_not-a-key"},
        timeout=10,
    )
    assert refused.status_code == 401
    assert refused.headers["content-type"] == "application/json"
    assert refused.json()["code"] == "UNAUTHENTICATED"

    # An operator command, in the running container, on the same settings.
    tenant = f"t{uuid.uuid4().hex[:6]}"
    out = engine(
        "exec", api.name, "python", "manage.py", "bootstrap",
        "--tenant", tenant, "--user", "ops", "--worker", f"{tenant}-w", "--json",
    )  # fmt: skip
    creds = json.loads(out.stdout)
    answered = httpx.post(
        f"{base}/v1/workspace-tools/execute",
        json=call,
        headers={"Authorization": f"Bearer {creds['api_key']}"},
        timeout=10,
    )
    # The key it issued is accepted: the refusal is the workspace's (its worker never started).
    assert answered.status_code == 409, answered.text
    assert answered.json()["code"] == "WORKER_MISMATCH"

    # The drainer: the image's `manage.py drain_completions` joins the completion stream's
    # consumer group under its container's host name.
    drainer = run_container(*server_env, image, "python", "manage.py", "drain_completions")
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    stream = f"{settings.REDIS_KEY_PREFIX}image:log:completions"

    def drainer_joined() -> bool:
        assert drainer.running(), f"the drainer exited:\n{drainer.logs()}"
        try:
            consumers = client.xinfo_consumers(stream, "drain")
        except redis.ResponseError:  # no stream or group yet
            return False
        return any(c["name"].startswith(f"{drainer.name}:") for c in consumers)

    wait_until(drainer_joined, timeout_s=60, interval_s=0.5)
    client.close()

    # compose.yaml's health checks, run as compose runs them, in each container.
    for container, check in ((api, "api"), (drainer, "drainer")):
        health = engine(
            "exec", container.name, "sh", "-c", f"python -m scripts.healthcheck {check}",
            check=False,
        )  # fmt: skip
        assert health.returncode == 0, health.stderr
