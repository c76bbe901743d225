"""The ASGI edge of the API process: every HTTP request meets it before Django does.

Routes other than the workspace API (bridge, workers, admin, dashboard) get their body read
here, bounded in size and time, then Django's own handling. The workspace API
(`/v1/workspace-tools/`) skips Django's per-request thread hops for the
request_started/request_finished signals, a large share of a call's cost; that is safe because
its async views never touch the database on that thread (`admission.dbthread` owns those
connections). On that path the edge counts the request in flight (per process and per
credential), reads the body only when it is worth reading, answers the refusals that need no
view, and hands the view what it learned (`EdgeContext`).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.db import DatabaseError, InterfaceError
from django.http import HttpResponseBase
from django.urls import set_script_prefix

from admission import refusals, shutdown
from admission.callers import cached_caller
from admission.completion import CompletionDraft, emit_row
from admission.refusals import Refusal
from api.bridge import BRIDGE_PREFIX, bridge_rate_refusal
from api.execute import body as edge_body
from api.execute.burst import Answer, Arrival, Burst, GateHooks, count_down
from api.execute.context import EdgeContext, EdgeRequest, Emissions
from api.execute.reading import ReadCall, describe_headers, is_execute, read_at_edge, scope_headers
from api.execute.view import execute_abandoned, rendered_refusal

API_PREFIX = "/v1/workspace-tools/"
Scope = dict[str, Any]


class InFlight:
    """Requests in flight on the workspace API, for the process and per credential (b"": none
    well-formed); a credential's entry goes with its last request."""

    def __init__(self) -> None:
        self.total = 0
        self.by_key: dict[bytes, int] = {}

    @contextlib.contextmanager
    def carried(self, key: bytes) -> Iterator[bool]:
        """Counts the request while it runs; False (and not counted) past either cap, so one
        credential's burst fills only its own share and its refusals fill neither."""
        held = self.by_key.get(key, 0)
        if (
            self.total >= settings.SLUICE_MAX_CALLS_IN_FLIGHT
            or held >= settings.SLUICE_MAX_CALLS_IN_FLIGHT_PER_KEY
        ):
            yield False
            return
        self.total += 1
        self.by_key[key] = held + 1
        try:
            yield True
        finally:
            self.total -= 1
            count_down(self.by_key, key)


@dataclass
class Body:
    """A request's body as the edge took it: read whole, or left unread (empty)."""

    file: io.BytesIO
    whole: bool


