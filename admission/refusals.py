"""Typed refusals: every way a call can end other than with the worker's result.

Services raise these and never speak HTTP; the API edge (`api/errors.py`) holds the one table
that turns a refusal's code into a status and headers. A refusal says what the caller may
conclude: `started` is False when the call certainly never reached a worker (safe to resend),
None when it may have run, True when the worker itself answered. `admission_outcome` is what
the completion row records for it, when the refusal decides that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Refusal(Exception):
    code: str
    message: str
    started: bool | None = False
    retry_after_s: int | None = None
    admission_outcome: str | None = None
    # Answer headers the protocol defines for this refusal (the rate limit's budget fields).
    headers: dict[str, str] = field(default_factory=dict)
    # A body the protocol shapes differently from {"error", "code"} (the rate limit's).
    body: dict[str, Any] | None = None
    # Until then (time.monotonic()) the same call from the same caller would get this same
    # answer, word for word: an API process may give it from memory (api/execute/burst.py).
    holds_until: float | None = None
    # An operator ended the call (a cancel), not its client or the service.
    by_operator: bool = False

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


NOT_STARTED = "the operation was not started"


def worker_not_found(worker_id: str) -> Refusal:
    return Refusal("WORKER_NOT_FOUND", f"Worker {worker_id} was not found.")


def worker_id_taken(worker_id: str) -> Refusal:
    return Refusal(
        "WORKER_ID_TAKEN",
        f"Worker id {worker_id} cannot be paired; the code is spent. Pair again with another id.",
    )


def pairing_code_unknown() -> Refusal:
    return Refusal("PAIRING_CODE_UNKNOWN", "This pairing code is unknown (or was revoked).")


def pairing_code_used() -> Refusal:
    return Refusal(
        "PAIRING_CODE_USED",
        "This pairing code was already used; create a new one. If you did not use it, "
        "revoke the worker.",
    )


def pairing_code_expired() -> Refusal:
    return Refusal("PAIRING_CODE_EXPIRED", "This pairing code has expired; create a new one.")


def no_worker_selected() -> Refusal:
    return Refusal(
        "NO_WORKER_SELECTED",
        f"No worker was named and the tenant has no default worker; {NOT_STARTED}.",
    )


def worker_offline(worker_id: str) -> Refusal:
    return Refusal("WORKER_OFFLINE", f"Worker {worker_id} is offline; {NOT_STARTED}.")


def worker_mismatch(reason: str) -> Refusal:
    return Refusal("WORKER_MISMATCH", f"{reason}; {NOT_STARTED}.")


def quarantined() -> Refusal:
    return Refusal(
        "WORKSPACE_QUARANTINED",
        "This workspace is quarantined after a mutation with an unknown outcome; an operator "
        f"must release it in the admin. {NOT_STARTED.capitalize()}.",
    )


def request_id_taken() -> Refusal:
    return Refusal(
        "INVALID_REQUEST_ID", "This request id already names another call; it was not started."
    )


def queue_full(
    worker_id: str, held: int, *, retry_after_s: int = 1, holds_until: float | None = None
) -> Refusal:
    """`retry_after_s`: when a place is likely (admission/backlog.py); a quick retry unless
    the queue was read."""
    return Refusal(
        "WORKER_QUEUE_FULL",
        f"Worker {worker_id} already holds {held} calls; {NOT_STARTED}. "
        "Slow down or use another worker.",
        retry_after_s=retry_after_s,
        admission_outcome="queue_full",
        holds_until=holds_until,
    )


def flow_share_taken(worker_id: str) -> Refusal:
    """A waiting call removed to keep its flow within its share of the worker's queue, as
    another flow arrived: it was never started."""
    return Refusal(
        "WORKER_QUEUE_FULL",
        f"Worker {worker_id}'s queue is shared with other principals, and your calls held "
        f"more than your share of it; {NOT_STARTED}. Slow down or use another worker.",
        admission_outcome="queue_full",
    )


def queue_timeout(retry_after_s: int) -> Refusal:
    return Refusal(
        "WORKSPACE_QUEUE_TIMEOUT",
        "The worker's queue did not admit the call within its queue budget; "
        f"{NOT_STARTED}. Retry after the hinted wait, or use an independent workspace.",
        retry_after_s=retry_after_s,
        admission_outcome="queue_timeout",
    )


def request_cancelled(*, by_operator: bool = False) -> Refusal:
    """`by_operator`: an operator cancelled it (manage.py cancel_call, the dashboard), not its
    own client; the answer is the same, only its words and its completion row say so."""
    who = "An operator cancelled the call" if by_operator else "The call was cancelled"
    return Refusal(
        "REQUEST_CANCELLED",
        f"{who} while it waited; it was not started.",
        admission_outcome="cancelled",
        by_operator=by_operator,
    )


def shutting_down(*, waited: bool = False) -> Refusal:
    """`waited`: the call was in its queue, and the shutdown took it out."""
    return Refusal(
        "SERVICE_SHUTTING_DOWN",
        f"This API process is shutting down; {NOT_STARTED}. Send it again.",
        retry_after_s=1,
        admission_outcome="cancelled" if waited else None,
    )


def rate_limited(
    *, message: str, headers: dict[str, str], body: dict[str, Any], holds_until: float | None
) -> Refusal:
    return Refusal(
        "RATE_LIMITED",
        message,
        admission_outcome="rate_limited",
        headers=headers,
        body=body,
        holds_until=holds_until,
    )


def key_revoked() -> Refusal:
    """The caller's key was revoked (or its principal disabled) while its call waited."""
    return Refusal(
        "UNAUTHENTICATED",
        f"The API key was revoked while the call waited; {NOT_STARTED}.",
    )


