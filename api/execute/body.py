"""The ASGI side of a request's body and answer, for every route: the credential as
authentication reads it, the body read whole within its limits, and the plumbing that gives
Django a body already read or ends the connection with the answer.

Django would spool any body whole to a temporary file however slowly it came; reading it here
bounds both its size and its time (contract §2.8).
"""

from __future__ import annotations

import asyncio
import io
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestAborted

from admission.refusals import Refusal
from api.errors import body_timeout, too_large
from workspaces.auth import bearer_token

Scope = dict[str, Any]
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def credential(scope: Scope) -> str:
    """The bearer key of the Authorization header as authentication reads it (so `Bearer  K`
    and `bearer K` are one key), or "" when there is no well-formed one."""
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            return bearer_token(bytes(value)) or ""
    return ""


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def declared_length(scope: Scope) -> int:
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return -1
    return -1


def declare_length(scope: Scope, length: int) -> None:
    headers = [(k, v) for k, v in scope.get("headers", []) if k != b"content-length"]
    scope["headers"] = [*headers, (b"content-length", str(length).encode())]


async def read_bounded(scope: Scope, receive: Any) -> io.BytesIO | Refusal:
    """The body, read whole within the body deadline and up to the body limit; otherwise the
    refusal, made as soon as it is certain (413 from the declared length or as the body passes
    the limit, 408 at the deadline). Raises RequestAborted when the client goes away first."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if declared_length(scope) > limit:
        return too_large()
    body = io.BytesIO()
    try:
        async with asyncio.timeout(settings.SLUICE_REQUEST_BODY_TIMEOUT_S):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise RequestAborted()
                body.write(message.get("body", b""))
                if body.tell() > limit:
                    return too_large()
                if not message.get("more_body", False):
                    body.seek(0)
                    return body
    except TimeoutError:
        return body_timeout()


def replaying(body: bytes, receive: Any) -> Any:
    """A receive that gives Django the body already read, then the connection's own messages."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Any:
        return pending.pop() if pending else await receive()

    return replay


def closing(send: Any) -> Any:
    """A send that ends the connection with the answer: for a body left unread."""

    async def closing_send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {
                **message,
                "headers": [*message.get("headers", []), (b"connection", b"close")],
            }
        await send(message)

    return closing_send


async def until_disconnect(receive: Any) -> None:
    """Django's listen_for_disconnect, except that body left unread is skipped, not an error."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RequestAborted()


# How long a cancelled view may run on before it is cancelled again.
RECANCEL_S = 0.05


async def cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel the task and see it end. One cancel can be lost inside a library (on Python 3.11
    `asyncio.wait_for`, which redis-py uses for every command, returns the result when the
    cancel and the result land in one step of the loop), so the cancel is repeated until the
    task has ended."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=RECANCEL_S)
    if not task.cancelled():
        task.exception()  # retrieved: a view that ended otherwise has nobody to answer
