"""The workspace endpoint and cancel (async: a waiting call costs a coroutine, not a thread).

`WorkspaceToolsExecuteApi` validates, authenticates (one query for the key, the worker and its
offer), and hands the call to `admission.services.call_execute`; every way the call can end is
an `admission.refusals.Refusal` that `api/errors.py` turns into its answer. Each POST leaves
exactly one completion row, written after its response has gone out (or, should this process
die first, by the drainer's sweep from the draft the call entered its queue with).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import io
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, InterfaceError
from django.http import HttpRequest
from drf_spectacular.utils import extend_schema
from redis.exceptions import RedisError
from rest_framework import exceptions
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from sluice_protocol import (
    OPERATIONS,
    ProtocolError,
    parse_queue_wait_header,
    validate_request,
    validate_request_id,
    validate_worker_id,
)

from admission import refusals, shutdown
from admission.callers import cached_resolve
from admission.completion import CompletionDraft, emit_row, emitted_rows_flush
from admission.connections import async_queue
from admission.policy import Policy, acurrent_policy
from admission.queue import AsyncQueue
from admission.ratelimit import RateLimiter
from admission.refusals import Refusal
from admission.selectors import Resolved, Target
from admission.services import Call, call_execute, isolation_key_hash
from api.authentication import ApiUser, AsyncApiKeyAuthentication
from api.base import AsyncApiView
from api.errors import (
    as_refusal,
    invalid,
    method_not_allowed,
    refusal_body,
    refusal_headers,
    status_of,
    too_large,
    unauthenticated,
)
from api.headers import API_HEADERS
from api.schema.answers import (
    BY_REQUEST_ID_CODES,
    EXECUTE_CODES,
    EXECUTE_HEADERS,
    REQUEST_ID,
    operation,
)
from api.schema.components import CancelState, execute_request, execute_result
from workspaces.access import Caller

log = logging.getLogger("sluice.admission")

# A row whose response was never closed is written after this long.
EMIT_FALLBACK_S = 1.0
_pending: set[_Emission] = set()
# On a refusal, the body is looked at for the row's workspace and operation only up to this size.
_FILL_BODY_MAX_BYTES = 64 * 1024
_WORKSPACE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # the contract's workspaceId
_PARSER = JSONParser()


@dataclass(frozen=True)
class Holding:
    """A refusal that holds (`Refusal.holds_until`): the same call from the same caller gets the
    same answer until then, so the edge may give it from memory (api/burst.py), with the row
    facts that came from its caller and worker, and the policy its budgets were decided under."""

    refusal: Refusal
    tenant_hash: str
    principal_hash: str
    worker_id: str
    policy: Policy

    @property
    def until(self) -> float:
        assert self.refusal.holds_until is not None
        return self.refusal.holds_until


@dataclass(frozen=True)
class ReadCall:
    """A call's headers and body as read: valid (`parsed`) or its refusal (`invalid`), and the
    draft that read them."""

    draft: CompletionDraft
    parsed: Parsed | None
    invalid: Refusal | None


# A ReadCall the edge made (api/burst.py), in the request's META: the view takes it over, so
# the body is parsed once and the call's life counts from its arrival, before its turn at its
# credential's gate.
READ_AT_EDGE = "sluice.read_at_edge"


@dataclass(frozen=True)
class Passing:
    """What the edge (api/burst.py) gives the view it starts for a call from its credential's
    gate; the view hands it to admission, for its call's draft, as the call's AdmissionHooks."""

    entered: Callable[[], None]
    # The policy the call's admission is decided under, with the call's draft (its caller and
    # worker named): told as soon as the policy is read.
    decided: Callable[[CompletionDraft, Policy], None]
    # Calls of its credential to its worker in flight here ahead of it, when they reach the
    # queue's limit: the queue is full by the time its turn would come.
    in_flight_ahead: int | None = None


@dataclass(frozen=True)
class EdgeHooks:
    """A call's AdmissionHooks from the edge's Passing."""

    passing: Passing
    draft: CompletionDraft

    def decided(self, policy: Policy) -> Refusal | None:
        self.passing.decided(self.draft, policy)
        ahead = self.passing.in_flight_ahead
        if ahead is None or ahead < policy.worker_queue_limit:
            return None
        # Refused before its rate limit (no unit taken, as the edge's answer to such a call
        # takes none); the edge gives the next such calls this answer for BEYOND_HOLD_S.
        return refusals.queue_full(
            self.draft.worker_id,
            policy.worker_queue_limit,
            holds_until=time.monotonic() + BEYOND_HOLD_S,
        )

    def entered(self) -> None:
        self.passing.entered()


# How long the answer to a call beyond its queue's limit (Passing.in_flight_ahead) holds.
BEYOND_HOLD_S = 1.0


PASSING: contextvars.ContextVar[Passing | None] = contextvars.ContextVar(
    "sluice_passing", default=None
)


class CompletionResponse(Response):
    """A response that writes its call's completion row once the server has sent and closed
    it, so the row's round trip to Redis never holds the answer up."""

    emission: _Emission | None = None
    holds: Holding | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.emission is not None:
                loop = self.emission.loop
                loop.call_soon_threadsafe(self.emission)


