"""The OpenAPI 3.1 document of Sluice's public HTTP surface (`/v1/schema/`), and its docs page.

Written by hand: drf-spectacular cannot see the async execute endpoint. What can drift is not
typed here twice. The request and result bodies take their field names, which fields are
required and their defaults from `sluice_client.protocol`'s own field tables, and every bound
and pattern from its constants, so the client, the server and this document agree by
construction: a field added to the protocol without a schema here fails the build (and
`tests/test_openapi_schema.py`, which also checks each bound against `validate_request`).
"""

from __future__ import annotations

import copy
import functools
import html
import json
import re
import sys
from collections.abc import Mapping
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from sluice_client import protocol as p

from admission.ratelimit import POLICY_NAME
from workspaces.runtime.config import MAX_SLOTS

Schema = dict[str, Any]
OPENAPI_VERSION = "3.1.0"
EXECUTE_PATH = "/v1/workspace-tools/execute"
_REF = "#/components/schemas/"

# --------------------------------------------------------------------------------------------
# Patterns, from the protocol's own regular expressions (it uses fullmatch; JSON Schema's
# `pattern` searches, so each is anchored). `\x00` and the classes below read the same in
# ECMA 262, Python and the Rust engine schemathesis validates with; `\s` does not, so the
# whitespace that `str.isspace` knows is spelled out.


def _anchored(regex: re.Pattern[str]) -> str:
    return f"^{regex.pattern}$"


def _python_whitespace_class() -> str:
    spaces = [c for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    runs: list[tuple[int, int]] = []
    for c in spaces:
        if runs and runs[-1][1] == c - 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))
    return "".join(f"\\u{lo:04x}" if lo == hi else f"\\u{lo:04x}-\\u{hi:04x}" for lo, hi in runs)


def _decimal_up_to(high: int) -> str:
    """An anchored pattern for the decimals 1..high without leading zeros (high >= 10)."""
    digits = str(high)
    alternatives = [f"[1-9][0-9]{{0,{len(digits) - 2}}}"]
    for index, char in enumerate(digits):
        low = 1 if index == 0 else 0
        if int(char) > low:
            rest = len(digits) - index - 1
            alternatives.append(f"{digits[:index]}[{low}-{int(char) - 1}][0-9]{{{rest}}}")
    alternatives.append(digits)
    return "^(?:" + "|".join(alternatives) + ")$"


# A safe relative path (§2.2): segments of anything but "/", "\" and NUL, none of them "." or "..".
_SEGMENT = r"[^/\\\x00]+"
_NO_DOT_SEGMENTS = r"(?!\.\.?(?:/|$))(?![^\x00]*/\.\.?(?:/|$))"
_SAFE_PATH = f"{_NO_DOT_SEGMENTS}{_SEGMENT}(?:/{_SEGMENT})*"
_WHITESPACE = _python_whitespace_class()

PATTERNS: dict[str, str] = {
    "workerId": _anchored(p._NAME_RE),
    "workspaceId": _anchored(p._WORKSPACE_ID_RE),
    "requestId": _anchored(p._REQUEST_ID_RE),
    "sha256": _anchored(p._SHA256_HEX_RE),
    "signal": _anchored(p._SIGNAL_RE),
    "unavailable": _anchored(p._UNAVAILABLE_RE),
    "timeout": _anchored(p._TIMEOUT_RE),
    # git refuses a worktree named *.lock; the name's characters cannot include a newline.
    "worktree": f"^(?!.*\\.lock$){p._NAME_RE.pattern}$",
    # The contract's ^[1-9][0-9]*$ and <= MAX_QUEUE_WAIT_MS, as one pattern.
    "queueWaitMs": _decimal_up_to(p.MAX_QUEUE_WAIT_MS),
    "path": f"^{_SAFE_PATH}$",
    "pathOrRoot": f"^(?:{_SAFE_PATH})?$",
    "query": "^[^\\x00\\r\\n]*$",
    # Not blank (str.isspace) and no NUL: optional whitespace, one other character, then any.
    "command": f"^[{_WHITESPACE}]*[^{_WHITESPACE}\\x00][^\\x00]*$",
    "incarnationId": "^[0-9a-f]{32}$",
    "seconds": "^[1-9][0-9]*$",
    "count": "^[0-9]+$",
}

