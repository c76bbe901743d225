"""A worker's own Redis user on a Redis Cluster: set on every node (ACLs and the script cache
are per node), and it works through the cluster client the worker uses, for its own keys only.

The Celery broker stays a plain Redis: a throwaway one here, never the machine's shared Redis.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from clusterkit import LocalCluster
from livesupport import unique
from redis.cluster import RedisCluster
from security.secsupport import ThrowawayRedis

from admission import connections
from admission.credentials import acl_user_name
from admission.management.commands.bootstrap import bootstrap
from admission.queue import SyncQueue, worker_keys
from workspaces.models import Worker

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    nodes = LocalCluster(tmp_path_factory.mktemp("acl-cluster"))
    try:
        yield nodes.start()
    finally:
        nodes.stop()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThrowawayRedis]:
    server = ThrowawayRedis(tmp_path_factory.mktemp("acl-broker"))
    yield server
    server.stop()


@pytest.fixture
def issuing(
    cluster: LocalCluster,
    broker: ThrowawayRedis,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    transactional_db: None,
) -> str:
    settings.ADMISSION_REDIS_URL = cluster.url
    settings.ADMISSION_REDIS_CLUSTER = True
    settings.REDIS_URL = settings.CELERY_BROKER_URL = broker.url()
    settings.SLUICE_WORKER_REDIS_ACL = True
    monkeypatch.setattr(connections, "_sync", None)
    prefix = f"c:{uuid.uuid4().hex[:10]}:"
    settings.REDIS_KEY_PREFIX = prefix
    return prefix


def refused(action: Any) -> bool:
    try:
        action()
    except redis.exceptions.NoPermissionError:
        return True
    except redis.exceptions.ResponseError as exc:
        return any(s in str(exc) for s in ("NOPERM", "no permissions", "can't access"))
    return False


def test_a_workers_user_is_on_every_node_and_reaches_only_its_own_keys(
    issuing: str, cluster: LocalCluster, broker: ThrowawayRedis
) -> None:
    prefix = issuing
    owner = unique("w")
    owner_node = cluster.node_for_key(worker_keys(prefix, owner).reg)
    # The outsider's keys live on another node than the owner's.
    outsider = next(
        w
        for w in (unique("w") for _ in range(100))
        if cluster.node_for_key(worker_keys(prefix, w).reg) != owner_node
    )
    tenant = unique("tenant")
    mine = bootstrap(tenant=tenant, user="owner", worker_id=owner)
    bootstrap(tenant=tenant, user="owner", worker_id=outsider)
    assert mine["admission_redis_cluster"] is True
    for port in cluster.ports:
        node = redis.Redis(host="127.0.0.1", port=port)
        assert node.execute_command("ACL", "GETUSER", acl_user_name(owner)) is not None
        node.close()
    assert broker.admin.execute_command("ACL", "GETUSER", acl_user_name(owner)) is not None

    own = RedisCluster.from_url(mine["admission_redis_url"], decode_responses=True)
    try:
        queue = SyncQueue(own, prefix)
        # Its own settle runs by SHA (the server loaded the script on every node) and is
        # discarded: there is no such call.
        settle = {"entry_id": "x", "incarnation": "x", "ticket": 1, "payload": {"t": "result"}}
        assert queue.settle(worker_id=owner, **settle) is False  # type: ignore[arg-type]
        assert refused(lambda: queue.settle(worker_id=outsider, **settle))  # type: ignore[arg-type]
        assert refused(lambda: own.hget(worker_keys(prefix, outsider).reg, "inc"))
        assert refused(lambda: own.keys("*"))
        assert refused(lambda: own.flushall())
    finally:
        own.close()

    Worker.objects.get(worker_id=owner).delete()
    for port in cluster.ports:
        node = redis.Redis(host="127.0.0.1", port=port)
        assert node.execute_command("ACL", "GETUSER", acl_user_name(owner)) is None
        node.close()