def rendered_refusal(refusal: Refusal) -> Response:
    """A refusal as the execute view answers a call that took no rate-limit unit (so carries
    no budget headers), in plain JSON (the edge answers only such calls: api/burst.py): the
    same status, headers and body (tests/api/test_burst_edge.py compares them)."""
    # The view's renderers and methods are its class's: no instance of its own (which opens a
    # queue on the running loop) is needed for them.
    view = object.__new__(WorkspaceToolsExecuteApi)
    response = Response(
        refusal_body(refusal), status=status_of(refusal), headers=refusal_headers(refusal)
    )
    renderer = view.get_renderers()[0]
    response.accepted_renderer = renderer
    response.accepted_media_type = renderer.media_type
    response.renderer_context = {}  # type: ignore[attr-defined]  # set so by DRF's finalize
    for name, value in view.default_response_headers.items():  # as DRF's finalize_response
        response[name] = value
    response.render()
    for name, value in API_HEADERS.items():  # as config/middleware.py
        response.setdefault(name, value)
    return response


@dataclass
class Parsed:
    body: dict[str, Any]
    worker_id: str | None
    queue_wait_ms: int
    request_id: str | None


def declared_too_large(headers: Headers) -> bool:
    """Whether the request's Content-Length already passes the body limit (413 unread)."""
    try:
        return int(headers.get("Content-Length") or 0) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    except ValueError:
        return False


class Headers(Protocol):
    """What a call's reading needs of its headers: a value by name, any case (a Django
    request's `headers`, or the edge's reading of the ASGI scope, api/burst.py)."""

    def get(self, key: str, /) -> str | None: ...


def _parse(
    headers: Headers, content_type: str, body: Callable[[], bytes], draft: CompletionDraft
) -> Parsed:
    """Headers and body, validated before anything is queued (DRF's JSON parser reads it)."""
    try:
        raw_worker = headers.get("X-LibreChat-Code-Worker-ID")
        worker_id = validate_worker_id(raw_worker) if raw_worker is not None else None
        queue_wait_ms = parse_queue_wait_header(headers.get("X-LibreChat-Workspace-Queue-Wait-Ms"))
        raw_request_id = headers.get("X-LibreChat-Workspace-Request-Id")
        request_id = validate_request_id(raw_request_id) if raw_request_id is not None else None
        draft.describe(request_id=request_id or "")
        body_json = validate_request(_json_body(content_type, body))
    except ProtocolError as exc:
        raise invalid(exc.code, exc.message) from None
    draft.describe(
        operation=str(body_json["operation"]),
        workspace_id=str(body_json["workspaceId"]),
        worktree=str(body_json.get("worktree") or ""),
    )
    return Parsed(body_json, worker_id, queue_wait_ms, request_id)


def read_call(request: HttpRequest, draft: CompletionDraft) -> ReadCall:
    return read_parts(request.headers, request.content_type or "", lambda: request.body, draft)


def read_parts(
    headers: Headers, content_type: str, body: Callable[[], bytes], draft: CompletionDraft
) -> ReadCall:
    """A call read from its headers, its content type and its body: valid or its refusal."""
    try:
        return ReadCall(draft, _parse(headers, content_type, body, draft), None)
    except Refusal as refusal:
        return ReadCall(draft, None, refusal)


def _json_body(content_type: str, body: Callable[[], bytes]) -> Any:
    if content_type.split(";")[0].strip() != "application/json":
        raise Refusal("UNSUPPORTED_MEDIA_TYPE", "The body must be application/json.")
    try:
        # Django enforces DATA_UPLOAD_MAX_MEMORY_SIZE here, for a chunked body too (DRF's own
        # stream would take a body without Content-Length for an empty one).
        raw = body()
    except RequestDataTooBig:
        raise too_large() from None
    try:
        if not raw:
            raise exceptions.ParseError()
        return _PARSER.parse(io.BytesIO(raw), "application/json", {"encoding": "utf-8"})
    except (exceptions.ParseError, RecursionError):
        # RecursionError: JSON nested past Python's limit is not a request either.
        raise invalid("INVALID_REQUEST", "The body is not valid JSON.") from None


