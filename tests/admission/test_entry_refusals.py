"""What the execute service answers for each way its worker's queue turns a call away at the
door (admission.services.refusal_at_entry): every one is "not started"."""

from __future__ import annotations

import pytest
from django.conf import settings

from admission.queue import Entered
from admission.services import refusal_at_entry


@pytest.mark.parametrize(
    ("entered", "code"),
    [
        (Entered("full", held=32), "WORKER_QUEUE_FULL"),
        (Entered("offline"), "WORKER_OFFLINE"),
        (Entered("refused", code="WORKER_OFFLINE"), "WORKER_OFFLINE"),
        (Entered("refused", code="WORKER_MISMATCH"), "WORKER_MISMATCH"),
        (Entered("refused", code="UNAUTHENTICATED"), "UNAUTHENTICATED"),
    ],
)
def test_each_refusal_at_the_door_has_its_code_and_never_started(
    entered: Entered, code: str
) -> None:
    refusal = refusal_at_entry("w1", entered, asked=100.0)
    assert refusal is not None
    assert refusal.code == code
    assert refusal.started is False


@pytest.mark.parametrize("status", ["granted", "waiting"])
def test_a_call_that_entered_is_not_refused(status: str) -> None:
    assert refusal_at_entry("w1", Entered(status, ticket=1), asked=100.0) is None


def test_a_full_queue_is_taken_as_full_for_a_moment_from_when_the_enter_was_sent() -> None:
    refusal = refusal_at_entry("w1", Entered("full", held=32), asked=100.0)
    assert refusal is not None
    assert refusal.holds_until == 100.0 + settings.SLUICE_FULL_QUEUE_HOLD_MS / 1000
