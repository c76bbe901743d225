"""The one exception a call raises, and the wording of its messages.

An agent reads `not_started` to decide whether a resend is safe. Only a typed rejection from
Sluice (reason `rejected`) says "The operation was not started" in its message; no other
message uses that phrase, so an agent that only reads text cannot be misled into a replay.
"""

from __future__ import annotations

import json
from typing import Any, Literal

Reason = Literal["rejected", "invalid", "timeout", "failed", "insufficient_time", "cancelled"]

MAX_ERROR_BODY_BYTES = 4096

NOT_STARTED_PHRASE = "The operation was not started"
MAY_HAVE_RUN_TAIL = " The operation may have run: check the workspace before resending."

# What an agent should do after each typed rejection. The keys are the codes of the contract's
# pre-enqueue rejections (the 429 rate limit has no code: its body says error "rate_limited").
REJECTION_ADVICE: dict[str, str] = {
    "WORKSPACE_QUEUE_TIMEOUT": (
        "the workspace stayed busy for the whole queue wait: wait and retry later, "
        "or pick an independent workspace"
    ),
    "WORKER_QUEUE_FULL": (
        "the worker's queue is full: wait and retry later, or pick an independent workspace "
        "on another worker"
    ),
    "rate_limited": "this principal is over its rate limit: slow down and retry later",
    "WORKER_OFFLINE": "the worker went offline or restarted: wait for it and retry",
    "SERVICE_SHUTTING_DOWN": "Sluice is restarting: wait and retry",
    "NO_WORKER_SELECTED": "pass a worker id, or ask an admin to set a default worker",
    "COMMAND_UNAVAILABLE": "the worker was too busy to start it in time: wait and retry",
    "EDIT_NOT_STARTED": (
        "the worker ran out of time matching the edits and wrote nothing: resend fewer or more "
        "specific edits"
    ),
    "UNAUTHENTICATED": "check the API key",
    "WORKER_UNAUTHORIZED": "the API key was revoked while the call waited: check the API key",
    "WORKER_NOT_FOUND": "check the worker id",
    "WORKER_MISMATCH": (
        "the worker does not offer this operation for this workspace: pick another worker "
        "or workspace"
    ),
    "WORKSPACE_QUARANTINED": (
        "an operator must release this workspace in Sluice admin first; meanwhile pick an "
        "independent workspace"
    ),
    "REQUEST_CANCELLED": "it was cancelled while it waited: resend it if it is still wanted",
}


class WorkspaceToolError(Exception):
    """A call that did not produce a result.

    `not_started` is True only when the operation is known not to have reached a worker, so
    resending it cannot run it twice. `body` holds at most 4096 bytes of the answer;
    `truncated` says the answer was longer or was cut off in transit.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: Reason,
        not_started: bool,
        status: int | None = None,
        code: str | None = None,
        body: bytes = b"",
        truncated: bool = False,
        request_id: str | None = None,
        attempts: int = 0,
    ) -> None:
        super().__init__(message)
        if len(body) > MAX_ERROR_BODY_BYTES:
            body, truncated = body[:MAX_ERROR_BODY_BYTES], True
        self.message = message
        self.reason: Reason = reason
        self.not_started = not_started
        self.status = status
        self.code = code
        self.body = body
        self.truncated = truncated
        self.request_id = request_id
        self.attempts = attempts

    @property
    def body_text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view, as the CLI prints it."""
        return {
            "error": self.message,
            "reason": self.reason,
            "not_started": self.not_started,
            "status": self.status,
            "code": self.code,
            "body": self.body_text,
            "truncated": self.truncated,
            "request_id": self.request_id,
            "attempts": self.attempts,
        }

    def __repr__(self) -> str:
        return (
            f"WorkspaceToolError(reason={self.reason!r}, status={self.status!r}, "
            f"code={self.code!r}, not_started={self.not_started!r})"
        )


def rejected_message(
    *, status: int, code: str, attempts: int, why_stopped: str | None, retry_after_ms: int | None
) -> str:
    advice = REJECTION_ADVICE.get(code, "check the request and retry")
    advice = advice[0].upper() + advice[1:]
    if code == "rate_limited" and retry_after_ms is not None:
        advice += f" (Sluice suggested {retry_after_ms / 1000:g} s)"
    tried = f" after {attempts} attempts" if attempts > 1 else ""
    stopped = f" Stopped retrying: {why_stopped}." if why_stopped else ""
    return (
        f"Sluice rejected the call with {code} (HTTP {status}){tried}. "
        f"{NOT_STARTED_PHRASE}. {advice}.{stopped}"
    )


def may_have_run_message(what: str) -> str:
    # Deliberately never says "not started": the outcome is unknown, so the caller must look
    # at the workspace before deciding to resend.
    return f"{what}.{MAY_HAVE_RUN_TAIL}"


# Worker answers that are a definite refusal: the worker checked the call and did nothing
# with the workspace (contract §2.5). Everything else that is not a typed Sluice rejection
# may have run.
WORKER_REFUSALS: dict[str, str] = {
    "NOT_FOUND": "no such file or directory in the workspace",
    "INVALID_PATH": "the path is outside the workspace or not allowed",
    "INVALID_REQUEST": "the worker found the request invalid",
    "READ_LIMIT_EXCEEDED": "the read is over the worker's size limit",
    "WRITE_DISABLED": "the worker does not allow writes in this workspace",
    "COMMAND_DISABLED": "the worker does not allow commands in this workspace",
    "EDIT_CONFLICT": "the file no longer matches what the edit expected; read it again",
    "FILE_EXISTS": "the file already exists",
    "WRITE_LIMIT_EXCEEDED": "the write is over the worker's size limit",
}


def worker_said(body: bytes) -> str | None:
    """The `error` text of a typed JSON body, or None."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    error = payload.get("error") if isinstance(payload, dict) else None
    return error if isinstance(error, str) and error else None


def describe(error: WorkspaceToolError) -> str:
    """The message a person reads (the CLI prints it): what Sluice or the worker said, and
    "may have run" only when the outcome is unknown.

    `error.message` itself stays as it is: agents read it, and it must never call an
    unknown outcome a refusal.
    """
    if not worker_refused(error):
        return error.message
    said = (worker_said(error.body) or WORKER_REFUSALS[error.code or ""]).rstrip(". ")
    return (
        f"The worker refused the call with {error.code} (HTTP {error.status}): {said}. "
        "It did not carry out the operation."
    )


def worker_refused(error: WorkspaceToolError) -> bool:
    """Whether the worker checked the call and did nothing with the workspace: the outcome is
    known, and resending the same call would be refused again."""
    return not error.not_started and error.code in WORKER_REFUSALS and not error.truncated
