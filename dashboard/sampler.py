"""Queue depth over time: every few seconds, each registered worker's waiting and running calls.

Runs as a thread of `manage.py drain_completions`, the process a deployment already runs once
(running more than one only samples more often). Each tick reads the same Redis state the live
cards show (one round trip for all workers, dashboard/live.py) and writes one row per
registered worker; a worker that is not registered gets no row, so its line breaks while it is
offline. The tick also notices a registration that vanished without a deregistration (the
worker stopped heartbeating) and records it as "expired", and once an hour it prunes samples
and worker events older than COMPLETION_RETENTION_DAYS, as prune_completions does for the log.

Redis or Postgres being away costs the samples of that tick only; the thread carries on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from dashboard.events import worker_event_record
from dashboard.live import live_cards
from dashboard.models import (
    CallerBucket,
    DepthBucket,
    FailureBucket,
    KeyBucket,
    KeyHour,
    QueueDepthSample,
    SeriesBucket,
    WorkerEvent,
)
from dashboard.rollup import Rollup
from workspaces import outages
from workspaces.models import Worker

log = logging.getLogger("sluice.dashboard.sampler")

SAMPLE_PERIOD_S = 5.0
# Also pruned here: the rollup's buckets (dashboard/rollup.py), recomputed by the same tick.
PRUNE_PERIOD_S = 3600.0
PRUNE_BATCH = 5_000


def queue_depth_sample(*, now: datetime, client: Any = None) -> int:
    """Record one sample per registered worker and any expiry since the last tick; rows written."""
    cards = live_cards(client=client)
    QueueDepthSample.objects.bulk_create(
        QueueDepthSample(at=now, worker_id=c.worker_id, waiting=c.waiting, running=c.running)
        for c in cards
        if c.registered
    )
    # Postgres still names an incarnation but Redis has none: the registration expired. The
    # heartbeat age guards the moment between a registration's Postgres and Redis steps.
    silent_since = now - timedelta(seconds=settings.WORKER_OFFLINE_AFTER_S)
    unregistered = {c.worker_id for c in cards if not c.registered}
    for worker_id, incarnation in (
        Worker.objects.filter(worker_id__in=unregistered, revoked_at__isnull=True)
        .exclude(incarnation_id="")
        .filter(last_heartbeat_at__lt=silent_since)
        .values_list("worker_id", "incarnation_id")
    ):
        worker_event_record(
            kind=WorkerEvent.Kind.EXPIRED,
            worker_id=worker_id,
            incarnation=incarnation,
            detail="no heartbeat for its registration's lifetime",
            at=now,
        )
    return sum(1 for c in cards if c.registered)


def dashboard_prune(*, older_than_days: int, now: datetime, batch_size: int = PRUNE_BATCH) -> int:
    """Delete samples, worker events and rollup buckets past retention, oldest first, in
    batches; rows deleted."""
    cutoff = now - timedelta(days=older_than_days)
    deleted = 0
    tables: list[tuple[Any, str]] = [
        (QueueDepthSample, "at"),
        (WorkerEvent, "at"),
        (SeriesBucket, "start"),
        (FailureBucket, "start"),
        (CallerBucket, "start"),
        (KeyBucket, "start"),
        (KeyHour, "start"),
        (DepthBucket, "start"),
    ]
    for model, column in tables:
        while True:
            batch = list(
                model.objects.filter(**{f"{column}__lt": cutoff})
                .order_by(column)
                .values_list("pk", flat=True)[:batch_size]
            )
            if not batch:
                break
            count, _ = model.objects.filter(pk__in=batch).delete()
            deleted += count
    return deleted


class QueueDepthSampler(threading.Thread):
    """Samples every `period_s` until stopped; prunes every `prune_period_s`. Given the
    drainer's `Rollup`, each tick also recomputes the rollup buckets that are due."""

    def __init__(
        self,
        *,
        period_s: float = SAMPLE_PERIOD_S,
        prune_period_s: float = PRUNE_PERIOD_S,
        clock: Callable[[], datetime] = timezone.now,
        client: Any = None,
        rollup: Rollup | None = None,
    ) -> None:
        super().__init__(name="queue-depth-sampler", daemon=True)
        self.rollup = rollup
        self.period_s = period_s
        self.prune_period_s = prune_period_s
        self.clock = clock
        self.client = client
        self.stopping = threading.Event()
        self.ticks = 0

    def tick(self) -> None:
        close_old_connections()
        now = self.clock()
        try:
            queue_depth_sample(now=now, client=self.client)
        finally:
            # Postgres alone: it goes on while Redis is away.
            if self.rollup is not None:
                self.rollup.tick(now=now)
        self.ticks += 1

    def run(self) -> None:
        prune_at = time.monotonic()  # prune once at start-up, then hourly
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                self.tick()
                if started >= prune_at:
                    dashboard_prune(
                        older_than_days=settings.COMPLETION_RETENTION_DAYS, now=self.clock()
                    )
                    prune_at = started + self.prune_period_s
            except Exception as exc:
                # Postgres or Redis is away: this tick's samples are lost, the next one tries.
                outages.warn(log, "queue-depth sample failed", exc)
            self.stopping.wait(max(0.0, self.period_s - (time.monotonic() - started)))
        connection.close()  # this thread's own connection

    def stop(self) -> None:
        self.stopping.set()
