"""The execute endpoint's answers: typed errors per status (contract §2.5), the headers of §3."""

from __future__ import annotations

from typing import Any

import sluice_protocol as p

from admission.ratelimit import POLICY_NAME
from api.schema.bodies import Schema
from api.schema.patterns import PATTERNS

REF = "#/components/schemas/"

# (status, code, when, started?) of the codes the API itself answers with: contract §2.5's
# table, plus the service codes it answers that the table leaves implicit. The worker's codes
# come from the protocol (WORKER_ERROR_STATUS and the *_UNAVAILABLE / *_TIMEOUT patterns).
EXECUTE_SERVICE_CODES: list[tuple[int, str, str, str]] = [
    (400, "INVALID_WORKSPACE_TOOL_REQUEST", "the body breaks §2.2", "no"),
    (400, "INVALID_WORKSPACE_QUEUE_WAIT", "queue-wait header malformed or over 300000", "no"),
    (400, "INVALID_WORKER_ID", "worker-id header malformed", "no"),
    (400, "INVALID_REQUEST_ID", "request-id header malformed, or it names another call", "no"),
    (400, "INVALID_REQUEST", "the body is not JSON", "no"),
    (401, "UNAUTHENTICATED", "missing or unknown API key", "no"),
    (404, "WORKER_NOT_FOUND", "unknown worker, or another tenant's", "no"),
    (
        409,
        "WORKER_MISMATCH",
        "workspace, operation, lane, edit feature or instruction file not offered",
        "no",
    ),
    (409, "WORKSPACE_QUARANTINED", "the isolation key is quarantined", "no"),
    (409, "REQUEST_CANCELLED", "cancelled by DELETE while it waited", "no"),
    (413, "REQUEST_TOO_LARGE", "body over the limit", "no"),
    (415, "UNSUPPORTED_MEDIA_TYPE", "body is not application/json", "no"),
    (429, "WORKER_QUEUE_FULL", "the worker's queue is full", "no"),
    (503, "WORKSPACE_QUEUE_TIMEOUT", "not admitted within the queue budget (Retry-After)", "no"),
    (503, "WORKER_OFFLINE", "worker offline, restarted or replaced", "no"),
    (503, "NO_WORKER_SELECTED", "no worker header and no default worker", "no"),
    (503, "SERVICE_SHUTTING_DOWN", "the API process is stopping", "no"),
    (503, "SERVICE_OVERLOADED", "the API process carries its limit of calls (Retry-After)", "no"),
    (503, "ADMISSION_UNAVAILABLE", "admission Redis unavailable", "no"),
    (503, "DATABASE_UNAVAILABLE", "Postgres unavailable (Retry-After)", "no, unless it ran"),
    (504, "ASSIGNMENT_EXPIRED", "exec deadline passed, or the worker vanished", "unknown"),
    (502, "RESULT_INVALID", "the worker's answer broke §2.2", "unknown"),
]
# The §3 refusal has a body of its own (RateLimited), not a code: {"error": "rate_limited", ...}.
RATE_LIMITED_WHEN = "principal over its rate (§3: RateLimited body, Retry-After, RateLimit-*)"
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


def error_body(codes: list[str], patterns: list[str] | None = None) -> Schema:
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
    "RateLimit-Reset": _header(
        "count",
        "Whole seconds until more units are available: until the bucket is full again on an "
        "allowed call, until this call would pass (= Retry-After) on a 429.",
    ),
    "RateLimit-Policy": {
        "description": "IETF draft policy field.",
        "schema": {"type": "string", "pattern": f'^"{POLICY_NAME}";q=[0-9]+;w=[0-9]+$'},
    },
    "RateLimit": {
        "description": "IETF draft limit field.",
        "schema": {"type": "string", "pattern": f'^"{POLICY_NAME}";r=[0-9]+;t=[0-9]+$'},
    },
}
WWW_AUTHENTICATE = {"WWW-Authenticate": {"schema": {"type": "string", "const": "Bearer"}}}


def json_content(schema: Schema) -> Schema:
    return {"application/json": {"schema": schema}}


def typed(description: str, codes: list[str], **extra: Any) -> Schema:
    return {"description": description, "content": json_content(error_body(codes)), **extra}


def execute_responses() -> Schema:
    responses: Schema = {
        "200": {
            "description": "The worker's result. A command past its own timeout is a result "
            "(`timedOut: true`), not an error.",
            "headers": _BUDGET_HEADERS,
            "content": json_content({"$ref": REF + "ExecuteResult"}),
        }
    }
    for status, rows in execute_error_codes().items():
        codes = [code for code, _, _ in rows if not code.startswith("^")]
        patterns = [code for code, _, _ in rows if code.startswith("^")]
        body: Schema = error_body(codes, patterns)
        headers: Schema = dict(_BUDGET_HEADERS)
        if status == 429:
            body = {"oneOf": [body, {"$ref": REF + "RateLimited"}]}
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
            "content": json_content(body),
            "x-codes": [{"code": c, "when": w, "started": s} for c, w, s in rows]
            + (
                [{"code": "rate_limited", "when": RATE_LIMITED_WHEN, "started": "no"}]
                if status == 429
                else []
            ),
        }
    return responses
