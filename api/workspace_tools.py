"""The workspace endpoint (async: a waiting call costs a coroutine, not a thread) and cancel."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, InterfaceError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt
from redis.exceptions import RedisError
from sluice_protocol import (
    OPERATIONS,
    ProtocolError,
    parse_queue_wait_header,
    validate_request,
    validate_request_id,
    validate_worker_id,
)

from admission import shutdown
from admission.completion import CompletionDraft, completion_emit
from admission.connections import async_queue
from admission.dbthread import in_db_thread
from admission.errors import ApiError, unauthenticated
from admission.policy import acurrent_policy
from admission.queue import AsyncQueue
from admission.ratelimit import RateLimiter
from admission.selectors import call_resolve
from admission.services import Call, call_execute, isolation_key_hash
from workspaces.access import Caller, caller_for_api_key
from workspaces.auth import bearer_token

log = logging.getLogger("sluice.admission")

# A row whose response was never closed is written after this long.
EMIT_FALLBACK_S = 1.0
_pending: set[_Emission] = set()
_background: set[asyncio.Task[Any]] = set()
# On a refusal, the body is looked at for the row's workspace and operation only up to this size.
_FILL_BODY_MAX_BYTES = 64 * 1024
_WORKSPACE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # the contract's workspaceId


async def authenticate(request: HttpRequest) -> Caller:
    token = bearer_token(request.headers.get("Authorization"))
    caller = await in_db_thread(caller_for_api_key, raw_key=token) if token else None
    if caller is None:
        raise unauthenticated()
    return caller


def _json_body(request: HttpRequest) -> Any:
    content_type = request.content_type or ""
    if content_type != "application/json":
        raise ApiError(415, "UNSUPPORTED_MEDIA_TYPE", "The body must be application/json.")
    try:
        raw = request.body
    except RequestDataTooBig:
        raise ApiError(413, "REQUEST_TOO_LARGE", "The request body is too large.") from None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        # RecursionError: JSON nested past Python's limit is not a request either.
        raise ApiError(400, "INVALID_REQUEST", "The body is not valid JSON.") from None


def _declared_too_large(request: HttpRequest) -> bool:
    try:
        return (
            int(request.headers.get("Content-Length") or 0) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        )
    except ValueError:
        return False


def _parse(
    request: HttpRequest, draft: CompletionDraft
) -> tuple[dict[str, Any], str | None, int, str | None]:
    """Headers and body, validated before anything is queued."""
    try:
        raw_worker = request.headers.get("X-LibreChat-Code-Worker-ID")
        worker_id = validate_worker_id(raw_worker) if raw_worker is not None else None
        queue_wait_ms = parse_queue_wait_header(
            request.headers.get("X-LibreChat-Workspace-Queue-Wait-Ms")
        )
        raw_request_id = request.headers.get("X-LibreChat-Workspace-Request-Id")
        request_id = validate_request_id(raw_request_id) if raw_request_id is not None else None
        draft.request_id = request_id or ""
        body = validate_request(_json_body(request))
    except ProtocolError as exc:
        raise ApiError(400, exc.code, exc.message) from None
    draft.operation = str(body["operation"])
    draft.workspace_id = str(body["workspaceId"])
    draft.worktree = str(body.get("worktree") or "")
    return body, worker_id, queue_wait_ms, request_id


def _fill_known(request: HttpRequest, draft: CompletionDraft) -> None:
    """On a refusal, name what the request carried (request id, worker, workspace, operation)
    when it is well-formed, so its completion row says what was refused. Only values that
    match the protocol's own patterns are kept: never content, command text or a path."""
    headers = request.headers
    for attr, header, check in (
        ("request_id", "X-LibreChat-Workspace-Request-Id", validate_request_id),
        ("worker_id", "X-LibreChat-Code-Worker-ID", validate_worker_id),
    ):
        if not getattr(draft, attr) and headers.get(header):
            with contextlib.suppress(ProtocolError):
                setattr(draft, attr, check(headers[header]))
    if (
        draft.operation
        or request.content_type != "application/json"
        or _declared_too_large(request)
    ):
        return
    try:
        raw = request.body
        body = json.loads(raw) if len(raw) <= _FILL_BODY_MAX_BYTES else None
    except (ValueError, UnicodeDecodeError, RecursionError, RequestDataTooBig):
        return
    if not isinstance(body, dict):
        return
    if isinstance(body.get("operation"), str) and body["operation"] in OPERATIONS:
        draft.operation = str(body["operation"])
    workspace, worktree = body.get("workspaceId"), body.get("worktree")
    if isinstance(workspace, str) and _WORKSPACE_ID_RE.fullmatch(workspace):
        draft.workspace_id = workspace
        # Lane names follow the worker-id pattern.
        with contextlib.suppress(ProtocolError):
            draft.worktree = validate_worker_id(worktree) if isinstance(worktree, str) else ""


