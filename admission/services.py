"""The execute call from admission to result (contract §2.3-§2.6).

A call is "not started" until its assignment may have been handed to Celery; every answer
before that point says so, every answer after it is ambiguous unless the worker said more.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from django.conf import settings
from redis.exceptions import RedisError
from sluice_protocol import (
    MUTATING_OPERATIONS,
    ProtocolError,
    isolation_key,
    validate_error_result,
    validate_result,
)

from admission import backlog, deadlines, refusals, shutdown
from admission.callers import caller_key_valid, forget_cached_callers
from admission.completion import CompletionDraft
from admission.connections import async_broker
from admission.dbthread import in_db_thread
from admission.deadlines import SYSTEM_CLOCK, Clock
from admission.models import Quarantine
from admission.policy import Policy, apolicy_for
from admission.queue import OPERATOR, AsyncQueue, Entered, Grant, offer_tokens
from admission.ratelimit import RateDecision, RateLimiter
from admission.selectors import Target
from workspaces import outages
from workspaces.access import Caller
from workspaces.dispatch import assignment_message
from workspaces.features import effective_edit_features, offer_gap, request_needs
from workspaces.secrets import keyed_hash
from workspaces.signing import sign, signing_key, unsigned, verify

# A call that reaches its queue this long after its allowance ran out is refused instead of
# entering (contract §2.8: no wait past allowance + 1 s).
LATE_ENTRY_MS = 1_000

log = logging.getLogger("sluice.admission")

# While waiting for a grant, a waiter re-checks its entry this often in case a push was lost
# (a Redis failover, say). Pushes are the hot path; this is only a safety net.
SAFETY_RECHECK_MS = 5_000
# The worker settles by its exec deadline; give its push this long to arrive.
SETTLE_GRACE_MS = 500
# Redis prunes an entry at its deadline by Redis's clock; a waiter that finds its entry gone
# this close to its own deadline timed out (the clocks and a stalled process may differ a bit).
PRUNED_EARLY_S = 1.0


# A durable call's request id stays bound this long past its deadlines (its status's life).
DURABLE_KEEP_MS = 16 * 60 * 1000


class DurableExists(Exception):
    """A durable POST repeated a request id this principal's earlier durable call holds."""

    def __init__(self, *, worker_id: str, entry_id: str) -> None:
        super().__init__(entry_id)
        self.worker_id, self.entry_id = worker_id, entry_id


class AdmissionHooks(Protocol):
    """What the HTTP edge is told of one call's admission while it happens."""

    def decided(self, policy: Policy) -> refusals.Refusal | None:
        """The call's policy is read. A refusal returned answers the call before its rate limit:
        it takes no unit and never enters the queue."""

    def entered(self) -> None:
        """The call is in its worker's queue, granted or waiting."""


@dataclass
class Call:
    """One execute call as admission sees it: what the edge read and resolved (the fields
    without defaults, `target`, `durable`, `refresh_target`, `hooks`), then what admission
    learns about it on the way, which the edge reads back when it answers."""

    caller: Caller
    request: dict[str, Any]
    worker_id: str
    queue_wait_header_ms: int
    request_id: str | None
    draft: CompletionDraft
    target: Target | None = None
    request_id_claimed: bool = False
    # May have reached the worker: from its grant on (a grant dispatches it).
    dispatched: bool = False
    # In the queue or perhaps in it: from the moment its enqueue is sent until the queue said
    # where it stands. An error of Redis in between leaves the call ambiguous (contract §2.5:
    # once the enqueue may have happened, only the worker's answer says more).
    maybe_queued: bool = False
    # When its wait for the worker's answer ends (the service's clock): admission + exec budget.
    exec_deadline: float | None = None
    # Durable (§2.7): the call outlives its HTTP request; `entered` is set once it is in the
    # queue (the 202 goes out then), and its status lives in Redis.
    durable: bool = False
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    entry_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    response_headers: dict[str, str] = field(default_factory=dict)
    # Looks the worker up again, past every cache (the API edge's resolver): used at most once,
    # when this process's view says the worker is offline or the queue refuses the call for an
    # incarnation that is no longer registered.
    refresh_target: Callable[[], Awaitable[Target | None]] | None = None
    # What the HTTP edge is told as the call's admission goes on (AdmissionHooks).
    hooks: AdmissionHooks | None = None
    # The policy its admission was decided under, once read.
    policy: Policy | None = None

    @property
    def operation(self) -> str:
        return str(self.request["operation"])


