"""A worker's own Redis credentials: one ACL user per worker, issued with its token (contract §4.4).

The API keeps the deployment's unrestricted Redis connection. Each worker gets a user that may
run only the commands the worker sends and touch only its own keys (its admission keys and
its Celery queue), so a worker host can neither read nor disturb another worker's calls.

The password is random, handed out once (bootstrap, admin rotation, later pairing) and kept
only as its SHA-256, which Redis accepts as is (`#<hash>`). That lets the server set the user
up again whenever the worker registers (after a Redis restart, a failover to a node that never
saw the user, a new cluster node) without holding the password.

Scripts: the worker runs `settle.lua` by SHA. It may not load scripts (`SCRIPT LOAD` would let
it run any Lua it likes), so the server loads the scripts the worker calls whenever it sets
the user up, on every node. A Redis that restarts empty loses both; the worker's next
heartbeat finds its registration gone, and that answer restores them (admission/registration.py),
so its Celery consumer can log in again before it registers again.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import redis
from django.conf import settings

from admission.connections import cluster_enabled
from admission.queue import revoked_key_prefix, worker_keys
from admission.scripts import lua_source
from workspaces.dispatch import worker_queue_name
from workspaces.models import Worker

log = logging.getLogger("sluice.credentials")

# What the worker sends, and nothing more. The consumer side of kombu (pop its own queue, bind
# it at start, put back what it prefetched when it stops), the clock (TIME) and what
# settle.lua runs inside Redis: a script runs with its caller's rights, command by command.
WORKER_COMMANDS = (
    # connection and clock
    "+hello",
    "+ping",
    "+time",
    # Celery/kombu consumer
    "+brpop",
    "+llen",
    "+lpush",
    "+rpush",
    "+multi",
    "+exec",
    "+watch",
    "+unwatch",
    "+sadd",
    "+zadd",
    "+zrem",
    "+zrange",
    "+hset",
    "+hget",
    "+hdel",
    "+set",
    "+get",
    "+del",
    # settle.lua and _common.lua
    "+hmget",
    "+hincrby",
    "+pexpire",
    "+exists",
    # Only scripts the server loaded: no EVAL, no SCRIPT (LOAD, FLUSH, KILL).
    "+evalsha",
)
# A cluster client learns the slot map (CLUSTER SLOTS) and the key positions of every command
# (COMMAND) when it starts: public facts about the server, no key in them.
CLUSTER_COMMANDS = ("+cluster|slots", "+command")
# The scripts a worker calls (by SHA), loaded by the server on every node it sets the user on.
WORKER_SCRIPTS = (("settle", True), ("heartbeat", True))
# Characters Redis's glob treats specially, escaped wherever a prefix lands in a pattern.
_GLOB = re.compile(r"([*?\[\]\\])")


class RedisAclUnavailable(Exception):
    """Redis cannot give this worker a user of its own (no ACL support, or ACL SETUSER refused)."""


@dataclass(frozen=True)
class WorkerRedisCredentials:
    user: str
    password: str
    redis_url: str
    admission_redis_url: str
    admission_redis_cluster: bool

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "redis_url": self.redis_url,
            "admission_redis_url": self.admission_redis_url,
        }
        if self.admission_redis_cluster:
            out["admission_redis_cluster"] = True
        return out


def acl_enabled() -> bool:
    return bool(getattr(settings, "SLUICE_WORKER_REDIS_ACL", True))


def _glob_escape(text: str) -> str:
    return _GLOB.sub(r"\\\1", text)


def acl_user_name(worker_id: str, prefix: str | None = None) -> str:
    """One name per deployment (key prefix) and worker, so two deployments on one Redis differ."""
    return f"{prefix if prefix is not None else settings.REDIS_KEY_PREFIX}worker:{worker_id}"


def worker_key_patterns(prefix: str, celery_prefix: str, worker_id: str) -> list[str]:
    """The keys a worker touches: its admission keys and its own Celery queue. (Kombu's shared
    `unacked` bookkeeping is off: CELERY_BROKER_TRANSPORT_OPTIONS ack_emulation.)"""
    # worker_keys builds every admission key; all of them share the `adm:{w:<id>}:` tag, whose
    # closing brace keeps `W` from matching a longer id such as `W2`.
    tag = worker_keys(prefix, worker_id).reg.removesuffix("reg")
    queue = _glob_escape(celery_prefix + worker_queue_name(worker_id))
    celery = _glob_escape(celery_prefix)
    bound = _glob_escape(worker_queue_name(worker_id))
    return [
        f"~{_glob_escape(tag)}*",
        f"~{queue}",
        # kombu's priority sub-queues, <queue>\x06\x16<priority>: whatever follows the queue
        # name must not be a worker-id character, or `W` would also match a worker `W2`.
        f"~{queue}[^-A-Za-z0-9._]*",
        f"~{celery}_kombu.binding.{bound}",
        f"~{celery}_kombu.binding_permanent.{bound}",
    ]


def worker_acl_rules(
    *,
    worker_id: str,
    password_sha256: str,
    prefix: str,
    celery_prefix: str,
    cluster: bool = False,
    sharded_pubsub: bool = True,
) -> list[str]:
    """Arguments of `ACL SETUSER <user> ...` confining one worker to its own keys.

    push_wake announces each push on the worker's own wake channel (admission/waiters.py):
    SPUBLISH on Redis 7, PUBLISH on Redis 6.2 (`sharded_pubsub` False), which has no sharded
    pub/sub and refuses a rule naming a command it does not know.

    The grants settle.lua makes check the revoked-key markers, which the worker may only
    read: a read-only key pattern (`%R~`), which Redis 6.2 does not have either; there the
    worker gets no access to them and its grants do not check revocations."""
    return [
        "reset",
        "on",
        f"#{password_sha256}",
        "resetchannels",
        "-@all",
        *WORKER_COMMANDS,
        "+spublish" if sharded_pubsub else "+publish",
        *(CLUSTER_COMMANDS if cluster else ()),
        *worker_key_patterns(prefix, celery_prefix, worker_id),
        *([f"%R~{_glob_escape(revoked_key_prefix(prefix))}*"] if sharded_pubsub else []),
        # Its own wake channel only: the same tag as its keys (admission/queue.py).
        f"&{_glob_escape(worker_keys(prefix, worker_id).wake_prefix)}",
    ]


def has_sharded_pubsub(client: redis.Redis) -> bool:
    """Redis 7 and later: SPUBLISH / SSUBSCRIBE exist."""
    try:
        version = str(client.info("server").get("redis_version", "7"))
        return int(version.split(".")[0]) >= 7
    except (redis.RedisError, ValueError):
        return True


def _celery_prefix() -> str:
    return str(settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", ""))


def _with_user(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _admin_nodes() -> Iterator[tuple[str, redis.Redis]]:
    """(label, admin client) for every Redis a worker connects to: the broker, and the
    admission Redis when it is another one (every node of it, on a cluster: ACLs and the
    script cache are per node, replicas included, so a failover keeps both)."""
    broker = settings.CELERY_BROKER_URL
    seen = set()
    seen.add(broker)
    yield broker, redis.Redis.from_url(broker, socket_connect_timeout=2, socket_timeout=10)
    admission = settings.ADMISSION_REDIS_URL
    if cluster_enabled():
        from redis.cluster import RedisCluster

        cluster = RedisCluster.from_url(admission, socket_connect_timeout=2, socket_timeout=10)
        try:
            for node in cluster.get_nodes():
                url = _with_node(admission, node.host, node.port)
                if url not in seen:
                    seen.add(url)
                    yield (
                        url,
                        redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10),
                    )
        finally:
            cluster.close()
    elif admission not in seen:
        yield (
            admission,
            redis.Redis.from_url(admission, socket_connect_timeout=2, socket_timeout=10),
        )


def _with_node(url: str, host: str, port: int) -> str:
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = (f"{auth}@" if auth else "") + (f"[{host}]" if ":" in host else host) + f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}"


def _set_user(worker_id: str, password_sha256: str | None) -> None:
    """On every node: the worker's ACL user (unless None) and the scripts it calls."""
    user = acl_user_name(worker_id)
    for url, client in _admin_nodes():
        with client:
            if password_sha256:
                rules = worker_acl_rules(
                    worker_id=worker_id,
                    password_sha256=password_sha256,
                    prefix=settings.REDIS_KEY_PREFIX,
                    celery_prefix=_celery_prefix(),
                    cluster=cluster_enabled(),
                    sharded_pubsub=has_sharded_pubsub(client),
                )
                _acl_setuser(client, url, worker_id, user, rules)
            for name, with_common in WORKER_SCRIPTS:
                client.script_load(lua_source(name, with_common))


