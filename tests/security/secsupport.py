"""Shared by the security tests: request bodies, answer fingerprints, a database and Redis
scan for raw secrets, and a throwaway Redis server whose ACLs a test may change freely.

Nothing here stands in for a part of Sluice. The throwaway Redis is a real `redis-server` of
the test's own on a free loopback port: the shared Redis of the machine is never given an ACL.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis
from django.db import connection
from livesupport import free_port

from workspaces.dispatch import worker_queue_name

EXECUTE = "/v1/workspace-tools/execute"
CANCEL = "/v1/workspace-tools/requests/{}"

# Headers whose value depends on the caller's own rate-limit budget (which every call spends
# from) or on the clock, not on what the call asked about.
BUDGET_HEADERS = {"date", "ratelimit-remaining", "ratelimit-reset", "ratelimit"}


def body(operation: str, workspace: str = "repo", **fields: Any) -> dict[str, Any]:
    return {"protocolVersion": 1, "operation": operation, "workspaceId": workspace, **fields}


def fingerprint(response: httpx.Response) -> tuple[int, bytes, tuple[tuple[str, str], ...]]:
    """What a caller can observe of an answer: status, exact body bytes, and every header
    (names always; values unless they only reflect the caller's own budget or the clock)."""
    headers = tuple(
        sorted(
            (name.lower(), "" if name.lower() in BUDGET_HEADERS else value)
            for name, value in response.headers.items()
        )
    )
    return response.status_code, response.content, headers


def tables_containing(needle: str) -> list[str]:
    """Every table of the database (Django's own included) with a row whose text has `needle`."""
    found = []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
        )
        for (table,) in cursor.fetchall():
            cursor.execute(
                f'SELECT count(*) FROM "{table}" t WHERE t::text LIKE %s',
                [f"%{needle}%"],
            )
            if cursor.fetchone()[0]:
                found.append(table)
    return found


def redis_dump(client: redis.Redis, prefix: str) -> str:
    """Every key under `prefix` with its value, as one text (strings, hashes, lists, sets, streams)."""
    parts: list[str] = []
    # Values are read as bytes: Django's cache (django-redis) keeps pickles under the prefix
    # too. Secrets are ASCII, so a lossy decode still shows any that leaked.
    given = client.connection_pool.connection_kwargs
    wanted = ("host", "port", "db", "username", "password")
    raw = redis.Redis(**{k: given[k] for k in wanted if k in given})
    for name in raw.scan_iter(match=f"{prefix}*", count=1000):
        key = _text(name)
        kind = _text(raw.type(name))
        value: Any
        if kind == "string":
            value = raw.get(name)
        elif kind == "hash":
            value = raw.hgetall(name)
        elif kind == "list":
            value = raw.lrange(name, 0, -1)
        elif kind == "set":
            value = raw.smembers(name)
        elif kind == "zset":
            value = raw.zrange(name, 0, -1, withscores=True)
        elif kind == "stream":
            value = raw.xrange(name)
        else:
            value = kind
        parts.append(f"{key} {_text(value)}")
    raw.close()
    return "\n".join(parts)


def _text(value: Any) -> str:
    """`value` (bytes, or containers of them) as text, bytes decoded leniently."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return repr({_text(k): _text(v) for k, v in value.items()})
    if isinstance(value, list | tuple | set):
        return repr([_text(v) for v in value])
    return repr(value)


def worker_queue(worker_id: str) -> str:
    return worker_queue_name(worker_id)


class ThrowawayRedis:
    """A `redis-server` of this test module's own, on a free loopback port, no persistence."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.admin = redis.Redis(port=self.port, decode_responses=True, socket_timeout=10)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.admin.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.05)

    def url(self, user: str | None = None, password: str | None = None) -> str:
        auth = f"{quote(user, safe='')}:{quote(password or '', safe='')}@" if user else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self, user: str, password: str) -> redis.Redis:
        return redis.Redis.from_url(self.url(user, password), decode_responses=True)

    def set_user(self, user: str, rules: list[str]) -> None:
        self.admin.execute_command("ACL", "SETUSER", user, *rules)

    def stop(self) -> None:
        self.admin.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