def check_target(call: Call, target: Target | None) -> Target:
    """Refusals before queueing: 404 for missing and foreign workers alike, then the offer."""
    if target is None:
        raise refusals.worker_not_found(call.worker_id)
    workspace = call.request["workspaceId"]
    if not target.workspace_registered:
        raise refusals.worker_mismatch(
            f"Workspace {workspace} is not registered on worker {call.worker_id}"
        )
    if call.operation not in target.operations:
        raise refusals.worker_mismatch(
            f"Worker {call.worker_id} does not offer {call.operation} on workspace {workspace}"
        )
    gap = offer_gap(
        request_needs(call.request),
        edit_features=target.edit_features,
        instruction_files=target.instruction_files,
    )
    if gap is not None:
        raise refusals.worker_mismatch(
            f"Worker {call.worker_id} does not offer {gap} on workspace {workspace}"
        )
    if call.request.get("worktree") and not target.linked_worktree_lanes:
        raise refusals.worker_mismatch(
            f"Worker {call.worker_id} does not offer linked-worktree lanes on workspace {workspace}"
        )
    if target.quarantined:
        raise refusals.quarantined()
    if not target.incarnation_id:
        raise refusals.worker_offline(call.worker_id)
    return target


def isolation_key_hash(worker_id: str, request: dict[str, Any]) -> str:
    base, lane = isolation_key(request)
    return keyed_hash("isolation", f"{worker_id}\x1f{base}\x1f{lane}")


async def _rate_limit(call: Call, policy: Policy, limiter: RateLimiter, clock: Clock) -> None:
    if not policy.rate_limit_enabled:
        return
    asked = clock.monotonic()
    decision: RateDecision = await limiter.take(
        principal_key=call.caller.scope, policy=policy.rate, cost=policy.weight(call.operation)
    )
    call.response_headers.update(decision.headers(policy.rate))
    if not decision.allowed:
        raise refusals.rate_limited(
            message=str(decision.body()["message"]),
            headers=decision.headers(policy.rate),
            body=decision.body(),
            holds_until=rate_refusal_holds_until(asked, decision),
        )


def rate_refusal_holds_until(asked: float, decision: RateDecision) -> float:
    """Until when the same call gets the same refusal: the bucket lets nothing through before
    `retry_after_ms` from `asked` (taken before the script was sent, so never later than
    Redis's own moment), and only while its Retry-After, in whole seconds, would still be the
    same number. So at most a second, after which the next call asks Redis again and sees any
    new limit."""
    ticks_ms = decision.retry_after_ms - (decision.retry_after_s - 1) * 1000
    return asked + max(0, min(decision.retry_after_ms, ticks_ms)) / 1000


async def _wait_for_grant(
    call: Call,
    queue: AsyncQueue,
    policy: Policy,
    deadline: float,
    woken: asyncio.Event,
    clock: Clock,
) -> Grant:
    """Block on this call's wake list until granted, refused, or the queue deadline passes.
    `woken` is set whenever a push for the call may have come (AsyncQueue.watching)."""
    while True:
        # Rounded up: a call is never told its allowance ran out while a fraction of a
        # millisecond of it is left.
        left_ms = math.ceil((deadline - clock.monotonic()) * 1000)
        if left_ms <= 0:
            break
        message = await queue.wait(
            worker_id=call.worker_id,
            entry_id=call.entry_id,
            timeout_ms=min(left_ms, SAFETY_RECHECK_MS),
            woken=woken,
        )
        if message is not None:
            return _granted_or_raise(call, message)
        if await queue.entry(worker_id=call.worker_id, entry_id=call.entry_id) is None:
            # The entry vanished without a push. Look once more; then, near the deadline it
            # was pruned as expired (a queue timeout), earlier the queue itself was lost.
            message = await queue.poll(worker_id=call.worker_id, entry_id=call.entry_id)
            if message is not None:
                return _granted_or_raise(call, message)
            if deadline - clock.monotonic() > PRUNED_EARLY_S:
                raise refusals.worker_offline(call.worker_id)
            break
    status, grant = await _leave(call, queue, policy, clock, code="WORKSPACE_QUEUE_TIMEOUT")
    if status == "running" and grant is not None:
        # Granted in the same instant the budget ran out: the grant wins, the push is spent.
        await queue.poll(worker_id=call.worker_id, entry_id=call.entry_id)
        return grant
    if status == "gone":
        message = await queue.poll(worker_id=call.worker_id, entry_id=call.entry_id)
        if message is not None:
            return _granted_or_raise(call, message)
    raise refusals.queue_timeout(await _timeout_retry_s(call, queue, policy, clock))


