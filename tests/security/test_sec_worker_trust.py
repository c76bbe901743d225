"""The trust boundary of a worker: it holds Redis (broker) credentials.

With the shared credentials of a default deployment, whoever runs a worker can read and write
every Redis key: the first two tests play the outsider's worker host doing exactly that to the
owner's worker (a forged assignment, a forged settlement). The fences (incarnation + ticket)
do not stop either, because both values are readable in Redis.

A Redis ACL per worker (docs/security.md) confines a worker to its own keys. The ACL tests run
a throwaway `redis-server` of their own, an API process pointed at it, and real workers that
connect as their own ACL user: calls still work end to end, and the same credentials cannot
reach another worker's keys. The machine's shared Redis is never given an ACL.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings
from livesupport import ApiServer, Worker, git_workspace, start_api
from secsupport import EXECUTE, ThrowawayRedis, body, worker_queue
from sluice_protocol import validate_request

from admission.completion import metrics_key, stream_key
from admission.credentials import acl_user_name, worker_acl_rules
from admission.queue import SyncQueue, request_id_key, worker_keys

pytestmark = pytest.mark.e2e


def call(http: httpx.Client, account: Any, payload: dict[str, Any]) -> httpx.Response:
    return http.post(
        EXECUTE,
        headers=account.auth | {"X-LibreChat-Code-Worker-ID": account.worker_id},
        json=payload,
    )


def shared_redis() -> redis.Redis:
    """What every worker host of a default deployment holds: the deployment's REDIS_URL."""
    return redis.Redis.from_url(settings.REDIS_URL, decode_responses=True, socket_timeout=30)


def wait_for_running_entry(worker_id: str, timeout_s: float = 10.0) -> tuple[str, dict[str, Any]]:
    keys = worker_keys(settings.REDIS_KEY_PREFIX, worker_id)
    deadline = time.monotonic() + timeout_s
    with shared_redis() as client:
        while time.monotonic() < deadline:
            for entry_id, raw in client.hgetall(keys.entries).items():
                entry = json.loads(raw)
                if entry.get("st") == "r":
                    return entry_id, entry
            time.sleep(0.01)
    raise AssertionError("no running entry")


# ---------------------------------------------------------------------------------------
# The default deployment: one set of Redis credentials for every worker.


def test_another_tenants_worker_host_cannot_make_the_owners_worker_run_a_command(
    api: Any, account_factory: Any, worker_factory: Any, tmp_path: Path
) -> None:
    owner = account_factory()
    worker_factory(owner, {"repo": git_workspace(tmp_path / "repo")})
    planted = tmp_path / "planted-by-outsider"
    # The outsider's worker host, with nothing but the deployment's Redis URL and prefix.
    with shared_redis() as attacker:
        incarnation = attacker.hget(
            worker_keys(settings.REDIS_KEY_PREFIX, owner.worker_id).reg, "inc"
        )
        seconds, micros = attacker.time()
    now_ms = seconds * 1000 + micros // 1000
    forged = {
        "assignmentId": uuid.uuid4().hex,
        "workerId": owner.worker_id,
        "incarnation": incarnation,
        "ticket": 10**12 + secrets.randbelow(10**6),
        "slot": 0,
        "request": validate_request(body("execute_command", command=f"touch {planted}")),
        "execDeadlineMs": now_ms + 30_000,
        "remainingMs": 30_000,
        "commandTimeoutMs": 10_000,
    }
    from workspaces.tasks import run_assignment

    run_assignment.apply_async(args=[forged], queue=worker_queue(owner.worker_id))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert not planted.exists(), "the owner's worker ran the outsider's command"
        time.sleep(0.05)
    # The worker is alive and consuming: its silence was a refusal.
    with api.client() as http:
        assert call(http, owner, body("read_file", path="README.md")).status_code == 200


def test_another_tenants_worker_host_cannot_answer_the_owners_call(
    api: Any, account_factory: Any, worker_factory: Any, tmp_path: Path
) -> None:
    owner = account_factory()
    worker_factory(owner, {"repo": git_workspace(tmp_path / "repo")})
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        with api.client() as http:
            pending = pool.submit(
                call, http, owner, body("execute_command", command="sleep 1.5; echo genuine")
            )
            entry_id, entry = wait_for_running_entry(owner.worker_id)
            with shared_redis() as attacker:
                SyncQueue(attacker, settings.REDIS_KEY_PREFIX).settle(
                    worker_id=owner.worker_id,
                    entry_id=entry_id,
                    incarnation=entry["inc"],
                    ticket=int(entry["seq"]),
                    payload={
                        "t": "result",
                        "ok": True,
                        "result": {
                            "protocolVersion": 1,
                            "operation": "execute_command",
                            "workspaceId": "repo",
                            "exitCode": 0,
                            "stdout": "FORGED by another tenant\n",
                            "stderr": "",
                            "truncated": False,
                            "timedOut": False,
                        },
                    },
                )
            answer = pending.result(timeout=30)
    finally:
        pool.shutdown(wait=True)
    # Without a per-worker Redis ACL the forger can still end the call (settle.lua cannot check
    # an HMAC), but its answer never reaches the client: the settlement is not signed with the
    # owner's worker key, so the call ends 502 RESULT_INVALID ("may have run").
    assert answer.status_code == 502, answer.text
    assert answer.json()["code"] == "RESULT_INVALID"
    assert "FORGED" not in answer.text