# --------------------------------------------------------------------------------------------
# Field schemas. Names, required-ness and defaults come from the protocol's tables below.


def _string(pattern: str | None = None, **bounds: Any) -> Schema:
    schema: Schema = {"type": "string", **bounds}
    if pattern is not None:
        schema["pattern"] = PATTERNS[pattern]
    return schema


def _utf8(max_bytes: int, **extra: Any) -> Schema:
    # JSON Schema counts characters; the protocol counts UTF-8 bytes, which is never fewer.
    return {
        "type": "string",
        "maxLength": max_bytes,
        "x-maxUtf8Bytes": max_bytes,
        "description": f"At most {max_bytes} bytes in UTF-8; no lone surrogates.",
        **extra,
    }


def _integer(minimum: int | None = None, maximum: int | None = None) -> Schema:
    # JSON Schema counts 5.0 as an integer; the protocol does not (it would hand a float on).
    schema: Schema = {"type": "integer", "description": INTEGER_LITERAL}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


INTEGER_LITERAL = "An integer literal: 5.0 or 5e0 is refused."
_BOOLEAN: Schema = {"type": "boolean"}
_PATH = _string(
    "path",
    maxLength=p.MAX_PATH_CHARS,
    description="A safe relative path: no leading '/', no backslash or NUL, "
    "no '.', '..' or empty segment.",
)
_PATH_OR_ROOT = {**_PATH, "pattern": PATTERNS["pathOrRoot"], "description": '"" is the root.'}
_EDITS: Schema = {
    "type": "array",
    "minItems": 1,
    "maxItems": p.MAX_EDITS,
    "items": {
        "type": "object",
        "required": ["oldText", "newText"],
        "additionalProperties": False,
        "properties": {
            "oldText": _utf8(p.MAX_EDIT_TEXT_BYTES, minLength=1),
            "newText": _utf8(p.MAX_EDIT_TEXT_BYTES),
            "replaceAll": {**_BOOLEAN, "default": False},
        },
    },
}

_COMMON_REQUEST_SCHEMAS: dict[str, Schema] = {
    "protocolVersion": {
        "type": "integer",
        "const": p.PROTOCOL_VERSION,
        "description": INTEGER_LITERAL,
    },
    "operation": _string(),  # narrowed to the operation's name per variant
    "workspaceId": _string("workspaceId"),
    "workspaceInstanceId": _string("sha256", description="A conversation worktree (64 hex)."),
    "worktree": _string("worktree", description="A linked-worktree lane."),
}
_OPERATION_REQUEST_SCHEMAS: dict[str, dict[str, Schema]] = {
    "read_file": {
        "path": _PATH,
        "startLine": _integer(1),
        "maxLines": _integer(1, p.MAX_READ_LINES),
    },
    "list_files": {
        "path": _PATH_OR_ROOT,
        "maxResults": _integer(1, p.MAX_LIST_RESULTS),
        "afterPath": _PATH,
    },
    "search_text": {
        "query": _string("query", minLength=1, maxLength=p.MAX_QUERY_CHARS),
        "path": _PATH_OR_ROOT,
        "maxResults": _integer(1, p.MAX_SEARCH_RESULTS),
    },
    "write_file": {
        "path": _PATH,
        "content": _utf8(p.MAX_WRITE_BYTES),
        "overwrite": _BOOLEAN,
    },
    "preview_edit": {"path": _PATH, "edits": _EDITS},
    "edit_file": {"path": _PATH, "edits": _EDITS, "expectedBaseSha256": _string("sha256")},
    "execute_command": {
        "command": {
            **_utf8(p.MAX_COMMAND_BYTES, minLength=1, pattern=PATTERNS["command"]),
            "description": f"Not blank, no NUL, at most {p.MAX_COMMAND_BYTES} bytes in UTF-8.",
        },
        "cwd": _PATH_OR_ROOT,
        "timeoutMs": _integer(1, p.MAX_COMMAND_TIMEOUT_MS),
        "maxOutputBytes": _integer(1, p.MAX_OUTPUT_BYTES),
    },
}

