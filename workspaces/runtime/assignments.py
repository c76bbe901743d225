"""Runs one assignment at most once and settles its result through Redis."""

from __future__ import annotations

import logging
import time
from typing import Any

from redis.exceptions import RedisError
from sluice_protocol import MAX_ERROR_CHARS, MUTATING_OPERATIONS

from workspaces.dispatch import assignment_of_message
from workspaces.operations import (
    Confinement,
    OperationError,
    OutcomeUnknown,
    resolve_lane,
    run_operation,
)
from workspaces.runtime import state as worker_state
from workspaces.signing import sign, unsigned, verify

log = logging.getLogger("sluice.worker")

# Time kept back from the exec deadline so the result still reaches the API in time.
SETTLE_MARGIN_MS = 500
# How long an assignment for an incarnation the worker is registering as waits for the answer
# (a registration makes 3 attempts of at most 10 s; a call late by then is dropped at its
# deadline).
REGISTRATION_WAIT_S = 30.0


def _family(operation: str) -> str:
    if operation == "execute_command":
        return "COMMAND"
    return "WRITE" if operation in MUTATING_OPERATIONS else "READ"


def _error(code: str, message: str, *, quarantine: bool = False) -> dict[str, Any]:
    text = message if len(message) <= MAX_ERROR_CHARS else message[: MAX_ERROR_CHARS - 1] + "…"
    return {
        "t": "result",
        "ok": False,
        "error": {"error": text, "code": code},
        "quarantine": quarantine,
    }


def assignment_run(assignment: dict[str, Any]) -> None:
    """Run an assignment Celery delivered, then each call its settlement hands back: when a
    settlement grants the next call on this worker, the settle script gives this thread that
    call's message instead of pushing it onto the Celery queue (a same-key handoff then costs
    one Redis round trip, not a broker hop). Every handed call goes through the same checks."""
    st = worker_state.current()
    if st is None:
        log.error("assignment received outside a running worker; dropped")
        return
    following: tuple[dict[str, Any], dict[str, Any] | None] | None = (assignment, None)
    while following is not None:
        following = _run_one(st, *following)


