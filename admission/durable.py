"""Durable requests (contract §2.7): a call that outlives the HTTP request that submitted it.

A durable call runs the same admission as execute (admission.services.call_execute) and the
submission is answered as soon as the call is in its worker's queue. From then on the call
needs no API process: the admission scripts grant it, push its assignment to the worker and
keep its status in Redis (`adm:{w:<id>}:ds:<entry>`), and the worker's settlement writes the
result there. The process that accepted it watches it while it lives; any process answers
its status.

Exactly one completion row, whoever is left: the row's draft is saved before the call enters
its queue (`adm:{w:<id>}:row:<entry>`, listed in the index `adm:durable`), and once the call
has ended the row is written by whoever claims the draft first (`AsyncQueue.row_claim`: one
MULTI of SET NX on a claim key and GET of the draft): the accepting process, a process
answering a status lookup, or the sweep the completion drainer runs every second
(`DurableSweeper`), which is what writes it when the accepting process died and nobody asks.
Whoever writes then marks the draft "done", so no later claim writes again. A writer that
dies between its claim and "done" leaves the claim to lapse (CLAIM_LEASE_MS) and the next
claimant writes the row again with the same uid, which Postgres keeps once (completion rows
are unique by uid); only that writer's /metrics counters may then count the call twice.

A synchronous call whose process dies is swept the same way: its draft and a status entered
the queue with it (AsyncQueue.enter), its process removes them when it writes the row, and the
sweep writes the row of one still there SYNC_ROW_GRACE_MS after the call ended (outcome
"disconnected": the answer reached nobody).

The row says what the call did, from the draft (who, what, budgets) and the final status
(ticket, slot, queue wait, execution, outcome). HTTP statuses belong to the API edge: every
writer is handed the edge's table (`status_of`), so the row records the status the
synchronous endpoint would have answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError
from sluice_protocol import (
    MUTATING_OPERATIONS,
    ProtocolError,
    validate_error_result,
    validate_result,
)

from admission import deadlines, refusals
from admission.completion import CompletionDraft, emit_row
from admission.dbthread import in_db_thread
from admission.models import Quarantine
from admission.queue import OPERATOR, AsyncQueue
from admission.ratelimit import RateLimiter
from admission.refusals import Refusal
from admission.services import (
    DURABLE_KEEP_MS,
    Call,
    DurableExists,
    call_execute,
    withdrawn_message,
)
from workspaces import outages
from workspaces.models import Worker
from workspaces.signing import signing_key, unsigned, verify

log = logging.getLogger("sluice.admission")

StatusOf = Callable[[Refusal], int]

# A settlement lands by its exec deadline; past this much more, a running call is over.
SETTLE_GRACE_MS = 500
# A claim to write a row lapses after this long (its writer died before marking it done).
CLAIM_LEASE_MS = 30_000
# The drainer sweeps for durable calls that ended without a row this often.
SWEEP_PERIOD_S = 1.0
# A synchronous call's process writes its row as soon as it answers, and its answer follows
# the call's end at once: a draft still there this long after the end lost its process.
SYNC_ROW_GRACE_MS = 15_000
# A draft whose call never showed a status this long past its budgets never entered its queue
# (its process died between saving the draft and entering): it owes no row.
NEVER_ENTERED_GRACE_MS = 60_000
# Codes the synchronous endpoint answers that LibreChat's durable client does not know (it
# would report each as a final 422 WORKSPACE_TOOL_REJECTED): a `failed` status says the same
# in codes it maps. Both mean "not started"; the row keeps the synchronous code and status.
STATUS_CODES = {
    # 503: the service stopped before the call's grant; sent again, it may run.
    "SERVICE_SHUTTING_DOWN": "WORKER_OFFLINE",
    # 403: the call's key was revoked while it waited; reported, never retried.
    "UNAUTHENTICATED": "WORKER_UNAUTHORIZED",
}
_SWEEP_CHUNK = 500
_SWEEP_MAX_CHUNKS = 20

# The accepting process's watchers, kept referenced until they end.
_watchers: set[asyncio.Task[Any]] = set()


def request_not_found() -> Refusal:
    return Refusal("REQUEST_NOT_FOUND", "No such request.")


@dataclass
class Ending:
    """What a durable call's status says: the §2.7 answer, and for an ended call the refusal
    it ended with (None: completed), whether it quarantines its key, and when it ended."""

    answer: dict[str, Any]
    live: bool
    refusal: Refusal | None = None
    quarantine: bool = False
    ended_ms: int = 0


def _failure(code: str, worker_id: str) -> Refusal:
    """The refusal the synchronous endpoint answers for a code the scripts wrote."""
    if code == "WORKSPACE_QUEUE_TIMEOUT":
        return refusals.queue_timeout(deadlines.QUEUE_TIMEOUT_RETRY_AFTER_S)
    if code == "WORKER_MISMATCH":
        return refusals.worker_mismatch(withdrawn_message(worker_id))
    if code == "WORKER_OFFLINE":
        return refusals.worker_offline(worker_id)
    if code == "REQUEST_CANCELLED":
        return refusals.request_cancelled()
    if code == "UNAUTHENTICATED":
        # Its key was revoked while it waited (the grant refused it; not started).
        return refusals.key_revoked()
    if code == "WORKER_QUEUE_FULL":
        # Its flow's share was taken back while it waited (another flow arrived).
        return refusals.flow_share_taken(worker_id)
    if code == "SERVICE_SHUTTING_DOWN":
        return refusals.shutting_down(waited=True)
    return refusals.assignment_expired()


def worker_signing_key(worker_id: str) -> bytes | None:
    """The key a worker signs its settlements with (its token's hash), for a durable status."""
    token_hash = Worker.objects.filter(worker_id=worker_id).values_list("token_hash", flat=True)
    found = token_hash.first()
    return signing_key(found) if found else None


def quarantine_row(*, row: dict[str, Any], reason: str) -> None:
    """Quarantine a durable call's key from its completion row draft (no Call object left)."""
    Quarantine.objects.create(
        worker_id=row["worker_id"],
        workspace_id=row["workspace_id"],
        worktree=row["worktree"],
        isolation_key_hash=row["isolation_key_hash"],
        operation=row["operation"],
        reason=reason[:512],
        request_id=row["request_id"],
    )


async def _settled(
    worker_id: str,
    entry_id: str,
    payload: dict[str, Any],
    request: dict[str, Any] | None,
    operation: str,
) -> tuple[dict[str, Any] | None, Refusal | None, bool]:
    """(result, refusal, quarantine) from a settlement, checked as execute checks it (the
    result against `request`; None: a synchronous call's, whose request is not kept and whose
    result reaches nobody)."""
    key = await in_db_thread(worker_signing_key, worker_id=worker_id)
    body = unsigned(payload)
    if key is None or not verify(
        key, "settlement", {"entry": entry_id, "payload": body}, payload.get("sig")
    ):
        return None, refusals.result_invalid("settlement"), False
    if payload.get("ok") is True:
        try:
            if request is not None:
                validate_result(request, payload.get("result"))
            return dict(payload["result"]), None, False
        except (ProtocolError, TypeError, ValueError):
            return None, refusals.result_invalid("result"), False
    try:
        _status, code, text = validate_error_result(payload.get("error"))
    except ProtocolError:
        return None, refusals.result_invalid("error answer"), False
    quarantine = payload.get("quarantine") is True and operation in MUTATING_OPERATIONS
    return None, refusals.worker_refused(code, text), quarantine


async def _settlement_read(
    queue: AsyncQueue,
    worker_id: str,
    entry_id: str,
    status: dict[str, Any],
    draft_operation: str,
) -> tuple[dict[str, Any] | None, Refusal | None, bool]:
    """(result, refusal, quarantine) of a settled call. A durable call's settlement is in its
    status and checked against its saved request; a synchronous call's (rw) is read from its
    wake list while that lasts, and its result, which reached nobody, is not kept."""
    if status.get("rw") != 1:
        request = await queue.row_request(worker_id=worker_id, entry_id=entry_id) or {}
        payload = json.loads(status["payload"])
        return await _settled(
            worker_id, entry_id, payload, request, str(request.get("operation", ""))
        )
    payload = await queue.settlement_of(worker_id=worker_id, entry_id=entry_id)
    if payload is None:
        message = "The worker settled the call, but its answer was no longer kept; it may have run."
        return None, refusals.assignment_expired(message), False
    _result, refusal, quarantine = await _settled(
        worker_id, entry_id, payload, None, draft_operation
    )
    return None, refusal, quarantine


async def durable_ending(
    queue: AsyncQueue,
    *,
    request_id: str,
    worker_id: str,
    entry_id: str,
    status: dict[str, Any],
    now_ms: int,
    draft_operation: str = "",
) -> Ending:
    """Read a status (Redis clock `now_ms`) as the §2.7 answer and, once ended, its ending.
    A synchronous call's status (rw) has no payload: its settlement is read from its wake list
    while that lasts, and its operation from its draft (`draft_operation`)."""
    state = str(status["state"])
    deadline = int(status["dl"])
    # Past its deadline nothing can grant or settle it any more (the scripts check by this
    # same clock), even when no script has run since to write so.
    if state == "queued" and deadline <= now_ms:
        state, status["code"] = "failed", "WORKSPACE_QUEUE_TIMEOUT"
    elif state == "admitted" and deadline + SETTLE_GRACE_MS <= now_ms:
        state, status["code"] = "failed", "ASSIGNMENT_EXPIRED"
    answer: dict[str, Any] = {"requestId": request_id, "state": state}
    if state in ("queued", "admitted"):
        return Ending(answer, live=True)
    refusal: Refusal | None = None
    quarantine = False
    if state == "settled":
        result, refusal, quarantine = await _settlement_read(
            queue, worker_id, entry_id, status, draft_operation
        )
        if result is not None:
            answer.update(state="completed", result=result)
    elif state == "failed":
        refusal = _failure(str(status.get("code")), worker_id)
    elif state == "cancelled":
        refusal = refusals.request_cancelled(by_operator=status.get("by") == OPERATOR)
    if refusal is not None and state != "cancelled":
        code = STATUS_CODES.get(refusal.code, refusal.code)
        answer.update(state="failed", error={"code": code, "message": refusal.message})
    # A settlement says when; any other ending happened by the call's deadline at the latest
    # (the scripts record no time for it), and by the moment it was seen.
    ended = int(status["te"]) if status.get("te") else min(now_ms, deadline)
    return Ending(answer, live=False, refusal=refusal, quarantine=quarantine, ended_ms=ended)


def completion_row(
    saved: dict[str, Any], status: dict[str, Any], ending: Ending, status_of: StatusOf
) -> CompletionDraft:
    """The call's one completion row: the saved draft, completed with the status's facts. A
    synchronous call's (rw) row is written only when its process died: its answer, the one the
    endpoint would have given, reached nobody."""
    refusal = ending.refusal
    admitted = status.get("ta")
    draft = CompletionDraft.restored(saved)
    draft.entered(int(status["seq"]))
    if admitted is not None:
        draft.admitted(
            int(status["slot"]),
            waited_ms=int(admitted) - int(status["t0"]),
            out_of_order=status.get("oo") == 1,
        )
        draft.ran(max(0, ending.ended_ms - int(admitted)))
    draft.answered(
        200 if refusal is None else status_of(refusal),
        refusal,
        duration_ms=max(0, ending.ended_ms - int(status["t0"])),
    )
    if status.get("rw") == 1:
        draft.unanswered()
    return draft


async def row_write_once(
    queue: AsyncQueue,
    *,
    worker_id: str,
    entry_id: str,
    status: dict[str, Any],
    ending: Ending,
    status_of: StatusOf,
    lease_ms: int = CLAIM_LEASE_MS,
) -> str:
    """Write an ended call's row if this caller wins the claim: "written", or "done" (someone
    wrote it) or "busy" (someone is writing it now)."""
    state, raw = await queue.row_claim(
        worker_id=worker_id, entry_id=entry_id, token=uuid.uuid4().hex, lease_ms=lease_ms
    )
    if raw is None:
        return state
    saved = json.loads(raw)
    row = completion_row(saved, status, ending, status_of)
    if ending.quarantine and ending.refusal is not None:
        await in_db_thread(quarantine_row, row=saved, reason=ending.refusal.message)
    await emit_row(row, queue.client, wait=True)
    # A synchronous call's "done" only has to outlive a claim that could still be under way.
    keep_ms = lease_ms if status.get("rw") == 1 else DURABLE_KEEP_MS
    await queue.row_done(worker_id=worker_id, entry_id=entry_id, ttl_ms=keep_ms)
    return "written"


async def durable_status(
    queue: AsyncQueue,
    *,
    request_id: str,
    worker_id: str,
    entry_id: str,
    status_of: StatusOf,
    now_ms: int | None = None,
) -> dict[str, Any] | None:
    """The §2.7 status of a durable call (None: gone), writing its row if nobody has yet."""
    status = await queue.durable_status(worker_id=worker_id, entry_id=entry_id)
    if status is None:
        return None
    now = now_ms if now_ms is not None else await queue.redis_now_ms()
    ending = await durable_ending(
        queue,
        request_id=request_id,
        worker_id=worker_id,
        entry_id=entry_id,
        status=status,
        now_ms=now,
    )
    if not ending.live:
        await row_write_once(
            queue,
            worker_id=worker_id,
            entry_id=entry_id,
            status=status,
            ending=ending,
            status_of=status_of,
        )
    return ending.answer


async def durable_submit(call: Call, *, queue: AsyncQueue, status_of: StatusOf) -> dict[str, Any]:
    """Submit a durable call: its status once it is in its queue (the 202), or, for a request
    id this principal's earlier durable call holds, that call's status (a repeat creates
    nothing, not even a row). Raises the Refusal of a call refused before its queue."""
    limiter = RateLimiter(queue.client, prefix=queue.prefix)
    task = asyncio.get_running_loop().create_task(_watch(call, queue, limiter, status_of))
    _watchers.add(task)
    task.add_done_callback(_watchers.discard)
    entered = asyncio.ensure_future(call.entered.wait())
    await asyncio.wait({task, entered}, return_when=asyncio.FIRST_COMPLETED)
    entered.cancel()
    if not call.entered.is_set():
        try:
            task.result()
        except DurableExists as exists:
            status = await durable_status(
                queue,
                request_id=call.request_id or "",
                worker_id=exists.worker_id,
                entry_id=exists.entry_id,
                status_of=status_of,
            )
            if status is None:
                raise request_not_found() from None
            return status
    state = "admitted" if call.draft.slot_index is not None else "queued"
    return {"requestId": call.request_id, "state": state}


async def _watch(call: Call, queue: AsyncQueue, limiter: RateLimiter, status_of: StatusOf) -> None:
    """Run the call in this process while it lives. Refused before its queue, the refusal is
    the submission's answer (and row); after it, the call's end writes the row."""
    try:
        await call_execute(call, queue=queue, limiter=limiter)
    except DurableExists:
        raise
    except Exception:
        if not call.entered.is_set():
            # Refused at its queue's door: the submission's own row tells, the draft goes.
            with contextlib.suppress(RedisError):
                await queue.row_forget(worker_id=call.worker_id, entry_id=call.entry_id)
            raise
    if not call.entered.is_set():
        return
    try:
        await durable_status(
            queue,
            request_id=call.request_id or "",
            worker_id=call.worker_id,
            entry_id=call.entry_id,
            status_of=status_of,
        )
    except RedisError as exc:
        outages.warn(log, "durable call ended; its row is left to the drainer's sweep", exc)


class DurableSweeper:
    """Writes the row of every durable call that ended without one (its accepting process
    died and nobody asked for its status), by the same claim as every other writer."""

    def __init__(
        self, queue: AsyncQueue, *, status_of: StatusOf, lease_ms: int = CLAIM_LEASE_MS
    ) -> None:
        self.queue, self.status_of, self.lease_ms = queue, status_of, lease_ms

    async def sweep_once(self, *, now_ms: int | None = None, wall_ms: int | None = None) -> int:
        """One pass over the index (oldest first); returns how many rows it wrote. `now_ms` is
        the Redis clock the statuses use, `wall_ms` the clock drafts were stamped with."""
        written = 0
        now = now_ms
        for chunk in range(_SWEEP_MAX_CHUNKS):
            owed = await self.queue.rows_owed(start=chunk * _SWEEP_CHUNK, limit=_SWEEP_CHUNK)
            if now is None and owed:
                now = await self.queue.redis_now_ms()
            for worker_id, entry_id, raw_status, raw_row in owed:
                assert now is not None
                try:
                    written += await self._one(
                        worker_id, entry_id, raw_status, raw_row, now, wall_ms
                    )
                except (ValueError, KeyError, TypeError):
                    # Not a draft or a status these modules wrote: nothing to write a row from.
                    log.warning("malformed durable call dropped", extra={"entry_id": entry_id})
                    await self.queue.row_unlist(worker_id=worker_id, entry_id=entry_id)
            if len(owed) < _SWEEP_CHUNK:
                break
        return written

    async def _one(
        self,
        worker_id: str,
        entry_id: str,
        raw_status: str | None,
        raw_row: str | None,
        now_ms: int,
        wall_ms: int | None,
    ) -> int:
        if raw_row is None or raw_row == "done":
            await self.queue.row_unlist(worker_id=worker_id, entry_id=entry_id)
            return 0
        if raw_status is None:
            saved = json.loads(raw_row)
            wall = wall_ms if wall_ms is not None else int(time.time() * 1000)
            budget_ms = int(saved["deadline_budget_ms"]) + NEVER_ENTERED_GRACE_MS
            if wall > float(saved["started"]) * 1000 + budget_ms:
                await self.queue.row_forget(worker_id=worker_id, entry_id=entry_id)
            return 0
        status = json.loads(raw_status)
        synchronous = status.get("rw") == 1
        if synchronous and not self._over(status, now_ms):
            return 0
        ending = await durable_ending(
            self.queue,
            request_id="",
            worker_id=worker_id,
            entry_id=entry_id,
            status=status,
            now_ms=now_ms,
            draft_operation=str(json.loads(raw_row).get("operation", "")),
        )
        if ending.live or (synchronous and now_ms < ending.ended_ms + SYNC_ROW_GRACE_MS):
            return 0
        wrote = await row_write_once(
            self.queue,
            worker_id=worker_id,
            entry_id=entry_id,
            status=status,
            ending=ending,
            status_of=self.status_of,
            lease_ms=self.lease_ms,
        )
        return 1 if wrote == "written" else 0

    @staticmethod
    def _over(status: dict[str, Any], now_ms: int) -> bool:
        """Whether a synchronous call may have ended SYNC_ROW_GRACE_MS ago: settled that long
        ago, or its deadline (with the settlement's grace) that far behind. Most calls a sweep
        finds are alive and well, and cost it nothing more than this look."""
        if status.get("te"):
            return now_ms >= int(status["te"]) + SYNC_ROW_GRACE_MS
        # Otherwise the scripts record no time: its deadline bounds when it ended (a running
        # call's settlement may come a little past it).
        grace_ms = SETTLE_GRACE_MS if status["state"] == "admitted" else 0
        return now_ms >= int(status["dl"]) + grace_ms + SYNC_ROW_GRACE_MS


class SweeperThread(threading.Thread):
    """Runs a DurableSweeper every `period_s` on an event loop of its own (the drainer's
    process is synchronous), until stopped. A pass that fails (Redis or Postgres away) is
    logged and the next one tries again: nothing is claimed that is not written or lapses."""

    def __init__(self, *, status_of: StatusOf, period_s: float = SWEEP_PERIOD_S) -> None:
        super().__init__(name="durable-sweeper", daemon=True)
        self.status_of, self.period_s = status_of, period_s
        self.stopping = threading.Event()

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        from admission.connections import async_client

        client = async_client(decode_responses=True, socket_connect_timeout=2)
        sweeper = DurableSweeper(
            AsyncQueue(client, settings.REDIS_KEY_PREFIX), status_of=self.status_of
        )
        try:
            while not self.stopping.is_set():
                try:
                    await sweeper.sweep_once()
                except Exception as exc:
                    outages.warn(log, "durable sweep failed; the next one tries again", exc)
                await asyncio.sleep(self.period_s)
        finally:
            await client.aclose()

    def stop(self) -> None:
        self.stopping.set()
