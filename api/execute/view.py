"""`POST /v1/workspace-tools/execute`: validate, authenticate, call `call_execute`, answer.

Every way a call can end is an `admission.refusals.Refusal` that `api/errors.py` turns into its
answer. Each POST leaves exactly one completion row, written after its response has gone out
(or, should this process die first, by the drainer's sweep from the draft the call entered
its queue with).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.db import DatabaseError, InterfaceError
from django.http import HttpRequest
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from admission import refusals, shutdown
from admission.callers import cached_resolve
from admission.completion import CompletionDraft, emit_row
from admission.connections import async_queue
from admission.policy import Policy
from admission.queue import AsyncQueue
from admission.ratelimit import RateLimiter
from admission.refusals import Refusal
from admission.selectors import Resolved, Target
from admission.services import Call, call_execute, isolation_key_hash
from api.authentication import ApiUser, AsyncApiKeyAuthentication
from api.base import AsyncApiView
from api.errors import (
    as_refusal,
    method_not_allowed,
    refusal_body,
    refusal_headers,
    status_of,
    too_large,
    unauthenticated,
)
from api.execute.context import EdgeContext, Emission, edge_of
from api.execute.reading import Parsed, declared_too_large, fill_known, read_call
from api.headers import API_HEADERS
from api.schema.answers import EXECUTE_CODES, EXECUTE_HEADERS, operation
from api.schema.components import execute_request, execute_result
from workspaces.access import Caller

log = logging.getLogger("sluice.admission")

# A row whose response was never closed is written after this long.
EMIT_FALLBACK_S = 1.0


@dataclass(frozen=True)
class Holding:
    """A refusal that holds (`Refusal.holds_until`): the same call from the same caller gets
    the same answer until then, so the edge may repeat it. With the row facts of its caller and
    worker, and the policy its budgets were decided under, for the repeated calls' rows."""

    refusal: Refusal
    tenant_hash: str
    principal_hash: str
    worker_id: str
    policy: Policy
    flow_hash: str = ""
    worker_confirmed: bool = False

    @property
    def until(self) -> float:
        assert self.refusal.holds_until is not None
        return self.refusal.holds_until


class CompletionResponse(Response):
    """A response that writes its call's completion row once the server has sent and closed
    it, so the row's round trip to Redis never holds the answer up."""

    emission: Emission | None = None
    holds: Holding | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.emission is not None:
                self.emission.loop.call_soon_threadsafe(self.emission)


class WorkspaceToolsExecuteApi(AsyncApiView):
    """`POST /v1/workspace-tools/execute` (contract §2)."""

    authentication_classes = [AsyncApiKeyAuthentication]
    http_method_names = ["post"]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.edge = EdgeContext()
        self.draft = CompletionDraft()
        self.parsed: Parsed | None = None
        # Validation runs first but speaks only after authentication: an unauthenticated
        # caller learns nothing about its request.
        self.invalid: Refusal | None = None
        self.resolved: Resolved | None = None
        self.token: str | None = None
        self.call: Call | None = None

    @cached_property
    def queue(self) -> AsyncQueue:
        return async_queue()

    async def prepare(self, request: Request) -> None:
        self.edge = edge_of(request._request)
        if self.edge.read is not None:
            self.draft = self.edge.read.draft
        if request.method != "POST":
            raise method_not_allowed("POST")
        if shutdown.stopping():
            raise refusals.shutting_down()
        if declared_too_large(request._request.headers):
            # Left unread, and said only after authentication: 401 comes first (docs/api.md).
            self.invalid = too_large()
            return
        read = self.edge.read or read_call(request._request, self.draft)
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

    def new_call(self, caller: Caller, *, durable: bool = False) -> Call:
        """The call for admission, once its caller and worker are known."""
        assert self.resolved is not None and self.parsed is not None
        if self.resolved.worker_id is None:
            raise refusals.no_worker_selected()
        self.draft.describe(worker_id=self.resolved.worker_id)
        if self.resolved.target is not None:
            self.draft.worker_found()
        self.call = Call(
            caller=caller,
            request=self.parsed.body,
            worker_id=self.resolved.worker_id,
            queue_wait_header_ms=self.parsed.queue_wait_ms,
            request_id=self.parsed.request_id,
            draft=self.draft,
            target=self.resolved.target,
            refresh_target=self.refresh_target,
            durable=durable,
            hooks=None if durable else self.edge.hooks,
        )
        return self.call

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
        call = self.new_call(self.checked_caller(request))
        limiter = RateLimiter(self.queue.client, prefix=self.queue.prefix)
        result = await call_execute(call, queue=self.queue, limiter=limiter)
        self.draft.answered(200)
        return self._answer(result, 200, {})

    def handle_exception(self, exc: Exception) -> Response:
        refusal = self._refusal_of(exc)
        fill_known(self.request._request, self.draft)
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
                flow_hash=self.draft.flow_hash,
                worker_confirmed=self.draft.worker_confirmed,
            )
        return response

    def _refusal_of(self, exc: Exception) -> Refusal:
        if isinstance(exc, DatabaseError | InterfaceError):
            # Postgres is away (authentication, worker lookups, the policy row). The row still
            # reaches the Redis stream and lands once Postgres is back.
            log.warning("database unavailable on the execute path", exc_info=True)
            return refusals.database_unavailable(
                started=False if self.draft.exec_ms is None else None
            )
        refusal = as_refusal(exc)
        if refusal is None:
            # Anything unforeseen still gets a typed answer and its completion row.
            log.exception("unexpected error on the execute path")
            refusal = Refusal(
                "INTERNAL_ERROR",
                "Internal error; the operation may or may not have run.",
                started=None,
            )
        return refusal

    def _answer(self, data: Any, status: int, headers: dict[str, str]) -> CompletionResponse:
        # A call that passed the rate limit carries its budget headers whatever its answer.
        budget = self.call.response_headers if self.call is not None else {}
        response = CompletionResponse(data, status=status, headers={**budget, **headers})
        response.emission = Emission(self.draft, self.queue, self.edge.emissions)
        response.emission.loop.call_later(EMIT_FALLBACK_S, response.emission)
        return response

    async def async_dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().async_dispatch(request, *args, **kwargs)
        except asyncio.CancelledError:
            # The client went away; the row says so.
            self.draft.went_away_answered()
            emit_row(self.draft, self.queue.client)
            raise


def rendered_refusal(refusal: Refusal) -> Response:
    """A refusal as the execute view answers a call that took no rate-limit unit (no budget
    headers): the same status, headers and body, for the edge to send without a view run."""
    view = WorkspaceToolsExecuteApi()
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


def execute_abandoned(request: HttpRequest) -> None:
    """A POST whose client went away before its body was even read still gets its row."""
    draft = CompletionDraft()
    fill_known(request, draft)
    draft.went_away_answered()
    emit_row(draft)