def _run_one(
    st: worker_state.WorkerState, assignment: dict[str, Any], handed_grant: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
    """Run one assignment at most once; returns the next one its settlement handed over, with
    that call's grant facts (`handed_grant`: the settle script's own, so not read again)."""
    if not verify(st.signing_key, "assignment", unsigned(assignment), assignment.get("sig")):
        # Not from the API: another broker client (e.g. another tenant's worker) forged it.
        st.count_drop("forged")
        log.warning("assignment with a bad signature dropped", extra={"worker_id": st.worker_id})
        return None
    fields: dict[str, Any] = {"worker_id": st.worker_id, "entry": assignment.get("assignmentId")}
    if assignment.get("incarnation") != st.incarnation:
        # Perhaps the incarnation this worker is registering as right now (state.registered).
        st.registered.wait(REGISTRATION_WAIT_S)
    if (
        assignment.get("incarnation") != st.incarnation
        or assignment.get("workerId") != st.worker_id
    ):
        st.count_drop("stale")
        log.warning("assignment for another incarnation dropped", extra=fields)
        return None
    # The grant facts come from the call's entry, which only the granting script writes: the
    # message that carried the assignment was prepared before the grant and names none. A call
    # a settlement handed over comes with the facts that settlement wrote (no second read).
    try:
        granted = handed_grant or st.queue.grant_of(
            worker_id=st.worker_id, entry_id=str(assignment["assignmentId"])
        )
    except RedisError:
        log.error("could not read the grant: Redis unavailable; not started", extra=fields)
        return None
    if granted is None or granted["incarnation"] != st.incarnation:
        # Settled, expired or never granted: a replay, or a call that is over.
        st.count_drop("expired")
        log.warning("assignment without a live grant dropped", extra=fields)
        return None
    ticket = int(granted["ticket"])
    fields.update(ticket=ticket, slot=granted["slot"])
    assignment = {**assignment, **granted}
    remaining_ms = float(assignment["execDeadlineMs"]) - st.redis_now_ms()
    if not st.first_sight(ticket, remaining_ms):
        st.count_drop("duplicate")
        log.warning("duplicate delivery dropped", extra=fields)
        return None
    if remaining_ms <= 0:
        st.count_drop("expired")
        log.warning("assignment past its deadline dropped", extra=fields)
        return None
    payload = _execute(st, assignment, remaining_ms)
    entry_id = str(assignment["assignmentId"])
    payload["sig"] = sign(st.signing_key, "settlement", {"entry": entry_id, "payload": payload})
    try:
        accepted, handed = st.queue.settle_taking_next(
            worker_id=st.worker_id,
            entry_id=entry_id,
            incarnation=st.incarnation,
            ticket=ticket,
            payload=payload,
            take_next=not st.stopping.is_set(),
        )
    except RedisError:
        # Logged without the assignment: its request holds file content or command text.
        log.error(
            "settlement failed: Redis unavailable; the call ends at its deadline", extra=fields
        )
        return None
    if not accepted:
        log.warning("settlement discarded: the assignment is no longer live", extra=fields)
        return None
    if handed is None:
        return None
    following = assignment_of_message(handed.message)
    if following is None:
        # Not a message the API builds, or past its expiry: dropped as Celery would drop it;
        # the call ends at its exec deadline.
        st.count_drop("expired")
        log.warning("handed-over assignment unreadable or expired; dropped", extra=fields)
        return None
    # The facts are the handed entry's own (the same script step granted it and wrote them).
    same = following.get("assignmentId") == handed.entry_id
    return following, handed.grant if same else None


def _execute(
    st: worker_state.WorkerState, assignment: dict[str, Any], remaining_ms: float
) -> dict[str, Any]:
    request = assignment["request"]
    operation = str(request["operation"])
    family = _family(operation)
    if remaining_ms <= SETTLE_MARGIN_MS:
        return _error(
            f"{family}_UNAVAILABLE",
            "The worker could not start the call before its deadline; it was not started.",
        )
    workspace = st.workspaces.get(str(request["workspaceId"]))
    if workspace is None:
        return _error(
            "WORKER_MISMATCH", "This workspace is not registered on the worker; it was not started."
        )
    deadline = time.monotonic() + (remaining_ms - SETTLE_MARGIN_MS) / 1000
    if operation == "execute_command":
        # The command's own timeout is capped by the operator's JOB_TIMEOUT (sent by the API).
        request = dict(
            request, timeoutMs=min(int(request["timeoutMs"]), int(assignment["commandTimeoutMs"]))
        )
    try:
        root = workspace.root
        if request.get("worktree"):
            if not st.lanes:
                raise OperationError(
                    "WORKER_MISMATCH", "This worker does not offer linked-worktree lanes."
                )
            root = resolve_lane(root, str(request["worktree"]))
        confinement = None
        if st.sandbox is not None:
            confinement = Confinement(st.sandbox, workspace.root, network=workspace.network)
        result = run_operation(
            request,
            root=root,
            deadline=deadline,
            offered=workspace.operations,
            confinement=confinement,
            walkers=st.walkers,
        )
    except OutcomeUnknown as exc:
        return _error(exc.code, exc.message, quarantine=True)
    except OperationError as exc:
        return _error(exc.code, exc.message)
    except Exception:
        log.exception(
            "operation failed unexpectedly",
            extra={"worker_id": st.worker_id, "operation": operation},
        )
        # A mutation that blew up half-way has an unknown outcome.
        return _error(
            f"{family}_UNAVAILABLE",
            "The worker failed while running the call.",
            quarantine=operation in MUTATING_OPERATIONS,
        )
    return {"t": "result", "ok": True, "result": result}