_COMMON_RESULT_SCHEMAS: dict[str, Schema] = {
    "protocolVersion": {"type": "integer", "const": p.PROTOCOL_VERSION},
    "operation": _string(),
    "workspaceId": _string("workspaceId"),
}
_OPERATION_RESULT_SCHEMAS: dict[str, dict[str, Schema]] = {
    "read_file": {
        "path": _PATH,
        "content": _string(maxLength=p.READ_MAX_BYTES),
        "startLine": _integer(1),
        "endLine": _integer(0),
        "truncated": _BOOLEAN,
        "nextStartLine": _integer(1),
    },
    "list_files": {
        "paths": {"type": "array", "maxItems": p.MAX_LIST_RESULTS, "items": _PATH},
        "truncated": _BOOLEAN,
        "nextAfterPath": _PATH,
    },
    "search_text": {
        "matches": {
            "type": "array",
            "maxItems": p.MAX_SEARCH_RESULTS,
            "items": {
                "type": "object",
                "required": ["path", "line", "column", "text"],
                "additionalProperties": False,
                "properties": {
                    "path": _PATH,
                    "line": _integer(1),
                    "column": _integer(1),
                    "text": _string(maxLength=p.MATCH_TEXT_MAX_CHARS),
                },
            },
        },
        "truncated": _BOOLEAN,
    },
    "write_file": {
        "path": _PATH,
        "created": _BOOLEAN,
        "bytesWritten": _integer(0, p.MAX_WRITE_BYTES),
    },
    "preview_edit": {
        "path": _PATH,
        "content": _string(),
        "hasUtf8Bom": _BOOLEAN,
        "baseSha256": _string("sha256"),
        "replacements": _integer(1),
        "bytesWritten": _integer(0),
    },
    "edit_file": {"path": _PATH, "replacements": _integer(1), "bytesWritten": _integer(0)},
    "execute_command": {
        "exitCode": {"type": ["integer", "null"]},
        "signal": _string("signal"),
        "stdout": _string(maxLength=p.MAX_OUTPUT_BYTES),
        "stderr": _string(maxLength=p.MAX_OUTPUT_BYTES),
        "truncated": _BOOLEAN,
        "timedOut": _BOOLEAN,
    },
}


def _title(operation: str, kind: str) -> str:
    return "".join(part.title() for part in operation.split("_")) + kind


def _object_from_fields(
    operation: str, fields: Mapping[str, Any], schemas: Mapping[str, Schema], kind: str
) -> Schema:
    """An exact object: the protocol's field table decides the keys, required ones, defaults."""
    if set(fields) != set(schemas):
        raise RuntimeError(
            f"config/schema.py and sluice_client.protocol disagree on the {operation} {kind} "
            f"fields: {sorted(set(fields) ^ set(schemas))}"
        )
    properties: dict[str, Schema] = {}
    required: list[str] = []
    for name, field in fields.items():
        schema = copy.deepcopy(schemas[name])
        if field.default is p._REQUIRED:
            required.append(name)
        elif field.default is not p._OPTIONAL:
            schema["default"] = field.default
        properties[name] = schema
    properties["operation"] = {"type": "string", "const": operation}
    return {
        "title": _title(operation, kind),
        "type": "object",
        "required": required,
        "additionalProperties": False,
        "properties": properties,
    }


def request_schema(operation: str) -> Schema:
    fields = {**p._COMMON_REQUEST_FIELDS, **p._OPERATION_REQUEST_FIELDS[operation]}
    schemas = {**_COMMON_REQUEST_SCHEMAS, **_OPERATION_REQUEST_SCHEMAS[operation]}
    return _object_from_fields(operation, fields, schemas, "Request")


