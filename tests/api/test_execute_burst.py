"""The burst machinery of the execute edge (api/execute/burst.py), one part at a time, on a
fake clock: the credential's gate, the refusals that hold, the calls in flight."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from django.http import HttpResponse

from admission import refusals
from admission.completion import CompletionDraft
from api.execute.burst import CallsInFlight, Gate, Memo, Passage
from api.execute.view import Holding


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
    return await gate.enter(credential)


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


def _learn(calls: CallsInFlight, key: Any, limit: int) -> None:
    """A view read a policy with this queue limit, for a caller of tenant t."""
    policy: Any = SimpleNamespace(worker_queue_limit=limit)
    calls.learn(key, CompletionDraft(tenant_hash="t", principal_hash="p", worker_id="w"), policy)


def test_calls_in_flight_tell_a_call_beyond_its_queue_limit_once_the_limit_is_known() -> None:
    calls = CallsInFlight()
    key = (b"a", "w", "read_file")
    other_op, other_worker = (b"a", "w", "execute_command"), (b"a", "w2", "read_file")
    for _ in range(3):
        calls.arrived(key)
    assert calls.beyond(key, calls.ahead(key)) is None  # no limit read for the pair yet
    _learn(calls, key, 2)
    assert calls.beyond(key, calls.ahead(key)) is not None
    # A pair is the credential and the worker, whatever the operation.
    assert calls.ahead(other_op) == 3 and calls.ahead(other_worker) == 0
    calls.left(key)
    assert calls.beyond(key, calls.ahead(key)) is not None  # two ahead: the limit
    calls.left(key)
    assert calls.beyond(key, calls.ahead(key)) is None  # one ahead, under the limit of two
    calls.left(key)
    assert calls.in_flight == {}


def test_a_call_beyond_the_limit_is_answered_only_while_the_limit_read_is_fresh() -> None:
    clock = [100.0]
    calls = CallsInFlight(now=lambda: clock[0])
    key = (b"a", "w", "read_file")
    _learn(calls, key, 2)
    clock[0] = 100.9
    made = calls.beyond(key, 2)
    assert made is not None and made.answer.status == 429
    assert json.loads(made.answer.content)["code"] == "WORKER_QUEUE_FULL"
    assert (made.holding.tenant_hash, made.holding.worker_id) == ("t", "w")
    assert calls.beyond(key, 2) is made  # rendered once, for every call of the pair
    clock[0] = 101.0
    # Not once the limit read is a second old: a view must read it again.
    assert calls.beyond(key, 2) is None and calls.beyond(key, 2, fresh=False) is made
    _learn(calls, key, 2)
    assert calls.beyond(key, 2) is not None


def test_one_view_reads_an_old_limit_again_and_the_calls_beyond_wait_for_it() -> None:
    async def scenario() -> None:
        clock = [100.0]
        calls = CallsInFlight(now=lambda: clock[0])
        key = (b"a", "w", "read_file")
        _learn(calls, key, 2)
        clock[0] = 105.0  # the limit read is old: the first call beyond reads it again
        reading = await calls.read_again(key)
        assert reading is not None
        waiting = asyncio.create_task(calls.read_again(key))
        await asyncio.sleep(0)
        assert not waiting.done()
        _learn(calls, key, 2)  # its view read the policy: the others need no view
        assert await asyncio.wait_for(waiting, 1) is None
        calls.read(key, reading)  # its view ended: nothing else is read again
        assert calls.reading == {}
        clock[0] = 110.0
        again = await calls.read_again(key)
        assert again is not None
        calls.read(key, reading)  # an earlier reading's end leaves a later one alone
        assert calls.reading[key[:2]] is again
        calls.read(key, again)
        assert again.done() and calls.reading == {}

    asyncio.run(scenario())