class Edge(ASGIHandler):
    """Django's ASGI handler with the edge in front of it. It owns the state of its process's
    requests: the calls in flight, the burst gate and refusals that hold, the rows to write."""

    request_class = EdgeRequest

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = InFlight()
        self.burst = Burst(lambda: settings.SLUICE_ADMITTING_PER_KEY)
        self.emissions = Emissions()
        self._overloaded: Answer | None = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith(API_PREFIX):
            key = edge_body.credential(scope).encode("latin-1")
            with self.in_flight.carried(key) as carried:
                await self._api_request(scope, receive, send, key, overloaded=not carried)
        else:
            await super().__call__(scope, receive, send)

    async def handle(self, scope: Scope, receive: Any, send: Any) -> None:
        """Every route but the workspace API's: the bridge's rate limit before anything is
        read, then the body read here before Django gets it."""
        body: io.BytesIO | Refusal | None = None
        if scope.get("path", "").startswith(BRIDGE_PREFIX):
            body = await bridge_rate_refusal(
                path=scope["path"],
                token=edge_body.credential(scope),
                client=edge_body.client_address(scope),
            )
        if body is None:
            try:
                body = await edge_body.read_bounded(scope, receive)
            except RequestAborted:
                return
        if isinstance(body, Refusal):
            # Its body is left unread: the connection ends with the answer.
            await Answer.of(rendered_refusal(body)).send(edge_body.closing(send))
            return
        await super().handle(scope, edge_body.replaying(body.getvalue(), receive), send)

    async def _api_request(
        self, scope: Scope, receive: Any, send: Any, key: bytes, *, overloaded: bool
    ) -> None:
        """Headers first: a request refused before its body matters (overloaded,
        unauthenticated, declared too large) is answered without reading it. The view still
        answers most refusals, so each keeps its typed body and its row."""
        try:
            body = await self._body_if_worth_it(scope, receive, key, overloaded=overloaded)
        except RequestAborted:
            self._abandoned(scope, io.BytesIO())  # gone before its body was read
            return
        if isinstance(body, Refusal):
            # Too slow: answered here, its row written, its place freed at once.
            await self._refused(scope, body).send(edge_body.closing(send))
            return
        if not body.whole:
            send = edge_body.closing(send)  # the rest of the body is never read
        if overloaded and (answer := self._overloaded_answer(scope)) is not None:
            await answer.send(send)
            return
        with body.file:
            set_script_prefix(get_script_prefix(scope))
            await self._respond(scope, receive, send, body, key, overloaded=overloaded)

    async def _respond(
        self, scope: Scope, receive: Any, send: Any, body: Body, key: bytes, *, overloaded: bool
    ) -> None:
        """An execute POST read whole meets its credential's gate (api/execute/burst.py),
        which may answer it as it arrives; every request then gets its view's answer, unless
        its client goes away first."""
        read = read_at_edge(scope, body.file.getvalue()) if body.whole else None
        arrival = None
        if body.whole and is_execute(scope) and not overloaded:
            arrived = self.burst.arrive(read, key)
            if isinstance(arrived, Answer):
                await arrived.send(send)
                return
            arrival = arrived
        try:
            answer = asyncio.create_task(self._answer(scope, body, read, key, overloaded, arrival))
            response = await self._unless_gone(answer, receive)
        finally:
            if arrival is not None:
                arrival.leave()  # left already, unless its task never ran
        if response is not None:
            await self._send(response, send)

    async def _body_if_worth_it(
        self, scope: Scope, receive: Any, key: bytes, *, overloaded: bool
    ) -> Body | Refusal:
        """The body, or an empty one when it is not to be read, or the refusal of a body too
        slow. Authentication comes first: an unauthenticated request is answered 401 whatever
        length it declares (docs/api.md)."""
        if scope.get("method") not in edge_body.BODY_METHODS:
            return Body(io.BytesIO(), whole=True)
        if overloaded or not await _authenticated(key):
            return Body(io.BytesIO(), whole=False)  # the view answers 503 or 401
        if edge_body.declared_length(scope) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
            return Body(io.BytesIO(), whole=False)  # the view answers 413 from the header
        read = await edge_body.read_bounded(scope, receive)
        if isinstance(read, io.BytesIO):
            return Body(read, whole=True)
        if read.code == "REQUEST_TOO_LARGE":
            # Refused while it streams in: what was received already passes the limit, and
            # the view answers 413 from that count.
            edge_body.declare_length(scope, settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
            return Body(io.BytesIO(), whole=False)
        return read

    async def _answer(
        self,
        scope: Scope,
        body: Body,
        read: ReadCall | None,
        key: bytes,
        overloaded: bool,
        arrival: Arrival | None,
    ) -> HttpResponseBase | Answer:
        """The view's answer; an `arrival` goes through its credential's gate first, and may
        get a refusal that holds (an `Answer`, its row written)."""

        async def view(hooks: GateHooks | None = None) -> HttpResponseBase:
            request, refusal = self.create_request(scope, body.file)
            if request is None:
                assert refusal is not None  # Django's answer to a request it cannot make
                return refusal
            assert isinstance(request, EdgeRequest)
            request.edge = EdgeContext(
                overloaded=overloaded, read=read, hooks=hooks, emissions=self.emissions
            )
            return await self.run_get_response(request)

        if arrival is None:
            return await view()

        def abandoned() -> None:
            if read is not None:
                _went_away(read)
            else:
                self._abandoned(scope, body.file)

        return await self.burst.through(arrival, read, key, view, abandoned)

    async def _unless_gone(
        self, answer: asyncio.Task[HttpResponseBase | Answer], receive: Any
    ) -> HttpResponseBase | Answer | None:
        """The answer, or None when the client went away first (the view is cancelled, and
        gives up its queue place)."""
        gone = asyncio.create_task(edge_body.until_disconnect(receive))
        await asyncio.wait([answer, gone], return_when=asyncio.FIRST_COMPLETED)
        if not answer.done():
            gone.exception()  # RequestAborted, the expected end of that task: retrieved
            await edge_body.cancelled(answer)
            return None
        gone.cancel()
        return answer.result()

    async def _send(self, response: HttpResponseBase | Answer, send: Any) -> None:
        if isinstance(response, Answer):
            await response.send(send)
            return
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await self.send_response(response, send)
        finally:
            # request_finished runs here, on the event loop's thread, which holds no database
            # connection (nothing on it may touch the database).
            response.close()

    def _abandoned(self, scope: Scope, body_file: io.BytesIO) -> None:
        """A POST to execute whose client went away before its body was read gets its row."""
        if not is_execute(scope):
            return
        request, _ = self.create_request(scope, body_file)
        if request is not None:
            execute_abandoned(request)

    def _overloaded_answer(self, scope: Scope) -> Answer | None:
        """The answer of an execute POST past a cap of calls in flight, made here as the view
        makes it (it names no caller and reads no body), its row written; None: the view
        answers it. Made here from the first such call on, so none of a large burst's
        overloaded calls costs a Django request and a view."""
        headers = scope_headers(scope)
        if shutdown.stopping() or headers is None:
            return None  # a stopping process answers SHUTTING_DOWN first
        if self._overloaded is None:
            self._overloaded = Answer.of(rendered_refusal(refusals.service_overloaded()))
        _edge_row(headers, self._overloaded, refusals.service_overloaded())
        return self._overloaded

    def _refused(self, scope: Scope, refusal: Refusal) -> Answer:
        """A refusal before any view ran (a body too slow), as the execute view makes it; an
        execute POST gets its row, naming what its headers say."""
        answer = Answer.of(rendered_refusal(refusal))
        if is_execute(scope):
            _edge_row(scope_headers(scope), answer, refusal)
        return answer


def _edge_row(headers: Any, answer: Answer, refusal: Refusal) -> None:
    draft = CompletionDraft()
    if headers is not None:
        describe_headers(headers, draft)
    draft.answered(answer.status, refusal)
    emit_row(draft)


def _went_away(read: ReadCall) -> None:
    """The row of a call whose client went away while it waited at the gate."""
    if read.parsed is not None and read.parsed.worker_id:
        read.draft.describe(worker_id=read.parsed.worker_id)
    read.draft.went_away_answered()
    emit_row(read.draft)


async def _authenticated(key: bytes) -> bool:
    """Whether the bearer key names a caller (cached for a second: admission.callers). A
    database outage reads as yes, so that the view answers its typed 503."""
    token = key.decode("latin-1")
    if not token:
        return False
    try:
        return await cached_caller(token) is not None
    except (DatabaseError, InterfaceError):
        return True