def result_schema(operation: str) -> Schema:
    fields = {**p._COMMON_RESULT_FIELDS, **p._OPERATION_RESULT_FIELDS[operation]}
    schemas = {**_COMMON_RESULT_SCHEMAS, **_OPERATION_RESULT_SCHEMAS[operation]}
    return _object_from_fields(operation, fields, schemas, "Result")


# --------------------------------------------------------------------------------------------
# Typed errors. (status, code, when, started): the execute endpoint's table of contract §2.5,
# plus the service codes it answers that the table leaves implicit. Worker codes come from
# the protocol (WORKER_ERROR_STATUS and the *_UNAVAILABLE / *_TIMEOUT patterns).

EXECUTE_SERVICE_CODES: list[tuple[int, str, str, str]] = [
    (400, "INVALID_WORKSPACE_TOOL_REQUEST", "the body breaks §2.2", "no"),
    (400, "INVALID_WORKSPACE_QUEUE_WAIT", "queue-wait header malformed or over 300000", "no"),
    (400, "INVALID_WORKER_ID", "worker-id header malformed", "no"),
    (400, "INVALID_REQUEST_ID", "request-id header malformed, or it names another call", "no"),
    (400, "INVALID_REQUEST", "the body is not JSON", "no"),
    (401, "UNAUTHENTICATED", "missing or unknown API key", "no"),
    (404, "WORKER_NOT_FOUND", "unknown worker, or another tenant's", "no"),
    (409, "WORKER_MISMATCH", "workspace, operation or lane not offered", "no"),
    (409, "WORKSPACE_QUARANTINED", "the isolation key is quarantined", "no"),
    (409, "REQUEST_CANCELLED", "cancelled by DELETE while it waited", "no"),
    (413, "REQUEST_TOO_LARGE", "body over the limit", "no"),
    (415, "UNSUPPORTED_MEDIA_TYPE", "body is not application/json", "no"),
    (429, "WORKER_QUEUE_FULL", "the worker's queue is full", "no"),
    (503, "WORKSPACE_QUEUE_TIMEOUT", "not admitted within the queue budget (Retry-After)", "no"),
    (503, "WORKER_OFFLINE", "worker offline, restarted or replaced", "no"),
    (503, "NO_WORKER_SELECTED", "no worker header and no default worker", "no"),
    (503, "SERVICE_SHUTTING_DOWN", "the API process is stopping", "no"),
    (503, "ADMISSION_UNAVAILABLE", "admission Redis unavailable", "no"),
    (503, "DATABASE_UNAVAILABLE", "Postgres unavailable (Retry-After)", "no, unless it ran"),
    (504, "ASSIGNMENT_EXPIRED", "exec deadline passed, or the worker vanished", "unknown"),
    (502, "RESULT_INVALID", "the worker's answer broke §2.2", "unknown"),
]
WORKER_CODE_PATTERNS = {503: PATTERNS["unavailable"], 504: PATTERNS["timeout"]}


def execute_error_codes() -> dict[int, list[tuple[str, str, str]]]:
    """status -> [(code, when, started)], service codes first, then the worker's."""
    table: dict[int, list[tuple[str, str, str]]] = {}
    for status, code, when, started in EXECUTE_SERVICE_CODES:
        table.setdefault(status, []).append((code, when, started))
    for code, status in sorted(p.WORKER_ERROR_STATUS.items()):
        if code not in {c for c, _, _ in table.get(status, [])}:
            table.setdefault(status, []).append(
                (code, "the worker refused the call", "yes/refused")
            )
    for status, pattern in WORKER_CODE_PATTERNS.items():
        table[status].append((pattern, "the worker could not run or finish it", "yes/refused"))
    return dict(sorted(table.items()))


def _error_body(codes: list[str], patterns: list[str] | None = None) -> Schema:
    """`{"error", "code"}` and nothing else; `code` one of `codes` or matching a pattern."""
    code: Schema = {"type": "string", "enum": codes}
    if patterns:
        code = {"anyOf": [code, *({"type": "string", "pattern": x} for x in patterns)]}
    return {
        "type": "object",
        "required": ["error", "code"],
        "additionalProperties": False,
        "properties": {"error": {"type": "string"}, "code": code},
    }


