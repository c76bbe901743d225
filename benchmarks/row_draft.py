"""A synchronous call's row draft (issue 34): what saving it with the call, and removing it
with the call's row, adds to the API process's side of one call.

    .venv/bin/python benchmarks/row_draft.py [--calls N]

In one process against the configured Redis (a key prefix of its own, removed afterwards):
per call, `AsyncQueue.enter` and the row's round trip (`completion_emit_many`), timed with and
without the draft, in alternating rounds; the worker's settlement between them is not timed.
Prints p50/p99 of both, then one JSON line for the docs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

WORKER = "bench-rows"
ROUNDS = 4


async def measure(calls: int) -> dict[bool, list[float]]:
    import redis
    import redis.asyncio as aioredis
    from django.conf import settings

    from admission.completion import CompletionDraft, completion_emit_many
    from admission.queue import AsyncQueue, SyncQueue, offer_tokens

    prefix = settings.REDIS_KEY_PREFIX
    offer = offer_tokens(
        operations=["read_file"], lanes=False, edit_features=frozenset(), instruction_files=[]
    )
    sync = SyncQueue(redis.Redis.from_url(settings.ADMISSION_REDIS_URL), prefix)
    sync.register_incarnation(
        worker_id=WORKER, incarnation="inc1", slots=4, ttl_ms=600_000, offer={"ws": offer}
    )
    client = aioredis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
    queue = AsyncQueue(client, prefix)
    samples: dict[bool, list[float]] = {False: [], True: []}
    try:
        for _ in range(ROUNDS):
            for with_draft in (False, True):
                for _ in range(calls // ROUNDS):
                    entry = uuid.uuid4().hex
                    draft = CompletionDraft(
                        worker_id=WORKER, workspace_id="ws", operation="read_file"
                    )
                    started = time.perf_counter()
                    row = ""
                    if with_draft:
                        row = json.dumps(draft.row())
                        draft.saved((WORKER, entry))
                    entered = await queue.enter(
                        worker_id=WORKER,
                        entry_id=entry,
                        key=("ws-" + entry, ""),  # a key each: every call is granted at once
                        queue_budget_ms=30_000,
                        exec_budget_ms=30_000,
                        queue_limit=64,
                        slot_ceiling=8,
                        operation="read_file",
                        workspace_id="ws",
                        needs=["op:read_file"],
                        row=row,
                        row_ttl_ms=120_000,
                    )
                    entered_at = time.perf_counter()
                    sync.settle(
                        worker_id=WORKER,
                        entry_id=entry,
                        incarnation="inc1",
                        ticket=entered.ticket or 0,
                        payload={"ok": True},
                    )
                    draft.answered(200)
                    settled_at = time.perf_counter()
                    await completion_emit_many([draft], client)
                    ended = time.perf_counter()
                    spent = (entered_at - started) + (ended - settled_at)
                    samples[with_draft].append(spent * 1000)
    finally:
        await client.aclose()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls each way (default 2000)")
    calls = parser.parse_args().calls
    harness.prepare("sluice_bench_rows")
    # Each row's structured log line would be measured, and would bury the table.
    import logging

    logging.getLogger("sluice.completion").setLevel(logging.WARNING)
    try:
        samples = asyncio.run(measure(calls))
    finally:
        harness.cleanup_redis()
    report: dict[str, Any] = {"benchmark": "row_draft", "calls_each_way": calls // ROUNDS * ROUNDS}
    print(f"{'enter + row round trip':<28}{'p50 ms':>10}{'p99 ms':>10}")
    for with_draft, name in ((False, "without draft"), (True, "with draft")):
        summary = harness.summary(samples[with_draft])
        report[name.replace(" ", "_")] = summary
        print(f"{name:<28}{summary['p50_ms']:>10.3f}{summary['p99_ms']:>10.3f}")
    report["cpus"] = os.cpu_count()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
