"""The workspace endpoint (async: a waiting call costs a coroutine, not a thread) and cancel."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from redis.exceptions import RedisError
from sluice_client.protocol import (
    ProtocolError,
    parse_queue_wait_header,
    validate_request,
    validate_request_id,
    validate_worker_id,
)

from admission.completion import CompletionDraft, completion_emit
from admission.connections import async_queue
from admission.errors import ApiError, unauthenticated
from admission.policy import acurrent_policy
from admission.ratelimit import RateLimiter
from admission.services import Call, call_execute
from workspaces.access import Caller, caller_for, default_worker_id, principal_for_api_key
from workspaces.auth import bearer_token

_background: set[asyncio.Task[Any]] = set()


async def authenticate(request: HttpRequest) -> Caller:
    token = bearer_token(request.headers.get("Authorization"))
    principal = await sync_to_async(principal_for_api_key, thread_sensitive=False)(token) if token else None
    if principal is None:
        raise unauthenticated()
    return caller_for(principal)


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
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "INVALID_REQUEST", "The body is not valid JSON.") from None


def _declared_too_large(request: HttpRequest) -> bool:
    try:
        return int(request.headers.get("Content-Length") or 0) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    except ValueError:
        return False


def _parse(request: HttpRequest, caller: Caller, draft: CompletionDraft) -> tuple[dict[str, Any], str | None, int, str | None]:
    """Headers and body, validated before anything is queued."""
    try:
        raw_worker = request.headers.get("X-LibreChat-Code-Worker-ID")
        worker_id = validate_worker_id(raw_worker) if raw_worker is not None else None
        queue_wait_ms = parse_queue_wait_header(request.headers.get("X-LibreChat-Workspace-Queue-Wait-Ms"))
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


@csrf_exempt
async def execute(request: HttpRequest) -> HttpResponse:
    draft = CompletionDraft()
    queue = async_queue()
    response: HttpResponse | None = None
    try:
        if request.method != "POST":
            raise ApiError(405, "METHOD_NOT_ALLOWED", "Use POST.")
        if _declared_too_large(request):
            raise ApiError(413, "REQUEST_TOO_LARGE", "The request body is too large.")
        caller = await authenticate(request)
        draft.tenant_hash, draft.principal_hash = caller.tenant_hash, caller.principal_hash
        body, worker_id, queue_wait_ms, request_id = _parse(request, caller, draft)
        if worker_id is None:
            worker_id = await sync_to_async(default_worker_id, thread_sensitive=False)(caller)
            if worker_id is None:
                raise ApiError(
                    503, "NO_WORKER_SELECTED", "No worker was named and the tenant has no default worker; not started."
                )
        draft.worker_id = worker_id
        call = Call(
            caller=caller, request=body, worker_id=worker_id, queue_wait_header_ms=queue_wait_ms,
            request_id=request_id, draft=draft,
        )
        result = await call_execute(call, queue=queue, limiter=RateLimiter(queue.client, prefix=queue.prefix))
        response = JsonResponse(result)
        for name, value in call.response_headers.items():
            response[name] = value
        draft.finish(200)
        return response
    except ApiError as exc:
        draft.finish(exc.status, exc.code)
        return exc.response()
    except asyncio.CancelledError:
        draft.outcome = "disconnected"
        draft.finish(499, "CLIENT_DISCONNECTED")
        raise
    finally:
        # Logged off the response path; the task is kept referenced until it is done.
        task = asyncio.get_running_loop().create_task(completion_emit(draft, queue.client))
        _background.add(task)
        task.add_done_callback(_background.discard)


@csrf_exempt
async def request_cancel(request: HttpRequest, request_id: str) -> HttpResponse:
    try:
        if request.method != "DELETE":
            raise ApiError(405, "METHOD_NOT_ALLOWED", "Use DELETE.")
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
            raise ApiError(503, "ADMISSION_UNAVAILABLE", "Admission is unavailable right now.") from None
        if state is None:
            raise ApiError(404, "REQUEST_NOT_FOUND", "No such request.")
        return JsonResponse({"state": state})
    except ApiError as exc:
        return exc.response()
