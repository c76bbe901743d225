"""A durable call's one completion row, whoever writes it (admission/durable.py): the reader
path, the drainer's sweep, two sweeps at once. Real Redis, fixed clocks, no processes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis
from livesupport import wait_until
from rowkit import REQUEST, RESULT, T0, WALL0, rows, run, settle, status_of

from admission.completion import CompletionDraft, metrics_key, stream_key
from admission.durable import DurableSweeper, durable_status
from admission.queue import AsyncQueue, durable_index_key, worker_keys


async def submit(q: AsyncQueue, worker_id: str, entry_id: str, now: int) -> Any:
    """What a durable submission leaves in Redis: the row draft (listed), then its entry."""
    draft = CompletionDraft(
        request_id="rid-" + entry_id,
        worker_id=worker_id,
        workspace_id="ws",
        operation="execute_command",
        deadline_budget_ms=10_000 + 6_000,
    )
    draft.started = (WALL0 + now - T0) / 1000
    await q.row_draft_save(
        worker_id=worker_id,
        entry_id=entry_id,
        row=json.dumps(draft.row()),
        request=json.dumps(REQUEST),
        ttl_ms=16_000 + 16 * 60_000,
        submitted_ms=int(draft.started * 1000),
    )
    return await q.enter(
        worker_id=worker_id,
        entry_id=entry_id,
        key=("ws", ""),
        queue_budget_ms=10_000,
        exec_budget_ms=6_000,
        queue_limit=64,
        slot_ceiling=8,
        operation="execute_command",
        workspace_id="ws",
        needs=["op:execute_command"],
        durable=True,
        now_ms=now,
    )


def test_the_reader_and_two_sweeps_at_once_write_each_row_exactly_once(
    worker: Any, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    w = worker.worker_id
    ids = [f"e{i:02d}" for i in range(24)]

    async def enter_all(q: AsyncQueue) -> list[Any]:
        return [await submit(q, w, e, T0 + i) for i, e in enumerate(ids)]

    entered = run(redis_prefix, enter_all)
    assert entered[0].status == "granted" and all(x.status == "waiting" for x in entered[1:])
    # The first ends with its result, which grants the second; that one never settles. A third
    # of the rest are cancelled while they wait; the others time out in the queue. Both
    # deadlines are seen only by the clock: no script runs to say so.
    settle(sync_redis, redis_prefix, worker, ids[0], entered[0].ticket, T0 + 700)
    cancelled = ids[2::3]

    async def cancel(q: AsyncQueue) -> None:
        for e in cancelled:
            await q.leave(
                worker_id=w, entry_id=e, slot_ceiling=8, code="REQUEST_CANCELLED", now_ms=T0 + 800
            )

    run(redis_prefix, cancel)
    late = T0 + 10_000 + len(ids) + 500

    async def race(reader: AsyncQueue, a: AsyncQueue, b: AsyncQueue) -> list[Any]:
        reads = [
            durable_status(reader, request_id="rid-" + e, worker_id=w, entry_id=e,
                           status_of=status_of, now_ms=late)
            for e in ids
        ]  # fmt: skip
        sweeps = [
            DurableSweeper(q, status_of=status_of).sweep_once(now_ms=late, wall_ms=WALL0)
            for q in (a, b)
        ]
        return list(await asyncio.gather(*sweeps, *reads))

    answers = run(redis_prefix, race, clients=3)
    assert answers[2]["state"] == "completed" and answers[2]["result"] == RESULT
    written = rows(sync_redis)
    assert sorted(written) == sorted("rid-" + e for e in ids)
    assert all(len(r) == 1 for r in written.values()), {k: len(v) for k, v in written.items()}
    # Nothing is owed any more, and another sweep writes nothing.
    assert sync_redis.zcard(durable_index_key(redis_prefix)) == 0
    again = run(
        redis_prefix,
        lambda q: DurableSweeper(q, status_of=status_of).sweep_once(now_ms=late, wall_ms=WALL0),
    )
    assert again == 0 and sum(len(r) for r in rows(sync_redis).values()) == len(ids)

    # Each row carries the call's real facts.
    done = written["rid-" + ids[0]][0]
    assert (done["http_status"], done["code"], done["admission_outcome"]) == ("200", "", "admitted")
    assert (done["worker_id"], done["operation"], done["slot_index"]) == (w, "execute_command", "0")
    assert (done["queue_wait_ms"], done["exec_ms"], done["duration_ms"]) == ("0", "700", "700")
    assert done["fencing_ticket"] == str(entered[0].ticket)
    gone = written["rid-" + cancelled[0]][0]
    assert (gone["http_status"], gone["code"], gone["outcome"]) == (
        "409",
        "REQUEST_CANCELLED",
        "cancelled",
    )
    assert gone["admission_outcome"] == "cancelled" and gone["slot_index"] == ""
    expired = written["rid-" + ids[1]][0]
    assert (expired["http_status"], expired["code"], expired["slot_index"]) == (
        "504",
        "ASSIGNMENT_EXPIRED",
        "0",
    )
    assert (expired["queue_wait_ms"], expired["exec_ms"]) == ("699", "6000")
    timed_out = written["rid-" + ids[3]][0]
    assert (timed_out["http_status"], timed_out["code"]) == ("503", "WORKSPACE_QUEUE_TIMEOUT")
    assert timed_out["admission_outcome"] == "queue_timeout" and timed_out["exec_ms"] == ""
    # It waited its whole queue budget (ended at its deadline, not when the sweep saw it).
    assert timed_out["queue_wait_ms"] == timed_out["duration_ms"] == "10000"


def test_a_claim_whose_writer_died_lapses_and_the_next_writes_the_same_row(
    worker: Any, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    w = worker.worker_id
    entered = run(redis_prefix, lambda q: submit(q, w, "a", T0))
    settle(sync_redis, redis_prefix, worker, "a", entered.ticket, T0 + 100)
    draft = json.loads(sync_redis.get(worker_keys(redis_prefix, w).row("a")) or "{}")
    claim = worker_keys(redis_prefix, w).row("a") + ":claim"

    async def dying_writer(q: AsyncQueue) -> Any:
        return await q.row_claim(worker_id=w, entry_id="a", token="dead", lease_ms=300)

    assert run(redis_prefix, dying_writer)[0] == "claimed"

    def sweep() -> int:
        return int(
            run(
                redis_prefix,
                lambda q: DurableSweeper(q, status_of=status_of).sweep_once(
                    now_ms=T0 + 200, wall_ms=WALL0
                ),
            )
        )

    # While the claim holds, nobody else writes.
    assert sweep() == 0 and rows(sync_redis) == {}
    wait_until(lambda: not sync_redis.exists(claim), timeout_s=5)
    assert sweep() == 1
    [row] = rows(sync_redis)["rid-a"]
    # The same uid a finished write would have had: Postgres keeps one row by it.
    assert row["uid"] == draft["uid"]


def test_a_draft_that_never_entered_its_queue_owes_no_row_and_goes(
    worker: Any, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    w = worker.worker_id
    k = worker_keys(redis_prefix, w)

    async def save_only(q: AsyncQueue) -> None:
        draft = CompletionDraft(request_id="rid-x", worker_id=w, deadline_budget_ms=16_000)
        draft.started = WALL0 / 1000
        await q.row_draft_save(worker_id=w, entry_id="x", row=json.dumps(draft.row()),
                               request=json.dumps(REQUEST), ttl_ms=60_000, submitted_ms=WALL0)  # fmt: skip

    run(redis_prefix, save_only)

    def sweep(wall: int) -> int:
        return int(
            run(
                redis_prefix,
                lambda q: DurableSweeper(q, status_of=status_of).sweep_once(
                    now_ms=T0, wall_ms=wall
                ),
            )
        )

    # Its process may be about to enter it: kept while its budgets could still run.
    assert sweep(WALL0 + 16_000) == 0 and sync_redis.exists(k.row("x"))
    assert sweep(WALL0 + 16_000 + 60_001) == 0
    assert not sync_redis.exists(k.row("x"), k.row("x") + ":req")
    assert sync_redis.zcard(durable_index_key(redis_prefix)) == 0 and rows(sync_redis) == {}


def test_every_key_a_durable_call_leaves_expires(
    worker: Any, sync_redis: redis.Redis, redis_prefix: str
) -> None:
    w = worker.worker_id
    seconds, micros = sync_redis.time()
    now = int(seconds) * 1000 + int(micros) // 1000

    async def scenario(q: AsyncQueue) -> Any:
        first = await submit(q, w, "a", now)
        await submit(q, w, "b", now + 1)
        await q.claim_request_id(scope="p", request_id="rid-a", worker_id=w, entry_id="a",
                                 ttl_ms=60_000, durable=True)  # fmt: skip
        return first

    first = run(redis_prefix, scenario)
    settle(sync_redis, redis_prefix, worker, "a", first.ticket, now + 50)

    async def cancel_and_sweep(q: AsyncQueue) -> int:
        await q.leave(worker_id=w, entry_id="b", slot_ceiling=8, code="REQUEST_CANCELLED")
        return await DurableSweeper(q, status_of=status_of).sweep_once()

    # (b was granted when a settled; it runs, so it is not cancelled and owes its row later.)
    assert run(redis_prefix, cancel_and_sweep) == 1
    keys = set(sync_redis.scan_iter(match=redis_prefix + "*", count=1000))
    # The completion stream and the /metrics hash are the log's, not the call's.
    keys -= {stream_key(), metrics_key()}
    assert worker_keys(redis_prefix, w).row("a") in keys
    forever = [key for key in keys if sync_redis.pttl(key) < 0]
    assert forever == []
    status_ttl = sync_redis.pttl(worker_keys(redis_prefix, w).status("a"))
    assert 10 * 60 * 1000 <= status_ttl <= 16 * 60 * 1000


@pytest.mark.parametrize(
    "code",
    [
        "WORKSPACE_QUEUE_TIMEOUT",
        "ASSIGNMENT_EXPIRED",
        "WORKER_OFFLINE",
        "WORKER_MISMATCH",
        "REQUEST_CANCELLED",
        # The grant refused it: its key was revoked while it waited.
        "UNAUTHENTICATED",
    ],
)
def test_a_durable_failure_answers_the_code_the_scripts_wrote(code: str) -> None:
    from admission.durable import _failure

    assert _failure(code, "w1").code == code
