"""The bridge routes LibreChat calls to attach a worker (contract §4.5), and the redeem route
`runworker --pairing-code` calls. Thin: validate, one service (admission/bridge.py), answer."""

from __future__ import annotations

import functools
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema
from redis.exceptions import RedisError
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from sluice_protocol import ProtocolError, validate_worker_id

from admission import refusals
from admission.bridge import (
    CODE_PATTERN,
    PROTOCOL_VERSION,
    pairing_create,
    pairing_redeem,
    worker_revoke,
    worker_status,
)
from admission.connections import async_queue
from admission.ratelimit import RateLimiter, RatePolicy
from api.errors import invalid
from api.schema.answers import WORKER_ID, operation
from api.schema.bridge import BridgePairing, BridgeRedeemed, BridgeRevoked, BridgeWorkerStatus
from api.workers import StrictCharField, StrictIntegerField, StrictSerializer
from workspaces.access import Caller
from workspaces.secrets import hash_secret

BRIDGE_PREFIX = "/v1/bridge/"
REDEEM_PATH = "/v1/bridge/pairings/redeem"


@functools.cache
def _policy(text: str) -> RatePolicy:
    return RatePolicy.parse(text)


# A limit that does not parse stops the process as it loads the routes, not a request later.
_policy(settings.SLUICE_BRIDGE_RATE_LIMIT)
_policy(settings.SLUICE_BRIDGE_REDEEM_RATE_LIMIT)


async def bridge_rate_refusal(*, path: str, token: str, client: str) -> refusals.Refusal | None:
    """Takes one unit of the request's bridge budget, before its body is read or its key
    looked up (config/asgi.py): redeem's per client address (its caller has no key yet),
    the other routes' per key, or per address for a request without a well-formed key. The
    same Redis limiter as the workspace API's, so every API process shares one budget."""
    if path == REDEEM_PATH or not token:
        policy = _policy(
            settings.SLUICE_BRIDGE_REDEEM_RATE_LIMIT
            if path == REDEEM_PATH
            else settings.SLUICE_BRIDGE_RATE_LIMIT
        )
        principal = f"bridge-addr:{'redeem' if path == REDEEM_PATH else 'key'}:{client}"
    else:
        policy = _policy(settings.SLUICE_BRIDGE_RATE_LIMIT)
        principal = f"bridge-key:{hash_secret(token)}"
    queue = async_queue()
    try:
        decision = await RateLimiter(queue.client, prefix=queue.prefix).take(
            principal_key=principal, policy=policy
        )
    except RedisError:
        return refusals.admission_unavailable()
    if decision.allowed:
        return None
    return refusals.Refusal(
        "BRIDGE_RATE_LIMITED",
        f"Too many bridge requests; retry in {decision.retry_after_s} seconds.",
        retry_after_s=decision.retry_after_s,
    )


# LibreChat's CodeBridgePrincipalType.
BINDING_PRINCIPAL_TYPES = ("deployment", "tenant", "user", "role", "group")


class BindingPrincipalSerializer(StrictSerializer):
    type = serializers.ChoiceField(BINDING_PRINCIPAL_TYPES)
    id = StrictCharField(min_length=1, max_length=256)


class BindingSerializer(StrictSerializer):
    tenantId = StrictCharField(min_length=1, max_length=256)
    principal = BindingPrincipalSerializer()


class PairingSerializer(StrictSerializer):
    workerId = StrictCharField(max_length=256)
    binding = BindingSerializer(required=False)


class RedeemSerializer(StrictSerializer):
    code = StrictCharField(max_length=256)
    protocolVersion = StrictIntegerField(min_value=1, max_value=1, required=False)


def _worker_id(value: str) -> str:
    try:
        return validate_worker_id(value)
    except ProtocolError as exc:
        raise invalid(exc.code, exc.message) from None


def _caller(request: Request) -> Caller:
    return request.user.caller  # type: ignore[union-attr]


# What every bridge route with an API key refuses.
_BRIDGE_CODES = [
    "UNAUTHENTICATED",
    "BRIDGE_RATE_LIMITED",
    "ADMISSION_UNAVAILABLE",
    "DATABASE_UNAVAILABLE",
]
# What a bridge route with a body refuses besides, before the view reads it (config/asgi.py).
_BODY_CODES = ["REQUEST_TOO_LARGE", "REQUEST_BODY_TIMEOUT"]
_BY_WORKER_CODES = [*_BRIDGE_CODES, "INVALID_WORKER_ID", "WORKER_NOT_FOUND"]


class BridgePairingCreateApi(APIView):
    @extend_schema(
        **operation(
            "createBridgePairing",
            request=PairingSerializer,
            ok=(200, BridgePairing),
            codes=[
                *_BRIDGE_CODES,
                *_BODY_CODES,
                "INVALID_WORKER_ID",
                "INVALID_REQUEST",
                "UNSUPPORTED_MEDIA_TYPE",
            ],
        )
    )
    def post(self, request: Request) -> Response:
        data = PairingSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        binding: dict[str, Any] | None = data.validated_data.get("binding")
        pairing = pairing_create(
            caller=_caller(request),
            worker_id=_worker_id(data.validated_data["workerId"]),
            binding=None
            if binding is None
            else {**binding, "principal": dict(binding["principal"])},
        )
        return Response(pairing.as_json())


class BridgePairingRedeemApi(APIView):
    # The code is the credential: the worker machine holds no key yet.
    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]

    @extend_schema(
        **operation(
            "redeemBridgePairing",
            request=RedeemSerializer,
            ok=(200, BridgeRedeemed),
            codes=[
                "INVALID_PAIRING_CODE",
                "INVALID_REQUEST",
                "PAIRING_CODE_UNKNOWN",
                "PAIRING_CODE_USED",
                "WORKER_ID_TAKEN",
                "PAIRING_CODE_EXPIRED",
                "UNSUPPORTED_MEDIA_TYPE",
                "BRIDGE_RATE_LIMITED",
                *_BODY_CODES,
                "ADMISSION_UNAVAILABLE",
                "DATABASE_UNAVAILABLE",
            ],
        )
    )
    def post(self, request: Request) -> Response:
        data = RedeemSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        code = data.validated_data["code"]
        if CODE_PATTERN.fullmatch(code) is None:
            raise invalid(
                "INVALID_PAIRING_CODE", "A pairing code is 32 characters of [A-Za-z0-9_-]."
            )
        return Response(pairing_redeem(code=code))


class BridgeWorkerStatusApi(APIView):
    @extend_schema(
        **operation(
            "bridgeWorkerStatus",
            ok=(200, BridgeWorkerStatus),
            parameters=[WORKER_ID],
            codes=_BY_WORKER_CODES,
        )
    )
    def get(self, request: Request, worker_id: str) -> Response:
        return Response(worker_status(caller=_caller(request), worker_id=_worker_id(worker_id)))


class BridgeWorkerRevokeApi(APIView):
    @extend_schema(
        **operation(
            "revokeBridgeWorker",
            ok=(200, BridgeRevoked),
            parameters=[WORKER_ID],
            codes=_BY_WORKER_CODES,
        )
    )
    def post(self, request: Request, worker_id: str) -> Response:
        worker_revoke(caller=_caller(request), worker_id=_worker_id(worker_id))
        return Response({"protocolVersion": PROTOCOL_VERSION, "revoked": True})
