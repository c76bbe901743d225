"""The answers of the bridge routes (contract §4.5). Their request bodies are the views'
serializers (api/bridge.py)."""

from __future__ import annotations

import sluice_protocol as p

from api.schema.bodies import BOOLEAN, Schema, integer, string
from api.schema.components import component, exact

_OPERATIONS = sorted(p.OPERATIONS)
_VERSION: Schema = {"type": "integer", "const": 1}
_OPERATION_SET: Schema = {
    "type": "array",
    "uniqueItems": True,
    "items": {"type": "string", "enum": _OPERATIONS},
}

BridgePairing = component(
    "BridgePairing",
    exact(
        ["protocolVersion", "workerId", "code", "expiresAt"],
        protocolVersion=_VERSION,
        workerId=string("workerId"),
        code={
            "type": "string",
            "pattern": "^[A-Za-z0-9_-]{32}$",
            "description": "Single use; dies at expiresAt (<= 10 min).",
        },
        expiresAt={"type": "string", "format": "date-time"},
    ),
)
BridgeRedeemed = component(
    "BridgeRedeemed",
    exact(
        ["protocolVersion", "workerId", "workerToken"],
        protocolVersion=_VERSION,
        workerId=string("workerId"),
        workerToken={"type": "string", "minLength": 1},
        redisUrl={"type": "string", "description": "The worker's own Redis user (§4.4)."},
        admissionRedisUrl={"type": "string"},
        admissionRedisCluster=BOOLEAN,
    ),
)
BridgeWorkerStatus = component(
    "BridgeWorkerStatus",
    exact(
        ["protocolVersion", "workerId", "online", "ready"],
        "leaseExpiresInMs and capabilities only when online.",
        protocolVersion=_VERSION,
        workerId=string("workerId"),
        online=BOOLEAN,
        ready=BOOLEAN,
        leaseExpiresInMs=integer(1, 60_000),
        capabilities=exact(
            ["sandboxProfile", "runtimes", "workspaceTools"],
            sandboxProfile={"type": "string", "enum": ["bwrap", "none"]},
            runtimes={"type": "array", "items": {"type": "string"}, "maxItems": 32},
            workspaceTools=exact(
                ["operations"],
                protocolVersion=_VERSION,
                operations=_OPERATION_SET,
                workspaces={
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 32,
                    "items": exact(
                        ["id", "operations"], id=string("workspaceId"), operations=_OPERATION_SET
                    ),
                },
            ),
        ),
    ),
)
BridgeRevoked = component(
    "BridgeRevoked",
    exact(
        ["protocolVersion", "revoked"],
        protocolVersion=_VERSION,
        revoked={"type": "boolean", "const": True},
    ),
)