def _header(pattern: str, description: str, *, required: bool = False) -> Schema:
    return {
        "description": description,
        "required": required,
        "schema": {"type": "string", "pattern": PATTERNS[pattern]},
    }


RETRY_AFTER = _header("seconds", "Whole seconds (>= 1) to wait before retrying.")
_BUDGET_HEADERS: dict[str, Schema] = {
    "RateLimit-Limit": _header("count", "Units per window (§3); absent while limiting is off."),
    "RateLimit-Remaining": _header("count", "Units left now; 0 on a rate-limit refusal."),
    "RateLimit-Reset": _header("count", "Whole seconds until the bucket is full again."),
    "RateLimit-Policy": {
        "description": "IETF draft policy field.",
        "schema": {"type": "string", "pattern": f'^"{POLICY_NAME}";q=[0-9]+;w=[0-9]+$'},
    },
    "RateLimit": {
        "description": "IETF draft limit field.",
        "schema": {"type": "string", "pattern": f'^"{POLICY_NAME}";r=[0-9]+;t=[0-9]+$'},
    },
}
_WWW_AUTHENTICATE = {"WWW-Authenticate": {"schema": {"type": "string", "const": "Bearer"}}}


def _json(schema: Schema) -> Schema:
    return {"application/json": {"schema": schema}}


def _typed(description: str, codes: list[str], **extra: Any) -> Schema:
    return {"description": description, "content": _json(_error_body(codes)), **extra}


def _execute_responses() -> Schema:
    responses: Schema = {
        "200": {
            "description": "The worker's result. A command past its own timeout is a result "
            "(`timedOut: true`), not an error.",
            "headers": _BUDGET_HEADERS,
            "content": _json({"$ref": _REF + "ExecuteResult"}),
        }
    }
    for status, rows in execute_error_codes().items():
        codes = [code for code, _, _ in rows if not code.startswith("^")]
        patterns = [code for code, _, _ in rows if code.startswith("^")]
        body: Schema = _error_body(codes, patterns)
        headers: Schema = dict(_BUDGET_HEADERS)
        if status == 429:
            body = {"oneOf": [body, {"$ref": _REF + "RateLimited"}]}
            headers["Retry-After"] = {
                **RETRY_AFTER,
                "description": "On a rate-limit refusal (§3); absent on WORKER_QUEUE_FULL.",
            }
        if status == 503:
            headers["Retry-After"] = {
                **RETRY_AFTER,
                "description": "On WORKSPACE_QUEUE_TIMEOUT and DATABASE_UNAVAILABLE.",
            }
        if status == 401:
            headers = {}
        responses[str(status)] = {
            "description": "; ".join(code for code, _, _ in rows),
            "headers": headers,
            "content": _json(body),
            "x-codes": [{"code": c, "when": w, "started": s} for c, w, s in rows],
        }
    return responses


# --------------------------------------------------------------------------------------------
# Components and paths


