"""The whole OpenAPI 3.1 document: components, security schemes and paths."""

from __future__ import annotations

import functools

import sluice_protocol as p

from api.schema.answers import (
    REF,
    WWW_AUTHENTICATE,
    error_body,
    execute_responses,
    json_content,
    typed,
)
from api.schema.bodies import (
    BOOLEAN,
    Schema,
    integer,
    request_schema,
    result_schema,
    string,
    title,
)
from api.schema.bridge import bridge_paths, bridge_schemas
from api.schema.patterns import PATTERNS
from workspaces.runtime.config import MAX_SLOTS

OPENAPI_VERSION = "3.1.0"
EXECUTE_PATH = "/v1/workspace-tools/execute"


def _request_id_parameter() -> Schema:
    return {"name": "requestId", "in": "path", "required": True, "schema": string("requestId")}


def _by_request_id_refusals() -> dict[str, Schema]:
    """What the routes that look a call up by its request id refuse with."""
    return {
        "401": typed("UNAUTHENTICATED", ["UNAUTHENTICATED"]),
        "404": typed(
            "REQUEST_NOT_FOUND: unknown id, malformed id, or another principal's call.",
            ["REQUEST_NOT_FOUND"],
        ),
        "503": typed("ADMISSION_UNAVAILABLE", ["ADMISSION_UNAVAILABLE"]),
    }