async def _timeout_retry_s(call: Call, queue: AsyncQueue, policy: Policy, clock: Clock) -> int:
    """When the call would have found a place, had it kept its own (its ticket; none: it never
    entered)."""
    return await backlog.queue_timeout_retry_s(
        queue,
        worker_id=call.worker_id,
        request=call.request,
        ticket=call.draft.fencing_ticket,
        slot_ceiling=policy.max_lease_slots,
        flow=call_flow(call),
        now_ms=clock.scripts_ms(),
    )


def _granted_or_raise(call: Call, message: dict[str, Any]) -> Grant:
    kind = message.get("t")
    if kind == "grant":
        return Grant(
            ticket=int(message["seq"]),
            slot=int(message["slot"]),
            incarnation="",
            admitted_ms=int(message["ta"]),
            exec_deadline_ms=int(message["dl"]),
            dispatched=int(message.get("dp") or 0) == 1,
            out_of_order=int(message.get("oo") or 0) == 1,
        )
    if kind == "full":
        raise refusals.flow_share_taken(call.worker_id)
    if kind == "mismatch":
        raise refusals.worker_mismatch(withdrawn_message(call.worker_id))
    if kind == "revoked":
        raise refusals.key_revoked()
    if kind == "cancelled":
        raise refusals.request_cancelled(by_operator=message.get("by") == OPERATOR)
    if kind == shutdown.MESSAGE["t"]:
        raise refusals.shutting_down(waited=True)
    raise refusals.worker_offline(call.worker_id)


async def _wait_for_result(
    call: Call,
    queue: AsyncQueue,
    grant: Grant,
    deadline: float,
    policy: Policy,
    woken: asyncio.Event,
    clock: Clock,
) -> dict[str, Any]:
    """Wait for the worker's settlement until the exec deadline. Past that, the outcome is unknown."""
    left_ms = int((deadline - clock.monotonic()) * 1000) + SETTLE_GRACE_MS
    message = await queue.wait(
        worker_id=call.worker_id,
        entry_id=call.entry_id,
        timeout_ms=max(left_ms, 1),
        woken=woken,
    )
    if message is None and not await _release(call, queue, policy, grant, clock):
        # Settled (or cleared) between the timeout and the release: take what was pushed.
        message = await queue.poll(worker_id=call.worker_id, entry_id=call.entry_id)
    if message is None or message.get("t") == "vanished":
        raise refusals.assignment_expired()
    if message.get("t") == "offline":
        # Deregistered after draining: whatever it had not taken it will never run.
        raise refusals.worker_offline(call.worker_id)
    return message


def _result_invalid(call: Call, what: str, exc: ProtocolError) -> refusals.Refusal:
    # The reason is logged, never echoed: a hostile worker must not speak to the client.
    log.warning(
        f"worker {what} refused", extra={"worker_id": call.worker_id, "reason": exc.message}
    )
    return refusals.result_invalid(what)


async def settlement_answer(call: Call, message: dict[str, Any]) -> dict[str, Any]:
    body = unsigned(message)
    if not verify(
        _key(call), "settlement", {"entry": call.entry_id, "payload": body}, message.get("sig")
    ):
        # Not from this call's worker (anyone with broker access can push to a wake list).
        raise _result_invalid(call, "settlement", ProtocolError("RESULT_INVALID", "bad signature"))
    if message.get("ok") is True:
        result = message.get("result")
        try:
            validate_result(call.request, result)
        except ProtocolError as exc:
            raise _result_invalid(call, "result", exc) from None
        assert isinstance(result, dict)
        return result
    try:
        _status, code, text = validate_error_result(message.get("error"))
    except ProtocolError as exc:
        raise _result_invalid(call, "error answer", exc) from None
    if message.get("quarantine") is True and call.operation in MUTATING_OPERATIONS:
        await in_db_thread(quarantine_key, call=call, reason=text)
        forget_cached_callers()
    raise refusals.worker_refused(code, text)


