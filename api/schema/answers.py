"""Typed errors and headers of each route, generated from the one refusal table (api/errors.py).

A view names the refusal codes it can answer; `operation()` groups them by their status from
`api.errors.ANSWERS`, gives each status its `{"error", "code"}` body narrowed to its codes,
lists each code with its `when` and `started` (`x-codes`), and adds Retry-After where a code of
that status carries it, WWW-Authenticate on 401, and the rate-limit budget headers of §3 where
the route is rate limited. Nothing here repeats a status.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sluice_protocol as p
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse

from admission.ratelimit import POLICY_NAME
from api.errors import ANSWERS, WORKER_ANSWER, WORKER_ANSWERS
from api.schema.bodies import Schema
from api.schema.components import component
from api.schema.patterns import PATTERNS
from api.schema.texts import TEXTS

REF = "#/components/schemas/"
RATE_LIMITED = "RATE_LIMITED"
# The worker's codes that the protocol names by pattern, not one by one.
WORKER_CODE_PATTERNS = {503: PATTERNS["unavailable"], 504: PATTERNS["timeout"]}

RateLimited = component(
    "RateLimited",
    {
        "type": "object",
        "required": ["error", "message", "retry_after_seconds"],
        "additionalProperties": False,
        "description": "The §3 rate-limit refusal: a body of its own, not a code.",
        "properties": {
            "error": {"type": "string", "const": "rate_limited"},
            "message": {"type": "string", "pattern": " retry in [0-9]+ seconds\\.$"},
            "retry_after_seconds": {"type": "integer", "minimum": 1},
        },
    },
)


def _string(pattern: str) -> Schema:
    return {"type": "string", "pattern": PATTERNS[pattern]}


# §3: on every answer of a rate-limited route once the call passed the limiter.
BUDGET_HEADERS: dict[str, tuple[Schema, str]] = {
    "RateLimit-Limit": (_string("count"), "Units per window (§3); absent while limiting is off."),
    "RateLimit-Remaining": (_string("count"), "Units left now; 0 on a rate-limit refusal."),
    "RateLimit-Reset": (
        _string("count"),
        "Whole seconds until more units are available: until the bucket is full again on an "
        "allowed call, until this call would pass (= Retry-After) on a 429.",
    ),
    "RateLimit-Policy": (
        {"type": "string", "pattern": f'^"{POLICY_NAME}";q=[0-9]+;w=[0-9]+$'},
        "IETF draft policy field.",
    ),
    "RateLimit": (
        {"type": "string", "pattern": f'^"{POLICY_NAME}";r=[0-9]+;t=[0-9]+$'},
        "IETF draft limit field.",
    ),
}
RETRY_AFTER = "Retry-After"
WWW_AUTHENTICATE = "WWW-Authenticate"


def worker_codes() -> dict[int, list[str]]:
    """status -> the worker's own codes (§2.5): the protocol's table, then its patterns."""
    table: dict[int, list[str]] = {}
    for code, status in sorted(p.WORKER_ERROR_STATUS.items()):
        table.setdefault(status, []).append(code)
    for status, pattern in WORKER_CODE_PATTERNS.items():
        table.setdefault(status, []).append(pattern)
    return table


def error_body(
    codes: Sequence[str], patterns: Sequence[str] = (), *, retry_hint: bool = False
) -> Schema:
    """`{"error", "code"}` and nothing else; `code` one of `codes` or matching a pattern.
    `retry_hint`: some of the codes repeat Retry-After in the body (`retry_after_seconds`)."""
    code: Schema = {"type": "string", "enum": list(codes)}
    if patterns:
        code = {"anyOf": [code, *({"type": "string", "pattern": x} for x in patterns)]}
    properties: Schema = {"error": {"type": "string"}, "code": code}
    if retry_hint:
        properties["retry_after_seconds"] = {
            "type": "integer",
            "minimum": 1,
            "description": "= Retry-After, on "
            + ", ".join(c for c in codes if c in ANSWERS and ANSWERS[c].retry_in_body)
            + ".",
        }
    return {
        "type": "object",
        "required": ["error", "code"],
        "additionalProperties": False,
        "properties": properties,
    }


def _code_rows(service: Iterable[str], worker: Iterable[str]) -> list[dict[str, str]]:
    # A worker's code may share a service code's name (INVALID_REQUEST, NOT_FOUND): its own
    # status and meaning are the worker's.
    rows = [(code, ANSWERS[code]) for code in service]
    rows += [(code, WORKER_ANSWERS.get(code, WORKER_ANSWER)) for code in worker]
    return [{"code": c, "when": a.when, "started": a.started} for c, a in rows]


def _refusal_response(status: int, service: list[str], worker: list[str]) -> OpenApiResponse:
    plain = [c for c in service if c != RATE_LIMITED]
    plain += [c for c in worker if c[0] != "^" and c not in plain]
    patterns = [c for c in worker if c[0] == "^"]
    hinted = any(ANSWERS[c].retry_in_body for c in service)
    body = error_body(plain, patterns, retry_hint=hinted)
    if RATE_LIMITED in service:
        body = {"oneOf": [body, {"$ref": REF + "RateLimited"}]} if plain else RateLimited.schema
    body = {**body, "x-codes": _code_rows(service, worker)}
    return OpenApiResponse(response=body, description="; ".join(service + worker))


def _header(
    name: str, schema: Schema, description: str, statuses: Iterable[int]
) -> OpenApiParameter:
    return OpenApiParameter(
        name,
        type=schema,
        location=OpenApiParameter.HEADER,
        description=description,
        response=sorted(statuses),
    )


def refusals(
    codes: Iterable[str], *, worker: bool = False, budget: bool = False, ok: int = 200
) -> tuple[dict[int, OpenApiResponse], list[OpenApiParameter]]:
    """The responses and response headers of a route that answers `ok` or one of `codes`
    (and, with `worker`, the worker's own codes)."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(ANSWERS[code].status, []).append(code)
    from_worker = worker_codes() if worker else {}
    statuses = sorted(set(by_status) | set(from_worker))
    responses = {
        status: _refusal_response(status, by_status.get(status, []), from_worker.get(status, []))
        for status in statuses
    }
    headers: list[OpenApiParameter] = []
    for status in statuses:
        retry = [c for c in by_status.get(status, []) if ANSWERS[c].retry_after]
        if retry:
            headers.append(
                _header(
                    RETRY_AFTER,
                    _string("seconds"),
                    "Whole seconds (>= 1) to wait before retrying; on " + ", ".join(retry) + ".",
                    [status],
                )
            )
    if 401 in by_status:
        headers.append(
            _header(WWW_AUTHENTICATE, {"type": "string", "const": "Bearer"}, "Bearer", [401])
        )
    if budget:
        # The limiter has run on every answer but those refused before it (401).
        on = [ok, *(s for s in statuses if s != 401)]
        headers += [_header(n, s, d, on) for n, (s, d) in BUDGET_HEADERS.items()]
    return responses, headers


def operation(
    operation_id: str,
    *,
    ok: tuple[int, Any],
    codes: Iterable[str] = (),
    request: Any = None,
    parameters: Sequence[OpenApiParameter] = (),
    worker: bool = False,
    budget: bool = False,
    media: str = "application/json",
) -> dict[str, Any]:
    """The `extend_schema` arguments of one operation: its text and example (api/schema/
    texts.py), its request body, its success answer and every refusal it can answer."""
    text = TEXTS[operation_id]
    status, body = ok
    responses, headers = refusals(codes, worker=worker, budget=budget, ok=status)
    examples = []
    if "request" in text:
        examples.append(OpenApiExample("request", value=text["request"], request_only=True))
    examples.append(
        OpenApiExample(
            "answer",
            value=text["answer"],
            response_only=True,
            status_codes=[str(status)],
            media_type=media,
        )
    )
    return {
        "operation_id": operation_id,
        "summary": text["summary"],
        "description": text.get("description", ""),
        "tags": [text["tag"]],
        "request": request,
        "parameters": [*parameters, *headers],
        "responses": {
            (status, media): OpenApiResponse(response=body, description=text.get("ok", "Done.")),
            **responses,
        },
        "examples": examples,
    }


# ---------------------------------------------------------------------------------------------
# What the views' decorators name: parameters, and the refusal sets of the workspace routes.


def _request_header(name: str, pattern: str, description: str) -> OpenApiParameter:
    return OpenApiParameter(
        name, type=_string(pattern), location=OpenApiParameter.HEADER, description=description
    )


EXECUTE_HEADERS = [
    _request_header(
        "X-LibreChat-Code-Worker-ID",
        "workerId",
        "The worker that runs the call. Absent: the tenant's default worker. Malformed: "
        "400 INVALID_WORKER_ID.",
    ),
    _request_header(
        "X-LibreChat-Workspace-Queue-Wait-Ms",
        "queueWaitMs",
        f"Admission allowance, ms: ^[1-9][0-9]*$ and <= {p.MAX_QUEUE_WAIT_MS} "
        f"[{p.DEFAULT_QUEUE_WAIT_MS}], capped by WORKSPACE_QUEUE_CEILING_MS. Otherwise "
        "400 INVALID_WORKSPACE_QUEUE_WAIT.",
    ),
    _request_header(
        "X-LibreChat-Workspace-Request-Id",
        "requestId",
        "Names the call so DELETE /v1/workspace-tools/requests/{request_id} can cancel it "
        "while it waits. Malformed or already used: 400 INVALID_REQUEST_ID.",
    ),
]


def path_parameter(name: str, pattern: str, description: str = "") -> OpenApiParameter:
    return OpenApiParameter(
        name, type=_string(pattern), location=OpenApiParameter.PATH, description=description
    )


REQUEST_ID = path_parameter(
    "request_id", "requestId", "The call's X-LibreChat-Workspace-Request-Id."
)
WORKER_ID = path_parameter("worker_id", "workerId")

# Refused before the call can have reached a worker (all "not started").
_BEFORE_DISPATCH = [
    "INVALID_WORKSPACE_TOOL_REQUEST",
    "INVALID_WORKSPACE_QUEUE_WAIT",
    "INVALID_WORKER_ID",
    "INVALID_REQUEST_ID",
    "INVALID_REQUEST",
    "UNAUTHENTICATED",
    "WORKER_NOT_FOUND",
    "WORKER_MISMATCH",
    "WORKSPACE_QUARANTINED",
    "REQUEST_CANCELLED",
    "REQUEST_TOO_LARGE",
    "REQUEST_BODY_TIMEOUT",
    "REQUEST_HEADERS_TOO_LARGE",
    "UNSUPPORTED_MEDIA_TYPE",
    "WORKER_QUEUE_FULL",
    RATE_LIMITED,
    "WORKSPACE_QUEUE_TIMEOUT",
    "WORKER_OFFLINE",
    "NO_WORKER_SELECTED",
    "SERVICE_SHUTTING_DOWN",
    "SERVICE_OVERLOADED",
    "ADMISSION_UNAVAILABLE",
    "DATABASE_UNAVAILABLE",
]
EXECUTE_CODES = [*_BEFORE_DISPATCH, "ASSIGNMENT_EXPIRED", "RESULT_INVALID"]
# A durable call answers once queued; what happens after is in its status.
DURABLE_SUBMIT_CODES = [*_BEFORE_DISPATCH, "NOT_FOUND"]
BY_REQUEST_ID_CODES = ["UNAUTHENTICATED", "REQUEST_NOT_FOUND", "ADMISSION_UNAVAILABLE"]
