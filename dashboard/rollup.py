"""The completion log rolled up into 10-minute buckets, so a 24 h window reads ~150 rows per
worker and table instead of every call (issue 16: each dashboard query within 300 ms on a
million rows).

What is rolled up: per bucket and worker, the chart numbers (outcomes, wait and execution
percentiles, busy slot-seconds; also for all workers together, because percentiles do not
add up), failures by status/code/operation, calls per principal, and calls per isolation key.

How it stays right: a bucket is never incremented, only recomputed from the log with the
very queries the dashboard runs on the log (dashboard/history.py with `Window(raw=True)`),
so a row delivered twice, or a late one, counts exactly once once its bucket is recomputed.
The drainer tells `Rollup.rows_landed` which buckets its batch touched (a call's arrival
bucket and every bucket its run spans); the sampler thread recomputes those that are
complete, every tick, and then moves the mark (`RollupMark`) to the last complete bucket. The
dashboard reads whole buckets below the mark from here and everything else from the log.

What could go wrong, and what covers it: rows written to Postgres by another process (the
API's direct write while Redis refuses the stream, another drainer) are not announced here,
so each time a bucket completes, it and the one before are recomputed for every worker that
has rows in them (a call's row lands within a call lifetime, < 10 minutes); on start-up the
last 24 h are recomputed, for buckets a process that died had not recomputed yet. A row
landing later still (a long Postgres outage) is announced by the drainer that lands it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction

from dashboard import history
from dashboard.models import (
    CallerBucket,
    DepthBucket,
    FailureBucket,
    KeyBucket,
    KeyHour,
    QueueDepthSample,
    RollupMark,
    SeriesBucket,
)
from dashboard.window import (
    MAX_BUCKETS,
    ROLLUP_STEP,
    TABLE,
    Window,
    bucket_floor,
    call_lifetime_ms,
)

log = logging.getLogger("sluice.dashboard.rollup")

# pg_advisory_xact_lock key: recomputes of any process run one at a time, so a recompute that
# read the log before another drainer's commit never overwrites one that read it after.
_LOCK = 0x51CE_0016
# The longest window whose chart step is the rollup's (MAX_BUCKETS of 10 minutes).
REBUILD_ON_START = MAX_BUCKETS * ROLLUP_STEP


def _window(start: datetime, worker_id: str) -> Window:
    return Window(
        since=start,
        until=start + ROLLUP_STEP,
        worker=worker_id or None,
        raw=True,
        fixed_step=ROLLUP_STEP,
    )


def _series(start: datetime, worker_id: str) -> SeriesBucket:
    w = _window(start, worker_id)
    outcomes = history.outcomes(w).get(start, {})
    waits = {p.t: p for p in history.wait_percentiles(w)}
    runs = {p.t: p for p in history.exec_percentiles(w)}
    busy = dict(history.slot_usage(w))
    wait, run = waits.get(start), runs.get(start)
    return SeriesBucket(
        start=start,
        worker_id=worker_id,
        outcomes=outcomes,
        queued=wait.calls if wait else 0,
        wait_p50_ms=wait.p50_ms if wait else None,
        wait_p95_ms=wait.p95_ms if wait else None,
        wait_p99_ms=wait.p99_ms if wait else None,
        ran=run.calls if run else 0,
        exec_p50_ms=run.p50_ms if run else None,
        exec_p95_ms=run.p95_ms if run else None,
        exec_p99_ms=run.p99_ms if run else None,
        busy_s=busy.get(start, 0.0) * ROLLUP_STEP.total_seconds(),
    )


_TABLES_SQL: dict[Any, str] = {  # KeyBucket's is _KEYS_SQL, shared with KeyHour
    FailureBucket: f"""
        INSERT INTO {FailureBucket._meta.db_table}
            (start, worker_id, http_status, code, operation, calls)
        SELECT %(since)s, worker_id, http_status, code, operation, count(*)
        FROM {TABLE}
        WHERE created_at >= %(since)s AND created_at < %(until)s AND worker_id = %(worker)s
          AND http_status <> 200
        GROUP BY 2, 3, 4, 5
    """,
    CallerBucket: f"""
        INSERT INTO {CallerBucket._meta.db_table}
            (start, worker_id, tenant_hash, principal_hash, calls, errors, rate_limited,
             queue_timeouts, queue_full, total_wait_ms, max_wait_ms)
        SELECT %(since)s, worker_id, tenant_hash, principal_hash, {history.CALLER_COLUMNS}
        FROM {TABLE}
        WHERE created_at >= %(since)s AND created_at < %(until)s AND worker_id = %(worker)s
        GROUP BY 2, 3, 4
    """,
    KeyBucket: f"""
        INSERT INTO {{table}}
            (start, worker_id, workspace_id, isolation_key_hash, calls, total_wait_ms,
             max_wait_ms, timeouts)
        SELECT %(since)s, worker_id, max(workspace_id), isolation_key_hash, count(*),
               sum(queue_wait_ms), max(queue_wait_ms),
               count(*) FILTER (WHERE admission_outcome = 'queue_timeout')
        FROM {TABLE}
        WHERE created_at >= %(since)s AND created_at < %(until)s AND worker_id = %(worker)s
          AND fencing_ticket IS NOT NULL
        GROUP BY 2, 4
    """,
}


_KEYS_SQL = _TABLES_SQL[KeyBucket]
HOUR = timedelta(hours=1)


def _key_hours(hours: set[tuple[datetime, str]]) -> None:
    for start, worker_id in sorted(hours):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK])
            KeyHour.objects.filter(start=start, worker_id=worker_id).delete()
            params: dict[str, Any] = {"since": start, "until": start + HOUR, "worker": worker_id}
            cursor.execute(_KEYS_SQL.format(table=KeyHour._meta.db_table), params)


def rollup_recompute(buckets: Iterable[tuple[datetime, str]]) -> int:
    """Recompute (bucket start, worker id) pairs from the log, and the all-workers series of
    their buckets; returns how many pairs. One transaction per bucket, under the rollup lock."""
    pairs = set(buckets)
    for start in sorted({start for start, _ in pairs}):
        workers = sorted(w for s, w in pairs if s == start)
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK])
            for worker_id in [*workers, ""]:
                SeriesBucket.objects.filter(start=start, worker_id=worker_id).delete()
                row = _series(start, worker_id)
                if row.outcomes or row.busy_s:
                    row.save()
                if not worker_id:
                    continue
                params = _window(start, worker_id).params()
                with connection.cursor() as cursor:
                    for model, sql in _TABLES_SQL.items():
                        model.objects.filter(start=start, worker_id=worker_id).delete()
                        cursor.execute(sql.format(table=model._meta.db_table), params)
    _key_hours({(bucket_floor(start, HOUR), w) for start, w in pairs})
    return len(pairs)


def touched_buckets(rows: Iterable[Any]) -> set[tuple[datetime, str]]:
    """The buckets a batch of completion rows changes: each call's arrival bucket, and every
    bucket its slot was busy in (its run can end several buckets later)."""
    limit = timedelta(milliseconds=call_lifetime_ms())
    touched = set()
    for row in rows:
        start = bucket_floor(row.created_at)
        ran_ms = (row.queue_wait_ms or 0) + (row.exec_ms or 0)
        end = row.created_at + min(timedelta(milliseconds=ran_ms), limit)
        while start <= end:
            touched.add((start, row.worker_id))
            start += ROLLUP_STEP
    return touched


def _workers_with_rows(starts: list[datetime]) -> set[tuple[datetime, str]]:
    """The (bucket, worker) pairs among `starts` that any row touches (as touched_buckets)."""
    sql = f"""
        SELECT DISTINCT b, worker_id
        FROM {TABLE},
             generate_series(
                 date_bin(%(step)s, created_at, {history.ORIGIN}),
                 created_at + least(coalesce(queue_wait_ms, 0) + coalesce(exec_ms, 0),
                                    %(lifetime_ms)s) * INTERVAL '1 millisecond',
                 %(step)s) AS b
        WHERE created_at >= %(lookback)s AND created_at < %(until)s
          AND b >= %(since)s AND b < %(until)s
    """
    lifetime_ms = call_lifetime_ms()
    params: dict[str, Any] = {
        "step": ROLLUP_STEP,
        "since": min(starts),
        "until": max(starts) + ROLLUP_STEP,
        "lookback": min(starts) - timedelta(milliseconds=lifetime_ms),
        "lifetime_ms": lifetime_ms,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {(t, w) for t, w in cursor.fetchall()}


_DEPTH_SQL = f"""
    INSERT INTO {DepthBucket._meta.db_table} (start, worker_id, waiting, running)
    SELECT date_bin(%(step)s, at, {history.ORIGIN}), worker_id, max(waiting), max(running)
    FROM {QueueDepthSample._meta.db_table}
    WHERE at >= %(since)s AND at < %(until)s
    GROUP BY 1, 2
    ON CONFLICT (start, worker_id)
        DO UPDATE SET waiting = excluded.waiting, running = excluded.running