def describe_headers(headers: Headers, draft: CompletionDraft) -> None:
    """The request id and the worker a refused request named, when they are well-formed."""
    for attr, header, check in (
        ("request_id", "X-LibreChat-Workspace-Request-Id", validate_request_id),
        ("worker_id", "X-LibreChat-Code-Worker-ID", validate_worker_id),
    ):
        value = headers.get(header)
        if not getattr(draft, attr) and value:
            with contextlib.suppress(ProtocolError):
                draft.describe(**{attr: check(value)})


def _fill_known(request: HttpRequest, draft: CompletionDraft) -> None:
    """On a refusal, name what the request carried (request id, worker, workspace, operation)
    when it is well-formed, so its completion row says what was refused. Only values that
    match the protocol's own patterns are kept: never content, command text or a path."""
    describe_headers(request.headers, draft)
    if (
        draft.operation
        or request.content_type != "application/json"
        or declared_too_large(request.headers)
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
        draft.describe(operation=str(body["operation"]))
    workspace, worktree = body.get("workspaceId"), body.get("worktree")
    if isinstance(workspace, str) and _WORKSPACE_ID_RE.fullmatch(workspace):
        draft.describe(workspace_id=workspace)
        # Lane names follow the worker-id pattern.
        with contextlib.suppress(ProtocolError):
            draft.describe(
                worktree=validate_worker_id(worktree) if isinstance(worktree, str) else ""
            )


class WorkspaceToolsExecuteApi(AsyncApiView):
    """`POST /v1/workspace-tools/execute` (contract §2)."""

    authentication_classes = [AsyncApiKeyAuthentication]
    http_method_names = ["post"]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.draft = CompletionDraft()
        self.queue = async_queue()
        self.parsed: Parsed | None = None
        # Validation runs first but speaks only after authentication: an unauthenticated
        # caller learns nothing about its request.
        self.invalid: Refusal | None = None
        self.resolved: Resolved | None = None
        self.token: str | None = None
        self.call: Call | None = None

    async def prepare(self, request: Request) -> None:
        edge: ReadCall | None = request._request.META.get(READ_AT_EDGE)
        if edge is not None:
            self.draft = edge.draft
        if request.method != "POST":
            raise method_not_allowed("POST")
        if shutdown.stopping():
            raise refusals.shutting_down()
        if declared_too_large(request._request.headers):
            # Left unread, and said only after authentication: 401 comes first (docs/api.md).
            self.invalid = too_large()
            return
        read = edge or read_call(request._request, self.draft)
        self.parsed, self.invalid = read.parsed, read.invalid

    async def lookup_caller(self, token: str | None) -> Caller | None:
        """The key, the worker (named or the tenant's default) and its offer in one query."""
        self.token = token
        self.resolved = await self._resolve()
        return self.resolved.caller

    async def _resolve(self, *, fresh: bool = False) -> Resolved:
        parsed = self.parsed

        def key_hash(worker_id: str) -> str:
            return isolation_key_hash(worker_id, parsed.body) if parsed else ""

        return await cached_resolve(
            token=self.token,
            worker_id=parsed.worker_id if parsed else None,
            request=parsed.body if parsed else None,
            key_hash=key_hash,
            fresh=fresh,
        )

    async def refresh_target(self) -> Target | None:
        """The call's worker looked up again, past the caller cache: its registration as it is
        now, after a restart this process had not seen yet."""
        resolved = await self._resolve(fresh=True)
        same = self.resolved is not None and resolved.worker_id == self.resolved.worker_id
        return resolved.target if same else None

    def checked_caller(self, request: Request) -> Caller:
        """The authenticated caller, named on the row; then the request's own refusal, held
        back until now so an unauthenticated caller learned nothing, may speak."""
        user = request.user
        assert isinstance(user, ApiUser) and self.resolved is not None
        caller = user.caller
        self.draft.describe(tenant_hash=caller.tenant_hash, principal_hash=caller.principal_hash)
        if self.invalid is not None or self.parsed is None:
            raise self.invalid or unauthenticated()
        return caller

    @extend_schema(
        **operation(
            "executeWorkspaceTool",
            request=execute_request(),
            ok=(200, execute_result()),
            parameters=EXECUTE_HEADERS,
            codes=EXECUTE_CODES,
            worker=True,
            budget=True,
        )
    )
    async def post(self, request: Request) -> Response:
        caller = self.checked_caller(request)
        assert self.resolved is not None and self.parsed is not None
        if self.resolved.worker_id is None:
            raise refusals.no_worker_selected()
        self.draft.describe(worker_id=self.resolved.worker_id)
        passing = PASSING.get()
        self.call = Call(
            caller=caller,
            request=self.parsed.body,
            worker_id=self.resolved.worker_id,
            queue_wait_header_ms=self.parsed.queue_wait_ms,
            request_id=self.parsed.request_id,
            draft=self.draft,
            target=self.resolved.target,
            refresh_target=self.refresh_target,
            hooks=EdgeHooks(passing, self.draft) if passing else None,
        )
        result = await call_execute(
            self.call,
            queue=self.queue,
            limiter=RateLimiter(self.queue.client, prefix=self.queue.prefix),
        )
        self.draft.answered(200)
        return self._answer(result, 200, {})

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, DatabaseError | InterfaceError):
            # Postgres is away (authentication, worker lookups, the policy row). The row still
            # reaches the Redis stream and lands once Postgres is back.
            log.warning("database unavailable on the execute path", exc_info=True)
            refusal: Refusal | None = refusals.database_unavailable(
                started=False if self.draft.exec_ms is None else None
            )
        else:
            refusal = as_refusal(exc)
        if refusal is None:
            # Anything unforeseen still gets a typed answer and its completion row.
            log.exception("unexpected error on the execute path")
            refusal = Refusal(
                "INTERNAL_ERROR",
                "Internal error; the operation may or may not have run.",
                started=None,
            )
        _fill_known(self.request._request, self.draft)
        status = status_of(refusal)
        self.draft.answered(status, refusal)
        response = self._answer(refusal_body(refusal), status, refusal_headers(refusal))
        if refusal.holds_until is not None and self.call and self.call.policy is not None:
            response.holds = Holding(
                refusal=refusal,
                tenant_hash=self.draft.tenant_hash,
                principal_hash=self.draft.principal_hash,
                worker_id=self.draft.worker_id,
                policy=self.call.policy,
            )
        return response

    def _answer(self, data: Any, status: int, headers: dict[str, str]) -> CompletionResponse:
        # A call that passed the rate limit carries its budget headers whatever its answer.
        budget = self.call.response_headers if self.call is not None else {}
        response = CompletionResponse(data, status=status, headers={**budget, **headers})
        emission = _Emission(self.draft, self.queue)
        response.emission = emission
        emission.loop.call_later(EMIT_FALLBACK_S, emission)
        return response

    async def async_dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().async_dispatch(request, *args, **kwargs)
        except asyncio.CancelledError:
            # The client went away; the row says so.
            self.draft.went_away_answered()
            emit_row(self.draft, self.queue.client)
            raise


