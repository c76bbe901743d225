"""What durable-request answers mean (contract §2.7): the capability probe, a request's
status, and the error a `failed` status stands for. Pure functions, shared by both clients.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from sluice_protocol import worker_error_status

from sluice_client.errors import WorkspaceToolError, may_have_run_message, rejected_message
from sluice_client.responses import RawResponse, Rejection, classify, json_object

CAPABILITIES_PATH = "/v1/workspace-tools/capabilities"
SUBMIT_PATH = "/v1/workspace-tools/requests"
# LibreChat's default; a status carries no interval hint, so the client picks one.
DEFAULT_POLL_INTERVAL_MS = 500
MIN_POLL_INTERVAL_MS = 100
MAX_POLL_INTERVAL_MS = 30_000
# Each durable HTTP request only asks or tells; none waits for the operation, so a short
# ceiling keeps every one of them far below a proxy's cut (~100 s).
TRANSPORT_TIMEOUT_MS = 10_000
# How long a cancel waits to learn whether Sluice dropped its in-flight call unstarted.
WITHDRAW_TIMEOUT_MS = 2_000

DurableMode = bool | Literal["auto"]
States = Literal["queued", "admitted", "completed", "failed", "cancelled"]
_STATES = frozenset({"queued", "admitted", "completed", "failed", "cancelled"})

# The synchronous endpoint's status for each code Sluice itself answers with (§2.5), so that a
# `failed` status raises exactly the error that endpoint's answer would have. Codes a worker
# may send come from `worker_error_status`, which is asked first: `INVALID_REQUEST` after
# acceptance is the worker's 422, the 400 one is refused before a request is ever accepted.
_SERVICE_STATUS: dict[str, int] = {
    "INVALID_WORKSPACE_TOOL_REQUEST": 400,
    "INVALID_WORKSPACE_QUEUE_WAIT": 400,
    "INVALID_WORKER_ID": 400,
    "INVALID_REQUEST_ID": 400,
    "INVALID_REQUEST": 400,
    "UNAUTHENTICATED": 401,
    # A durable call's key was revoked while it waited (its status says so in a code
    # LibreChat's durable client maps).
    "WORKER_UNAUTHORIZED": 403,
    "WORKER_NOT_FOUND": 404,
    "WORKER_MISMATCH": 409,
    "WORKSPACE_QUARANTINED": 409,
    "REQUEST_CANCELLED": 409,
    "REQUEST_TOO_LARGE": 413,
    "UNSUPPORTED_MEDIA_TYPE": 415,
    "WORKER_QUEUE_FULL": 429,
    "RESULT_INVALID": 502,
    "WORKSPACE_QUEUE_TIMEOUT": 503,
    "WORKER_OFFLINE": 503,
    "NO_WORKER_SELECTED": 503,
    "SERVICE_SHUTTING_DOWN": 503,
    "ASSIGNMENT_EXPIRED": 504,
}


def check_durable_mode(value: object) -> DurableMode:
    if value is True or value is False or value == "auto":
        return value
    raise ValueError(f'durable must be True, False or "auto", got {value!r}')


def check_poll_interval_ms(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("poll_interval_ms must be an integer number of milliseconds")
    if not MIN_POLL_INTERVAL_MS <= value <= MAX_POLL_INTERVAL_MS:
        raise ValueError(
            f"poll_interval_ms must be {MIN_POLL_INTERVAL_MS}..{MAX_POLL_INTERVAL_MS}, got {value}"
        )
    return value


# -- the capability probe ---------------------------------------------------------------------


def probe_outcome(
    response: RawResponse, *, wall_now_s: float, request_id: str
) -> bool | WorkspaceToolError:
    """Whether Sluice offers durable requests; an error when its answer cannot tell.

    Only an explicit answer falls back (404, or version 0). Anything else fails closed rather
    than quietly sending the call down the synchronous path, as LibreChat does. Nothing has
    been submitted yet, so every failure here is "not started".
    """
    if response.status == 404:
        return False
    if response.status == 200:
        payload = json_object(response)
        version: object = payload.get("durableWorkspaceRequests") if payload is not None else None
        if version in (0, 1) and not isinstance(version, bool):
            return version == 1
        what = "a capabilities answer without durableWorkspaceRequests 0 or 1"
    else:
        outcome = classify(response, wall_now_s=wall_now_s, request_id=request_id)
        if isinstance(outcome, Rejection):
            return WorkspaceToolError(
                rejected_message(
                    status=outcome.status,
                    code=outcome.code,
                    attempts=0,
                    why_stopped=None,
                    retry_after_ms=outcome.hint_ms,
                ),
                reason="rejected",
                not_started=True,
                status=outcome.status,
                code=outcome.code,
                body=outcome.body,
                request_id=request_id,
            )
        what = f"HTTP {response.status}"
    return WorkspaceToolError(
        f"Could not learn whether Sluice offers durable requests ({what}); nothing was submitted.",
        reason="failed",
        not_started=True,
        status=response.status,
        body=response.body,
        truncated=response.truncated,
        request_id=request_id,
    )


def probe_transport_error(exc: Exception, request_id: str) -> WorkspaceToolError:
    return WorkspaceToolError(
        f"Could not ask Sluice whether it offers durable requests ({type(exc).__name__}: "
        f"{exc}); nothing was submitted.",
        reason="failed",
        not_started=True,
        request_id=request_id,
    )


def cancelled_before_submit(request_id: str, *, attempts: int = 0) -> WorkspaceToolError:
    return WorkspaceToolError(
        "The call was cancelled before it was submitted; nothing was sent.",
        reason="cancelled",
        not_started=True,
        request_id=request_id,
        attempts=attempts,
    )


def not_offered_error(request_id: str) -> WorkspaceToolError:
    return WorkspaceToolError(
        "This Sluice does not offer durable requests, and durable=True does not fall back to "
        'the synchronous endpoint; nothing was sent. Use durable="auto" to fall back.',
        reason="invalid",
        not_started=True,
        request_id=request_id,
    )


# -- statuses ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Status:
    state: States
    result: object  # None unless completed
    has_result: bool
    code: str | None  # only when failed
    message: str


def parse_status(response: RawResponse, request_id: str) -> Status | None:
    """A status for *this* request, or None: another id's status is as bad as garbage."""
    payload = json_object(response)
    if payload is None or payload.get("requestId") != request_id:
        return None
    state = payload.get("state")
    if state not in _STATES:
        return None
    error = payload.get("error")
    code: str | None = None
    message = ""
    if error is not None:
        if not isinstance(error, dict) or not isinstance(error.get("code"), str):
            return None
        code = error["code"]
        message = error["message"] if isinstance(error.get("message"), str) else ""
    return Status(
        state=state,
        result=payload.get("result"),
        has_result="result" in payload,
        code=code,
        message=message,
    )


