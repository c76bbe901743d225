"""Durable requests (contract §2.7), their HTTP side: capabilities, submit, status, cancel.

The domain (the call's watcher, its status, its one completion row) is admission/durable.py;
these views parse, call it, and shape the answer. They hand it `status_of` (api/errors.py),
so a row records the status the synchronous endpoint would have answered.
"""

from __future__ import annotations

import asyncio
from typing import Any

from django.http import HttpRequest
from drf_spectacular.utils import extend_schema
from redis.exceptions import RedisError
from rest_framework.request import Request
from rest_framework.response import Response
from sluice_protocol import ProtocolError, validate_request_id

from admission import refusals
from admission.completion import emit_row
from admission.connections import async_queue
from admission.durable import durable_status, durable_submit, request_not_found
from admission.queue import dispatch_in_redis
from admission.refusals import Refusal
from api.authentication import ApiUser, AsyncApiKeyAuthentication
from api.base import AsyncApiView
from api.errors import method_not_allowed, status_of
from api.execute.cancel import WorkspaceToolsRequestCancelApi
from api.execute.view import WorkspaceToolsExecuteApi
from api.schema.answers import (
    BY_REQUEST_ID_CODES,
    DURABLE_SUBMIT_CODES,
    EXECUTE_HEADERS,
    REQUEST_ID,
    operation,
)
from api.schema.components import Capabilities, DurableStatus, execute_request


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
        call = self.new_call(caller, durable=True)
        status = await durable_submit(call, queue=self.queue, status_of=status_of)
        # A plain Response: a queued call's row is written when it ends, a repeat's never.
        headers = call.response_headers if call.entered.is_set() else {}
        return Response(status, status=202, headers=headers)

    async def async_dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        try:
            return await AsyncApiView.async_dispatch(self, request, *args, **kwargs)
        except asyncio.CancelledError:
            if self.call is None:
                # Gone before anything was queued: the row says so, as for execute.
                self.draft.went_away_answered()
                emit_row(self.draft, self.queue.client)
            # Otherwise the call carries on (its watcher task is not this request's) and
            # writes its own row; the client finds it under its request id.
            raise


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
            raise request_not_found() from None
        queue = async_queue()
        try:
            bound = await queue.request_binding(scope=user.caller.scope, request_id=request_id)
            status = None
            if bound is not None and bound[2]:
                status = await durable_status(
                    queue,
                    request_id=request_id,
                    worker_id=bound[0],
                    entry_id=bound[1],
                    status_of=status_of,
                )
        except RedisError:
            raise refusals.admission_unavailable() from None
        if status is None:
            raise request_not_found()
        return Response(status)
