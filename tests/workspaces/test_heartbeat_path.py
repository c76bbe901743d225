"""The worker's heartbeat goes straight to Redis (real Redis, the real heartbeat script) and
keeps control.py's meaning: alive, replaced, and lost (asked of the API, which says which)."""

from __future__ import annotations

import redis

from admission.queue import SyncQueue
from workspaces.runtime.control import ControlPlane

W = "hb-worker"


def test_heartbeats_renew_in_redis_and_tell_replaced_and_lost(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    queue = SyncQueue(sync_redis, redis_prefix)
    queue.register_incarnation(worker_id=W, incarnation="inc1", slots=1, ttl_ms=30_000)
    key = queue.keys(W).reg
    sync_redis.pexpire(key, 1_000)
    # Nothing answers on this port: whatever the HTTP side is asked answers None.
    control = ControlPlane(
        "http://127.0.0.1:9",
        worker_id=W,
        token="t",
        redis_beat=lambda inc: queue.heartbeat(worker_id=W, incarnation=inc, ttl_ms=30_000),
    )
    assert control.heartbeat("inc1") is True
    assert sync_redis.pttl(key) > 20_000  # renewed by the Redis path, not by the API
    queue.register_incarnation(worker_id=W, incarnation="inc2", slots=1, ttl_ms=30_000)
    assert control.heartbeat("inc1") is False  # replaced
    sync_redis.delete(key)
    # Lost: Redis cannot tell lost from replaced, so the API is asked (unreachable here).
    assert control.heartbeat("inc2") is None


def test_deregister_says_whether_it_happened(api, account_factory, caplog) -> None:
    """runworker prints "deregistered" only on True: a failed try has logged why already."""
    import socket

    owner = account_factory()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    gone = ControlPlane(f"http://127.0.0.1:{closed}", worker_id=owner.worker_id, token="t")
    assert gone.deregister("a" * 32) is False
    refused = ControlPlane(api.url, worker_id=owner.worker_id, token="slw_00000000_not-a-token")
    assert refused.deregister("a" * 32) is False
    assert [r.getMessage().split(";")[0] for r in caplog.records if r.name == "sluice.worker"] == [
        "could not deregister",
        "could not deregister (HTTP 401)",
    ]
    mine = ControlPlane(api.url, worker_id=owner.worker_id, token=owner.worker_token)
    registered = mine.register(
        workspaces=[
            {"workspaceId": "repo", "operations": ["read_file"], "linkedWorktreeLanes": False}
        ],
        slots=1,
    )
    assert mine.deregister(registered["incarnationId"]) is True
