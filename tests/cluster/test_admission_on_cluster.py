"""Admission on a three-master Redis Cluster (issue 8, item 6).

Every admission key of a worker carries the hash tag `{w:<id>}` (the wake lists the scripts
build from a prefix included) and every rate-limit bucket `{p:<principal>}`, so each script
touches one slot. These tests prove it on a real local cluster: the scripts through the
cluster clients of `admission.connections` with workers spread over all three nodes, BLPOP
wake-ups, the rate limiter, and one end-to-end call through an API process and a worker whose
admission Redis is the cluster while Celery's broker stays on the plain shared Redis.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from clusterkit import LocalCluster
from django.conf import settings
from livesupport import Worker, git_workspace, start_api

from admission import connections
from admission.queue import AsyncQueue, worker_keys
from admission.ratelimit import RateLimiter, RatePolicy, ratelimit_key

pytestmark = pytest.mark.e2e

EXECUTE = "/v1/workspace-tools/execute"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    nodes = LocalCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield nodes.start()
    finally:
        nodes.stop()


@pytest.fixture
def on_cluster(cluster: LocalCluster, settings: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point this process's admission clients at the cluster; returns a fresh key prefix."""
    settings.ADMISSION_REDIS_URL = cluster.url
    settings.ADMISSION_REDIS_CLUSTER = True
    monkeypatch.setattr(connections, "_sync", None)
    monkeypatch.setattr(connections, "_async", {})
    prefix = f"c:{uuid.uuid4().hex[:10]}:"
    settings.REDIS_KEY_PREFIX = prefix
    return prefix


def node_keys(cluster: LocalCluster, prefix: str) -> dict[int, dict[str, int]]:
    """port -> {key: PTTL} for every key under `prefix`, read node by node."""
    found: dict[int, dict[str, int]] = {}
    for port in cluster.ports:
        node = redis.Redis(host="127.0.0.1", port=port, decode_responses=True)
        found[port] = {k: node.pttl(k) for k in node.scan_iter(match=f"{prefix}*", count=1000)}
        node.close()
    return found


def test_the_clients_are_cluster_clients_only_when_the_setting_is_on(
    on_cluster: str, settings: Any
) -> None:
    assert isinstance(connections.sync_queue().client, redis.cluster.RedisCluster)
    assert isinstance(connections.sync_client(), redis.cluster.RedisCluster)
    settings.ADMISSION_REDIS_CLUSTER = False
    connections._sync = None
    assert type(connections.sync_queue().client) is redis.Redis


def test_every_script_runs_on_the_cluster_for_workers_spread_over_all_three_nodes(
    cluster: LocalCluster, on_cluster: str
) -> None:
    prefix = on_cluster
    workers = [f"w{i}" for i in range(24)]
    homes = {cluster.node_for_key(worker_keys(prefix, w).reg) for w in workers}
    assert homes == set(cluster.ports), "the workers' slots should cover every node"
    sq = connections.sync_queue()
    for w in workers:
        assert sq.register_incarnation(worker_id=w, incarnation="inc1", slots=2, ttl_ms=30_000) == (
            0,
            0,
        )
        assert sq.heartbeat(worker_id=w, incarnation="inc1", ttl_ms=30_000)

    async def one_worker(q: AsyncQueue, w: str) -> list[str]:
        def enter(entry: str, key: tuple[str, str]) -> Any:
            return q.enter(
                worker_id=w,
                entry_id=entry,
                key=key,
                queue_budget_ms=20_000,
                exec_budget_ms=20_000,
                queue_limit=4,
                slot_ceiling=8,
                operation="write_file",
            )

        a = await enter("a", ("A", ""))
        b = await enter("b", ("A", ""))
        c = await enter("c", ("B", ""))
        d = await enter("d", ("A", "lane"))
        e = await enter("e", ("C", ""))
        assert [x.status for x in (a, b, c, d, e)] == [
            "granted",
            "waiting",
            "granted",
            "waiting",
            "full",
        ]
        assert a.grant is not None and c.grant is not None
        assert (a.grant.slot, c.grant.slot) == (0, 1)
        # b is woken by a push onto its wake list, announced on the worker's shard channel to
        # the node's subscriber (admission/waiters.py), in the same settle that frees a's slot.
        woken = asyncio.ensure_future(q.wait(worker_id=w, entry_id="b", timeout_ms=10_000))
        await asyncio.sleep(0.05)
        settled = await asyncio.to_thread(
            sq.settle,
            worker_id=w,
            entry_id="a",
            incarnation="inc1",
            ticket=a.grant.ticket,
            payload={"t": "result", "ok": True},
        )
        assert settled
        message = await woken
        assert message is not None and message["t"] == "grant" and message["slot"] == 0
        # The settlement itself reached a's wake list.
        assert (await q.poll(worker_id=w, entry_id="a")) == {"t": "result", "ok": True}
        # A stale settlement is discarded; d (a lane of A, behind b) leaves; c is released.
        assert not await asyncio.to_thread(
            sq.settle,
            worker_id=w,
            entry_id="a",
            incarnation="inc1",
            ticket=a.grant.ticket,
            payload={},
        )
        assert (await q.leave(worker_id=w, entry_id="d", slot_ceiling=8))[0] == "left"
        assert await q.release(worker_id=w, entry_id="c", ticket=c.grant.ticket, slot_ceiling=8)
        f = await enter("f", ("A", ""))
        assert f.status == "waiting"
        told = await asyncio.to_thread(sq.deregister, worker_id=w, incarnation="inc1")
        # b was running and f waiting: both are told the worker left.
        assert told == 2
        offline = await q.wait(worker_id=w, entry_id="f", timeout_ms=5_000)
        assert offline == {"t": "offline"}
        return [x.status for x in (a, b, c, d, e, f)]

    async def main() -> list[list[str]]:
        q = connections.async_queue()
        try:
            return await asyncio.gather(*(one_worker(q, w) for w in workers))
        finally:
            await q.client.aclose()
            await q.waiters.close()

    results = asyncio.run(main())
    assert len(results) == len(workers)
    # Nothing under the prefix is left without a TTL, on any node (deregister deleted the
    # queues; the wake lists and stats counters expire on their own).
    keys = node_keys(cluster, prefix)
    assert sum(len(k) for k in keys.values()) > 0
    assert all(ttl > 0 for per_node in keys.values() for ttl in per_node.values()), keys


