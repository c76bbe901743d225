"""Durable requests (contract §2.7): a call that outlives the HTTP request that submitted it.

`POST /v1/workspace-tools/requests` runs the same admission as execute and answers 202 as
soon as the call is in its worker's queue. From then on the call needs no API process: the
admission scripts grant it, push its assignment to the worker, and keep its status in Redis
(`adm:{w:<id>}:ds:<entry>`), and the worker's settlement writes the result there. The process
that accepted it keeps watching while it lives; any process answers `GET .../requests/<id>`.

Exactly one completion row: the draft saved at entry (`adm:{w:<id>}:row:<entry>`) is taken
atomically by whoever first sees the call end, the accepting process or a status lookup.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from django.http import HttpRequest
from drf_spectacular.utils import extend_schema
from redis.exceptions import RedisError
from rest_framework.request import Request
from rest_framework.response import Response
from sluice_protocol import (
    MUTATING_OPERATIONS,
    ProtocolError,
    validate_error_result,
    validate_request_id,
    validate_result,
)

from admission import deadlines, refusals
from admission.completion import CompletionDraft, completion_emit
from admission.connections import async_queue
from admission.dbthread import in_db_thread
from admission.queue import AsyncQueue, dispatch_in_redis
from admission.ratelimit import RateLimiter
from admission.refusals import Refusal
from admission.services import (
    DURABLE_KEEP_MS,
    Call,
    DurableExists,
    call_execute,
    quarantine_row,
    withdrawn_message,
    worker_signing_key,
)
from api.authentication import ApiUser, AsyncApiKeyAuthentication
from api.base import AsyncApiView
from api.errors import method_not_allowed, status_of
from api.schema.answers import (
    BY_REQUEST_ID_CODES,
    DURABLE_SUBMIT_CODES,
    EXECUTE_HEADERS,
    REQUEST_ID,
    operation,
)
from api.schema.components import Capabilities, DurableStatus, execute_request
from api.workspace_tools import WorkspaceToolsExecuteApi, WorkspaceToolsRequestCancelApi
from api.workspace_tools import _emit as emit_row
from workspaces.signing import unsigned, verify

log = logging.getLogger("sluice.admission")

# The accepting process's watchers, kept referenced until they end.
_watchers: set[asyncio.Task[Any]] = set()
# A settlement lands by its exec deadline; past this much more, a running call is over.
_SETTLE_GRACE_MS = 500
_NOT_FOUND = Refusal("REQUEST_NOT_FOUND", "No such request.")


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
    return refusals.assignment_expired()


async def _settled(
    worker_id: str, entry_id: str, payload: dict[str, Any], request: dict[str, Any]
) -> tuple[dict[str, Any] | None, Refusal | None, bool]:
    """(result, refusal, quarantine) from a settlement, checked as execute checks it."""
    key = await in_db_thread(worker_signing_key, worker_id=worker_id)
    body = unsigned(payload)
    if key is None or not verify(
        key, "settlement", {"entry": entry_id, "payload": body}, payload.get("sig")
    ):
        return None, refusals.result_invalid("settlement"), False
    if payload.get("ok") is True:
        try:
            validate_result(request, payload.get("result"))
        except ProtocolError:
            return None, refusals.result_invalid("result"), False
        return dict(payload["result"]), None, False
    try:
        _status, code, text = validate_error_result(payload.get("error"))
    except ProtocolError:
        return None, refusals.result_invalid("error answer"), False
    quarantine = payload.get("quarantine") is True and request.get("operation") in (
        MUTATING_OPERATIONS
    )
    return None, refusals.worker_refused(code, text), quarantine


async def durable_status(
    queue: AsyncQueue, *, request_id: str, worker_id: str, entry_id: str
) -> dict[str, Any] | None:
    """The §2.7 status of a durable call (None: gone), writing its row if it just ended."""
    status = await queue.durable_status(worker_id=worker_id, entry_id=entry_id)
    if status is None:
        return None
    now = await queue.redis_now_ms()
    state = str(status["state"])
    # Past its deadline nothing can grant or settle it any more (the scripts check by this
    # same clock), even when no script has run since to write so.
    if state == "queued" and int(status["dl"]) <= now:
        state, status["code"] = "failed", "WORKSPACE_QUEUE_TIMEOUT"
    elif state == "admitted" and int(status["dl"]) + _SETTLE_GRACE_MS <= now:
        state, status["code"] = "failed", "ASSIGNMENT_EXPIRED"
    answer: dict[str, Any] = {"requestId": request_id, "state": state}
    if state in ("queued", "admitted"):
        return answer
    draft_raw = await queue.row_draft_take(
        worker_id=worker_id, entry_id=entry_id, ttl_ms=DURABLE_KEEP_MS
    )
    saved = json.loads(draft_raw) if draft_raw is not None else None
    refusal: Refusal | None = None
    quarantine = False
    if state == "settled":
        request = await queue.row_request(worker_id=worker_id, entry_id=entry_id)
        result, refusal, quarantine = await _settled(
            worker_id, entry_id, json.loads(status["payload"]), request or {}
        )
        if result is not None:
            answer.update(state="completed", result=result)
    elif state == "failed":
        refusal = _failure(str(status.get("code")), worker_id)
    elif state == "cancelled":
        refusal = refusals.request_cancelled()
    if refusal is not None and state != "cancelled":
        answer.update(state="failed", error={"code": refusal.code, "message": refusal.message})
    if saved is not None:
        await _write_row(saved, status, refusal, quarantine, now, queue)
    return answer


async def _write_row(
    saved: dict[str, Any],
    status: dict[str, Any],
    refusal: Refusal | None,
    quarantine: bool,
    now: int,
    queue: AsyncQueue,
) -> None:
    row = saved
    ended = int(status.get("te") or now)
    admitted = status.get("ta")
    draft = CompletionDraft(**{k: v for k, v in row.items() if k != "started"})
    draft.started = float(row["started"])
    draft.fencing_ticket = int(status["seq"])
    if admitted is not None:
        draft.admission_outcome = "admitted"
        draft.slot_index = int(status["slot"])
        draft.queue_wait_ms = int(admitted) - int(status["t0"])
        draft.exec_ms = ended - int(admitted)
    if refusal is not None and refusal.admission_outcome is not None:
        draft.admission_outcome = refusal.admission_outcome
    if status["state"] == "cancelled":
        draft.outcome = "cancelled"
    draft.http_status = 200 if refusal is None else status_of(refusal)
    draft.code = "" if refusal is None else refusal.code
    draft.duration_ms = max(0, ended - int(status["t0"]))
    if quarantine and refusal is not None:
        await in_db_thread(quarantine_row, row=row, reason=refusal.message)
    await completion_emit(draft, queue.client)


class CapabilitiesApi(AsyncApiView):
    """`GET /v1/workspace-tools/capabilities`: durable requests are offered only where the
    scripts dispatch by themselves (admission.queue.dispatch_in_redis)."""

    authentication_classes = [AsyncApiKeyAuthentication]

    http_method_names = ["get"]

    async def prepare(self, request: Request) -> None:
        if request.method != "GET":
            raise method_not_allowed("GET")

    @extend_schema(
        **operation("workspaceToolCapabilities", ok=(200, Capabilities), codes=["UNAUTHENTICATED"])
    )
    async def get(self, request: Request) -> Response:
        return Response({"durableWorkspaceRequests": 1 if dispatch_in_redis() else 0})


class DurableSubmitApi(WorkspaceToolsExecuteApi):
    """`POST /v1/workspace-tools/requests`: execute's admission, answered 202 once queued."""

    @extend_schema(
        **operation(
            "submitDurableRequest",
            request=execute_request(),
            ok=(202, DurableStatus),
            parameters=EXECUTE_HEADERS,
            codes=DURABLE_SUBMIT_CODES,
            budget=True,
        )
    )
    async def post(self, request: Request) -> Response:
        caller = self.checked_caller(request)
        assert self.resolved is not None and self.parsed is not None
        if self.parsed.request_id is None:
            raise Refusal(
                "INVALID_REQUEST_ID", "X-LibreChat-Workspace-Request-Id is required here."
            )
        if not dispatch_in_redis():
            raise Refusal("NOT_FOUND", "Durable requests are not offered here.")
        if self.resolved.worker_id is None:
            raise refusals.no_worker_selected()
        self.draft.worker_id = self.resolved.worker_id
        self.call = call = Call(
            caller=caller,
            request=self.parsed.body,
            worker_id=self.resolved.worker_id,
            queue_wait_header_ms=self.parsed.queue_wait_ms,
            request_id=self.parsed.request_id,
            draft=self.draft,
            target=self.resolved.target,
            durable=True,
        )
        task = asyncio.get_running_loop().create_task(
            _watch(call, self.queue, RateLimiter(self.queue.client, prefix=self.queue.prefix))
        )
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
                    self.queue,
                    request_id=call.request_id or "",
                    worker_id=exists.worker_id,
                    entry_id=exists.entry_id,
                )
                if status is None:
                    raise _NOT_FOUND from None
                # A repeat creates nothing, not even a row.
                return Response(status, status=202)
        # Queued: from here the call's row is written when it ends (see _watch).
        state = "admitted" if call.draft.slot_index is not None else "queued"
        return Response(
            {"requestId": call.request_id, "state": state},
            status=202,
            headers=call.response_headers,
        )

    async def async_dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        try:
            return await AsyncApiView.async_dispatch(self, request, *args, **kwargs)
        except asyncio.CancelledError:
            if self.call is None:
                # Gone before anything was queued: the row says so, as for execute.
                self.draft.outcome = "disconnected"
                self.draft.finish(499, "CLIENT_DISCONNECTED")
                emit_row(self.draft, self.queue)
            # Otherwise the call carries on (its watcher task is not this request's) and
            # writes its own row; the client finds it under its request id.
            raise


