"""A key revoked while its call waits: every script that grants refuses the call instead of
dispatching it, and gives its place to the next (real Redis, fixed clocks, no API process)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable
from typing import Any

import pytest
import redis
from django.conf import settings
from queuekit import dispatching_queue, entering, run
from queuekit import pushed as queuekit_pushed

from admission.credentials import worker_acl_rules
from admission.queue import AsyncQueue, SyncQueue, offer_tokens, worker_keys
from admission.scripts import lua_source

W = "wr1"
T0 = 1_000_000
REVOKED, GOOD = 7, 8
OFFER = {
    "ws": offer_tokens(
        operations=["execute_command"], lanes=False, edit_features=frozenset(), instruction_files=[]
    )
}


@pytest.fixture
def sq(sync_redis: redis.Redis, redis_prefix: str) -> SyncQueue:
    queue: SyncQueue = dispatching_queue(sync_redis, redis_prefix, W, OFFER)
    return queue


def pushed(sync_redis: redis.Redis) -> list[str]:
    return queuekit_pushed(sync_redis, W)


def enter(q: AsyncQueue, entry_id: str, now: int, **kw: Any) -> Awaitable[Any]:
    return entering(q, W, entry_id, now, {"queue_budget_ms": 60_000, "key_id": GOOD}, **kw)


def wake(sync_redis: redis.Redis, redis_prefix: str, entry_id: str) -> list[dict[str, Any]]:
    key = worker_keys(redis_prefix, W).wake(entry_id)
    return [json.loads(m) for m in sync_redis.lrange(key, 0, -1)]


@pytest.mark.parametrize("freed_by", ["release", "settle", "expiry"])
def test_a_revoked_keys_waiting_call_is_refused_and_the_next_call_gets_the_slot(
    freed_by: str, sq: SyncQueue, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    async def scenario(q: AsyncQueue) -> Any:
        first = await enter(q, "a", T0, exec_budget_ms=1_000)
        assert (await enter(q, "b", T0 + 1, key_id=REVOKED, durable=True)).status == "waiting"
        assert (await enter(q, "c", T0 + 2)).status == "waiting"
        sq.mark_keys_revoked(key_ids=[REVOKED])
        if freed_by == "release":
            await q.release(worker_id=W, entry_id="a", ticket=first.ticket, slot_ceiling=8,
                            now_ms=T0 + 10)  # fmt: skip
        elif freed_by == "expiry":
            # Nobody released a (its API process died): the next script prunes it past its
            # exec deadline and grants in the same step.
            await enter(q, "d", T0 + 1_001, key=("other", ""))
        return first

    first = run(scenario, redis_prefix)
    if freed_by == "settle":
        assert sq.settle(
            worker_id=W, entry_id="a", incarnation="inc1", ticket=first.ticket, payload={},
            now_ms=T0 + 10,
        )  # fmt: skip
    # b never reached the worker; c, the next in line, got the slot and was dispatched.
    assert pushed(sync_redis) == ["envelope-a", "envelope-c"]
    assert sq.grant_of(worker_id=W, entry_id="c") is not None
    _, entries, _ = sq.snapshot(W)
    assert "b" not in {e["id"] for e in entries}
    assert not sync_redis.hexists(worker_keys(redis_prefix, W).env, "b")
    assert wake(sync_redis, redis_prefix, "b") == [{"t": "revoked"}]
    status = json.loads(str(sync_redis.get(worker_keys(redis_prefix, W).status("b"))))
    assert (status["state"], status["code"]) == ("failed", "UNAUTHENTICATED")


def test_without_the_mark_the_same_waiting_call_is_dispatched(
    sq: SyncQueue, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    async def scenario(q: AsyncQueue) -> None:
        first = await enter(q, "a", T0)
        await enter(q, "b", T0 + 1, key_id=REVOKED)
        sq.mark_keys_revoked(key_ids=[GOOD + 100])
        await q.release(worker_id=W, entry_id="a", ticket=first.ticket, slot_ceiling=8,
                        now_ms=T0 + 10)  # fmt: skip

    run(scenario, redis_prefix)
    assert pushed(sync_redis) == ["envelope-a", "envelope-b"]


def test_a_call_entering_with_a_revoked_key_is_refused_and_leaves_nothing(
    sq: SyncQueue, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    # Its API process still remembered the key (the caller cache, up to 1 s).
    sq.mark_keys_revoked(key_ids=[REVOKED])
    entered = run(lambda q: enter(q, "a", T0, key_id=REVOKED), redis_prefix)
    assert (entered.status, entered.code) == ("refused", "UNAUTHENTICATED")
    assert pushed(sync_redis) == []
    _, entries, _ = sq.snapshot(W)
    assert entries == []
    assert not sync_redis.hexists(worker_keys(redis_prefix, W).env, "a")


def test_the_mark_outlives_the_longest_wait_and_unmarking_restores_the_key(
    sq: SyncQueue, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    sq.mark_keys_revoked(key_ids=[REVOKED])
    key = f"{redis_prefix}adm:revoked:{REVOKED}"
    # The queue ceiling is at most 300 s (admission/models.py); the marker outlasts it.
    assert sync_redis.pttl(key) > 300_000
    sq.unmark_keys_revoked(key_ids=[REVOKED])
    assert run(lambda q: enter(q, "a", T0, key_id=REVOKED), redis_prefix).status == "granted"


def test_a_settlement_under_the_workers_own_redis_user_reads_the_mark_but_cannot_write_it(
    sq: SyncQueue, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    """settle.lua runs with the worker's rights (admission/credentials.py): they must let its
    grants see a revocation, and must not let a worker forge or erase one."""
    user, password = f"{redis_prefix}worker:{W}", "pw-" + redis_prefix
    sync_redis.execute_command(
        "ACL",
        "SETUSER",
        user,
        *worker_acl_rules(
            worker_id=W,
            password_sha256=hashlib.sha256(password.encode()).hexdigest(),
            prefix=redis_prefix,
            celery_prefix=str(settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"]),
        ),
    )
    sync_redis.script_load(lua_source("settle", True))
    confined = redis.Redis.from_url(
        settings.ADMISSION_REDIS_URL, username=user, password=password, decode_responses=True
    )
    try:

        async def scenario(q: AsyncQueue) -> Any:
            first = await enter(q, "a", T0)
            await enter(q, "b", T0 + 1, key_id=REVOKED)
            await enter(q, "c", T0 + 2)
            return first

        first = run(scenario, redis_prefix)
        sq.mark_keys_revoked(key_ids=[REVOKED])
        assert SyncQueue(confined, redis_prefix).settle(
            worker_id=W, entry_id="a", incarnation="inc1", ticket=first.ticket, payload={},
            now_ms=T0 + 10,
        )  # fmt: skip
        assert pushed(sync_redis) == ["envelope-a", "envelope-c"]
        assert wake(sync_redis, redis_prefix, "b") == [{"t": "revoked"}]
        marker = f"{redis_prefix}adm:revoked:{REVOKED}"
        for forge in (lambda: confined.delete(marker), lambda: confined.set(marker + "0", "1")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                forge()
    finally:
        confined.close()
        sync_redis.execute_command("ACL", "DELUSER", user)