def quarantine_key(*, call: Call, reason: str) -> None:
    Quarantine.objects.create(
        worker_id=call.worker_id,
        workspace_id=str(call.request["workspaceId"]),
        worktree=str(call.request.get("worktree") or ""),
        isolation_key_hash=call.draft.isolation_key_hash,
        operation=call.operation,
        reason=reason[:512],
        request_id=call.draft.request_id or call.draft.uid,
    )


def withdrawn_message(worker_id: str) -> str:
    return f"Worker {worker_id} no longer offers this call on its workspace"


def _assignment(
    call: Call, incarnation: str, exec_budget_ms: int, command_timeout_ms: int
) -> dict[str, Any]:
    """The signed assignment, prepared before the call enters the queue. It holds no grant
    facts (ticket, slot, exec deadline): the worker reads those from the call's entry in
    Redis, which only the grant writes, so the signed part stays the same from entry to run."""
    assignment = {
        "assignmentId": call.entry_id,
        "workerId": call.worker_id,
        "incarnation": incarnation,
        "request": call.request,
        "remainingMs": exec_budget_ms,
        "commandTimeoutMs": command_timeout_ms,
    }
    assignment["sig"] = sign(_key(call), "assignment", assignment)
    return assignment


def call_needs(request: dict[str, Any]) -> list[str]:
    """The offer tokens (admission.queue.offer_tokens) a call needs of its workspace."""
    needs = request_needs(request)
    tokens = [f"op:{request['operation']}"]
    tokens += ["lanes"] if request.get("worktree") else []
    tokens += [f"ef:{f}" for f in sorted(needs.edit_features)]
    tokens += [f"if:{needs.instruction_file}"] if needs.instruction_file is not None else []
    return tokens


def workspace_offer_tokens(
    *,
    operations: list[str],
    linked_worktree_lanes: bool,
    edit_features: list[str] | None,
    instruction_files: list[dict[str, object]],
) -> str:
    return offer_tokens(
        operations=operations,
        lanes=linked_worktree_lanes,
        edit_features=effective_edit_features(edit_features),
        instruction_files=[str(f.get("path")) for f in instruction_files],
    )


def call_budgets(request: dict[str, Any], header_ms: int, policy: Policy) -> tuple[int, int]:
    """(queue budget, exec budget) in ms: what the call may wait, and then run."""
    return (
        deadlines.queue_budget_ms(header_ms=header_ms, ceiling_ms=policy.queue_ceiling_ms),
        deadlines.exec_budget_ms(request=request, job_timeout_ms=policy.job_timeout_ms),
    )


def call_flow(call: Call) -> str:
    """The flow a call takes turns as in its worker's queue: its principal. Not refined by
    workspaceInstanceId, which the caller names freely: one principal naming many instances
    would otherwise take many turns and many shares of a worker."""
    return call.caller.scope


def _key(call: Call) -> bytes:
    assert call.target is not None  # checked before admission
    return signing_key(call.target.token_hash)


@dataclass(frozen=True)
class Budgets:
    """What one call may spend, fixed once its policy is read: how long it may wait in its
    queue and then run (ms), and when its wait ends on the service's monotonic clock."""

    policy: Policy
    queue_ms: int
    exec_ms: int
    queue_deadline: float

    @property
    def life_ms(self) -> int:
        return self.queue_ms + self.exec_ms


async def call_execute(
    call: Call, *, queue: AsyncQueue, limiter: RateLimiter, clock: Clock = SYSTEM_CLOCK
) -> dict[str, Any]:
    """Admit, dispatch and await one call. Raises a Refusal for every answer but a result.

    Every time it reads comes from `clock`; `call.draft.started_monotonic` is on the same one."""
    call.draft.describe(
        isolation_key_hash=isolation_key_hash(call.worker_id, call.request),
        flow_hash=call_flow(call),
    )
    try:
        budgets = await _budgets_read(call, limiter, clock)
        target = await _target_checked(call)
        await _names_bound(call, queue, budgets)
        # Watched from before it enters: its waits then look at its wake list only when a push
        # is announced (no look right after entering, nor after its grant).
        async with queue.watching(worker_id=call.worker_id, entry_id=call.entry_id) as woken:
            return await _admitted_call(call, queue, budgets, target, woken, clock)
    except refusals.Refusal as refusal:
        call.draft.refused(refusal)
        raise
    except RedisError as exc:
        raise _redis_lost(call, exc) from None
    finally:
        await _request_id_finished(call, queue)