async def _watch(call: Call, queue: AsyncQueue, limiter: RateLimiter) -> None:
    """Run the call in this process while it lives. Refused before its entry, the refusal is
    the POST's answer (and row); after it, the call's end writes the row via its status."""
    try:
        await call_execute(call, queue=queue, limiter=limiter)
    except DurableExists:
        raise
    except Exception:
        if not call.entered.is_set():
            raise
    if not call.entered.is_set():
        return
    try:
        await durable_status(
            queue, request_id=call.request_id or "", worker_id=call.worker_id,
            entry_id=call.entry_id,
        )  # fmt: skip
    except RedisError:
        log.warning("durable call ended; its row waits for a status lookup", exc_info=True)


class DurableRequestApi(WorkspaceToolsRequestCancelApi):
    """`GET` (status, §2.7) and `DELETE` (cancel, §2.6) of `/v1/workspace-tools/requests/<id>`,
    same principal only: an unknown id and another principal's answer the same 404."""

    http_method_names = ["get", "delete"]

    async def prepare(self, request: Request) -> None:
        if request.method not in ("GET", "DELETE"):
            raise method_not_allowed("GET, DELETE")

    @extend_schema(
        **operation(
            "durableRequestStatus",
            ok=(200, DurableStatus),
            parameters=[REQUEST_ID],
            codes=BY_REQUEST_ID_CODES,
        )
    )
    async def get(self, request: Request, request_id: str) -> Response:
        user = request.user
        assert isinstance(user, ApiUser)
        try:
            validate_request_id(request_id)
        except ProtocolError:
            raise _NOT_FOUND from None
        queue = async_queue()
        try:
            bound = await queue.request_binding(scope=user.caller.scope, request_id=request_id)
            status = None
            if bound is not None and bound[2]:
                status = await durable_status(
                    queue, request_id=request_id, worker_id=bound[0], entry_id=bound[1]
                )
        except RedisError:
            raise refusals.admission_unavailable() from None
        if status is None:
            raise _NOT_FOUND
        return Response(status)
