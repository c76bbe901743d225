"""What the admission scripts cost inside Redis as a worker's queue grows: `settle` (a worker
hands back a result, and the same step grants and hands it the next call) and `enter`, with
1, 8 and 31 calls of one caller waiting behind the running one on one workspace (the hand-off
benchmark keeps about 7 waiting; a full queue of 32 holds 31).

Each script's own time is read from Redis's SLOWLOG (threshold 0 for the run, restored
after), so the client's round trip and this process's CPU are not in it. Every waiting call
carries an API key id and needs the workspace's offer, as the API's calls do: each grant
checks them (admission/lua/_common.lua, `refusal_of`). The worker is registered and the
calls entered by the tests' own helpers (tests/admission/queuekit.py).

Needs Redis only, no database:  .venv/bin/python benchmarks/scripts.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("SLUICE_LOCAL_SECRET", "1")
# The settings want a database; this benchmark never connects to it.
os.environ.setdefault("DATABASE_URL", "postgres://root@127.0.0.1:5432/test")

import redis
import redis.asyncio as aioredis
from django.conf import settings

from admission.queue import AsyncQueue, SyncQueue, offer_tokens

# now 0: Redis's own clock; long budgets, a limit the queues never reach.
ENTRY = {
    "queue_budget_ms": 600_000,
    "exec_budget_ms": 600_000,
    "queue_limit": 1_000,
    "incarnation": "inc1",
    "key_id": 1,
}
OFFER = {
    "ws": offer_tokens(
        operations=["execute_command"], lanes=False, edit_features=frozenset(), instruction_files=[]
    )
}


def _enter(q: AsyncQueue, worker_id: str, entry_id: str) -> Any:
    """An execute_command call on "ws" (the tests' own helper), as the API enters one: its
    caller's key id and the offer it needs are checked at every grant."""
    from queuekit import entering

    return entering(q, worker_id, entry_id, 0, ENTRY)


def _durations(sync: redis.Redis, sha: str) -> list[float]:
    return [
        e["duration"] / 1000
        for e in sync.slowlog_get(1_000_000)
        if e["command"].split()[:2] == [b"EVALSHA", sha.encode()]
    ]


async def one_queue(sync: redis.Redis, prefix: str, waiting: int, rounds: int) -> dict[str, Any]:
    """`rounds` hand-offs with `waiting` calls behind the running one: settle it (taking the
    next), then enter one more call, so the queue stays as long."""
    from queuekit import dispatching_queue

    worker_id = f"w{waiting}"
    sq: SyncQueue = dispatching_queue(sync, prefix, worker_id, OFFER)
    client = aioredis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
    try:
        q = AsyncQueue(client, prefix)
        running = await _enter(q, worker_id, "e0")
        for i in range(waiting):
            await _enter(q, worker_id, f"e{i + 1}")
        current = ("e0", running.ticket)
        sync.slowlog_reset()
        for n in range(rounds):
            accepted, handed = sq.settle_taking_next(
                worker_id=worker_id,
                entry_id=current[0],
                incarnation="inc1",
                ticket=current[1],
                payload={"ok": True},
                take_next=True,
            )
            assert accepted and handed is not None
            current = (handed.entry_id, int(handed.grant["ticket"]))
            await _enter(q, worker_id, f"e{waiting + 1 + n}")
        settle = _durations(sync, sq.scripts["settle"].sha)
        enter = _durations(sync, q.scripts["enter"].sha)
    finally:
        await client.aclose()
    return {
        "waiting": waiting,
        "settle_ms": _summary(settle),
        "enter_ms": _summary(enter),
    }


def _summary(values: list[float]) -> dict[str, Any]:
    import harness

    return harness.summary(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent / "tests" / "admission")]  # harness, queuekit
    sync = redis.Redis.from_url(settings.ADMISSION_REDIS_URL)
    prefix = f"bench-scripts-{uuid.uuid4().hex[:8]}:"
    saved = sync.config_get("slowlog-*")
    sync.config_set("slowlog-log-slower-than", 0)
    sync.config_set("slowlog-max-len", 100 * args.rounds)
    try:
        results = [
            asyncio.run(one_queue(sync, prefix, waiting, args.rounds)) for waiting in (1, 8, 31)
        ]
    finally:
        for name, value in saved.items():
            sync.config_set(name, value)
        for key in sync.scan_iter(match=f"{prefix}*", count=1000):
            sync.delete(key)
    print(json.dumps({"rounds": args.rounds, "queues": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