async def _budgets_read(call: Call, limiter: RateLimiter, clock: Clock) -> Budgets:
    """The call's policy and budgets. The edge's hook, then the rate limit, may refuse it
    here, before it costs its worker's queue anything."""
    policy = call.policy = await apolicy_for(
        worker_id=call.worker_id, tenant_id=call.caller.tenant_id
    )
    queue_ms, exec_ms = call_budgets(call.request, call.queue_wait_header_ms, policy)
    call.draft.describe(
        deadline_budget_ms=deadlines.deadline_budget_ms(queue_ms=queue_ms, exec_ms=exec_ms)
    )
    budgets = Budgets(policy, queue_ms, exec_ms, call.draft.started_monotonic + queue_ms / 1000)
    refused = call.hooks.decided(policy) if call.hooks is not None else None
    if refused is not None:
        raise refused
    await _rate_limit(call, policy, limiter, clock)
    return budgets


async def _target_checked(call: Call) -> Target:
    if call.target is not None and not call.target.incarnation_id:
        # Offline as this process last saw it: a worker that registered again within the
        # cache's second is looked up once more before the call is refused.
        await _looked_up_again(call)
    return check_target(call, call.target)


async def _names_bound(call: Call, queue: AsyncQueue, budgets: Budgets) -> None:
    """Bind the call's conversation instance and its request id to its caller, or refuse it."""
    base, _lane = isolation_key(call.request)
    if call.request.get("workspaceInstanceId") and not await queue.bind_instance(
        worker_id=call.worker_id, base=base, scope=call.caller.scope
    ):
        raise refusals.worker_mismatch("This workspaceInstanceId belongs to another principal")
    if not call.request_id:
        return
    claimed = await queue.claim_request_id(
        scope=call.caller.scope,
        request_id=call.request_id,
        worker_id=call.worker_id,
        entry_id=call.entry_id,
        ttl_ms=budgets.life_ms + 60_000 + (DURABLE_KEEP_MS if call.durable else 0),
        durable=call.durable,
    )
    if not claimed:
        bound = await queue.request_binding(scope=call.caller.scope, request_id=call.request_id)
        if call.durable and bound is not None and bound[2]:
            raise DurableExists(worker_id=bound[0], entry_id=bound[1])
        raise refusals.request_id_taken()
    call.request_id_claimed = True


def _redis_lost(call: Call, exc: RedisError) -> refusals.Refusal:
    """The answer when Redis failed under the call: not started before its enqueue was sent,
    ambiguous from then on (the enqueue may have happened, and a grant dispatches)."""
    # A Redis that is down or too busy to connect to is expected under overload: one line.
    outages.warn(log, "admission Redis unavailable", exc)
    if call.draft.slot_index is None and not (call.dispatched or call.maybe_queued):
        return refusals.admission_unavailable()
    call.dispatched = True
    return refusals.assignment_expired(
        "Lost track of the call after it entered its worker's queue; it may or may not have run."
    )


async def _request_id_finished(call: Call, queue: AsyncQueue) -> None:
    """Only the call that bound the id marks it finished; a refused duplicate must not. A
    call never dispatched frees its id, so a client may resend under it; one that may have
    run keeps it ("finished"), so a replay is refused. A durable call's id names its status
    for as long as that lives."""
    if not call.request_id_claimed or (call.durable and call.entered.is_set()):
        return
    with contextlib.suppress(RedisError, asyncio.CancelledError):
        await asyncio.shield(
            queue.finish_request_id(
                scope=call.caller.scope,
                request_id=call.request_id or "",
                dispatched=call.dispatched or call.maybe_queued,
            )
        )