def worker_token_refused(*, given: bool) -> Refusal:
    """A worker's own 401: its token names no worker, typically after a rotation or revocation."""
    if not given:
        return Refusal(
            "UNAUTHENTICATED", "A worker token is required (Authorization: Bearer <token>)."
        )
    return Refusal(
        "UNAUTHENTICATED",
        "This worker token is not valid: it was rotated or revoked (or never issued). Start the "
        "worker with its current token, or issue a new one (bootstrap --rotate-worker-token, "
        "the admin's Rotate token, or pair again).",
    )


def service_overloaded(retry_after_s: int = 1) -> Refusal:
    """This API process, or this credential's share of it, already carries as many calls as
    it may; another may not."""
    return Refusal(
        "SERVICE_OVERLOADED",
        f"This API process is at its limit of calls in flight (for all callers, or for this "
        f"key); {NOT_STARTED}. "
        "Retry after the hinted wait.",
        retry_after_s=retry_after_s,
    )


def admission_unavailable() -> Refusal:
    return Refusal(
        "ADMISSION_UNAVAILABLE",
        f"Admission is unavailable right now; {NOT_STARTED}.",
    )


def database_unavailable(*, started: bool | None) -> Refusal:
    """Postgres is away: a retryable answer. Only a call never dispatched says "not started"."""
    what = NOT_STARTED if started is False else "the operation may have run"
    return Refusal(
        "DATABASE_UNAVAILABLE",
        f"The service's database is unavailable; {what}.",
        started=started,
        retry_after_s=5,
    )


def assignment_expired(message: str | None = None) -> Refusal:
    return Refusal(
        "ASSIGNMENT_EXPIRED",
        message
        or "The worker did not answer before the call's execution deadline; the operation may "
        "or may not have run. Check the workspace before resending.",
        started=None,
    )


def result_invalid(what: str) -> Refusal:
    return Refusal(
        "RESULT_INVALID",
        f"The worker's {what} broke the protocol and was not forwarded; the operation may have run.",
        started=None,
    )


def worker_refused(code: str, message: str) -> Refusal:
    """The worker ran (or refused) the call and answered with one of its own codes."""
    return Refusal(code, message, started=True)
