"""The time window a history view or report covers: `--since 1h`, `?range=24h`, a worker filter."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from admission.models import CompletionLog
from admission.policy import current_policy
from dashboard.models import RollupMark

# The ranges the dashboard offers; contention_report takes any duration.
RANGES = {"15m": "15 min", "1h": "1 hour", "6h": "6 hours", "24h": "24 hours", "7d": "7 days"}
DEFAULT_RANGE = "1h"
# A chart gets at most this many buckets, so the bucket follows the window: 10 s for 15 min,
# 30 s for 1 h, 2 min for 6 h, 10 min for 24 h, 1 h for 7 days. A 10 s burst in an hour is
# then one bar a bar wide, not a sliver.
MAX_BUCKETS = 180
_STEPS_S = (10, 30, 60, 120, 300, 600, 1800, 3600, 6 * 3600, 86400)
_DURATION_RE = re.compile(r"([1-9][0-9]{0,5})([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# The rollup's bucket (dashboard/rollup.py): a window whose chart step is this reads its whole
# buckets from the rollup tables and only its ragged ends from the log. Buckets are numbered
# from ORIGIN, as date_bin numbers the charts' buckets.
ROLLUP_STEP = timedelta(minutes=10)
ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)

TABLE = CompletionLog._meta.db_table


# Per query, for its transaction only. JIT compilation cost more than the queries themselves
# (over a second for the slot-utilisation query on a million rows, for nothing), and the
# default 4 MB work_mem sends a 24 h window's sorts to disk.
_QUERY_SETTINGS = "SELECT set_config('jit', 'off', true), set_config('work_mem', '64MB', true)"


def fetch_rows(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_QUERY_SETTINGS)
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def parse_duration(text: str) -> timedelta:
    """'90s', '15m', '1h', '7d' -> timedelta; ValueError with a readable reason otherwise."""
    match = _DURATION_RE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"expected a duration such as 15m, 1h or 7d, not {text!r}")
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds > 400 * 86400:
        raise ValueError("a window longer than 400 days is not useful")
    return timedelta(seconds=seconds)


def bucket_floor(t: datetime, step: timedelta = ROLLUP_STEP) -> datetime:
    return ORIGIN + ((t - ORIGIN) // step) * step


@dataclass(frozen=True)
class Window:
    since: datetime
    until: datetime
    worker: str | None = None
    # Read the log only, never the rollup (the rollup itself is computed this way).
    raw: bool = False
    # A fixed bucket width instead of the one that follows the span (the rollup's buckets).
    fixed_step: timedelta | None = None

    @classmethod
    def last(
        cls, span: timedelta, *, worker: str | None = None, now: datetime | None = None
    ) -> Window:
        until = now or timezone.now()
        return cls(since=until - span, until=until, worker=worker or None)

    @property
    def span(self) -> timedelta:
        return self.until - self.since

    @property
    def step(self) -> timedelta:
        """Bucket width: the finest step that gives at most MAX_BUCKETS buckets."""
        if self.fixed_step is not None:
            return self.fixed_step
        span_s = self.span.total_seconds()
        return timedelta(
            seconds=next((s for s in _STEPS_S if span_s / s <= MAX_BUCKETS), _STEPS_S[-1])
        )

    @cached_property
    def rollup_range(self) -> tuple[datetime, datetime]:
        """[r0, r1): the whole buckets this window reads from the rollup; empty (until, until)
        when it reads the log alone. Only buckets the rollup has completed count."""
        if self.raw or self.step != ROLLUP_STEP:
            return self.until, self.until
        mark = RollupMark.objects.values_list("complete_until", flat=True).first()
        first = bucket_floor(self.since)
        r0 = first if first == self.since else first + ROLLUP_STEP
        r1 = min(bucket_floor(self.until), mark) if mark is not None else r0
        return (r0, r1) if r1 > r0 else (self.until, self.until)

    def params(self) -> dict[str, Any]:
        r0, r1 = self.rollup_range
        return {
            "since": self.since,
            "until": self.until,
            "worker": self.worker or "",
            "step": self.step,
            "r0": r0,
            "r1": r1,
        }

    @property
    def raw_sql(self) -> str:
        """The WHERE term for the log's rows this window reads: its ragged ends around the
        rolled-up buckets, or all of it. Each range is an index range of created_at."""
        return (
            "((created_at >= %(since)s AND created_at < %(r0)s)"
            " OR (created_at >= %(r1)s AND created_at < %(until)s))"
        )

    @property
    def rollup_worker_sql(self) -> str:
        return "AND worker_id = %(worker)s" if self.worker else ""

    @property
    def worker_sql(self) -> str:
        """An extra WHERE term; the (worker_id, created_at) index serves it."""
        return "AND worker_id = %(worker)s" if self.worker else ""


def call_lifetime_ms() -> int:
    """The longest a call can live (its queue budget plus its exec budget), for overlap lookbacks.

    A holder that started this long before a timed-out call arrived cannot have still held a
    slot when it did, so the overlap searches never scan further back than this. It follows the
    current policy: right after the ceilings were lowered, an older long call can be missed.
    """
    policy = current_policy()
    # +5 s: a command's settle allowance (contract §2.3); +5 s of clock slack between API hosts.
    return policy.queue_ceiling_ms + policy.job_timeout_ms + 10_000


def step_label(step: timedelta) -> str:
    """'10 s', 'minute', '10 minutes', '6 h': how a chart names its bucket."""
    seconds = int(step.total_seconds())
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes == 1:
        return "minute"
    return f"{minutes} minutes" if minutes < 60 else f"{minutes // 60} h"
