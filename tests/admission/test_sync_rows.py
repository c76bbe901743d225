"""A synchronous call's completion row when its API process dies (admission/durable.py): the
draft it saved as it entered its queue is written by the drainer's sweep once the call is over,
exactly once, and never when the process lived to write the row itself. Real Redis, fixed
clocks, no processes (tests/faults/test_fault_api_kill_rows.py kills a real one)."""

from __future__ import annotations

import json
from typing import Any

import redis
from rowkit import T0, WALL0, rows, run, settle, status_of

from admission.completion import CompletionDraft, completion_emit_many
from admission.durable import SYNC_ROW_GRACE_MS, DurableSweeper
from admission.queue import AsyncQueue, durable_index_key, worker_keys

QUEUE_MS, EXEC_MS = 10_000, 6_000


async def enter(q: AsyncQueue, worker_id: str, entry_id: str, now: int) -> tuple[Any, Any]:
    """A synchronous execute_command call entering as call_execute enters it: its row draft
    goes in with it."""
    draft = CompletionDraft(
        request_id="rid-" + entry_id,
        worker_id=worker_id,
        workspace_id="ws",
        operation="execute_command",
        deadline_budget_ms=QUEUE_MS + EXEC_MS,
    )
    draft.started = (WALL0 + now - T0) / 1000
    draft.saved((worker_id, entry_id))
    assert q.dispatching, "the sweep runs where the scripts dispatch"
    entered = await q.enter(
        worker_id=worker_id,
        entry_id=entry_id,
        key=("ws", ""),
        queue_budget_ms=QUEUE_MS,
        exec_budget_ms=EXEC_MS,
        queue_limit=64,
        slot_ceiling=8,
        operation="execute_command",
        workspace_id="ws",
        needs=["op:execute_command"],
        row=json.dumps(draft.row()),
        row_ttl_ms=QUEUE_MS + EXEC_MS + 16 * 60_000,
        now_ms=now,
    )
    return entered, draft


def sweep(prefix: str, now: int) -> int:
    return int(
        run(
            prefix,
            lambda q: DurableSweeper(q, status_of=status_of).sweep_once(now_ms=now, wall_ms=WALL0),
        )
    )


def test_a_dead_processs_calls_get_their_rows_from_the_sweep_once_each_is_over(
    worker: Any, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    w = worker.worker_id

    async def enter_three(q: AsyncQueue) -> list[Any]:
        return [await enter(q, w, e, T0 + i) for i, e in enumerate(("ran", "lost", "waited"))]

    # One slot: "ran" runs and settles; "lost" is granted then and never settles (its worker
    # died too); "waited" times out behind it. Nobody is left to answer any of them.
    (ran, _), (lost, _), (waited, _) = run(redis_prefix, enter_three)
    assert (ran.status, lost.status, waited.status) == ("granted", "waiting", "waiting")
    settle(sync_redis, redis_prefix, worker, "ran", ran.ticket, T0 + 700)

    # Not while each could still be answered by a process that is merely slow.
    assert sweep(redis_prefix, T0 + 700 + SYNC_ROW_GRACE_MS - 1) == 0
    assert rows(sync_redis) == {}
    assert sweep(redis_prefix, T0 + 700 + SYNC_ROW_GRACE_MS) == 1
    # "lost" was granted at 700 and ran out its exec budget (and the settlement's grace);
    # "waited" ran out its queue budget.
    assert sweep(redis_prefix, T0 + 700 + EXEC_MS + 500 + SYNC_ROW_GRACE_MS) == 1
    assert sweep(redis_prefix, T0 + 2 + QUEUE_MS + SYNC_ROW_GRACE_MS - 1) == 0
    assert sweep(redis_prefix, T0 + 2 + QUEUE_MS + SYNC_ROW_GRACE_MS) == 1
    assert sweep(redis_prefix, T0 + 10 * 60_000) == 0

    written = rows(sync_redis)
    assert sorted(written) == ["rid-lost", "rid-ran", "rid-waited"]
    assert all(len(r) == 1 for r in written.values())
    assert sync_redis.zcard(durable_index_key(redis_prefix)) == 0
    done = written["rid-ran"][0]
    # What the endpoint would have answered, which reached nobody.
    assert (done["http_status"], done["code"], done["outcome"]) == ("200", "", "disconnected")
    assert (done["admission_outcome"], done["slot_index"], done["fencing_ticket"]) == (
        "admitted",
        "0",
        str(ran.ticket),
    )
    assert (done["queue_wait_ms"], done["exec_ms"], done["duration_ms"]) == ("0", "700", "700")
    expired = written["rid-lost"][0]
    assert (expired["http_status"], expired["code"], expired["exec_ms"]) == (
        "504",
        "ASSIGNMENT_EXPIRED",
        str(EXEC_MS),
    )
    timed_out = written["rid-waited"][0]
    assert (timed_out["http_status"], timed_out["code"], timed_out["slot_index"]) == (
        "503",
        "WORKSPACE_QUEUE_TIMEOUT",
        "",
    )


def test_a_process_that_writes_its_own_row_leaves_nothing_to_sweep(
    worker: Any, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    w = worker.worker_id
    k = worker_keys(redis_prefix, w)

    async def answered(q: AsyncQueue) -> Any:
        (first, draft), (_, second_draft) = [await enter(q, w, e, T0) for e in ("a", "b")]
        # The process answers "a" (its wait for the result ended: 504) and "b" (its client
        # left while it waited), each row in the one round trip a batch of rows takes.
        draft.answered(504, code="ASSIGNMENT_EXPIRED", duration_ms=EXEC_MS)
        second_draft.went_away_answered()
        await completion_emit_many([draft, second_draft], q.client)
        return first

    first = run(redis_prefix, answered)
    assert not sync_redis.exists(k.row("a"), k.status("a"), k.row("b"), k.status("b"))
    assert sync_redis.zcard(durable_index_key(redis_prefix)) == 0
    # The call settles after its answer: that brings back no status to sweep.
    settle(sync_redis, redis_prefix, worker, "a", first.ticket, T0 + EXEC_MS - 1)
    assert not sync_redis.exists(k.status("a"))
    assert sweep(redis_prefix, T0 + 10 * 60_000) == 0
    written = rows(sync_redis)
    assert {rid: len(r) for rid, r in written.items()} == {"rid-a": 1, "rid-b": 1}
    assert written["rid-a"][0]["code"] == "ASSIGNMENT_EXPIRED"