def _components() -> Schema:
    operations = sorted(p.OPERATIONS)
    schemas: Schema = {}
    for kind, build in (("Request", request_schema), ("Result", result_schema)):
        for operation in operations:
            schemas[_title(operation, kind)] = build(operation)
        schemas["Execute" + kind] = {
            "oneOf": [{"$ref": _REF + _title(op, kind)} for op in operations],
            "discriminator": {
                "propertyName": "operation",
                "mapping": {op: _REF + _title(op, kind) for op in operations},
            },
        }
    schemas["Error"] = {
        **_error_body([]),
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
            "retry_after_seconds": _integer(1),
        },
    }
    schemas["CancelState"] = {
        "type": "object",
        "required": ["state"],
        "additionalProperties": False,
        "properties": {"state": {"type": "string", "enum": ["cancelled", "running", "finished"]}},
    }
    schemas["WorkerRegistration"] = {
        "type": "object",
        "required": ["workerId", "workspaces", "slots"],
        "additionalProperties": False,
        "properties": {
            "workerId": _string("workerId", description="The token's own worker id."),
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
                        "workspaceId": _string("workspaceId"),
                        "operations": {
                            "type": "array",
                            "minItems": 1,
                            "maxItems": len(operations),
                            "items": {"type": "string", "enum": operations},
                        },
                        "linkedWorktreeLanes": {**_BOOLEAN, "default": False},
                    },
                },
            },
            "slots": _integer(1, MAX_SLOTS),
        },
    }
    schemas["Incarnation"] = {
        "type": "object",
        "required": ["workerId", "incarnationId"],
        "additionalProperties": False,
        "properties": {
            "workerId": _string("workerId"),
            "incarnationId": _string("incarnationId"),
        },
    }
    schemas["Registered"] = {
        "type": "object",
        "required": ["incarnationId", "slots", "queue"],
        "additionalProperties": False,
        "properties": {
            "incarnationId": _string("incarnationId"),
            "slots": _integer(1, MAX_SLOTS),
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
        "200": {"description": "Done.", "content": _json(ok)},
        "400": _typed(
            "INVALID_REQUEST: the body breaks the schema, or is not JSON.", ["INVALID_REQUEST"]
        ),
        "401": _typed("UNAUTHENTICATED", ["UNAUTHENTICATED"], headers=_WWW_AUTHENTICATE),
        "403": _typed("FORBIDDEN: the token belongs to another worker.", ["FORBIDDEN"]),
        "415": _typed("UNSUPPORTED_MEDIA_TYPE", ["UNSUPPORTED_MEDIA_TYPE"]),
    }
    if operation_id == "heartbeatWorker":
        responses["409"] = _typed(
            "WORKER_SUPERSEDED: this incarnation was replaced or expired.", ["WORKER_SUPERSEDED"]
        )
    return {
        "post": {
            "operationId": operation_id,
            "tags": ["workers"],
            "summary": summary,
            "security": [{"workerToken": []}],
            "requestBody": {"required": True, "content": _json({"$ref": _REF + body})},
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
                    "content": _json({"$ref": _REF + "ExecuteRequest"}),
                },
                "responses": _execute_responses(),
            }
        },
        "/v1/workspace-tools/requests/{requestId}": {
            "delete": {
                "operationId": "cancelRequest",
                "tags": ["workspace-tools"],
                "summary": "Cancel a waiting call by its request id (same principal only).",
                "description": "A waiting call is removed and answers 409 REQUEST_CANCELLED; a "
                "running or finished call is untouched.",
                "security": [{"apiKey": []}],
                "parameters": [
                    {
                        "name": "requestId",
                        "in": "path",
                        "required": True,
                        "schema": _string("requestId"),
                    }
                ],
                "responses": {
                    "200": {
                        "description": "The call's state.",
                        "content": _json({"$ref": _REF + "CancelState"}),
                    },
                    "401": _typed("UNAUTHENTICATED", ["UNAUTHENTICATED"]),
                    "404": _typed(
                        "REQUEST_NOT_FOUND: unknown id, malformed id, or another principal's call.",
                        ["REQUEST_NOT_FOUND"],
                    ),
                    "503": _typed("ADMISSION_UNAVAILABLE", ["ADMISSION_UNAVAILABLE"]),
                },
            }
        },
        "/v1/workers/register": _worker_operation(
            "Register a worker: a new incarnation.",
            "WorkerRegistration",
            {"$ref": _REF + "Registered"},
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
            _ok_object(ok={"type": "boolean", "const": True}, offline=_integer(0)),
            "deregisterWorker",
        ),
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "tags": ["operations"],
                "summary": "Postgres and Redis reachability.",
                "security": [],
                "responses": {
                    "200": {
                        "description": "Both answer.",
                        "content": _json({"$ref": _REF + "Health"}),
                    },
                    "503": {
                        "description": "One is down.",
                        "content": _json({"$ref": _REF + "Health"}),
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
                    "200": {"description": "OpenAPI 3.1", "content": _json({"type": "object"})}
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
            {"name": "operations", "description": "Health and metrics."},
            {"name": "schema", "description": "This document."},
        ],
        "paths": _paths(),
        "components": _components(),
    }


