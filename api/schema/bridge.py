"""The bridge routes of contract §4.5 in the OpenAPI document: schemas and paths."""

from __future__ import annotations

import sluice_protocol as p

from api.schema.answers import REF, WWW_AUTHENTICATE, json_content, typed
from api.schema.bodies import BOOLEAN, Schema, integer, string

_OPERATIONS = sorted(p.OPERATIONS)
_CODE: Schema = {"type": "string", "pattern": "^[A-Za-z0-9_-]{32}$"}
_VERSION: Schema = {"type": "integer", "const": 1}


def _object(required: list[str], **properties: Schema) -> Schema:
    return {
        "type": "object",
        "required": required,
        "additionalProperties": False,
        "properties": properties,
    }


def bridge_schemas() -> dict[str, Schema]:
    operations: Schema = {
        "type": "array",
        "uniqueItems": True,
        "items": {"type": "string", "enum": _OPERATIONS},
    }
    text: Schema = {"type": "string", "minLength": 1, "maxLength": 256}
    return {
        "BridgePairingRequest": _object(
            ["workerId"],
            workerId=string("workerId"),
            binding=_object(
                ["tenantId", "principal"],
                tenantId=text,
                principal=_object(
                    ["type", "id"],
                    type={
                        "type": "string",
                        "enum": ["deployment", "tenant", "user", "role", "group"],
                    },
                    id=text,
                ),
            ),
        ),
        "BridgePairing": _object(
            ["protocolVersion", "workerId", "code", "expiresAt"],
            protocolVersion=_VERSION,
            workerId=string("workerId"),
            code={**_CODE, "description": "Single use; dies at expiresAt (<= 10 min)."},
            expiresAt={"type": "string", "format": "date-time"},
        ),
        "BridgeRedeemRequest": _object(["code"], code={"type": "string"}, protocolVersion=_VERSION),
        "BridgeRedeemed": _object(
            ["protocolVersion", "workerId", "workerToken"],
            protocolVersion=_VERSION,
            workerId=string("workerId"),
            workerToken={"type": "string", "minLength": 1},
            redisUrl={"type": "string", "description": "The worker's own Redis user (§4.4)."},
            admissionRedisUrl={"type": "string"},
            admissionRedisCluster=BOOLEAN,
        ),
        "BridgeWorkerStatus": {
            **_object(
                ["protocolVersion", "workerId", "online", "ready"],
                protocolVersion=_VERSION,
                workerId=string("workerId"),
                online=BOOLEAN,
                ready=BOOLEAN,
                leaseExpiresInMs=integer(1, 60_000),
                capabilities=_object(
                    ["sandboxProfile", "runtimes", "workspaceTools"],
                    sandboxProfile={"type": "string", "enum": ["bwrap", "none"]},
                    runtimes={"type": "array", "items": {"type": "string"}, "maxItems": 32},
                    workspaceTools=_object(
                        ["operations"],
                        protocolVersion=_VERSION,
                        operations=operations,
                        workspaces={
                            "type": "array",
                            "minItems": 1,
                            "maxItems": 32,
                            "items": _object(
                                ["id", "operations"],
                                id=string("workspaceId"),
                                operations=operations,
                            ),
                        },
                    ),
                ),
            ),
            "description": "leaseExpiresInMs and capabilities only when online.",
        },
        "BridgeRevoked": _object(
            ["protocolVersion", "revoked"],
            protocolVersion=_VERSION,
            revoked={"type": "boolean", "const": True},
        ),
    }


def _worker_parameter() -> Schema:
    return {"name": "workerId", "in": "path", "required": True, "schema": string("workerId")}


def _common(**more: Schema) -> Schema:
    return {
        "401": typed("UNAUTHENTICATED", ["UNAUTHENTICATED"], headers=WWW_AUTHENTICATE),
        "503": typed(
            "ADMISSION_UNAVAILABLE, DATABASE_UNAVAILABLE",
            ["ADMISSION_UNAVAILABLE", "DATABASE_UNAVAILABLE"],
        ),
        **more,
    }


