"""Reading one execute call: its headers and body checked against the protocol, once.

The view reads a call from its Django request; the edge may read it first from the ASGI scope
and the body it read (`read_at_edge`), and hands that reading to the view, so a body is
parsed once whichever side reads it.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest
from django.http.request import split_domain_port, validate_host
from django.utils.http import parse_header_parameters
from rest_framework import exceptions
from rest_framework.parsers import JSONParser
from sluice_protocol import (
    OPERATIONS,
    ProtocolError,
    parse_queue_wait_header,
    validate_request,
    validate_request_id,
    validate_worker_id,
)

from admission.completion import CompletionDraft
from admission.refusals import Refusal
from api.errors import invalid, too_large

EXECUTE_PATH = "/v1/workspace-tools/execute"
# On a refusal, the body is looked at for the row's workspace and operation only up to this size.
_FILL_BODY_MAX_BYTES = 64 * 1024
_WORKSPACE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # the contract's workspaceId
_PARSER = JSONParser()
# Accept headers the JSON renderer answers exactly as it does with none.
_PLAIN_ACCEPT = frozenset({None, "", "*/*", "application/json"})


class Headers(Protocol):
    """A value by header name, any case: a Django request's `headers`, or `ScopeHeaders`."""

    def get(self, key: str, /) -> str | None: ...


@dataclass
class Parsed:
    body: dict[str, Any]
    worker_id: str | None
    queue_wait_ms: int
    request_id: str | None


@dataclass(frozen=True)
class ReadCall:
    """A call's headers and body as read: valid (`parsed`) or its refusal (`invalid`), and the
    draft of its completion row that the reading described."""

    draft: CompletionDraft
    parsed: Parsed | None
    invalid: Refusal | None


def read_call(request: HttpRequest, draft: CompletionDraft) -> ReadCall:
    return read_parts(request.headers, request.content_type or "", lambda: request.body, draft)


def read_parts(
    headers: Headers, content_type: str, body: Callable[[], bytes], draft: CompletionDraft
) -> ReadCall:
    """A call read from its headers, its content type and its body: valid or its refusal."""
    try:
        return ReadCall(draft, _parse(headers, content_type, body, draft), None)
    except Refusal as refusal:
        return ReadCall(draft, None, refusal)


def _parse(
    headers: Headers, content_type: str, body: Callable[[], bytes], draft: CompletionDraft
) -> Parsed:
    try:
        raw_worker = headers.get("X-LibreChat-Code-Worker-ID")
        worker_id = validate_worker_id(raw_worker) if raw_worker is not None else None
        queue_wait_ms = parse_queue_wait_header(headers.get("X-LibreChat-Workspace-Queue-Wait-Ms"))
        raw_request_id = headers.get("X-LibreChat-Workspace-Request-Id")
        request_id = validate_request_id(raw_request_id) if raw_request_id is not None else None
        draft.describe(request_id=request_id or "")
        body_json = validate_request(_json_body(content_type, body))
    except ProtocolError as exc:
        raise invalid(exc.code, exc.message) from None
    draft.describe(
        operation=str(body_json["operation"]),
        workspace_id=str(body_json["workspaceId"]),
        worktree=str(body_json.get("worktree") or ""),
    )
    return Parsed(body_json, worker_id, queue_wait_ms, request_id)


def _json_body(content_type: str, body: Callable[[], bytes]) -> Any:
    if content_type.split(";")[0].strip() != "application/json":
        raise Refusal("UNSUPPORTED_MEDIA_TYPE", "The body must be application/json.")
    try:
        # Django enforces DATA_UPLOAD_MAX_MEMORY_SIZE here, for a chunked body too.
        raw = body()
    except RequestDataTooBig:
        raise too_large() from None
    try:
        if not raw:
            raise exceptions.ParseError()
        return _PARSER.parse(io.BytesIO(raw), "application/json", {"encoding": "utf-8"})
    except (exceptions.ParseError, RecursionError):
        # RecursionError: JSON nested past Python's limit is not a request either.
        raise invalid("INVALID_REQUEST", "The body is not valid JSON.") from None


