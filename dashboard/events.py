"""Worker online/offline and restart history: recorded where registration changes, read here.

admission/registration.py announces every change (`worker_event`); this module writes it to
Postgres. An expiry is announced by whoever notices it first (the queue-depth sampler, or the
worker's own heartbeat coming back "lost"), so it is recorded once per incarnation.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from dashboard.models import WorkerEvent
from dashboard.window import Window

# Events that end an incarnation: once one is recorded, a later "expired" for it is old news.
_ENDINGS = (WorkerEvent.Kind.EXPIRED, WorkerEvent.Kind.DEREGISTERED, WorkerEvent.Kind.REVOKED)


def worker_event_record(
    *, kind: str, worker_id: str, incarnation: str, detail: str = "", at: datetime | None = None
) -> WorkerEvent | None:
    """Write one event; None for an expiry already recorded (or an unknown kind: never raised)."""
    if kind not in WorkerEvent.Kind.values:
        return None
    if (
        kind == WorkerEvent.Kind.EXPIRED
        and WorkerEvent.objects.filter(
            worker_id=worker_id, incarnation_id=incarnation, kind__in=_ENDINGS
        ).exists()
    ):
        return None
    return WorkerEvent.objects.create(
        at=at or timezone.now(),
        worker_id=worker_id[:128],
        kind=kind,
        incarnation_id=incarnation[:64],
        detail=detail[:200],
    )


def on_worker_event(sender: Any, **kwargs: Any) -> None:
    """The receiver connected in DashboardConfig.ready()."""
    worker_event_record(
        kind=kwargs["kind"],
        worker_id=kwargs["worker_id"],
        incarnation=kwargs["incarnation"],
        detail=kwargs.get("detail", ""),
    )


@dataclass(frozen=True)
class EventRow:
    at: datetime
    worker_id: str
    kind: str
    label: str
    incarnation_short: str
    detail: str

    @property
    def online(self) -> bool:
        return self.kind in (WorkerEvent.Kind.REGISTERED, WorkerEvent.Kind.RESTARTED)


def worker_events(window: Window, *, limit: int = 15) -> tuple[list[EventRow], int]:
    """(the newest `limit` events in the window, how many there are in all)."""
    events = WorkerEvent.objects.filter(at__gte=window.since, at__lt=window.until)
    if window.worker:
        events = events.filter(worker_id=window.worker)
    labels = dict(WorkerEvent.Kind.choices)
    rows = [
        EventRow(e.at, e.worker_id, e.kind, labels[e.kind], e.incarnation_id[:8], e.detail)
        for e in events.order_by("-at", "-pk")[:limit]
    ]
    return rows, events.count() if len(rows) == limit else len(rows)