def bridge_paths() -> Schema:
    bad_id = typed(
        "INVALID_WORKER_ID: the id breaks the worker-id pattern; INVALID_REQUEST: the body "
        "breaks the schema or is not JSON.",
        ["INVALID_WORKER_ID", "INVALID_REQUEST"],
    )
    not_found = typed(
        "WORKER_NOT_FOUND: no such worker in this tenant (another tenant's included), and no "
        "pairing of it by this tenant.",
        ["WORKER_NOT_FOUND"],
    )
    return {
        "/v1/bridge/pairings": {
            "post": {
                "operationId": "createBridgePairing",
                "tags": ["bridge"],
                "summary": "A single-use pairing code for a worker id of the caller's tenant.",
                "security": [{"apiKey": []}],
                "requestBody": {
                    "required": True,
                    "content": json_content({"$ref": REF + "BridgePairingRequest"}),
                },
                "responses": _common(
                    **{
                        "200": {
                            "description": "The code.",
                            "content": json_content({"$ref": REF + "BridgePairing"}),
                        },
                        "400": bad_id,
                        "415": typed("UNSUPPORTED_MEDIA_TYPE", ["UNSUPPORTED_MEDIA_TYPE"]),
                    }
                ),
            }
        },
        "/v1/bridge/pairings/redeem": {
            "post": {
                "operationId": "redeemBridgePairing",
                "tags": ["bridge"],
                "summary": "Spend a pairing code for the worker's id, token and Redis URLs.",
                "description": "`runworker --pairing-code` calls it once. No key: the code is "
                "the credential.",
                "security": [],
                "requestBody": {
                    "required": True,
                    "content": json_content({"$ref": REF + "BridgeRedeemRequest"}),
                },
                "responses": {
                    "200": {
                        "description": "The worker's credentials (shown once).",
                        "content": json_content({"$ref": REF + "BridgeRedeemed"}),
                    },
                    "400": typed(
                        "INVALID_PAIRING_CODE: not 32 characters of [A-Za-z0-9_-]; "
                        "INVALID_REQUEST: the body breaks the schema.",
                        ["INVALID_PAIRING_CODE", "INVALID_REQUEST"],
                    ),
                    "404": typed("PAIRING_CODE_UNKNOWN", ["PAIRING_CODE_UNKNOWN"]),
                    "409": typed(
                        "PAIRING_CODE_USED; WORKER_ID_TAKEN (another tenant holds the id; the "
                        "code is spent)",
                        ["PAIRING_CODE_USED", "WORKER_ID_TAKEN"],
                    ),
                    "410": typed("PAIRING_CODE_EXPIRED", ["PAIRING_CODE_EXPIRED"]),
                    "415": typed("UNSUPPORTED_MEDIA_TYPE", ["UNSUPPORTED_MEDIA_TYPE"]),
                    "503": typed(
                        "ADMISSION_UNAVAILABLE (the code stays good), DATABASE_UNAVAILABLE",
                        ["ADMISSION_UNAVAILABLE", "DATABASE_UNAVAILABLE"],
                    ),
                },
            }
        },
        "/v1/bridge/workers/{workerId}/status": {
            "get": {
                "operationId": "bridgeWorkerStatus",
                "tags": ["bridge"],
                "summary": "Whether the worker is online and ready, its lease and its offer.",
                "security": [{"apiKey": []}],
                "parameters": [_worker_parameter()],
                "responses": _common(
                    **{
                        "200": {
                            "description": "The status.",
                            "content": json_content({"$ref": REF + "BridgeWorkerStatus"}),
                        },
                        "400": bad_id,
                        "404": not_found,
                    }
                ),
            }
        },
        "/v1/bridge/workers/{workerId}/revoke": {
            "post": {
                "operationId": "revokeBridgeWorker",
                "tags": ["bridge"],
                "summary": "Revoke the worker's token and Redis user; waiting calls get "
                "WORKER_OFFLINE. Idempotent.",
                "security": [{"apiKey": []}],
                "parameters": [_worker_parameter()],
                "responses": _common(
                    **{
                        "200": {
                            "description": "Revoked.",
                            "content": json_content({"$ref": REF + "BridgeRevoked"}),
                        },
                        "400": bad_id,
                        "404": not_found,
                    }
                ),
            }
        },
    }
