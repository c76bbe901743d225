"""What the dashboard records besides the completion log: queue depth samples, worker events.

Both are written once per deployment or where the event happens (see dashboard/sampler.py and
dashboard/events.py), read only by the dashboard, and pruned after COMPLETION_RETENTION_DAYS
by the sampler, like the log itself.
"""

from __future__ import annotations

from django.db import models


class QueueDepthSample(models.Model):
    """One worker's queue at one moment, as the live card showed it: calls waiting, calls running."""

    at = models.DateTimeField()
    worker_id = models.CharField(max_length=128)
    waiting = models.PositiveIntegerField()
    running = models.PositiveIntegerField()

    class Meta:
        indexes = [
            models.Index(fields=["at"], name="depth_by_time"),
            models.Index(fields=["worker_id", "at"], name="depth_by_worker"),
        ]

    def __str__(self) -> str:
        return (
            f"{self.worker_id} {self.at:%H:%M:%S}: {self.waiting} waiting, {self.running} running"
        )


class WorkerEvent(models.Model):
    """A change in a worker's registration: the online/offline and restart history."""

    class Kind(models.TextChoices):
        REGISTERED = "registered", "registered"
        RESTARTED = "restarted", "restarted (new incarnation)"
        DEREGISTERED = "deregistered", "deregistered"
        EXPIRED = "expired", "went offline (heartbeats stopped)"
        REVOKED = "revoked", "revoked"

    at = models.DateTimeField()
    worker_id = models.CharField(max_length=128)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    # The incarnation the event is about: the new one for registered/restarted, the one that
    # ended otherwise. Empty when there was none (a revoke of a worker that was not registered).
    incarnation_id = models.CharField(max_length=64, blank=True)
    detail = models.CharField(max_length=200, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["at"], name="worker_event_by_time"),
            models.Index(fields=["worker_id", "at"], name="worker_event_by_worker"),
        ]

    def __str__(self) -> str:
        return f"{self.worker_id} {self.kind} at {self.at:%Y-%m-%d %H:%M:%S}"