"""


def depth_recompute(*, since: datetime, until: datetime) -> None:
    """Roll the queue-depth samples of [since, until) (whole buckets) up, every worker."""
    params: dict[str, Any] = {"step": ROLLUP_STEP, "since": since, "until": until}
    with connection.cursor() as cursor:
        cursor.execute(_DEPTH_SQL, params)


class Rollup:
    """The drainer announces landed rows; the sampler's tick recomputes complete buckets."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dirty: set[tuple[datetime, str]] = set()
        self._started = False

    def rows_landed(self, rows: Iterable[Any]) -> None:
        """Called by the drainer after a batch is committed (any thread)."""
        touched = touched_buckets(rows)
        with self._lock:
            self._dirty |= touched

    def tick(self, *, now: datetime) -> int:
        """Recompute the complete dirty buckets and move the mark; returns pairs recomputed."""
        complete_until = bucket_floor(now)
        mark = RollupMark.objects.values_list("complete_until", flat=True).first()
        with self._lock:
            due = {p for p in self._dirty if p[0] + ROLLUP_STEP <= complete_until}
            self._dirty -= due
        if not self._started:
            since = complete_until - REBUILD_ON_START
            due |= _workers_with_rows(
                [since + ROLLUP_STEP * i for i in range(int(REBUILD_ON_START / ROLLUP_STEP))]
            )
            depth_recompute(since=since, until=complete_until)
        elif mark is None or mark < complete_until:
            # Buckets completed since the last tick, and the one before: rows other processes
            # wrote there (see the module docstring). Samples are written as they are taken,
            # so a complete bucket's samples are final (give or take another sampler's tick).
            newest = complete_until - ROLLUP_STEP
            due |= _workers_with_rows([newest - ROLLUP_STEP, newest])
            depth_recompute(since=newest - ROLLUP_STEP, until=complete_until)
        try:
            done = rollup_recompute(due)
        except Exception:
            with self._lock:
                self._dirty |= due  # try again next tick
            raise
        self._started = True
        if mark is None or mark < complete_until:
            RollupMark.objects.update_or_create(pk=1, defaults={"complete_until": complete_until})
        return done