async def _admitted_call(
    call: Call,
    queue: AsyncQueue,
    budgets: Budgets,
    target: Target,
    woken: asyncio.Event,
    clock: Clock,
) -> dict[str, Any]:
    """Enter the worker's queue, wait for the grant, make sure the call is dispatched, and
    wait for its settlement."""
    expires = datetime.fromtimestamp(clock.now() + budgets.life_ms / 1000, tz=UTC)
    entry_budget_ms = _entry_budget_ms(budgets, clock)
    if entry_budget_ms is None:
        # Granting it now would already be a wait past allowance + 1 s.
        raise refusals.queue_timeout(await _timeout_retry_s(call, queue, budgets.policy, clock))
    if call.durable:
        await _durable_draft_saved(call, queue, budgets)
    entered, asked, message = await _entered(
        call, queue, budgets, target, entry_budget_ms, expires, clock
    )
    full_retry_s = (
        await backlog.queue_full_retry_s(
            queue,
            worker_id=call.worker_id,
            slot_ceiling=budgets.policy.max_lease_slots,
            now_ms=clock.scripts_ms(),
        )
        if entered.status == "full"
        else 1
    )
    refused = refusal_at_entry(call.worker_id, entered, asked, full_retry_s=full_retry_s)
    if refused is not None:
        raise refused
    _mark_entered(call, entered)
    grant = await _grant_awaited(call, queue, budgets, entered, woken, clock)
    admitted_at = clock.monotonic()
    waited_ms = int((admitted_at - call.draft.started_monotonic) * 1000)
    call.draft.admitted(grant.slot, waited_ms=waited_ms, out_of_order=grant.out_of_order)
    await _dispatch_if_scripts_could_not(
        call,
        queue,
        budgets.policy,
        grant,
        waited=entered.grant is None,
        message=message,
        clock=clock,
    )
    call.exec_deadline = admitted_at + budgets.exec_ms / 1000
    return await _result_awaited(call, queue, grant, budgets.policy, admitted_at, woken, clock)


def _entry_budget_ms(budgets: Budgets, clock: Clock) -> int | None:
    """What is left of the queue allowance as the call enters; None: it ran out more than
    LATE_ENTRY_MS ago. It counts from the request's start (contract §2.3), so time a loaded
    process spent before this point cannot let Redis grant the call later than allowed (§2.8:
    no wait past allowance + 1 s)."""
    # Rounded up, so the entry's deadline in Redis is never before the allowance's end.
    left_ms = math.ceil((budgets.queue_deadline - clock.monotonic()) * 1000)
    if left_ms < -LATE_ENTRY_MS:
        return None
    # At least 1 ms: a call that arrives just spent is still granted if its slot is free,
    # and else times out at once.
    return max(1, left_ms)


async def _durable_draft_saved(call: Call, queue: AsyncQueue, budgets: Budgets) -> None:
    # Whoever claims it first once the call ends writes its row from this draft
    # (admission/durable.py): this process, any process answering its status, or the
    # drainer's sweep when no API process is left to.
    await queue.row_draft_save(
        worker_id=call.worker_id,
        entry_id=call.entry_id,
        row=json.dumps(call.draft.row()),
        request=json.dumps(call.request),
        ttl_ms=budgets.life_ms + DURABLE_KEEP_MS,
        submitted_ms=int(call.draft.started * 1000),
    )


async def _entered(
    call: Call,
    queue: AsyncQueue,
    budgets: Budgets,
    target: Target,
    entry_budget_ms: int,
    expires: datetime,
    clock: Clock,
) -> tuple[Entered, float, tuple[str, str]]:
    """Enter the call: (what the queue said, when it was asked, the call's Celery message as
    (queue list key, envelope)). Refused only because the worker restarted since this
    process last looked, the call enters once more, signed for the new incarnation."""
    # A synchronous call's row draft goes in with it (the same script, no round trip of its
    # own): if this process dies, the drainer's sweep writes the row from it once the call
    # ends (admission/durable.py); if it lives, writing the row here removes it.
    row = "" if call.durable or not queue.dispatching else json.dumps(call.draft.row())
    while True:
        if row:
            call.draft.saved((call.worker_id, call.entry_id))
        message = _signed_message(call, target, budgets, expires)
        # From here until the queue answers, the call may be in it (and granted, so dispatched).
        call.maybe_queued = True
        asked = clock.monotonic()
        entered = await _enter_once(
            call, queue, budgets, target, entry_budget_ms, message[1], row, clock
        )
        call.maybe_queued = False
        if row and entered.status not in ("granted", "waiting"):
            call.draft.saved(None)  # refused at the door: its row's write has nothing to remove
        if entered.status != "refused":
            return entered, asked, message
        # Perhaps only this process's view of the worker was old: ask Postgres again.
        forget_cached_callers()
        fresh = await _restarted_target(call, target, entered.code)
        if fresh is None:
            return entered, asked, message
        # The call never entered, so it enters under the same entry id (its request id names
        # it). The refusal's own wake-up is taken first, or the next wait would read it.
        await queue.poll(worker_id=call.worker_id, entry_id=call.entry_id)
        target = fresh


