"""An operator's cancel and drain as the execute service meets them (fake clock, real Redis).

The rig is test_execute_service's: one worker with one slot, the worker played by its scripts.
"""

from __future__ import annotations

from typing import Any

import pytest
import test_execute_service
from test_execute_service import (
    RESULT,
    Rig,
    bounded,
    execute,
    hold_the_slot,
    make_call,
    refused,
    run,
    until,
    when_waiting,
)

from admission import refusals
from admission.queue import AsyncQueue

pytestmark = pytest.mark.usefixtures("transactional_db")

# The fixture itself (one worker with one slot), under its own name here.
rig = test_execute_service.rig


def test_an_operator_cancel_ends_the_waiting_call_not_started_and_its_row_says_so(
    rig: Rig,
) -> None:
    call = make_call(rig, request_id="operator-cancel-01")
    when_waiting(
        rig,
        call,
        lambda: rig.sq.cancel_waiting(
            worker_id=rig.worker_id,
            entry_id=call.entry_id,
            slot_ceiling=8,
            now_ms=rig.clock.peek_ms(),
        ),
    )

    async def scenario(queue: AsyncQueue) -> refusals.Refusal:
        await hold_the_slot(rig, queue)
        return await refused(execute(rig, queue, call))

    refusal = run(rig, scenario)
    # The typed answer a client's own DELETE gives (409 REQUEST_CANCELLED, not started).
    assert (refusal.code, refusal.started, refusal.by_operator) == (
        "REQUEST_CANCELLED",
        False,
        True,
    )
    assert "operator" in refusal.message
    call.draft.answered(409, refusal)
    row = call.draft.row()
    assert (row["outcome"], row["admission_outcome"], row["operator_cancelled"]) == (
        "cancelled",
        "cancelled",
        True,
    )
    assert rig.state(call.entry_id) is None and rig.state("holder") == "r"
    assert not rig.broker_messages()


def test_a_drained_worker_with_a_free_slot_lets_the_call_time_out_with_the_usual_code(
    rig: Rig,
) -> None:
    assert rig.sq.drain(worker_id=rig.worker_id, note={"by": "ops"})
    call = make_call(rig, wait_ms=1_000)
    when_waiting(rig, call, lambda: rig.clock.advance(1.0))

    async def scenario(queue: AsyncQueue) -> refusals.Refusal:
        return await refused(execute(rig, queue, call))

    refusal = run(rig, scenario)
    assert (refusal.code, refusal.started) == ("WORKSPACE_QUEUE_TIMEOUT", False)
    assert call.draft.admission_outcome == "queue_timeout"
    assert not rig.broker_messages()


def test_a_resume_grants_the_call_that_waited_for_it(rig: Rig) -> None:
    assert rig.sq.drain(worker_id=rig.worker_id, note={"by": "ops"})
    call = make_call(rig)
    when_waiting(
        rig,
        call,
        lambda: rig.sq.resume(worker_id=rig.worker_id, slot_ceiling=8, now_ms=rig.clock.peek_ms()),
    )

    async def scenario(queue: AsyncQueue) -> Any:
        task = execute(rig, queue, call)
        await until(lambda: call.dispatched or task.done())
        rig.settle_with_result(call)
        return await bounded(task)

    assert run(rig, scenario) == RESULT
    assert call.draft.admission_outcome == "admitted" and call.draft.slot_index == 0