def _database_unavailable(draft: CompletionDraft) -> ApiError:
    # Postgres is away (authentication, worker lookups, the policy row): a typed, retryable
    # answer instead of Django's HTML 500. The row still reaches the Redis stream and lands
    # once Postgres is back. Only a call that was never dispatched may say "not started".
    log.warning("database unavailable on the execute path", exc_info=True)
    started = (
        "the operation was not started" if draft.exec_ms is None else "the operation may have run"
    )
    return ApiError(
        503,
        "DATABASE_UNAVAILABLE",
        f"The service's database is unavailable; {started}.",
        headers={"Retry-After": "5"},
    )


def _with_budget_headers(response: HttpResponse, call: Call | None) -> HttpResponse:
    """A call that passed the rate limit carries its budget headers whatever its answer."""
    for name, value in (call.response_headers if call is not None else {}).items():
        response.setdefault(name, value)
    return response


@csrf_exempt
async def execute(request: HttpRequest) -> HttpResponse:
    draft = CompletionDraft()
    queue = async_queue()
    loop = asyncio.get_running_loop()
    try:
        response = await _answer(request, draft, queue)
    except BaseException:
        # Cancelled: the client went away. The row says so (`_answer` filled it in).
        _emit(draft, queue)
        raise
    # The row is written once the handler has sent the response and closes it, so its round
    # trip to Redis does not hold the answer up. A response that is never closed (its client
    # went away at the last moment, after the view returned) still gets its row, later.
    emit = _Emission(draft, queue)
    closers = response._resource_closers  # type: ignore[attr-defined]
    closers.append(lambda: loop.call_soon_threadsafe(emit))
    loop.call_later(EMIT_FALLBACK_S, emit)
    return response


class _Emission:
    """Writes one call's row the first time it is called; later calls do nothing."""

    def __init__(self, draft: CompletionDraft, queue: AsyncQueue) -> None:
        self.draft, self.queue = draft, queue
        _pending.add(self)

    def __call__(self) -> None:
        if self in _pending:
            _pending.discard(self)
            _emit(self.draft, self.queue)


def execute_abandoned(request: HttpRequest) -> None:
    """A POST whose client went away before its body was even read still gets its row."""
    try:
        is_execute = resolve(request.path_info).func is execute
    except Resolver404:
        return
    if request.method != "POST" or not is_execute:
        return
    draft = CompletionDraft()
    draft.outcome = "disconnected"
    _fill_known(request, draft)
    draft.finish(499, "CLIENT_DISCONNECTED")
    _emit(draft, async_queue())


async def emissions_flush(timeout_s: float = 5.0) -> None:
    """Write the rows not written yet and wait for them (a process about to stop)."""
    for emission in list(_pending):
        emission()
    if _background:
        await asyncio.wait(set(_background), timeout=timeout_s)