def _components() -> Schema:
    operations = sorted(p.OPERATIONS)
    schemas: Schema = {}
    for kind, build in (("Request", request_schema), ("Result", result_schema)):
        for operation in operations:
            schemas[title(operation, kind)] = build(operation)
        schemas["Execute" + kind] = {
            "oneOf": [{"$ref": REF + title(op, kind)} for op in operations],
            "discriminator": {
                "propertyName": "operation",
                "mapping": {op: REF + title(op, kind) for op in operations},
            },
        }
    schemas["Error"] = {
        **error_body([]),
        "description": "Every typed error; each response narrows `code` to its own codes.",
    }
    schemas["Error"]["properties"]["code"] = {"type": "string", "pattern": "^[A-Z][A-Z0-9_]*$"}
    schemas["RateLimited"] = {
        "type": "object",
        "required": ["error", "message", "retry_after_seconds"],
        "additionalProperties": False,
        "properties": {
            "error": {"type": "string", "const": "rate_limited"},
            "message": {"type": "string", "pattern": " retry in [0-9]+ seconds\\.$"},
            "retry_after_seconds": integer(1),
        },
    }
    schemas["CancelState"] = {
        "type": "object",
        "required": ["state"],
        "additionalProperties": False,
        "properties": {"state": {"type": "string", "enum": ["cancelled", "running", "finished"]}},
    }
    schemas["DurableStatus"] = {
        "type": "object",
        "required": ["requestId", "state"],
        "additionalProperties": False,
        "properties": {
            "requestId": string("requestId"),
            "state": {
                "type": "string",
                "enum": ["queued", "admitted", "completed", "failed", "cancelled"],
            },
            "result": {"type": "object", "description": "The §2.2 result (completed)."},
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "additionalProperties": False,
                "description": "failed: the code the synchronous endpoint would have answered.",
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    }
    schemas["Capabilities"] = {
        "type": "object",
        "required": ["durableWorkspaceRequests"],
        "additionalProperties": False,
        "properties": {"durableWorkspaceRequests": {"type": "integer", "enum": [0, 1]}},
    }
    schemas["WorkerRegistration"] = {
        "type": "object",
        "required": ["workerId", "workspaces", "slots"],
        "additionalProperties": False,
        "properties": {
            "workerId": string("workerId", description="The token's own worker id."),
            "workspaces": {
                "type": "array",
                "minItems": 1,
                "maxItems": 256,
                "description": "Workspace ids must be unique.",
                "items": {
                    "type": "object",
                    "required": ["workspaceId", "operations"],
                    "additionalProperties": False,
                    "properties": {
                        "workspaceId": string("workspaceId"),
                        "operations": {
                            "type": "array",
                            "minItems": 1,
                            "maxItems": len(operations),
                            "items": {"type": "string", "enum": operations},
                        },
                        "linkedWorktreeLanes": {**BOOLEAN, "default": False},
                    },
                },
            },
            "slots": integer(1, MAX_SLOTS),
        },
    }
    schemas["Incarnation"] = {
        "type": "object",
        "required": ["workerId", "incarnationId"],
        "additionalProperties": False,
        "properties": {
            "workerId": string("workerId"),
            "incarnationId": string("incarnationId"),
        },
    }
    schemas["Registered"] = {
        "type": "object",
        "required": ["incarnationId", "slots", "queue"],
        "additionalProperties": False,
        "properties": {
            "incarnationId": string("incarnationId"),
            "slots": integer(1, MAX_SLOTS),
            "queue": {"type": "string", "description": "The worker's own Celery queue."},
        },
    }
    check = {"type": "string", "pattern": "^(?:ok|down: [A-Za-z0-9_.]+)$"}
    schemas["Health"] = {
        "type": "object",
        "required": ["database", "redis"],
        "additionalProperties": False,
        "properties": {"database": check, "redis": check},
    }
    schemas.update(bridge_schemas())
    return {
        "schemas": schemas,
        "securitySchemes": {
            "apiKey": {"type": "http", "scheme": "bearer", "description": "An API key."},
            "workerToken": {"type": "http", "scheme": "bearer", "description": "A worker token."},
            "metricsToken": {"type": "http", "scheme": "bearer", "description": "METRICS_TOKEN."},
        },
    }


def _worker_operation(summary: str, body: str, ok: Schema, operation_id: str) -> Schema:
    responses: Schema = {
        "200": {"description": "Done.", "content": json_content(ok)},
        "400": typed(
            "INVALID_REQUEST: the body breaks the schema, or is not JSON.", ["INVALID_REQUEST"]
        ),
        "401": typed("UNAUTHENTICATED", ["UNAUTHENTICATED"], headers=WWW_AUTHENTICATE),
        "403": typed("FORBIDDEN: the token belongs to another worker.", ["FORBIDDEN"]),
        "415": typed("UNSUPPORTED_MEDIA_TYPE", ["UNSUPPORTED_MEDIA_TYPE"]),
    }
    if operation_id == "heartbeatWorker":
        responses["409"] = typed(
            "WORKER_SUPERSEDED: this incarnation was replaced or expired.", ["WORKER_SUPERSEDED"]
        )
    return {
        "post": {
            "operationId": operation_id,
            "tags": ["workers"],
            "summary": summary,
            "security": [{"workerToken": []}],
            "requestBody": {"required": True, "content": json_content({"$ref": REF + body})},
            "responses": responses,
        }
    }


def _ok_object(**properties: Schema) -> Schema:
    return {
        "type": "object",
        "required": list(properties),
        "additionalProperties": False,
        "properties": properties,
    }


def _execute_parameters() -> list[Schema]:
    def header(name: str, pattern: str, description: str) -> Schema:
        return {
            "name": name,
            "in": "header",
            "required": False,
            "description": description,
            "schema": {"type": "string", "pattern": PATTERNS[pattern]},
        }

    return [
        header(
            "X-LibreChat-Code-Worker-ID",
            "workerId",
            "The worker that runs the call. Absent: the tenant's default worker. Malformed: "
            "400 INVALID_WORKER_ID.",
        ),
        header(
            "X-LibreChat-Workspace-Queue-Wait-Ms",
            "queueWaitMs",
            f"Admission allowance, ms: ^[1-9][0-9]*$ and <= {p.MAX_QUEUE_WAIT_MS} "
            f"[{p.DEFAULT_QUEUE_WAIT_MS}], capped by WORKSPACE_QUEUE_CEILING_MS. Otherwise "
            "400 INVALID_WORKSPACE_QUEUE_WAIT.",
        ),
        header(
            "X-LibreChat-Workspace-Request-Id",
            "requestId",
            "Names the call so DELETE /v1/workspace-tools/requests/{requestId} can cancel it "
            "while it waits. Malformed or already used: 400 INVALID_REQUEST_ID.",
        ),
    ]


def _paths() -> Schema:
    text = {"text/plain": {"schema": {"type": "string"}}}
    return {
        EXECUTE_PATH: {
            "post": {
                "operationId": "executeWorkspaceTool",
                "tags": ["workspace-tools"],
                "summary": "Run one workspace operation on a worker (waits for admission).",
                "description": "Every answer before the assignment may have reached the worker "
                "says the operation was not started (safe to resend); 502 and 504 mean it may "
                "have run. `x-codes` on each response lists its codes (contract §2.5).",
                "security": [{"apiKey": []}],
                "parameters": _execute_parameters(),
                "requestBody": {
                    "required": True,
                    "content": json_content({"$ref": REF + "ExecuteRequest"}),
                },
                "responses": execute_responses(),
            }
        },
        "/v1/workspace-tools/capabilities": {
            "get": {
                "operationId": "workspaceToolCapabilities",
                "tags": ["workspace-tools"],
                "summary": "What this deployment offers beyond execute (contract §2.7).",
                "security": [{"apiKey": []}],
                "responses": {
                    "200": {
                        "description": "1: durable requests are offered; 0: use execute.",
                        "content": json_content({"$ref": REF + "Capabilities"}),
                    },
                    "401": typed("UNAUTHENTICATED", ["UNAUTHENTICATED"]),
                },
            }
        },
        "/v1/workspace-tools/requests": {
            "post": {
                "operationId": "submitDurableRequest",
                "tags": ["workspace-tools"],
                "summary": "Submit a durable call: 202 once it is in its worker's queue.",
                "description": "Same headers and body as execute; the request id header is "
                "required. Refusals before the call is queued are execute's typed answers. "
                "Repeating an id this principal's durable call holds creates nothing and "
                "answers that call's status.",
                "security": [{"apiKey": []}],
                "parameters": _execute_parameters(),
                "requestBody": {
                    "required": True,
                    "content": json_content({"$ref": REF + "ExecuteRequest"}),
                },
                "responses": {
                    "202": {
                        "description": "Accepted (or already accepted): its status.",
                        "content": json_content({"$ref": REF + "DurableStatus"}),
                    },
                    **{
                        code: answer
                        for code, answer in execute_responses().items()
                        if code not in ("200", "502", "504")
                    },
                },
            }
        },
        "/v1/workspace-tools/requests/{requestId}": {
            "get": {
                "operationId": "durableRequestStatus",
                "tags": ["workspace-tools"],
                "summary": "A durable call's status (same principal only).",
                "description": "Any API process answers; a completed status is kept for at "
                "least 10 minutes.",
                "security": [{"apiKey": []}],
                "parameters": [_request_id_parameter()],
                "responses": {
                    "200": {
                        "description": "The call's status.",
                        "content": json_content({"$ref": REF + "DurableStatus"}),
                    },
                    **_by_request_id_refusals(),
                },
            },
            "delete": {
                "operationId": "cancelRequest",
                "tags": ["workspace-tools"],
                "summary": "Cancel a waiting call by its request id (same principal only).",
                "description": "A waiting call is removed and answers 409 REQUEST_CANCELLED; a "
                "running or finished call is untouched.",
                "security": [{"apiKey": []}],
                "parameters": [_request_id_parameter()],
                "responses": {
                    "200": {
                        "description": "The call's state.",
                        "content": json_content({"$ref": REF + "CancelState"}),
                    },
                    **_by_request_id_refusals(),
                },
            },
        },
        "/v1/workers/register": _worker_operation(
            "Register a worker: a new incarnation.",
            "WorkerRegistration",
            {"$ref": REF + "Registered"},
            "registerWorker",
        ),
        "/v1/workers/heartbeat": _worker_operation(
            "Keep an incarnation alive (every <= 10 s).",
            "Incarnation",
            _ok_object(ok={"type": "boolean", "const": True}),
            "heartbeatWorker",
        ),
        "/v1/workers/deregister": _worker_operation(
            "Drain done: go offline; calls still waiting get WORKER_OFFLINE.",
            "Incarnation",
            _ok_object(ok={"type": "boolean", "const": True}, offline=integer(0)),
            "deregisterWorker",
        ),
        **bridge_paths(),
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "tags": ["operations"],
                "summary": "Postgres and Redis reachability.",
                "security": [],
                "responses": {
                    "200": {
                        "description": "Both answer.",
                        "content": json_content({"$ref": REF + "Health"}),
                    },
                    "503": {
                        "description": "One is down.",
                        "content": json_content({"$ref": REF + "Health"}),
                    },
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "tags": ["operations"],
                "summary": "Prometheus text exposition (contract §5).",
                "description": "Loopback clients only, unless METRICS_TOKEN is set; then the "
                "token is required. Answers in text, errors included.",
                "security": [{}, {"metricsToken": []}],
                "responses": {
                    "200": {"description": "Prometheus text format.", "content": text},
                    "401": {
                        "description": "METRICS_TOKEN set, token missing or wrong.",
                        "content": text,
                    },
                    "403": {
                        "description": "Not loopback and no METRICS_TOKEN set.",
                        "content": text,
                    },
                    "503": {"description": "Redis or Postgres is down.", "content": text},
                },
            }
        },
        "/v1/schema/": {
            "get": {
                "operationId": "openapiSchema",
                "tags": ["schema"],
                "summary": "This document.",
                "security": [],
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1",
                        "content": json_content({"type": "object"}),
                    }
                },
            }
        },
        "/v1/schema/docs/": {
            "get": {
                "operationId": "openapiDocs",
                "tags": ["schema"],
                "summary": "This document as an HTML page.",
                "security": [],
                "responses": {
                    "200": {
                        "description": "HTML",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }


@functools.cache
def openapi_document() -> Schema:
    """The whole document; built once per process. Callers must not mutate it."""
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "Sluice",
            "version": str(p.PROTOCOL_VERSION),
            "description": "Admission control for AI agents' workspace tool calls; wire-"
            "compatible with LibreChat's Code API workspace-tools contract (protocol v1).",
        },
        "tags": [
            {"name": "workspace-tools", "description": "Agents (API keys)."},
            {"name": "workers", "description": "Worker machines (worker tokens)."},
            {"name": "bridge", "description": "Attaching workers from LibreChat (§4.5)."},
            {"name": "operations", "description": "Health and metrics."},
            {"name": "schema", "description": "This document."},
        ],
        "paths": _paths(),
        "components": _components(),
    }