# --------------------------------------------------------------------------------------------
# The two views. Public, no authentication: the document holds no secret and no tenant data.


def _only_get(request: HttpRequest) -> JsonResponse | None:
    if request.method in ("GET", "HEAD"):
        return None
    response = JsonResponse({"error": "Use GET.", "code": "METHOD_NOT_ALLOWED"}, status=405)
    response["Allow"] = "GET, HEAD"
    return response


def schema_view(request: HttpRequest) -> HttpResponse:
    return _only_get(request) or JsonResponse(openapi_document())


def schema_docs_view(request: HttpRequest) -> HttpResponse:
    return _only_get(request) or render(request, "schema/docs.html", docs_context())


_REF_IN_HTML = re.compile(r"&quot;#/components/schemas/(\w+)&quot;")


def _pretty(schema: Any) -> str:
    """Indented JSON, HTML-escaped, with each $ref turned into a link to its schema."""
    text = html.escape(json.dumps(schema, indent=2))
    return _REF_IN_HTML.sub(r'&quot;<a href="#schema-\1">#/components/schemas/\1</a>&quot;', text)


def _constraints(schema: Schema) -> str:
    if "$ref" in schema:
        return schema["$ref"].removeprefix(_REF)
    parts = [str(schema.get("type", "any"))]
    for key in ("const", "enum", "pattern"):
        if key in schema:
            parts.append(f"{key} {json.dumps(schema[key])}")
    for key, label in (
        ("minimum", ">="),
        ("maximum", "<="),
        ("minLength", "chars >="),
        ("maxLength", "chars <="),
        ("x-maxUtf8Bytes", "UTF-8 bytes <="),
        ("minItems", "items >="),
        ("maxItems", "items <="),
    ):
        if key in schema:
            parts.append(f"{label} {schema[key]}")
    if isinstance(schema.get("items"), dict):
        parts.append(f"of {_constraints(schema['items'])}")
    return ", ".join(parts)


def _fields(schema: Schema) -> list[dict[str, str]]:
    required = set(schema.get("required", []))
    return [
        {
            "name": name,
            "presence": "required"
            if name in required
            else f"default {json.dumps(field['default'])}"
            if "default" in field
            else "optional",
            "constraints": _constraints(field),
            "description": field.get("description", ""),
        }
        for name, field in schema.get("properties", {}).items()
    ]


def _response_rows(operation: Schema) -> list[dict[str, Any]]:
    rows = []
    for status, response in operation["responses"].items():
        media, content = next(iter(response.get("content", {"": {"schema": {}}}).items()))
        rows.append(
            {
                "status": status,
                "description": response["description"],
                "media": media,
                "codes": response.get("x-codes", []),
                "headers": [
                    {
                        "name": name,
                        "description": header.get("description", ""),
                        "pattern": header["schema"].get("pattern", header["schema"].get("const")),
                    }
                    for name, header in response.get("headers", {}).items()
                ],
                "schema": _pretty(content["schema"]),
            }
        )
    return rows


@functools.cache
def docs_context() -> dict[str, Any]:
    document = openapi_document()
    endpoints = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            endpoints.append(
                {
                    "id": operation["operationId"],
                    "method": method.upper(),
                    "path": path,
                    "summary": operation["summary"],
                    "description": operation.get("description", ""),
                    "security": [" + ".join(each) or "none" for each in operation["security"]]
                    or ["none"],
                    "parameters": [
                        {**param, "constraints": _constraints(param["schema"])}
                        for param in operation.get("parameters", [])
                    ],
                    "body": _pretty(body["schema"]) if body else "",
                    "responses": _response_rows(operation),
                }
            )
    schemas = [
        {"name": name, "fields": _fields(schema), "json": _pretty(schema)}
        for name, schema in document["components"]["schemas"].items()
    ]
    return {
        "info": document["info"],
        "version": document["openapi"],
        "endpoints": endpoints,
        "schemas": schemas,
    }