def _signed_message(
    call: Call, target: Target, budgets: Budgets, expires: datetime
) -> tuple[str, str]:
    # Signed against the incarnation the offer was read with: a call entering under another
    # one is refused by the grant (WORKER_OFFLINE), and the worker drops it as stale.
    command_timeout = deadlines.command_timeout_ms(
        request=call.request, job_timeout_ms=budgets.policy.job_timeout_ms
    )
    assignment = _assignment(call, target.incarnation_id, budgets.exec_ms, command_timeout)
    return assignment_message(assignment, expires=expires)


async def _enter_once(
    call: Call,
    queue: AsyncQueue,
    budgets: Budgets,
    target: Target,
    entry_budget_ms: int,
    envelope: str,
    row: str,
    clock: Clock,
) -> Entered:
    return await queue.enter(
        worker_id=call.worker_id,
        entry_id=call.entry_id,
        key=isolation_key(call.request),
        queue_budget_ms=entry_budget_ms,
        exec_budget_ms=budgets.exec_ms,
        queue_limit=budgets.policy.worker_queue_limit,
        slot_ceiling=budgets.policy.max_lease_slots,
        operation=call.operation,
        workspace_id=str(call.request["workspaceId"]),
        needs=call_needs(call.request),
        envelope=envelope,
        durable=call.durable,
        incarnation=target.incarnation_id,
        key_id=call.caller.key_id,
        row=row,
        row_ttl_ms=budgets.life_ms + DURABLE_KEEP_MS,
        flow=call_flow(call),
        flow_share_percent=budgets.policy.flow_share_percent,
        now_ms=clock.scripts_ms(),
    )


def refusal_at_entry(
    worker_id: str, entered: Entered, asked: float, *, full_retry_s: int = 1
) -> refusals.Refusal | None:
    """The refusal for a call the queue did not take (None: granted or waiting). `asked`:
    when the enter was sent, on the service's monotonic clock; `full_retry_s`: a full queue's
    Retry-After (admission/backlog.py)."""
    if entered.status == "full":
        # Taken as full for a moment, during which the edge answers the caller's next calls to
        # this worker without asking the queue: a burst costs one queue script per moment, not
        # one per call.
        return refusals.queue_full(
            worker_id,
            entered.held,
            retry_after_s=full_retry_s,
            holds_until=asked + settings.SLUICE_FULL_QUEUE_HOLD_MS / 1000,
        )
    if entered.status == "offline":
        return refusals.worker_offline(worker_id)
    if entered.status != "refused":
        return None
    if entered.code == "WORKER_MISMATCH":
        return refusals.worker_mismatch(withdrawn_message(worker_id))
    if entered.code == "UNAUTHENTICATED":
        # Revoked a moment ago; this process's caller cache had not seen it yet.
        return refusals.key_revoked()
    return refusals.worker_offline(worker_id)


def _mark_entered(call: Call, entered: Entered) -> None:
    assert entered.ticket is not None  # granted or waiting: the script gave it one
    call.draft.entered(entered.ticket)
    call.entered.set()
    if call.hooks is not None:
        call.hooks.entered()
    if entered.grant is not None and entered.grant.dispatched:
        # From the grant on, the assignment may have reached the worker.
        call.dispatched = True


async def _grant_awaited(
    call: Call,
    queue: AsyncQueue,
    budgets: Budgets,
    entered: Entered,
    woken: asyncio.Event,
    clock: Clock,
) -> Grant:
    """The call's grant, given at entry or waited for. A waiter that goes away, or whose wait
    breaks on Redis, takes its entry out, so a grant nobody will use does not hold the key."""
    policy = budgets.policy
    # A durable call outlives this process: a shutdown leaves it queued.
    marked = (
        contextlib.nullcontext()
        if call.durable
        else shutdown.waiting(call.worker_id, call.entry_id)
    )
    try:
        with marked:
            if entered.grant is None and shutdown.stopping() and not call.durable:
                # Entered after the shutdown sweep: leave as the sweep would have made it.
                await _leave(call, queue, policy, clock, message=shutdown.MESSAGE)
            return entered.grant or await _wait_for_grant(
                call, queue, policy, budgets.queue_deadline, woken, clock
            )
    except asyncio.CancelledError:
        if call.durable:
            # Only this process's end cancels a durable call's watcher: the call stays queued.
            raise
        call.draft.went_away()
        await asyncio.shield(_leave_or_release(call, queue, policy, clock))
        raise
    except RedisError:
        await asyncio.shield(_leave_or_release(call, queue, policy, clock))
        raise


