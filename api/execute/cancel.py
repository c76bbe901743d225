"""`DELETE /v1/workspace-tools/requests/<id>` (contract §2.6): cancel a call, same principal only."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from redis.exceptions import RedisError
from rest_framework.request import Request
from rest_framework.response import Response
from sluice_protocol import ProtocolError, validate_request_id

from admission import refusals
from admission.connections import async_queue
from admission.policy import acurrent_policy
from admission.refusals import Refusal
from api.authentication import ApiUser, AsyncApiKeyAuthentication
from api.base import AsyncApiView
from api.errors import method_not_allowed
from api.schema.answers import BY_REQUEST_ID_CODES, REQUEST_ID, operation
from api.schema.components import CancelState


class WorkspaceToolsRequestCancelApi(AsyncApiView):
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
