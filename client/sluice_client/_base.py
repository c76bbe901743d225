"""What the sync and async clients share apart from the policy: settings, request
preparation, credentials and headers. No I/O happens here.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sluice_protocol import (
    PROTOCOL_VERSION,
    ProtocolError,
    validate_request,
    validate_request_id,
    validate_worker_id,
)

from sluice_client import __version__
from sluice_client.durable_answers import DurableMode, check_durable_mode
from sluice_client.errors import WorkspaceToolError
from sluice_client.policy import AttemptPlan, Budgets

EXECUTE_PATH = "/v1/workspace-tools/execute"
CANCEL_PATH = "/v1/workspace-tools/requests/{request_id}"
WORKER_HEADER = "X-LibreChat-Code-Worker-ID"
QUEUE_WAIT_HEADER = "X-LibreChat-Workspace-Queue-Wait-Ms"
REQUEST_ID_HEADER = "X-LibreChat-Workspace-Request-Id"

# A credential is a key, a ready headers dict, or something that mints either per attempt (a
# call can outlive a short-lived token). The async client also accepts a coroutine function.
Credentials = (
    str
    | Mapping[str, str]
    | Callable[[], str | Mapping[str, str]]
    | Callable[[], Awaitable[str | Mapping[str, str]]]
)


@dataclass(frozen=True)
class PreparedCall:
    """A validated request, serialized once: every attempt sends exactly these bytes."""

    request: dict[str, Any]
    body: bytes
    request_id: str
    budgets: Budgets


def new_request_id() -> str:
    # 24 URL-safe characters: inside the contract's [A-Za-z0-9_-]{16,128}.
    return secrets.token_urlsafe(18)


def check_credentials(api_key: object) -> None:
    if isinstance(api_key, str):
        if not api_key.strip():
            raise ValueError("api_key must not be empty")
    elif not isinstance(api_key, Mapping) and not callable(api_key):
        raise TypeError("api_key must be a str, a headers mapping, or a callable returning one")


def check_worker_id(worker_id: str | None) -> None:
    if worker_id is not None:
        try:
            validate_worker_id(worker_id)
        except ProtocolError as exc:
            raise ValueError(exc.message) from None


def prepare_call(
    request: Mapping[str, Any],
    *,
    budgets: Budgets,
    overrides: Mapping[str, Any],
    request_id: str | None,
) -> PreparedCall:
    """Rule 8: refuse a bad request before anything is sent."""
    try:
        call_budgets = budgets.with_overrides(overrides)
    except ValueError as exc:
        raise _invalid(str(exc), request_id) from None
    body = dict(request)
    body.setdefault("protocolVersion", PROTOCOL_VERSION)
    try:
        normalized = validate_request(body)
        if request_id is not None:
            validate_request_id(request_id)
    except ProtocolError as exc:
        raise _invalid(exc.message, request_id, code=exc.code) from None
    # The normalized form carries every default, so the server computes the same execution
    # reserve as the client did from it.
    encoded = json.dumps(normalized, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return PreparedCall(normalized, encoded, request_id or new_request_id(), call_budgets)


def _invalid(
    message: str, request_id: str | None, *, code: str | None = None
) -> WorkspaceToolError:
    return WorkspaceToolError(
        f"Invalid request, nothing was sent: {message}",
        reason="invalid",
        not_started=True,
        code=code,
        request_id=request_id,
    )


def credential_headers(minted: object) -> dict[str, str]:
    if isinstance(minted, str):
        return {"Authorization": f"Bearer {minted}"}
    if isinstance(minted, Mapping):
        return {str(name): str(value) for name, value in minted.items()}
    raise TypeError("credentials must be a key or a headers mapping")


def credential_failure(exc: Exception, request_id: str | None) -> WorkspaceToolError:
    return WorkspaceToolError(
        f"Could not get credentials for the call ({type(exc).__name__}: {exc}); nothing was sent.",
        reason="failed",
        not_started=True,
        request_id=request_id,
    )


def cancel_url(request_id: str) -> str:
    try:
        validate_request_id(request_id)  # it becomes a path segment
    except ProtocolError as exc:
        raise _invalid(exc.message, None, code=exc.code) from None
    return CANCEL_PATH.format(request_id=request_id)


def cancel_transport_error(exc: Exception, request_id: str) -> WorkspaceToolError:
    return WorkspaceToolError(
        f"Could not ask Sluice to cancel request {request_id} ({type(exc).__name__}: {exc}).",
        reason="failed",
        not_started=False,
        request_id=request_id,
    )


def attempt_headers(
    *, credentials: Mapping[str, str], worker_id: str | None, call: PreparedCall, plan: AttemptPlan
) -> dict[str, str]:
    headers = dict(credentials)
    # The protocol headers come last so a credentials mapping cannot override them.
    headers.update(
        {
            "Content-Type": "application/json",
            "Accept": "application/json",
            QUEUE_WAIT_HEADER: str(plan.queue_wait_ms),
            REQUEST_ID_HEADER: call.request_id,
        }
    )
    if worker_id is not None:
        headers[WORKER_HEADER] = worker_id
    return headers


def lookup_headers(credentials: Mapping[str, str]) -> dict[str, str]:
    """Headers of a durable probe, lookup or cancel: no body, so no queue wait or request id."""
    headers = dict(credentials)
    headers["Accept"] = "application/json"
    return headers


def call_durable_mode(
    client_mode: DurableMode, call_mode: object | None, request_id: str
) -> DurableMode:
    """The durable mode of one call: its own when given, else the client's."""
    if call_mode is None:
        return client_mode
    try:
        return check_durable_mode(call_mode)
    except ValueError as exc:
        raise _invalid(str(exc), request_id) from None


def user_agent() -> str:
    return f"sluice-client/{__version__}"


def to_ms(seconds: float) -> int:
    # Rounded, not truncated: a test clock at 0.1 s must read as exactly 100 ms.
    return round(seconds * 1000)