async def _dispatch_if_scripts_could_not(
    call: Call,
    queue: AsyncQueue,
    policy: Policy,
    grant: Grant,
    *,
    waited: bool,
    message: tuple[str, str],
    clock: Clock,
) -> None:
    """The API's part of "the grant is the dispatch" (admission/queue.py): where the grant
    script could not reach the broker (`grant.dispatched` false: admission on a Redis
    Cluster, whose broker is a Redis of its own), this process pushes the call's message.

    The script checks revoked keys before it dispatches; here a call that waited re-checks
    its key in Postgres, and one revoked meanwhile frees its slot and never runs."""
    if not grant.dispatched:
        if waited and not await in_db_thread(caller_key_valid, caller=call.caller):
            await asyncio.shield(_release(call, queue, policy, grant, clock))
            raise refusals.key_revoked()
        call.dispatched = True
        try:
            await async_broker().lpush(*message)
        except Exception:
            log.warning("dispatch failed; waiting out the exec deadline", exc_info=True)
    call.dispatched = True


async def _result_awaited(
    call: Call,
    queue: AsyncQueue,
    grant: Grant,
    policy: Policy,
    admitted_at: float,
    woken: asyncio.Event,
    clock: Clock,
) -> dict[str, Any]:
    assert call.exec_deadline is not None
    try:
        message = await _wait_for_result(
            call, queue, grant, call.exec_deadline, policy, woken, clock
        )
    except asyncio.CancelledError:
        call.draft.went_away()
        raise
    finally:
        call.draft.ran(int((clock.monotonic() - admitted_at) * 1000))
    return await settlement_answer(call, message)


async def _looked_up_again(call: Call) -> Target | None:
    """The call's worker as Postgres has it now, past this process's caller cache (whose
    second may not have seen a restart yet). Once per call: a second doubt is the answer."""
    refresh, call.refresh_target = call.refresh_target, None
    fresh = None if refresh is None else await refresh()
    if fresh is not None:
        call.target = fresh
    return fresh


async def _restarted_target(call: Call, old: Target, refused_code: str) -> Target | None:
    """The worker's new registration, when the queue refused the call only because the one it
    was signed for is gone (WORKER_OFFLINE at enter means exactly that)."""
    if refused_code != "WORKER_OFFLINE":
        return None
    fresh = await _looked_up_again(call)
    if fresh is None or fresh.incarnation_id == old.incarnation_id:
        return None
    return check_target(call, fresh)


async def _leave_or_release(call: Call, queue: AsyncQueue, policy: Policy, clock: Clock) -> None:
    """A waiter went away: take it out of the queue. Granted meanwhile, the call is running
    (its grant dispatched it) and is left alone, unless its envelope still waits for this
    process to push it: then the slot is freed and the call never runs."""
    try:
        status, grant = await _leave(call, queue, policy, clock, code="CLIENT_DISCONNECTED")
        if status == "running" and grant is not None and grant.dispatched:
            call.dispatched = True
        elif status == "running" and grant is not None:
            await _release(call, queue, policy, grant, clock)
    except RedisError:
        # Still in the queue, where any grant dispatches it: it may run.
        call.maybe_queued = True
        log.warning(
            "could not take a departed waiter out of the queue; it expires at its deadline",
            exc_info=True,
        )


async def _leave(
    call: Call,
    queue: AsyncQueue,
    policy: Policy,
    clock: Clock,
    *,
    code: str = "",
    message: dict[str, Any] | None = None,
) -> tuple[str, Grant | None]:
    return await queue.leave(
        worker_id=call.worker_id,
        entry_id=call.entry_id,
        slot_ceiling=policy.max_lease_slots,
        message=message,
        code=code,
        now_ms=clock.scripts_ms(),
    )


async def _release(
    call: Call, queue: AsyncQueue, policy: Policy, grant: Grant, clock: Clock
) -> bool:
    return await queue.release(
        worker_id=call.worker_id,
        entry_id=call.entry_id,
        ticket=grant.ticket,
        slot_ceiling=policy.max_lease_slots,
        now_ms=clock.scripts_ms(),
    )