def declared_too_large(headers: Headers) -> bool:
    """Whether the request's Content-Length already passes the body limit (413 unread)."""
    try:
        return int(headers.get("Content-Length") or 0) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    except ValueError:
        return False


def describe_headers(headers: Headers, draft: CompletionDraft) -> None:
    """The request id and the worker a refused request named, when they are well-formed."""
    for attr, header, check in (
        ("request_id", "X-LibreChat-Workspace-Request-Id", validate_request_id),
        ("worker_id", "X-LibreChat-Code-Worker-ID", validate_worker_id),
    ):
        value = headers.get(header)
        if not getattr(draft, attr) and value:
            with contextlib.suppress(ProtocolError):
                draft.describe(**{attr: check(value)})


def fill_known(request: HttpRequest, draft: CompletionDraft) -> None:
    """On a refusal, name what the request carried (request id, worker, workspace, operation)
    when it is well-formed, so its completion row says what was refused. Only values that
    match the protocol's own patterns are kept: never content, command text or a path."""
    describe_headers(request.headers, draft)
    if (
        draft.operation
        or request.content_type != "application/json"
        or declared_too_large(request.headers)
    ):
        return
    try:
        raw = request.body
        body = json.loads(raw) if len(raw) <= _FILL_BODY_MAX_BYTES else None
    except (ValueError, UnicodeDecodeError, RecursionError, RequestDataTooBig):
        return
    if not isinstance(body, dict):
        return
    if isinstance(body.get("operation"), str) and body["operation"] in OPERATIONS:
        draft.describe(operation=str(body["operation"]))
    workspace, worktree = body.get("workspaceId"), body.get("worktree")
    if isinstance(workspace, str) and _WORKSPACE_ID_RE.fullmatch(workspace):
        draft.describe(workspace_id=workspace)
        # Lane names follow the worker-id pattern.
        with contextlib.suppress(ProtocolError):
            draft.describe(
                worktree=validate_worker_id(worktree) if isinstance(worktree, str) else ""
            )


class ScopeHeaders(dict[str, str]):
    """An ASGI request's headers by lower-case name."""

    def get(self, key: str, /) -> str | None:  # type: ignore[override]
        return super().get(key.lower())


def is_execute(scope: dict[str, Any]) -> bool:
    return scope.get("method") == "POST" and scope.get("path") == EXECUTE_PATH


def scope_headers(scope: dict[str, Any]) -> ScopeHeaders | None:
    """An execute POST's headers, when the view would read them exactly as they are here: no
    header name with an underscore or given twice (Django folds those), a Host Django accepts,
    and an Accept that DRF answers with plain JSON. None: only Django may read this request."""
    if not is_execute(scope) or scope.get("root_path") or settings.USE_X_FORWARDED_HOST:
        return None
    headers = ScopeHeaders()
    for raw_name, raw_value in scope.get("headers") or ():
        name = raw_name.decode("latin-1").lower()
        if "_" in name or name in headers:
            return None
        headers[name] = raw_value.decode("latin-1")
    if not _host_allowed(headers.get("host")) or headers.get("accept") not in _PLAIN_ACCEPT:
        return None
    return headers


def _host_allowed(host: str | None) -> bool:
    """What `HttpRequest.get_host` accepts (config.middleware checks it for the API)."""
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    domain, _ = split_domain_port(host or "")
    return bool(domain) and validate_host(domain, allowed)


def read_at_edge(scope: dict[str, Any], body: bytes) -> ReadCall | None:
    """An execute POST read from its ASGI scope and its whole body, before Django makes a
    request of it; None when only Django may read it (`scope_headers`)."""
    headers = scope_headers(scope)
    if headers is None:
        return None
    content_type = parse_header_parameters(headers.get("content-type") or "")[0]
    try:
        return read_parts(headers, content_type, lambda: body, CompletionDraft())
    except Exception:
        return None  # unforeseen: the view meets it in its own reading and answers it