def test_the_rate_limit_is_exact_for_principals_on_every_node(
    cluster: LocalCluster, on_cluster: str
) -> None:
    prefix = on_cluster
    principals = [f"p{i}" for i in range(30)]
    assert {cluster.node_for_key(ratelimit_key(prefix, p)) for p in principals} == set(
        cluster.ports
    )
    policy = RatePolicy.parse("5/30s")

    async def main() -> dict[str, int]:
        client = connections.async_client(decode_responses=True)
        limiter = RateLimiter(client, prefix=prefix)
        try:
            decisions = await asyncio.gather(
                *(
                    limiter.take(principal_key=p, policy=policy)
                    for p in principals
                    for _ in range(8)
                )
            )
        finally:
            await client.aclose()
        allowed: dict[str, int] = dict.fromkeys(principals, 0)
        for i, decision in enumerate(decisions):
            allowed[principals[i // 8]] += decision.allowed
        return allowed

    assert asyncio.run(main()) == dict.fromkeys(principals, 5)


def test_a_call_through_an_api_on_the_cluster_runs_and_waits_by_push_and_logs_its_row(
    cluster: LocalCluster,
    live_env: dict[str, str],
    account_factory: Any,
    tmp_path: Path,
) -> None:
    from admission.models import CompletionLog

    owner = account_factory()
    # Admission on the cluster; the Celery broker (REDIS_URL) stays on the plain shared Redis.
    env = live_env | {"ADMISSION_REDIS_URL": cluster.url, "ADMISSION_REDIS_CLUSTER": "1"}
    api = start_api(env)
    worker = Worker(
        worker_id=owner.worker_id,
        token=owner.worker_token,
        workspaces={"a": git_workspace(tmp_path / "a")},
        api_url=api.url,
        env=env,
        slots=2,
    )
    headers = owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id}
    log = tmp_path / "order.log"
    try:
        worker.start()
        with httpx.Client(base_url=api.url, timeout=60) as http:
            r = http.post(
                EXECUTE,
                json={
                    "protocolVersion": 1,
                    "operation": "read_file",
                    "workspaceId": "a",
                    "path": "README.md",
                },
                headers=headers | {"X-LibreChat-Workspace-Request-Id": "cluster-read-000001"},
            )
            assert r.status_code == 200, r.text
            assert r.json()["content"] == "# demo"

        # Two commands on one key: the second waits and is woken by the first one's settlement.
        def run(name: str) -> httpx.Response:
            body = {
                "protocolVersion": 1,
                "operation": "execute_command",
                "workspaceId": "a",
                "command": f"echo {name} start >> {log}; sleep 0.5; echo {name} end >> {log}",
            }
            with httpx.Client(base_url=api.url, timeout=60) as http:
                return http.post(EXECUTE, json=body, headers=headers)

        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(run, "one")
            time.sleep(0.2)
            second = pool.submit(run, "two")
            answers = [first.result(), second.result()]
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        assert log.read_text().split("\n")[:4] == ["one start", "one end", "two start", "two end"]
        # The worker's registration is on the node owning its slot, not on the broker's Redis;
        # Celery's queue is on the broker.
        reg = worker_keys(settings.REDIS_KEY_PREFIX, owner.worker_id).reg
        home = redis.Redis(host="127.0.0.1", port=cluster.node_for_key(reg))
        shared = redis.Redis.from_url(settings.REDIS_URL)
        try:
            assert home.exists(reg) and not shared.exists(reg)
            assert list(shared.scan_iter(match=f"{settings.REDIS_KEY_PREFIX}celery:*"))
        finally:
            home.close()
            shared.close()
    finally:
        worker.stop()
        api.process.stop()
    # The drainer read the completion stream off the cluster into Postgres.
    deadline = time.monotonic() + 10
    while not CompletionLog.objects.filter(request_id="cluster-read-000001").exists():
        assert time.monotonic() < deadline, "the completion row never reached Postgres"
        time.sleep(0.1)
    assert CompletionLog.objects.filter(worker_id=owner.worker_id, http_status=200).count() == 3


def test_an_unreachable_cluster_is_a_redis_error_so_admission_answers_503(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from livesupport import free_port

    settings.ADMISSION_REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    settings.ADMISSION_REDIS_CLUSTER = True

    async def main() -> None:
        client = connections.async_client(decode_responses=True, socket_connect_timeout=0.5)
        try:
            with pytest.raises(redis.RedisError):
                await client.get("anything")
        finally:
            await client.aclose()

    asyncio.run(main())
    with pytest.raises(redis.RedisError):
        connections.sync_client(socket_connect_timeout=0.5)


def test_live_cards_and_metrics_read_the_queues_on_the_cluster(on_cluster: str, db: None) -> None:
    from dashboard.live import live_cards

    assert live_cards(client=connections.sync_queue().client) == []