def _acl_setuser(
    client: redis.Redis, url: str, worker_id: str, user: str, rules: list[str]
) -> None:
    try:
        client.execute_command("ACL", "SETUSER", user, *rules)
    except redis.exceptions.NoPermissionError as exc:
        raise RedisAclUnavailable(
            f"Redis at {_where(url)} refused ACL SETUSER for worker {worker_id} ({exc}); "
            "give the API's Redis user the right to manage ACLs, "
            "or set SLUICE_WORKER_REDIS_ACL=off to hand workers the shared REDIS_URL"
        ) from None
    except redis.exceptions.ResponseError as exc:
        text = str(exc)
        if "unknown command" in text.lower() or "unknown subcommand" in text.lower():
            text = "it has no ACLs (Redis 6 or later is needed)"
        raise RedisAclUnavailable(
            f"Redis at {_where(url)} cannot give worker {worker_id} a user of its own: "
            f"{text}; set SLUICE_WORKER_REDIS_ACL=off to hand workers the shared REDIS_URL"
        ) from None


def worker_credentials_issue(*, worker: Worker) -> WorkerRedisCredentials | None:
    """A fresh Redis password for `worker`: sets its ACL user (replacing the old password at
    once) and stores the password's hash. None when SLUICE_WORKER_REDIS_ACL is off.

    Call it inside the transaction that issues the token: if Redis refuses, nothing is saved.
    Raises RedisAclUnavailable."""
    if not acl_enabled():
        return None
    password = secrets.token_urlsafe(32)
    password_sha256 = hashlib.sha256(password.encode()).hexdigest()
    _set_user(worker.worker_id, password_sha256)
    Worker.objects.filter(pk=worker.pk).update(redis_password_hash=password_sha256)
    worker.redis_password_hash = password_sha256
    user = acl_user_name(worker.worker_id)
    return WorkerRedisCredentials(
        user=user,
        password=password,
        redis_url=_with_user(settings.CELERY_BROKER_URL, user, password),
        admission_redis_url=_with_user(settings.ADMISSION_REDIS_URL, user, password),
        admission_redis_cluster=cluster_enabled(),
    )


def worker_credentials_restore(*, worker: Worker) -> None:
    """At registration: load the scripts the worker calls, and set its ACL user up again from
    the stored hash (after a Redis restart both are gone). A worker may not load scripts
    itself, ACLs on or off, so the scripts are loaded either way."""
    enabled = acl_enabled() and bool(worker.redis_password_hash)
    _set_user(worker.worker_id, worker.redis_password_hash if enabled else None)


def worker_credentials_revoke(*, worker_id: str) -> None:
    """Delete the worker's ACL user everywhere and drop its open connections at once."""
    if not acl_enabled():
        return
    user = acl_user_name(worker_id)
    for _, client in _admin_nodes():
        with client:
            # ACL DELUSER also closes every connection authenticated as that user.
            client.execute_command("ACL", "DELUSER", user)
