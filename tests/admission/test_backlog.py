"""Retry-After from the backlog (admission/backlog.py): the estimate's rules on real Redis, with
fixed clocks. Calls enter a real queue through the enter script; the worker's pace is what
completed calls' rows leave in its pace list."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from queuekit import run

from admission.backlog import (
    ANY_OPERATION,
    Work,
    pace_record,
    place_in_ms,
    queue_full_retry_s,
    queue_timeout_retry_s,
)
from admission.completion import CompletionDraft
from admission.queue import AsyncQueue, SyncQueue, pace_sample, worker_keys

W = "w1"
T0 = 1_000_000
COMMAND = "execute_command"


def register(sync_redis: redis.Redis, prefix: str, slots: int) -> SyncQueue:
    queue = SyncQueue(sync_redis, prefix)
    queue.register_incarnation(worker_id=W, incarnation="inc1", slots=slots, ttl_ms=600_000)
    return queue


def measured(sync_redis: redis.Redis, prefix: str, *samples: tuple[str, int]) -> None:
    pipe = sync_redis.pipeline(transaction=False)
    for operation, ms in samples:
        pace_sample(pipe, prefix=prefix, worker_id=W, operation=operation, exec_ms=ms)
    pipe.execute()


def request(workspace: str = "ws", operation: str = COMMAND) -> dict[str, Any]:
    return {"protocolVersion": 1, "operation": operation, "workspaceId": workspace}


async def fill(
    q: AsyncQueue,
    calls: list[tuple[str, str]],
    *,
    at: int = T0,
    queue_budget_ms: int = 120_000,
    queue_limit: int = 64,
    name: str = "e",
) -> list[Any]:
    """Enter (workspace, operation) calls in order, one ms apart; their Entered answers."""
    entered = []
    for i, (workspace, operation) in enumerate(calls):
        entered.append(
            await q.enter(
                worker_id=W,
                entry_id=f"{name}{i}",
                key=(workspace, ""),
                queue_budget_ms=queue_budget_ms,
                exec_budget_ms=300_000,
                queue_limit=queue_limit,
                slot_ceiling=8,
                operation=operation,
                now_ms=at + i,
            )
        )
    return entered


def timeout_retry(q: AsyncQueue, ticket: int | None, now: int, **kw: Any) -> Any:
    return queue_timeout_retry_s(
        q,
        worker_id=W,
        request=kw.pop("request", request()),
        ticket=ticket,
        slot_ceiling=8,
        flow=kw.pop("flow", ""),
        now_ms=now,
    )


# --- what the estimate is told from -------------------------------------------------------


def test_without_measured_work_a_refusal_is_a_quick_retry(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    register(sync_redis, redis_prefix, slots=1)

    async def scenario(q: AsyncQueue) -> tuple[int, int]:
        await fill(q, [("ws", COMMAND)] * 10)
        return (
            await timeout_retry(q, None, T0 + 1_000),
            await queue_full_retry_s(q, worker_id=W, slot_ceiling=8, now_ms=T0 + 1_000),
        )

    # Ten calls ahead, but nothing says how long one takes: the old quick retries.
    assert run(scenario, redis_prefix) == (2, 1)


@pytest.mark.parametrize(("calls", "told_s"), [(3, 2), (5, 4), (8, 7)])
def test_a_longer_backlog_is_told_a_proportionally_longer_wait(
    sync_redis: redis.Redis, redis_prefix: str, calls: int, told_s: int
) -> None:
    """The last of `calls` 1 s commands on one key times out: sent again, it is behind every
    other call of its flow on its key (one runs at a time, the running one half done)."""
    register(sync_redis, redis_prefix, slots=2)
    measured(sync_redis, redis_prefix, *[(COMMAND, 1_000)] * 5, ("read_file", 5))

    async def scenario(q: AsyncQueue) -> int:
        entered = await fill(q, [("ws", COMMAND)] * calls)
        return int(await timeout_retry(q, entered[-1].ticket, T0 + 500))

    assert run(scenario, redis_prefix) == told_s


def test_another_flow_sent_again_is_told_its_turn_not_the_whole_backlog(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    """The grant takes flows in turn: another principal's call behind eight 1 s commands of
    one flow waits for the running one (half done) and the first waiting one (never passed by a
    later arrival), not for all eight."""
    register(sync_redis, redis_prefix, slots=2)
    measured(sync_redis, redis_prefix, *[(COMMAND, 1_000)] * 5)

    async def scenario(q: AsyncQueue) -> tuple[int, int]:
        await fill(q, [("ws", COMMAND)] * 8)
        other = await timeout_retry(q, None, T0 + 500, flow="another-principal")
        same = await timeout_retry(q, None, T0 + 500)
        return int(other), int(same)

    assert run(scenario, redis_prefix) == (2, 8)


def test_the_scenario_of_the_issue_seven_seconds_ahead_are_told_seven(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    """Eight 1 s commands on one workspace; a call behind them with a 1 s allowance times out
    as the first finishes: seven seconds of work are ahead of it (it was told 2 s before)."""
    sq = register(sync_redis, redis_prefix, slots=4)
    measured(sync_redis, redis_prefix, *[(COMMAND, 1_000)] * 3)

    async def scenario(q: AsyncQueue) -> int:
        entered = await fill(q, [("ws", COMMAND)] * 9)
        first = entered[0]
        assert sq.settle(
            worker_id=W,
            entry_id="e0",
            incarnation="inc1",
            ticket=first.ticket,
            payload={"t": "result"},
            now_ms=T0 + 1_000,
        )
        return int(await timeout_retry(q, entered[8].ticket, T0 + 1_008))

    assert run(scenario, redis_prefix) == 7


def test_the_wait_stays_within_1_and_30_seconds(sync_redis: redis.Redis, redis_prefix: str) -> None:
    register(sync_redis, redis_prefix, slots=1)
    measured(sync_redis, redis_prefix, (COMMAND, 2_000))

    async def scenario(q: AsyncQueue) -> tuple[int, int]:
        # Nothing ahead: the next second. Forty 2 s commands ahead: 30 s, not 80.
        alone = await timeout_retry(q, None, T0)
        await fill(q, [("ws", COMMAND)] * 40)
        return alone, await timeout_retry(q, None, T0 + 40)

    assert run(scenario, redis_prefix) == (1, 30)


@pytest.mark.parametrize(
    ("calls", "now", "expected"),
    [
        # Two 30 ms reads run, thirty 20 s commands wait behind them: a place frees at once,
        # so a full queue with a short head stays a quick retry.
        ([("a", "read_file"), ("b", "read_file"), *[("ws", COMMAND)] * 30], T0 + 20, 1),
        # 6 s into two 20 s commands: the first ends in about 14 s.
        ([("a", COMMAND), ("b", COMMAND)], T0 + 6_000, 14),
    ],
)
def test_a_full_queue_is_told_when_its_first_running_call_is_likely_to_end(
    sync_redis: redis.Redis,
    redis_prefix: str,
    calls: list[tuple[str, str]],
    now: int,
    expected: int,
) -> None:
    register(sync_redis, redis_prefix, slots=2)
    measured(sync_redis, redis_prefix, *[(COMMAND, 20_000)] * 4, *[("read_file", 30)] * 4)

    async def scenario(q: AsyncQueue) -> int:
        entered = await fill(q, calls, queue_limit=len(calls))
        assert [e.status for e in entered[:2]] == ["granted", "granted"]
        return int(await queue_full_retry_s(q, worker_id=W, slot_ceiling=8, now_ms=now))

    assert run(scenario, redis_prefix) == expected


def test_work_on_other_workspaces_counts_only_where_it_holds_the_slots(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    register(sync_redis, redis_prefix, slots=2)
    measured(sync_redis, redis_prefix, (COMMAND, 10_000), ("read_file", 1_000))

    async def scenario(q: AsyncQueue) -> list[int]:
        # A 10 s command runs on "a"; three 1 s reads of "b" wait. A read of "b" behind them
        # has three seconds ahead (the other slot serves "b"), a command on "a" ten.
        calls = [("a", COMMAND), *[("b", "read_file")] * 3]
        await fill(q, calls)
        return [
            await timeout_retry(q, None, T0 + 10, request=request("b", "read_file")),
            await timeout_retry(q, None, T0 + 10, request=request("a")),
        ]

    assert run(scenario, redis_prefix) == [3, 10]


def test_an_operation_not_measured_lately_takes_the_mean_of_all(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    register(sync_redis, redis_prefix, slots=1)
    measured(sync_redis, redis_prefix, ("read_file", 1_000), ("write_file", 3_000))

    async def scenario(q: AsyncQueue) -> int:
        await fill(q, [("ws", COMMAND)] * 3)  # running, then two waiting: 2 s each
        return int(await timeout_retry(q, None, T0 + 3))

    assert run(scenario, redis_prefix) == 6


def test_waiting_calls_whose_allowance_ends_first_do_not_count(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    register(sync_redis, redis_prefix, slots=1)
    measured(sync_redis, redis_prefix, (COMMAND, 2_000))

    async def scenario(q: AsyncQueue) -> int:
        # One 2 s command runs; four more wait with 1 s allowances: they leave before their
        # turn, so only the running one is ahead.
        await fill(q, [("ws", COMMAND)])
        await fill(q, [("ws", COMMAND)] * 4, at=T0 + 10, queue_budget_ms=1_000, name="short")
        return int(await timeout_retry(q, None, T0 + 20))

    assert run(scenario, redis_prefix) == 2


def test_the_read_changes_nothing(sync_redis: redis.Redis, redis_prefix: str) -> None:
    register(sync_redis, redis_prefix, slots=1)
    measured(sync_redis, redis_prefix, (COMMAND, 1_000))
    k = worker_keys(redis_prefix, W)

    async def scenario(q: AsyncQueue) -> dict[str, Any]:
        await fill(q, [("ws", COMMAND)] * 3, queue_budget_ms=1_000)
        before = {key: sync_redis.dump(key) for key in (k.reg, k.queue, k.entries, k.pace)}
        # Long past every waiting call's deadline: a grant script would prune them, this not.
        await timeout_retry(q, None, T0 + 60_000)
        await queue_full_retry_s(q, worker_id=W, slot_ceiling=8, now_ms=T0 + 60_000)
        return {key: sync_redis.dump(key) == before[key] for key in before}

    assert all(run(scenario, redis_prefix).values())


# --- where the pace comes from ------------------------------------------------------------


def _row(**facts: Any) -> dict[str, Any]:
    draft = CompletionDraft(worker_id=W, operation=COMMAND)
    draft.admitted(0, waited_ms=0)
    draft.ran(1_234)
    row = draft.row()
    row.update(facts)
    return row


@pytest.mark.parametrize(
    ("facts", "counted"),
    [
        ({}, True),
        ({"outcome": "disconnected"}, False),  # measured until the client left, not the work
        ({"code": "ASSIGNMENT_EXPIRED", "http_status": 504}, False),
        ({"code": "EDIT_CONFLICT", "http_status": 409}, True),  # the worker ran and answered
        ({"slot_index": None, "exec_ms": None}, False),  # never admitted
    ],
)
def test_a_call_that_ran_to_its_answer_adds_to_its_worker_pace(
    sync_redis: redis.Redis, redis_prefix: str, facts: dict[str, Any], counted: bool
) -> None:
    pipe = sync_redis.pipeline(transaction=False)
    pace_record(pipe, _row(**facts), prefix=redis_prefix)
    pipe.execute()
    pace = worker_keys(redis_prefix, W).pace
    assert sync_redis.lrange(pace, 0, -1) == ([f"{COMMAND} 1234"] if counted else [])
    if counted:
        assert 0 < sync_redis.pttl(pace) <= 3600 * 1000


# --- the replay itself --------------------------------------------------------------------


def test_running_calls_past_the_slot_count_hold_the_next_grant() -> None:
    # Three run on two slots (an operator lowered them): the call waits for two to end.
    running = [Work(COMMAND, x, "", ran_ms=ran) for x, ran in (("a", 0), ("b", 500), ("c", 800))]
    means = {COMMAND: 1_000.0, "": 1_000.0}
    assert place_in_ms(running, slots=2, means=means, call=Work(COMMAND, "d", "")) == 500


def test_a_lane_waits_for_its_checkout_and_sibling_lanes_do_not() -> None:
    means = {COMMAND: 1_000.0, "": 1_000.0}
    checkout = [Work(COMMAND, "ws", "", ran_ms=0)]
    assert place_in_ms(checkout, slots=4, means=means, call=Work(COMMAND, "ws", "l1")) == 1_000
    sibling = [Work(COMMAND, "ws", "l2", ran_ms=0)]
    assert place_in_ms(sibling, slots=4, means=means, call=Work(COMMAND, "ws", "l1")) == 0


def test_reads_on_one_key_run_together_and_a_write_waits_for_them() -> None:
    means = {"read_file": 1_000.0, COMMAND: 1_000.0, ANY_OPERATION: 1_000.0}
    reading = [Work("read_file", "ws", "", ran_ms=0), Work("read_file", "ws", "", ran_ms=0)]
    assert place_in_ms(reading, slots=4, means=means, call=Work("read_file", "ws", "")) == 0
    assert place_in_ms(reading, slots=4, means=means, call=Work(COMMAND, "ws", "")) == 1_000
