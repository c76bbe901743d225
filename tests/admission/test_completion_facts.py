"""The completion row follows from the call's facts, in one place (admission/completion.py).

The services and the views only report facts (described, entered, admitted, ran, refused,
went away, answered); what the row then says of admission and outcome is decided by the
draft's methods alone. The last test holds every other module to that.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from admission import refusals
from admission.completion import CompletionDraft

ROOT = Path(__file__).resolve().parents[2]


def test_a_call_refused_before_its_queue_says_so() -> None:
    draft = CompletionDraft()
    draft.answered(429, refusals.queue_full("w1", 32))
    row = draft.row()
    assert (row["http_status"], row["code"]) == (429, "WORKER_QUEUE_FULL")
    assert (row["admission_outcome"], row["outcome"]) == ("queue_full", "completed")
    assert row["fencing_ticket"] is None and row["slot_index"] is None


def test_a_call_that_waited_and_timed_out_counts_its_whole_life_as_its_wait() -> None:
    draft = CompletionDraft(started_monotonic=100.0)
    draft.entered(7)
    draft.refused(refusals.queue_timeout(1))
    draft.answered(503, refusals.queue_timeout(1), duration_ms=15_000)
    row = draft.row()
    assert row["admission_outcome"] == "queue_timeout"
    assert row["queue_wait_ms"] == 15_000 and row["fencing_ticket"] == 7


def test_an_admitted_call_records_its_slot_wait_and_run() -> None:
    draft = CompletionDraft()
    draft.entered(3)
    draft.admitted(1, waited_ms=40)
    draft.ran(120)
    draft.answered(200, duration_ms=170)
    row = draft.row()
    assert (row["admission_outcome"], row["outcome"], row["code"]) == ("admitted", "completed", "")
    assert (row["slot_index"], row["queue_wait_ms"], row["exec_ms"]) == (1, 40, 120)


@pytest.mark.parametrize(
    ("entered", "admitted", "admission"),
    [
        (False, False, "rejected_before_queue"),  # gone before it reached a queue
        (True, False, "cancelled"),  # taken out of the queue it waited in
        (True, True, "admitted"),  # it ran (or runs on): admission stays what it was
    ],
)
def test_a_client_that_went_away_is_recorded_by_where_its_call_was(
    entered: bool, admitted: bool, admission: str
) -> None:
    draft = CompletionDraft()
    if entered:
        draft.entered(1)
    if admitted:
        draft.admitted(0, waited_ms=5)
    draft.went_away_answered()
    row = draft.row()
    assert (row["http_status"], row["code"]) == (499, "CLIENT_DISCONNECTED")
    assert (row["outcome"], row["admission_outcome"]) == ("disconnected", admission)


def test_a_cancelled_call_and_a_shutdown_while_waiting_read_as_cancelled() -> None:
    cancelled = CompletionDraft()
    cancelled.entered(1)
    cancelled.answered(409, refusals.request_cancelled())
    assert (cancelled.outcome, cancelled.admission_outcome) == ("cancelled", "cancelled")
    stopped = CompletionDraft()
    stopped.entered(1)
    stopped.answered(503, refusals.shutting_down(waited=True))
    assert (stopped.outcome, stopped.admission_outcome) == ("completed", "cancelled")
    # Refused at the door by a stopping process: it never reached a queue.
    door = CompletionDraft()
    door.answered(503, refusals.shutting_down())
    assert door.admission_outcome == "rejected_before_queue"


def test_describe_takes_only_what_a_request_and_its_caller_say() -> None:
    draft = CompletionDraft()
    draft.describe(operation="read_file", worker_id="w1", deadline_budget_ms=9)
    assert (draft.operation, draft.worker_id, draft.deadline_budget_ms) == ("read_file", "w1", 9)
    with pytest.raises(TypeError, match="admission_outcome"):
        draft.describe(admission_outcome="admitted")


def test_a_saved_draft_is_restored_with_its_start() -> None:
    draft = CompletionDraft(operation="list_files", started=1_700_000_000.5)
    restored = CompletionDraft.restored(draft.row())
    assert restored.started == 1_700_000_000.5
    assert restored.row()["uid"] == draft.uid


def _draft_writes(path: Path) -> list[str]:
    """Assignments to a draft's attributes (`x.draft.f = ...`, `draft.f = ...`, setattr)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        line = getattr(node, "lineno", 0)
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
        for target in flat:
            if isinstance(target, ast.Attribute) and "draft" in ast.unparse(target.value):
                found.append(f"{path.relative_to(ROOT)}:{line}: {ast.unparse(target)}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and node.args
            and "draft" in ast.unparse(node.args[0])
        ):
            found.append(f"{path.relative_to(ROOT)}:{line}: setattr")
    return found


def test_no_module_but_completion_writes_a_drafts_fields() -> None:
    sources = [
        path
        for package in ("api", "admission", "workspaces", "dashboard", "config")
        for path in (ROOT / package).rglob("*.py")
        if path != ROOT / "admission" / "completion.py" and "migrations" not in path.parts
    ]
    assert len(sources) > 50
    assert [w for path in sources for w in _draft_writes(path)] == []


def test_a_row_is_every_field_of_the_draft_but_its_process_local_facts() -> None:
    """row() reads the fields shallowly (dataclasses.asdict deep-copied each, 0.14 ms a row):
    that holds while every field is a plain value, which this pins."""
    from dataclasses import asdict

    draft = CompletionDraft(request_id="r" * 16)
    draft.describe(operation="read_file", workspace_id="repo")
    draft.answered(429, refusals.queue_full("w1", 32))
    expected = asdict(draft)
    # Its monotonic start, where it was saved and whether its worker was confirmed belong to
    # this process (the last feeds /metrics only), not to the row.
    del expected["started_monotonic"], expected["saved_as"], expected["worker_confirmed"]
    assert draft.row() == expected
    plain = (str, int, float, bool, type(None))
    assert all(isinstance(value, plain) for value in expected.values())
