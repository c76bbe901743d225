"""api/burst.py's gate and memory of refusals, on one event loop with a fake clock."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from django.http import HttpResponse

from admission import refusals
from admission.completion import CompletionDraft
from api.burst import Answer, Gate, Lines, Memo, Passage, Remembered
from api.workspace_tools import Holding


def _holding(until: float) -> HttpResponse:
    response = HttpResponse(b'{"code": "WORKER_QUEUE_FULL"}', status=429)
    # The memory keeps the policy for the rows it writes; these tests write none.
    policy: Any = None
    response.holds = Holding(  # type: ignore[attr-defined]
        refusal=refusals.queue_full("w", 32, holds_until=until),
        tenant_hash="",
        principal_hash="",
        worker_id="w",
        policy=policy,
    )
    return response


async def _place(gate: Gate, credential: bytes) -> Passage:
    """A place at the gate, for a call that can be excused by nothing."""
    turn = await gate.enter(credential)
    assert isinstance(turn, Passage)
    return turn


def test_the_gate_lets_width_calls_of_a_credential_pass_and_the_rest_in_arrival_order() -> None:
    async def scenario() -> list[int]:
        gate = Gate(lambda: 2)
        first, second = await _place(gate, b"a"), await _place(gate, b"a")
        order: list[int] = []

        async def waiter(n: int) -> None:
            passage = await _place(gate, b"a")
            order.append(n)
            passage.release()

        tasks = [asyncio.create_task(waiter(n)) for n in range(3)]
        other = await asyncio.wait_for(_place(gate, b"b"), 1)  # another credential never waits
        await asyncio.sleep(0)
        assert order == [] and gate.waiting(b"a") == 3
        first.release()
        first.release()  # idempotent: one place, not two
        await asyncio.gather(*tasks)
        second.release()
        other.release()
        assert gate.passing(b"a") == 0 and gate.waiting(b"a") == 0
        return order

    assert asyncio.run(scenario()) == [0, 1, 2]


def test_a_waiting_call_excused_leaves_the_line_at_once_and_the_others_keep_their_order() -> None:
    """`excuse` answers the waiting calls whose answer is known now (a refusal learned while
    they waited), with no place freed; the others keep their order and take the places."""
    response = _holding(until=10.0)
    holding = response.holds  # type: ignore[attr-defined]
    refused = Remembered(answer=Answer.of(response), holding=holding)

    async def scenario() -> None:
        gate = Gate(lambda: 1)
        holder = await _place(gate, b"a")
        known: set[int] = set()
        order: list[int] = []

        async def waiter(n: int) -> Passage | Remembered:
            turn = await gate.enter(b"a", lambda: refused if n in known else None)
            order.append(n)
            return turn

        tasks = [asyncio.create_task(waiter(n)) for n in range(4)]
        await asyncio.sleep(0)
        gate.excuse(b"a")  # nobody is excused yet: nothing changes
        tasks[3].cancel()  # cancelled in line: skipped, not asked
        known.update({1, 3})
        gate.excuse(b"a")
        assert await asyncio.wait_for(tasks[1], 1) is refused
        assert order == [1] and gate.passing(b"a") == 1 and gate.waiting(b"a") == 2
        holder.release()
        first = await asyncio.wait_for(tasks[0], 1)
        assert isinstance(first, Passage)
        first.release()
        last = await asyncio.wait_for(tasks[2], 1)
        assert isinstance(last, Passage) and order == [1, 0, 2]
        last.release()
        with pytest.raises(asyncio.CancelledError):
            await tasks[3]
        assert gate.passing(b"a") == 0 and gate.waiting(b"a") == 0

    asyncio.run(scenario())


def test_a_call_cancelled_as_it_is_handed_a_place_passes_the_place_on() -> None:
    async def scenario() -> None:
        gate = Gate(lambda: 1)
        holder = await _place(gate, b"a")
        cancelled = asyncio.create_task(_place(gate, b"a"))
        nxt = asyncio.create_task(_place(gate, b"a"))
        await asyncio.sleep(0)
        holder.release()  # the place goes to `cancelled`...
        cancelled.cancel()  # ...which is cancelled in the same step
        passage = await asyncio.wait_for(nxt, 1)
        assert gate.passing(b"a") == 1
        passage.release()
        assert gate.passing(b"a") == 0

    asyncio.run(scenario())


def test_a_call_cancelled_in_line_and_dropped_by_a_release_before_it_runs_leaves_quietly() -> None:
    async def scenario() -> None:
        gate = Gate(lambda: 1)
        holder = await _place(gate, b"a")
        waiter = asyncio.create_task(_place(gate, b"a"))
        await asyncio.sleep(0)
        waiter.cancel()  # its turn is cancelled at once; its own code runs at its next step
        holder.release()  # drops the cancelled turn, and the line with it
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert gate.passing(b"a") == 0 and gate.waiting(b"a") == 0
        again = await asyncio.wait_for(_place(gate, b"a"), 1)
        again.release()

    asyncio.run(scenario())


def test_a_refusal_is_recalled_until_it_runs_out_then_one_call_asks_again() -> None:
    now = [100.0]

    async def scenario() -> None:
        memo = Memo(now=lambda: now[0])
        key = (b"a", "w", "read_file")
        assert await memo.recall(key) is None
        memo.learn(key, _holding(until=100.02))
        memo.asked(key)
        assert (await memo.recall(key)) is not None
        now[0] = 100.02  # held until, not including, its moment
        assert await memo.recall(key) is None  # this call asks
        waiting = asyncio.create_task(memo.recall(key))
        await asyncio.sleep(0)
        assert not waiting.done()  # the others wait for that answer
        memo.learn(key, HttpResponse(status=200))  # it was admitted: nothing holds
        memo.asked(key)
        assert await asyncio.wait_for(waiting, 1) is None
        assert key not in memo.held

    asyncio.run(scenario())


def test_a_call_expected_refused_asks_first_and_the_others_wait_for_its_answer() -> None:
    now = [100.0]

    async def scenario() -> None:
        memo = Memo(now=lambda: now[0])
        key = (b"a", "w", "read_file")
        # Nothing learned for the key: an ordinary call asks, and nobody waits for it.
        assert await memo.recall(key) is None and key not in memo.asking
        # A call whose answer is known to be a refusal asks, and the next such wait for it.
        assert await memo.recall(key, refusal_expected=True) is None
        waiting = asyncio.create_task(memo.recall(key, refusal_expected=True))
        await asyncio.sleep(0)
        assert not waiting.done()
        memo.learn(key, _holding(until=101.0))
        memo.asked(key)
        assert await asyncio.wait_for(waiting, 1) is not None

    asyncio.run(scenario())


def _read(request_id: str | None = None, **body: Any) -> Any:
    """A ReadCall as the edge makes it, for Lines (which looks at the parsed request only)."""
    parsed = SimpleNamespace(request_id=request_id, body={"workspaceId": "repo", **body})
    return SimpleNamespace(parsed=parsed)


def _decided(lines: Lines, key: Any, limit: int) -> None:
    """A view of the line read a policy with this queue limit, for a caller of tenant t."""
    policy: Any = SimpleNamespace(worker_queue_limit=limit)
    lines.decided(key, CompletionDraft(tenant_hash="t", principal_hash="p", worker_id="w"), policy)


def test_lines_tell_a_call_beyond_its_queue_limit_once_the_limit_is_known() -> None:
    lines = Lines(Memo(), seen=lambda: None, read=lambda: None)
    key = (b"a", "w", "read_file")
    other_op, other_worker = (b"a", "w", "execute_command"), (b"a", "w2", "read_file")
    for _ in range(3):
        lines.arrived(key)
    assert lines.beyond(key, _read()) is None  # no limit read for the line yet
    _decided(lines, key, 2)
    assert lines.beyond(key, _read()) == 3
    # A line is the credential and the worker, whatever the operation.
    assert lines.beyond(other_op, _read()) == 3
    assert lines.beyond(other_worker, _read()) is None
    # The view answers these before the queue: never taken as beyond.
    assert lines.beyond(key, _read(request_id="req-0123456789abcdef")) is None
    assert lines.beyond(key, _read(workspaceInstanceId="inst-1")) is None
    lines.left(key)
    assert lines.beyond(key, _read()) == 2
    lines.left(key)
    assert lines.beyond(key, _read()) is None  # one ahead, under the limit of two
    lines.left(key)
    assert lines.in_flight == {}


def test_lines_answer_a_call_beyond_the_limit_only_while_the_limit_read_is_fresh() -> None:
    clock = [100.0]
    lines = Lines(Memo(now=lambda: clock[0]), seen=lambda: None, read=lambda: None)
    key = (b"a", "w", "read_file")
    assert lines.refusal(key) is None  # nothing read for the line
    _decided(lines, key, 2)
    clock[0] = 100.9
    made = lines.refusal(key)
    assert made is not None and made.answer.status == 429
    assert json.loads(made.answer.content)["code"] == "WORKER_QUEUE_FULL"
    assert (made.holding.tenant_hash, made.holding.worker_id) == ("t", "w")
    # Kept for the next ones as long as it holds (a second), then made again while fresh...
    assert lines.refusal(key) is made
    clock[0] = 101.95
    assert lines.refusal(key) is None  # ...and not once the limit read is over a second old
    _decided(lines, key, 2)
    assert lines.refusal(key) is not None


def test_a_view_reading_the_policy_answers_the_calls_beyond_that_wait_for_an_asking_call() -> None:
    async def scenario() -> None:
        clock = [100.0]
        memo = Memo(now=lambda: clock[0])
        lines = Lines(memo, seen=lambda: None, read=lambda: None)
        key = (b"a", "w", "read_file")
        _decided(lines, key, 2)
        clock[0] = 105.0  # the limit read is stale: the first call beyond asks the view
        assert lines.refusal(key) is None
        assert await memo.recall(key, refusal_expected=True) is None
        waiting = asyncio.create_task(memo.recall(key, refusal_expected=True))
        await asyncio.sleep(0)
        assert not waiting.done()
        _decided(lines, key, 2)  # the asking call's view (or any of the line's) read it
        answered = await asyncio.wait_for(waiting, 1)
        assert answered is not None and answered.answer.status == 429
        assert key not in memo.asking

    asyncio.run(scenario())


def test_an_old_limit_read_is_current_while_its_policy_version_is_read_unchanged() -> None:
    clock = [100.0]
    seen: list[Any] = [None]
    lines = Lines(Memo(now=lambda: clock[0]), seen=lambda: seen[0], read=lambda: 7)
    key = (b"a", "w", "read_file")
    _decided(lines, key, 2)  # read under version 7
    clock[0] = 160.0
    assert lines.refusal(key) is None  # a minute ago, nothing read since
    seen[0] = (8, 159.5)
    assert lines.refusal(key) is None  # another call found version 8: the policy changed
    seen[0] = (7, 158.0)
    assert lines.refusal(key) is None  # version 7 still, but two seconds ago
    seen[0] = (7, 159.5)
    assert lines.refusal(key) is not None  # version 7 half a second ago: still current