class _Emission:
    """Writes one call's row the first time it is called; later calls do nothing."""

    def __init__(self, draft: CompletionDraft, queue: AsyncQueue) -> None:
        self.draft, self.queue = draft, queue
        self.loop = asyncio.get_running_loop()
        _pending.add(self)

    def __call__(self) -> None:
        if self in _pending:
            _pending.discard(self)
            emit_row(self.draft, self.queue.client)


def execute_abandoned(request: HttpRequest) -> None:
    """A POST whose client went away before its body was even read still gets its row."""
    if request.method != "POST" or request.path_info != "/v1/workspace-tools/execute":
        return
    draft = CompletionDraft()
    _fill_known(request, draft)
    draft.went_away_answered()
    emit_row(draft)


async def emissions_flush(timeout_s: float = 5.0) -> None:
    """Write the rows not written yet and wait for them (a process about to stop)."""
    for emission in list(_pending):
        emission()
    await emitted_rows_flush(timeout_s)


class WorkspaceToolsRequestCancelApi(AsyncApiView):
    """`DELETE /v1/workspace-tools/requests/<id>` (contract §2.6): same principal only."""

    authentication_classes = [AsyncApiKeyAuthentication]
    http_method_names = ["delete"]

    async def prepare(self, request: Request) -> None:
        if request.method != "DELETE":
            raise method_not_allowed("DELETE")

    @extend_schema(
        **operation(
            "cancelRequest",
            ok=(200, CancelState),
            parameters=[REQUEST_ID],
            codes=BY_REQUEST_ID_CODES,
        )
    )
    async def delete(self, request: Request, request_id: str) -> Response:
        user = request.user
        assert isinstance(user, ApiUser)
        not_found = Refusal("REQUEST_NOT_FOUND", "No such request.")
        try:
            validate_request_id(request_id)
        except ProtocolError:
            raise not_found from None
        policy = await acurrent_policy()
        try:
            state = await async_queue().cancel(
                scope=user.caller.scope, request_id=request_id, slot_ceiling=policy.max_lease_slots
            )
        except RedisError:
            raise refusals.admission_unavailable() from None
        if state is None:
            raise not_found
        return Response({"state": state})
