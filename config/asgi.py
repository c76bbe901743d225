"""ASGI entry point: `uvicorn config.asgi:application`."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
from typing import TYPE_CHECKING, Any

import django
from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.urls import set_script_prefix

from admission.refusals import Refusal

if TYPE_CHECKING:
    from api.burst import Arrival
    from api.workspace_tools import ReadCall

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

ASGIScope = dict[str, Any]


class SluiceAsgiHandler(ASGIHandler):
    """Django's ASGI handler, with a shorter way through it for the workspace API.

    For every request Django starts a thread of its own and hops into it twice (the
    request_started and request_finished signals: resetting the query log, closing the DB
    connections of that thread). The workspace API's async view never touches the database on
    such a thread (its reads run in a pool, `admission.dbthread`, which looks after its own
    connections), so on this 2-core machine those hops were a quarter of a call's overhead.
    API requests skip them; everything else (admin, dashboard, worker endpoints) is untouched.
    They keep the rest: the middleware chain, the view's cancellation when the client goes
    away, and the response's close.
    """

    async def __call__(self, scope: ASGIScope, receive: Any, send: Any) -> None:
        from config.middleware import FAST_PREFIX

        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http" and scope.get("path", "").startswith(FAST_PREFIX):
            await self._handle_api(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    async def handle(self, scope: ASGIScope, receive: Any, send: Any) -> None:
        """Every route but the workspace API's (bridge, workers, admin, dashboard): the bridge's
        rate limit before anything is read, then the body read here, bounded in size and time,
        before Django (which would spool any body whole to a temporary file, however slowly it
        came) gets it."""
        from api import burst
        from api.bridge import BRIDGE_PREFIX, bridge_rate_refusal

        body: io.BytesIO | Refusal | None = None
        if scope.get("path", "").startswith(BRIDGE_PREFIX):
            body = await bridge_rate_refusal(
                path=scope["path"], token=_credential(scope), client=_client_address(scope)
            )
        if body is None:
            try:
                body = await _read_bounded(scope, receive)
            except RequestAborted:
                return
        if isinstance(body, Refusal):
            # Its body is left unread: the connection ends with the answer.
            await burst.refused_at_edge(scope, body).send(_closing(send))
            return
        await super().handle(scope, _replaying(body.getvalue(), receive), send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        """ASGI lifespan (Django itself has none): once the server runs, SIGTERM and SIGINT
        first wake this process's waiting calls (admission/shutdown.py)."""
        from admission import shutdown

        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                shutdown.install(asyncio.get_running_loop())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                from api.workspace_tools import emissions_flush

                # The last answers' completion rows are still on their way to Redis (the
                # drainer process lands them in Postgres).
                await emissions_flush()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _handle_api(self, scope: ASGIScope, receive: Any, send: Any) -> None:
        """Counts the request in flight for the process and for its credential (the bearer key
        as authentication reads it, however the header spells it: known before anything is
        read or looked up). Past either cap it is answered 503 SERVICE_OVERLOADED: one
        credential's burst fills only its own share."""
        global _in_flight
        credential = _credential(scope).encode("latin-1")
        held = _in_flight_by_key.get(credential, 0)
        if (
            _in_flight >= settings.SLUICE_MAX_CALLS_IN_FLIGHT
            or held >= settings.SLUICE_MAX_CALLS_IN_FLIGHT_PER_KEY
        ):
            # Refused, so not carried: it counts against neither cap while it is answered
            # (a burst's refusals would otherwise fill the process's cap for everyone).
            await self._api_request(scope, receive, send, credential, overloaded=True)
            return
        _in_flight += 1
        _in_flight_by_key[credential] = held + 1
        try:
            await self._api_request(scope, receive, send, credential, overloaded=False)
        finally:
            _in_flight -= 1
            left = _in_flight_by_key[credential] - 1
            if left:
                _in_flight_by_key[credential] = left
            else:
                del _in_flight_by_key[credential]

    async def _api_request(
        self, scope: ASGIScope, receive: Any, send: Any, credential: bytes, *, overloaded: bool
    ) -> None:
        """Headers first: a request that is refused (over this process's limit of calls in
        flight, unauthenticated, declared too large) is answered without its body being read,
        and a body is read only up to the limit. The view still answers every refusal, so each
        one keeps its typed body and its completion row; it sees an empty body then."""
        try:
            body_file, read_whole = await self._body_if_worth_it(
                scope, receive, credential, overloaded=overloaded
            )
            if isinstance(body_file, Refusal):
                # Too slow: answered here, its row written, and its place freed at once.
                from api import burst

                await burst.refused_at_edge(scope, body_file).send(_closing(send))
                return
        except RequestAborted:
            # Gone before its body was read; a POST to execute still leaves its row.
            from api.workspace_tools import execute_abandoned

            request, _ = self.create_request(scope, io.BytesIO())
            if request is not None:
                execute_abandoned(request)
            return
        if not read_whole:
            # The rest of the body is never read: the connection ends with this answer.
            send = _closing(send)
        from api import burst

        if overloaded:
            refused = burst.overloaded_at_edge(scope)
            if refused is not None:
                await refused.send(send)
                return
        with body_file:
            set_script_prefix(get_script_prefix(scope))
            # An execute POST whose whole body was read: the edge reads it itself.
            at_edge = read_whole and burst.gated(scope)
            read = burst.read_at_edge(scope, body_file.getvalue()) if at_edge else None
            arrival = None
            if at_edge and not overloaded:
                # Answered from memory (a refusal that holds: no Django request, view or
                # response), or counted in its line as it is read, before the next arrival is
                # (api/burst.py).
                edge = burst.at_edge(read, credential)
                if isinstance(edge, burst.Answer):
                    await edge.send(send)
                    return
                arrival = edge
            try:
                answer = asyncio.create_task(
                    self._answer(
                        scope,
                        body_file,
                        read,
                        credential=credential,
                        overloaded=overloaded,
                        arrival=arrival,
                    )
                )
                gone = asyncio.create_task(_until_disconnect(receive))
                await asyncio.wait([answer, gone], return_when=asyncio.FIRST_COMPLETED)
                if not answer.done():
                    # The client went away: the view is cancelled (and takes its queue place).
                    gone.exception()  # RequestAborted, the expected end of that task: retrieved
                    await _cancelled(answer)
                    return
            finally:
                if arrival is not None:
                    arrival.leave()  # already left in `through`, unless its task never ran
            gone.cancel()
            response = answer.result()
            if isinstance(response, burst.Answer):
                await response.send(send)
                return
            try:
                with contextlib.suppress(asyncio.CancelledError):
                    await self.send_response(response, send)
            finally:
                # request_finished runs here, on the event loop's thread, which holds no
                # database connection (nothing on it may touch the database).
                response.close()

    async def _answer(
        self,
        scope: ASGIScope,
        body_file: io.BytesIO,
        read: ReadCall | None,
        *,
        credential: bytes,
        overloaded: bool,
        arrival: Arrival | None,
    ) -> Any:
        """The view's answer (a Django response); an execute POST whose whole body was read
        (`arrival`: counted in its line) goes through its credential's gate first, and may be
        answered from the memory of refusals (a `burst.Answer`, its row written)."""
        from api import burst

        async def view() -> Any:
            request, refusal = self.create_request(scope, body_file)
            if request is None:
                return refusal
            if overloaded:
                from api.authentication import OVERLOADED_FLAG

                request.META[OVERLOADED_FLAG] = True
            if read is not None:
                from api.workspace_tools import READ_AT_EDGE

                request.META[READ_AT_EDGE] = read
            return await self.run_get_response(request)

        def abandoned() -> None:
            from api.workspace_tools import execute_abandoned

            request, _ = self.create_request(scope, body_file)
            if request is not None:
                execute_abandoned(request)

        if arrival is not None:
            return await burst.through(arrival, read, credential, view, abandoned)
        return await view()

    async def _body_if_worth_it(
        self, scope: ASGIScope, receive: Any, credential: bytes, *, overloaded: bool
    ) -> tuple[io.BytesIO | Refusal, bool]:
        """(the body, or an empty one when it is not to be read, or the refusal of a body too
        slow; whether it was read whole). Authentication comes first: an unauthenticated
        request is answered 401 whatever length it declares (docs/api.md)."""
        if overloaded or scope.get("method") not in BODY_METHODS:
            return io.BytesIO(), scope.get("method") not in BODY_METHODS
        if not await _authenticated(credential):
            return io.BytesIO(), False  # the view answers 401
        if _declared_length(scope) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
            return io.BytesIO(), False  # the view answers 413 from the header
        body = await _read_bounded(scope, receive)
        if isinstance(body, io.BytesIO):
            return body, True
        if body.code == "REQUEST_TOO_LARGE":
            # Refused while it streams in (chunked or not): what was received already passes
            # the limit, and the view answers 413 from that count.
            _declare_length(scope, settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
            return io.BytesIO(), False
        return body, False


BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_in_flight = 0
# Requests in flight per bearer key (b"": none well-formed); a key's entry goes with its last one.
_in_flight_by_key: dict[bytes, int] = {}


def _credential(scope: ASGIScope) -> str:
    """The bearer key of the Authorization header as authentication reads it (so `Bearer  K`
    and `bearer K` are one key), or "" when there is no well-formed one."""
    from workspaces.auth import bearer_token

    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            return bearer_token(bytes(value)) or ""
    return ""


def _client_address(scope: ASGIScope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def _declared_length(scope: ASGIScope) -> int:
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return -1
    return -1


async def _read_bounded(scope: ASGIScope, receive: Any) -> io.BytesIO | Refusal:
    """The body, read whole within the body deadline and up to the body limit; otherwise the
    refusal, made as soon as it is certain (413 REQUEST_TOO_LARGE from the declared length
    or as the body passes the limit, 408 REQUEST_BODY_TIMEOUT at the deadline). Raises
    RequestAborted when the client goes away first."""
    from api.errors import body_timeout, too_large

    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if _declared_length(scope) > limit:
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


def _replaying(body: bytes, receive: Any) -> Any:
    """A receive that gives Django the body already read, then the connection's own messages."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Any:
        return pending.pop() if pending else await receive()

    return replay


async def _authenticated(credential: bytes) -> bool:
    """Whether the bearer key names a caller (cached for a second: admission.callers). A
    database outage reads as yes: the view then answers its typed 503 as before."""
    from django.db import DatabaseError, InterfaceError

    from admission.callers import cached_caller

    token = credential.decode("latin-1")
    if not token:
        return False
    try:
        return await cached_caller(token) is not None
    except (DatabaseError, InterfaceError):
        return True


def _declare_length(scope: ASGIScope, length: int) -> None:
    headers = [(k, v) for k, v in scope.get("headers", []) if k != b"content-length"]
    scope["headers"] = [*headers, (b"content-length", str(length).encode())]


def _closing(send: Any) -> Any:
    async def closing_send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {
                **message,
                "headers": [*message.get("headers", []), (b"connection", b"close")],
            }
        await send(message)

    return closing_send


# How long a cancelled view may run on before it is cancelled again.
RECANCEL_S = 0.05


async def _cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel the task and see it end. One cancel can be lost inside a library: on Python
    3.11 `asyncio.wait_for` returns the awaited result when the cancel and the result land in
    the same step of the loop, and redis-py sends every command through it (a call whose
    client had gone ran anyway and answered 200). So the cancel is repeated until the task
    has ended; a task already cleaning up after the first one keeps its shielded steps."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=RECANCEL_S)
    if not task.cancelled():
        task.exception()  # retrieved: a view that ended otherwise has nobody to answer


async def _until_disconnect(receive: Any) -> None:
    """Django's listen_for_disconnect, except that body left unread is skipped, not an error."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RequestAborted()


django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application() does
application = SluiceAsgiHandler()