# ---------------------------------------------------------------------------------------
# Confined: a Redis ACL user per worker, on a throwaway Redis.


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThrowawayRedis]:
    server = ThrowawayRedis(tmp_path_factory.mktemp("acl-redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def acl_api(acl_redis: ThrowawayRedis, live_env: dict[str, str]) -> Iterator[ApiServer]:
    """An API process on the throwaway Redis; it keeps the default user (all keys)."""
    url = acl_redis.url()
    server = start_api(live_env | {"REDIS_URL": url, "ADMISSION_REDIS_URL": url})
    yield server
    server.process.stop()


class ConfinedWorkers:
    """Starts real `runworker` processes that connect to Redis as their own ACL user."""

    def __init__(self, redis_server: ThrowawayRedis, api: ApiServer, env: dict[str, str]) -> None:
        self.redis, self.api, self.env = redis_server, api, env
        self.started: list[Worker] = []
        self.passwords: dict[str, str] = {}

    def user(self, account: Any) -> tuple[str, str]:
        """The product's own rules (admission/credentials.py), set by hand on this Redis."""
        name, password = acl_user_name(account.worker_id), secrets.token_urlsafe(24)
        self.redis.set_user(
            name,
            worker_acl_rules(
                worker_id=account.worker_id,
                password_sha256=hashlib.sha256(password.encode()).hexdigest(),
                prefix=settings.REDIS_KEY_PREFIX,
                celery_prefix=str(settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"]),
            ),
        )
        return name, password

    def start(self, account: Any, repo: Path) -> Worker:
        user, password = self.user(account)
        self.passwords[account.worker_id] = password
        url = self.redis.url(user, password)
        worker = Worker(
            worker_id=account.worker_id,
            token=account.worker_token,
            workspaces={"repo": repo},
            api_url=self.api.url,
            env=self.env | {"REDIS_URL": url, "ADMISSION_REDIS_URL": url},
        )
        self.started.append(worker)
        return worker.start()

    def client(self, account: Any) -> redis.Redis:
        """The Redis connection that account's worker host holds."""
        return self.redis.client(
            acl_user_name(account.worker_id), self.passwords[account.worker_id]
        )


@pytest.fixture
def confined(
    acl_redis: ThrowawayRedis, acl_api: ApiServer, live_env: dict[str, str], transactional_db: None
) -> Iterator[ConfinedWorkers]:
    workers = ConfinedWorkers(acl_redis, acl_api, live_env)
    yield workers
    for worker in workers.started:
        worker.kill()


def denied(action: Any) -> bool:
    try:
        action()
    except redis.exceptions.NoPermissionError:
        return True
    except redis.exceptions.ResponseError as exc:
        # Inside a script Redis words it differently: "... can't access at least one of the keys".
        return any(s in str(exc) for s in ("NOPERM", "no permissions", "can't access"))
    return False


def test_a_worker_confined_by_its_acl_serves_calls_but_cannot_reach_another_workers_keys(
    confined: ConfinedWorkers, acl_api: ApiServer, account_factory: Any, tmp_path: Path
) -> None:
    owner = account_factory()
    # The outsider's worker id extends the owner's, so no pattern may match it by prefix.
    outsider = account_factory(worker=f"{owner.worker_id}-2")
    confined.start(owner, git_workspace(tmp_path / "owner"))
    confined.start(outsider, git_workspace(tmp_path / "outsider"))
    with acl_api.client() as http:
        # End to end under the ACL: admission, dispatch, the run and the fenced settlement.
        read = call(http, owner, body("read_file", path="README.md"))
        assert read.status_code == 200, read.text
        ran = call(http, owner, body("execute_command", command="echo confined"))
        assert ran.json()["stdout"] == "confined\n", ran.text
        assert call(http, outsider, body("read_file", path="README.md")).status_code == 200

    p = settings.REDIS_KEY_PREFIX
    mine, theirs = worker_keys(p, owner.worker_id), worker_keys(p, outsider.worker_id)
    their_queue = f"{p}celery:{worker_queue(outsider.worker_id)}"
    with confined.client(owner) as own:
        # Its own keys answer (the confinement is not a blanket refusal) ...
        assert own.hget(mine.reg, "inc")
        # ... another worker's do not: not its registration (the incarnation a forged
        # assignment needs), queue, entries or wake lists, nor its Celery queue.
        assert denied(lambda: own.hget(theirs.reg, "inc"))
        assert denied(lambda: own.hgetall(theirs.entries))
        assert denied(lambda: own.zrange(theirs.queue, 0, -1))
        assert denied(lambda: own.lpop(theirs.wake("x")))
        assert denied(lambda: own.lrange(their_queue, 0, -1))
        assert denied(lambda: own.lpush(their_queue, "{}"))
        assert denied(lambda: own.brpop([their_queue], timeout=1))
        # The settle script runs with the caller's rights: no settling another worker's call.
        assert denied(
            lambda: SyncQueue(own, p).settle(
                worker_id=outsider.worker_id,
                entry_id="x",
                incarnation="x",
                ticket=1,
                payload={"t": "result"},
            )
        )
        # Nor a script of its own that reaches past its declared keys.
        snoop = own.register_script("return redis.call('HGET', ARGV[1], 'inc')")
        assert denied(lambda: snoop(keys=[mine.reg], args=[theirs.reg]))
        # The API's own keys: completion rows, metrics, request ids, rate limits.
        assert denied(lambda: own.xrange(stream_key()))
        assert denied(lambda: own.hgetall(metrics_key()))
        assert denied(lambda: own.get(request_id_key(p, "someone", "x" * 16)))
        assert denied(lambda: own.hgetall(f"{p}rl:{{p:someone}}"))
        # No listing of the keyspace (which would name every worker), no pub/sub, no admin.
        assert denied(lambda: own.keys("*"))
        assert denied(lambda: own.scan(0))
        assert denied(lambda: own.randomkey())
        assert denied(lambda: own.publish("anything", "x"))
        assert denied(lambda: own.client_list())
        assert denied(lambda: own.config_get("*"))
        assert denied(lambda: own.flushall())
        assert denied(lambda: own.execute_command("EVAL", "return 1", 0))
    # Both workers still serve calls after all that.
    with acl_api.client() as http:
        assert call(http, outsider, body("read_file", path="README.md")).status_code == 200


def test_a_worker_needs_no_broker_key_it_shares_with_other_workers(
    confined: ConfinedWorkers,
    acl_redis: ThrowawayRedis,
    acl_api: ApiServer,
    account_factory: Any,
    tmp_path: Path,
) -> None:
    owner = account_factory()
    worker = confined.start(owner, git_workspace(tmp_path / "owner"))
    with acl_api.client() as http:
        answer = call(http, owner, body("execute_command", command="echo confined"))
    assert answer.status_code == 200, answer.text
    assert answer.json()["stdout"] == "confined\n"
    # Kombu's delivery bookkeeping (one `unacked` hash for every consumer) is off: no such
    # key was ever written, by this worker or any other, while it ran and after it stopped.
    worker.stop()
    assert [k for k in acl_redis.admin.scan_iter(match="*unacked*")] == []


def test_a_failed_settlement_does_not_put_the_command_in_the_workers_log(
    confined: ConfinedWorkers,
    acl_redis: ThrowawayRedis,
    acl_api: ApiServer,
    account_factory: Any,
    tmp_path: Path,
) -> None:
    owner = account_factory()
    worker = confined.start(owner, git_workspace(tmp_path / "owner"))
    # Redis refuses the worker's settlement from now on (as it would while failing over).
    acl_redis.set_user(acl_user_name(owner.worker_id), ["-evalsha"])
    marker = f"CMD-MARKER-{uuid.uuid4().hex[:12]}"
    ran = tmp_path / "ran"
    pool = ThreadPoolExecutor(max_workers=1)
    http = httpx.Client(base_url=acl_api.url, timeout=30)
    # The call itself ends 504 at its exec deadline; nobody needs to wait for that.
    pending = pool.submit(
        call, http, owner, body("execute_command", command=f"touch {ran} # {marker}", timeoutMs=500)
    )
    pending.add_done_callback(lambda _: http.close())
    pool.shutdown(wait=False)
    deadline = time.monotonic() + 10
    while not ran.exists():
        assert time.monotonic() < deadline, "the command never ran"
        time.sleep(0.05)
    assert worker.process is not None
    # Whatever the worker logs about the failure, it logs within a moment of the run.
    time.sleep(1.5)
    output = worker.process.output()
    assert "NoPermissionError" in output or "settle" in output, output[-2000:]
    assert marker not in output
