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
            # Covering: a 24 h chart of every worker reads the index alone.
            models.Index(
                fields=["at"], name="depth_by_time", include=["worker_id", "waiting", "running"]
            ),
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


# The completion log rolled up into 10-minute buckets (dashboard/rollup.py), so a 24 h window
# (whose chart bucket is 10 minutes) reads ~150 rows per worker instead of every call. Each
# row is recomputed from the log, never incremented, so a row landed twice counts once.


class SeriesBucket(models.Model):
    """One bucket of one worker (worker_id "" = all workers): the history charts' numbers."""

    start = models.DateTimeField()
    worker_id = models.CharField(max_length=128, blank=True)
    outcomes = models.JSONField(default=dict)  # category (history.OUTCOMES) -> calls
    queued = models.PositiveIntegerField(default=0)
    wait_p50_ms = models.FloatField(null=True)
    wait_p95_ms = models.FloatField(null=True)
    wait_p99_ms = models.FloatField(null=True)
    ran = models.PositiveIntegerField(default=0)
    exec_p50_ms = models.FloatField(null=True)
    exec_p95_ms = models.FloatField(null=True)
    exec_p99_ms = models.FloatField(null=True)
    busy_s = models.FloatField(default=0.0)  # slot-seconds busy within the bucket

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["worker_id", "start"], name="series_bucket_unique")
        ]

    def __str__(self) -> str:
        return f"{self.worker_id or 'all workers'} {self.start:%Y-%m-%d %H:%M}"


class Bucket(models.Model):
    """One worker's share of one rollup bucket (its start time)."""

    start = models.DateTimeField()
    worker_id = models.CharField(max_length=128)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.worker_id} {self.start:%Y-%m-%d %H:%M}"


class FailureBucket(Bucket):
    http_status = models.PositiveSmallIntegerField()
    code = models.CharField(max_length=64, blank=True)
    operation = models.CharField(max_length=64, blank=True)
    calls = models.PositiveIntegerField()

    class Meta:
        indexes = [models.Index(fields=["start", "worker_id"], name="failure_bucket_by_time")]


class CallerBucket(Bucket):
    tenant_hash = models.CharField(max_length=64, blank=True)
    principal_hash = models.CharField(max_length=64, blank=True)
    calls = models.PositiveIntegerField()
    errors = models.PositiveIntegerField()
    rate_limited = models.PositiveIntegerField()
    queue_timeouts = models.PositiveIntegerField()
    queue_full = models.PositiveIntegerField()
    total_wait_ms = models.BigIntegerField()
    max_wait_ms = models.BigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["start", "worker_id"], name="caller_bucket_by_time")]


class KeyTotals(Bucket):
    """Calls that entered a queue, per isolation key (and so per workspace)."""

    workspace_id = models.CharField(max_length=128, blank=True)
    isolation_key_hash = models.CharField(max_length=64, blank=True)
    calls = models.PositiveIntegerField()
    total_wait_ms = models.BigIntegerField()
    max_wait_ms = models.BigIntegerField()
    timeouts = models.PositiveIntegerField()

    class Meta:
        abstract = True


class KeyBucket(KeyTotals):
    class Meta:
        indexes = [models.Index(fields=["start", "worker_id"], name="key_bucket_by_time")]


class KeyHour(KeyTotals):
    """KeyBucket by the hour: a 24 h window's top keys read ~4x fewer rows (one per key and
    hour rather than per key and 10 minutes). Recomputed with each of its 10-minute buckets."""

    class Meta:
        indexes = [models.Index(fields=["start", "worker_id"], name="key_hour_by_time")]

    def __str__(self) -> str:
        return f"{self.worker_id} {self.start:%Y-%m-%d %H:00}"


class DepthBucket(Bucket):
    """The most calls waiting and running in any queue-depth sample of the bucket."""

    waiting = models.PositiveIntegerField()
    running = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["start", "worker_id"], name="depth_bucket_unique")
        ]


class RollupMark(models.Model):
    """One row: every bucket that ends at or before `complete_until` has been rolled up."""

    complete_until = models.DateTimeField()

    def __str__(self) -> str:
        return f"rolled up until {self.complete_until:%Y-%m-%d %H:%M}"