def failure_error(
    code: str | None, message: str, *, request_id: str, attempts: int
) -> WorkspaceToolError:
    """The error a `failed` status raises: the one the synchronous answer would have raised.

    The status is rebuilt from the code and classified by the same rules as a synchronous
    answer, so `reason`, `status`, `code` and `not_started` agree. A typed "not started"
    failure is final here: the submission already waited its whole queue allowance.
    """
    status = None if code is None else worker_error_status(code) or _SERVICE_STATUS.get(code)
    if code is None or status is None:
        what = "Sluice reported the durable request failed" + (
            f" with code {code}" if code else " without a code"
        )
        return WorkspaceToolError(
            may_have_run_message(what),
            reason="failed",
            not_started=False,
            code=code,
            request_id=request_id,
            attempts=attempts,
        )
    body = json.dumps({"error": message, "code": code}, ensure_ascii=False).encode("utf-8")
    synthetic = RawResponse(status=status, headers={}, body=body, truncated=False)
    outcome = classify(synthetic, wall_now_s=0.0, request_id=request_id)
    if isinstance(outcome, Rejection):
        return WorkspaceToolError(
            rejected_message(
                status=status,
                code=code,
                attempts=attempts,
                why_stopped="a durable request's failure is final" if outcome.kind else None,
                retry_after_ms=None,
            ),
            reason="rejected",
            not_started=True,
            status=status,
            code=code,
            body=body,
            request_id=request_id,
            attempts=attempts,
        )
    if isinstance(outcome, WorkspaceToolError):
        outcome.attempts = attempts
        return outcome
    raise AssertionError("a synthetic error status never classifies as a result")
