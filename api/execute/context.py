"""What the edge hands the view of one request on the workspace API: one object, made by the
edge, carried by the request the edge makes (`EdgeRequest`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest

from admission.completion import CompletionDraft, emit_row, emitted_rows_flush

if TYPE_CHECKING:
    # Types only: authentication reads the context, and must not import DRF's views with it.
    from admission.queue import AsyncQueue
    from admission.services import AdmissionHooks
    from api.execute.reading import ReadCall


class Emissions:
    """The completion rows written once their answers have gone out, not yet written: a
    process about to stop writes them at once (`flush`)."""

    def __init__(self) -> None:
        self.pending: set[Emission] = set()

    async def flush(self, timeout_s: float = 5.0) -> None:
        for emission in list(self.pending):
            emission()
        await emitted_rows_flush(timeout_s)


class Emission:
    """Writes one call's row the first time it is called; later calls do nothing."""

    def __init__(
        self, draft: CompletionDraft, queue: AsyncQueue, emissions: Emissions | None
    ) -> None:
        self.draft, self.queue, self.emissions = draft, queue, emissions
        self.loop = asyncio.get_running_loop()
        self.done = False
        if emissions is not None:
            emissions.pending.add(self)

    def __call__(self) -> None:
        if not self.done:
            self.done = True
            if self.emissions is not None:
                self.emissions.pending.discard(self)
            emit_row(self.draft, self.queue.client)


@dataclass(frozen=True)
class EdgeContext:
    """The edge's facts about a request, for its view."""

    # Past this process's or its credential's cap of calls in flight: refused before any lookup.
    overloaded: bool = False
    # The edge's reading of an execute POST (None: the view reads it).
    read: ReadCall | None = None
    # Told as the call's admission goes on (the edge's gate for its credential).
    hooks: AdmissionHooks | None = None
    emissions: Emissions | None = field(default=None, compare=False)


NO_EDGE = EdgeContext()


class EdgeRequest(ASGIRequest):
    """Django's ASGI request, with the edge's context for its view."""

    edge: EdgeContext = NO_EDGE


def edge_of(request: HttpRequest) -> EdgeContext:
    """The edge's context of a request (NO_EDGE for one the edge did not make, in tests)."""
    return request.edge if isinstance(request, EdgeRequest) else NO_EDGE