def _emit(draft: CompletionDraft, queue: AsyncQueue) -> None:
    # The task is kept referenced until it is done.
    task = asyncio.get_running_loop().create_task(completion_emit(draft, queue.client))
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _answer(request: HttpRequest, draft: CompletionDraft, queue: AsyncQueue) -> HttpResponse:
    call: Call | None = None
    try:
        if request.method != "POST":
            raise ApiError(405, "METHOD_NOT_ALLOWED", "Use POST.", headers={"Allow": "POST"})
        if shutdown.stopping():
            raise shutdown.refusal()
        if _declared_too_large(request):
            raise ApiError(413, "REQUEST_TOO_LARGE", "The request body is too large.")
        # Validation runs first but speaks only after authentication: an unauthenticated
        # caller learns nothing about its request.
        invalid: ApiError | None = None
        parsed: tuple[dict[str, Any], str | None, int, str | None] | None = None
        try:
            parsed = _parse(request, draft)
        except ApiError as exc:
            invalid = exc
        resolved = await in_db_thread(
            call_resolve,
            token=bearer_token(request.headers.get("Authorization")),
            worker_id=parsed[1] if parsed else None,
            request=parsed[0] if parsed else None,
            key_hash=lambda worker_id: isolation_key_hash(worker_id, parsed[0]) if parsed else "",
        )
        if resolved.caller is None:
            raise unauthenticated()
        caller = resolved.caller
        draft.tenant_hash, draft.principal_hash = caller.tenant_hash, caller.principal_hash
        if invalid is not None or parsed is None:
            raise invalid or unauthenticated()
        body, _, queue_wait_ms, request_id = parsed
        if resolved.worker_id is None:
            raise ApiError(
                503,
                "NO_WORKER_SELECTED",
                "No worker was named and the tenant has no default worker; not started.",
            )
        draft.worker_id = resolved.worker_id
        call = Call(
            caller=caller,
            request=body,
            worker_id=resolved.worker_id,
            queue_wait_header_ms=queue_wait_ms,
            request_id=request_id,
            draft=draft,
            target=resolved.target,
        )
        result = await call_execute(
            call, queue=queue, limiter=RateLimiter(queue.client, prefix=queue.prefix)
        )
        response: HttpResponse = JsonResponse(result)
        for name, value in call.response_headers.items():
            response[name] = value
        draft.finish(200)
        return response
    except ApiError as exc:
        _fill_known(request, draft)
        draft.finish(exc.status, exc.code)
        return _with_budget_headers(exc.response(), call)
    except (DatabaseError, InterfaceError):
        _fill_known(request, draft)
        error = _database_unavailable(draft)
        draft.finish(error.status, error.code)
        return _with_budget_headers(error.response(), call)
    except Exception:
        # Anything unforeseen still gets a typed answer and its completion row.
        log.exception("unexpected error on the execute path")
        _fill_known(request, draft)
        draft.finish(500, "INTERNAL_ERROR")
        return _with_budget_headers(
            JsonResponse(
                {
                    "error": "Internal error; the operation may or may not have run.",
                    "code": "INTERNAL_ERROR",
                },
                status=500,
            ),
            call,
        )
    except asyncio.CancelledError:
        draft.outcome = "disconnected"
        draft.finish(499, "CLIENT_DISCONNECTED")
        raise


@csrf_exempt
async def request_cancel(request: HttpRequest, request_id: str) -> HttpResponse:
    try:
        if request.method != "DELETE":
            raise ApiError(405, "METHOD_NOT_ALLOWED", "Use DELETE.", headers={"Allow": "DELETE"})
        caller = await authenticate(request)
        try:
            validate_request_id(request_id)
        except ProtocolError:
            raise ApiError(404, "REQUEST_NOT_FOUND", "No such request.") from None
        policy = await acurrent_policy()
        try:
            state = await async_queue().cancel(
                scope=caller.scope, request_id=request_id, slot_ceiling=policy.max_lease_slots
            )
        except RedisError:
            raise ApiError(
                503, "ADMISSION_UNAVAILABLE", "Admission is unavailable right now."
            ) from None
        if state is None:
            raise ApiError(404, "REQUEST_NOT_FOUND", "No such request.")
        return JsonResponse({"state": state})
    except ApiError as exc:
        return exc.response()
    except (DatabaseError, InterfaceError):
        return ApiError(
            503,
            "DATABASE_UNAVAILABLE",
            "The service's database is unavailable; nothing was cancelled.",
            headers={"Retry-After": "5"},
        ).response()
