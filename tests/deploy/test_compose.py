"""compose.yaml brought up for real: Postgres, Redis, the API and the drainer, each healthy;
an operator command in the API's container issues a key the API then accepts.

Postgres and Redis are the registry's images when they can be pulled, else stand-ins built
from Debian's packages (tests/deploy/standin/) on the base `make image` used. The compose file
is used as it is, from a directory of the test's own holding it and its .env, under a project
name of its own, with free host ports.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest
from imagesupport import ENGINE, build_image, engine
from livesupport import ROOT, free_port, wait_until

COMPOSE: list[str] | None
if shutil.which("podman-compose") and ENGINE == "podman":
    COMPOSE = ["podman-compose"]
elif ENGINE == "docker":
    COMPOSE = ["docker", "compose"]
else:
    COMPOSE = None

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(ENGINE is None, reason="neither podman nor docker is installed"),
]

STANDIN = Path(__file__).parent / "standin"


def service_image(official: str, standin: str) -> str:
    """The official image if it is here or can be pulled, else the stand-in, built once."""
    if engine("image", "inspect", official, check=False).returncode == 0:
        return official
    if engine("pull", "-q", official, check=False, timeout=120).returncode == 0:
        return official
    tag = f"localhost/sluice-test-{standin}:latest"
    if engine("image", "inspect", tag, check=False).returncode != 0:
        bases = ("docker.io/library/python:3.11-slim-bookworm", "localhost/sluice-base:bookworm")
        base = next(b for b in bases if engine("image", "inspect", b, check=False).returncode == 0)
        engine(
            "build", "--build-arg", f"BASE={base}", "-f", str(STANDIN / f"Containerfile.{standin}"),
            "-t", tag, str(STANDIN), timeout=600,
        )  # fmt: skip
    return tag


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[str, int]]:
    if COMPOSE is None:
        pytest.fail(
            "podman is installed without podman-compose (Debian: apt-get install podman-compose)"
        )
    build_image()
    project = f"sluicetest{uuid.uuid4().hex[:8]}"
    port = free_port()
    shutil.copy(ROOT / "compose.yaml", tmp_path / "compose.yaml")
    settings = {
        "SECRET_KEY": uuid.uuid4().hex * 2,
        "POSTGRES_PASSWORD": uuid.uuid4().hex,
        "REDIS_PASSWORD": uuid.uuid4().hex,
        "PORT": str(port),
        "REDIS_PUBLISH": f"127.0.0.1:{free_port()}",
        "POSTGRES_IMAGE": service_image("docker.io/library/postgres:16-bookworm", "postgres"),
        "REDIS_IMAGE": service_image("docker.io/library/redis:7-bookworm", "redis"),
        "API_PROCESSES": "1",
    }
    (tmp_path / ".env").write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    compose = [*COMPOSE, "-p", project, "-f", str(tmp_path / "compose.yaml")]
    try:
        up = subprocess.run(
            [*compose, "up", "-d"], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        yield project, port
    finally:
        subprocess.run(
            [*compose, "down", "-v", "-t", "10"], cwd=tmp_path, capture_output=True, timeout=300
        )
        # podman-compose 1.0 leaves the project's network behind.
        engine("network", "rm", f"{project}_default", check=False)


def container(project: str, service: str) -> str:
    names = engine(
        "ps", "-a", "--format", "{{.Names}}",
        "--filter", f"label=com.docker.compose.project={project}",
        "--filter", f"label=com.docker.compose.service={service}",
    ).stdout.split()  # fmt: skip
    assert len(names) == 1, names
    return names[0]


def healthy(name: str) -> bool:
    if ENGINE == "podman":
        # Without systemd podman schedules no health checks: run the one compose declared.
        return engine("healthcheck", "run", name, check=False, timeout=60).returncode == 0
    state = engine("inspect", "--format", "{{.State.Health.Status}}", name, check=False)
    return state.stdout.strip() == "healthy"


def test_compose_brings_up_four_healthy_services_and_bootstrap_runs_in_the_api(
    stack: tuple[str, int],
) -> None:
    project, port = stack
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    api = container(project, "api")
    try:
        wait_until(answers, timeout_s=180, interval_s=1)
    except AssertionError:
        logs = engine("logs", api, check=False)
        raise AssertionError(
            f"/healthz did not answer 200:\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}"
        ) from None
    for service in ("postgres", "redis", "api", "drainer"):
        name = container(project, service)
        wait_until(partial(healthy, name), timeout_s=90, interval_s=1)

    out = engine(
        "exec", api, "python", "manage.py", "bootstrap",
        "--tenant", "acme", "--user", "alice", "--worker", "alice-laptop", "--json",
    )  # fmt: skip
    key = json.loads(out.stdout)["api_key"]
    answered = httpx.post(
        f"{base}/v1/workspace-tools/execute",
        json={"protocolVersion": 1, "operation": "read_file", "workspaceId": "app", "path": "a"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )
    assert answered.status_code == 409, answered.text
    assert answered.json()["code"] == "WORKER_MISMATCH"
