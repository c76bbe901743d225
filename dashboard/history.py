"""Time series for the dashboard's history charts, computed in Postgres from the completion log.

Each function is one query over [since, until) of `created_at` (the call's arrival), served
by the `completion_by_time` index or, with a worker filter, by `completion_by_worker`.
Buckets come from `date_bin`, so a chart's points line up with the window's step.

A window whose step is the rollup's (10 minutes: a 24 h window) reads its whole, rolled-up
buckets from the rollup tables (dashboard/rollup.py) and only its ragged ends from the log;
both halves are the same query's numbers (the rollup is computed by these very functions).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Sum

from dashboard.models import (
    CallerBucket,
    DepthBucket,
    FailureBucket,
    KeyBucket,
    KeyHour,
    QueueDepthSample,
    SeriesBucket,
)
from dashboard.window import TABLE, Window, bucket_floor, call_lifetime_ms, fetch_rows
from workspaces.models import Worker

# Outcome categories of the stacked chart, bottom to top, with what each means.
OUTCOMES = {
    "ok": "answered 200",
    "worker_error": "ran; the worker answered an error",
    "expired": "ASSIGNMENT_EXPIRED: outcome unknown",
    "queue_timeout": "WORKSPACE_QUEUE_TIMEOUT",
    "queue_full": "WORKER_QUEUE_FULL",
    "rate_limited": "rate limited",
    "cancelled": "cancelled or disconnected",
    "refused": "refused before queueing (validation, auth, offline ...)",
}
_OUTCOME_SQL = """
    CASE
        WHEN http_status = 200 THEN 'ok'
        WHEN admission_outcome IN ('queue_timeout', 'queue_full', 'rate_limited') THEN admission_outcome
        WHEN admission_outcome = 'cancelled' OR outcome <> 'completed' THEN 'cancelled'
        WHEN code = 'ASSIGNMENT_EXPIRED' THEN 'expired'
        WHEN exec_ms IS NOT NULL THEN 'worker_error'
        ELSE 'refused'
    END
"""
ORIGIN = "TIMESTAMPTZ '2000-01-01 00:00:00+00'"
SERIES = SeriesBucket._meta.db_table
FAILURES = FailureBucket._meta.db_table
CALLERS = CallerBucket._meta.db_table
KEYS = KeyBucket._meta.db_table
KEY_HOURS = KeyHour._meta.db_table
# Series rows for all workers carry worker_id "".
_SERIES_WORKER = "worker_id = %(worker)s"


@dataclass(frozen=True)
class WaitPoint:
    t: datetime
    p50_ms: float
    p95_ms: float
    p99_ms: float
    calls: int


def _percentiles(window: Window, column: str, rows_with: str, rolled: str) -> list[WaitPoint]:
    """p50/p95/p99 of `column` per bucket, over the rows where `rows_with` holds; `rolled`
    names the rollup's columns of the same numbers (wait or exec)."""
    n = "queued" if rolled == "wait" else "ran"
    sql = f"""
        SELECT date_bin(%(step)s, created_at, {ORIGIN}) AS t,
               percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY {column}),
               count(*)
        FROM {TABLE}
        WHERE {window.raw_sql} {window.worker_sql}
          AND {rows_with}
        GROUP BY 1
        UNION ALL
        SELECT start, ARRAY[{rolled}_p50_ms, {rolled}_p95_ms, {rolled}_p99_ms], {n}
        FROM {SERIES}
        WHERE start >= %(r0)s AND start < %(r1)s AND {_SERIES_WORKER} AND {n} > 0
        ORDER BY 1
    """
    return [WaitPoint(t, p[0], p[1], p[2], n) for t, p, n in fetch_rows(sql, window.params())]


def wait_percentiles(window: Window) -> list[WaitPoint]:
    """Queue-wait p50/p95/p99 per bucket over calls that entered a queue (timeouts included)."""
    return _percentiles(window, "queue_wait_ms", "fencing_ticket IS NOT NULL", "wait")


def outcomes(window: Window) -> dict[datetime, dict[str, int]]:
    """Calls per bucket and outcome category (see OUTCOMES)."""
    sql = f"""
        SELECT date_bin(%(step)s, created_at, {ORIGIN}) AS t, {_OUTCOME_SQL} AS category, count(*)
        FROM {TABLE}
        WHERE {window.raw_sql} {window.worker_sql}
        GROUP BY 1, 2
        UNION ALL
        SELECT start, o.key, o.value::bigint
        FROM {SERIES}, jsonb_each_text(outcomes) AS o
        WHERE start >= %(r0)s AND start < %(r1)s AND {_SERIES_WORKER}
        ORDER BY 1
    """
    series: dict[datetime, dict[str, int]] = {}
    for t, category, count in fetch_rows(sql, window.params()):
        series.setdefault(t, {})[category] = count
    return series


def slot_usage(window: Window) -> list[tuple[datetime, float]]:
    """Average busy slots per bucket: each admitted call's [admission, end] split over buckets.

    Calls that arrived up to one call lifetime before the window still count for the part of
    their run inside it.
    """
    # Outside the rolled-up buckets [r0, r1): the calls that can reach the raw ends.
    sql = f"""
        WITH c AS (
            SELECT created_at + queue_wait_ms * INTERVAL '1 millisecond' AS s,
                   created_at + (queue_wait_ms + coalesce(exec_ms, 0)) * INTERVAL '1 millisecond' AS e
            FROM {TABLE}
            WHERE ((created_at >= %(lookback_since)s AND created_at < %(r0)s)
                   OR (created_at >= %(lookback_r1)s AND created_at < %(until)s)) {window.worker_sql}
              AND slot_index IS NOT NULL AND exec_ms > 0
        )
        SELECT b, sum(extract(epoch FROM least(c.e, b + %(step)s) - greatest(c.s, b)))
        FROM c, generate_series(date_bin(%(step)s, c.s, {ORIGIN}), c.e, %(step)s) AS b
        WHERE b >= date_bin(%(step)s, %(since)s, {ORIGIN}) AND b < %(until)s AND c.e > b
          AND NOT (b >= %(r0)s AND b < %(r1)s)
        GROUP BY b
        UNION ALL
        SELECT start, busy_s FROM {SERIES}
        WHERE start >= %(r0)s AND start < %(r1)s AND {_SERIES_WORKER} AND busy_s > 0
        ORDER BY 1
    """
    lookback = timedelta(milliseconds=call_lifetime_ms())
    params = window.params()
    params |= {
        "lookback_since": window.since - lookback,
        "lookback_r1": params["r1"] - lookback if params["r1"] < window.until else window.until,
    }
    step_s = window.step.total_seconds()
    return [(b, float(busy_s) / step_s) for b, busy_s in fetch_rows(sql, params)]


def slot_capacity(window: Window) -> int:
    """Lease slots of the worker (or of all workers) as negotiated at their last registration."""
    workers = Worker.objects.all()
    if window.worker:
        workers = workers.filter(worker_id=window.worker)
    return int(workers.aggregate(total=Sum("slots"))["total"] or 0)


@dataclass(frozen=True)
class Contended:
    worker_id: str
    workspace_id: str
    key_hash: str  # "" when grouped by workspace
    calls: int
    total_wait_ms: int
    max_wait_ms: int
    timeouts: int


def top_contended(
    window: Window, *, by_key: bool, limit: int = 10
) -> tuple[list[Contended], list[Contended]]:
    """(top by total queue wait, top by timeouts) of workspaces, or of isolation-key hashes."""
    key = "isolation_key_hash" if by_key else "''"
    workspace = "max(workspace_id)" if by_key else "workspace_id"
    group = "worker_id, isolation_key_hash" if by_key else "worker_id, workspace_id"
    sql = f"""
        WITH u AS (
            SELECT worker_id, workspace_id, isolation_key_hash, count(*) AS calls,
                   sum(queue_wait_ms) AS total_wait, max(queue_wait_ms) AS max_wait,
                   count(*) FILTER (WHERE admission_outcome = 'queue_timeout') AS timeouts
            FROM {TABLE}
            WHERE {window.raw_sql} {window.worker_sql}
              AND fencing_ticket IS NOT NULL
            GROUP BY 1, 2, 3
            UNION ALL
            SELECT worker_id, workspace_id, isolation_key_hash, calls, total_wait_ms,
                   max_wait_ms, timeouts
            FROM {KEYS}
            WHERE ((start >= %(r0)s AND start < %(h0)s) OR (start >= %(h1)s AND start < %(r1)s))
              {window.rollup_worker_sql}
            UNION ALL
            SELECT worker_id, workspace_id, isolation_key_hash, calls, total_wait_ms,
                   max_wait_ms, timeouts
            FROM {KEY_HOURS}
            WHERE start >= %(h0)s AND start < %(h1)s {window.rollup_worker_sql}
        ), g AS (
            SELECT worker_id, {workspace} AS workspace_id, {key} AS key_hash, sum(calls) AS calls,
                   sum(total_wait) AS total_wait, max(max_wait) AS max_wait,
                   sum(timeouts) AS timeouts
            FROM u
            GROUP BY {group}
        ), r AS (
            SELECT g.*, row_number() OVER (ORDER BY total_wait DESC) AS by_wait,
                   row_number() OVER (ORDER BY timeouts DESC, total_wait DESC) AS by_timeouts
            FROM g
        )
        SELECT worker_id, workspace_id, key_hash, calls, total_wait, max_wait, timeouts, by_wait, by_timeouts
        FROM r WHERE by_wait <= %(limit)s OR (by_timeouts <= %(limit)s AND timeouts > 0)
    """
    params = window.params()
    # Whole hours of the rolled-up range come from KeyHour, the rest from KeyBucket.
    hour = timedelta(hours=1)
    h0, h1 = (
        bucket_floor(params["r0"] + hour - timedelta(microseconds=1), hour),
        bucket_floor(params["r1"], hour),
    )
    if h1 <= h0:
        h0 = h1 = params["r1"]
    rows = fetch_rows(sql, params | {"limit": limit, "h0": h0, "h1": h1})
    items = [
        (Contended(r[0], r[1], r[2], int(r[3]), int(r[4]), int(r[5]), int(r[6])), r[7], r[8])
        for r in rows
    ]
    by_wait = [
        c
        for c, rank, _ in sorted(items, key=lambda i: i[1])
        if rank <= limit and c.total_wait_ms > 0
    ]
    by_timeouts = [
        c for c, _, rank in sorted(items, key=lambda i: i[2]) if rank <= limit and c.timeouts > 0
    ]
    return by_wait, by_timeouts


def exec_percentiles(window: Window) -> list[WaitPoint]:
    """Execution-time p50/p95/p99 per bucket over calls that reached a worker and ran."""
    return _percentiles(window, "exec_ms", "exec_ms IS NOT NULL", "exec")


@dataclass(frozen=True)
class Failure:
    http_status: int
    code: str
    operation: str
    calls: int


def failures(window: Window) -> list[Failure]:
    """Every answer but a 200, by status, code and operation (most frequent first)."""
    sql = f"""
        WITH u AS (
            SELECT http_status, code, operation, count(*) AS n
            FROM {TABLE}
            WHERE {window.raw_sql} {window.worker_sql}
              AND http_status <> 200
            GROUP BY 1, 2, 3
            UNION ALL
            SELECT http_status, code, operation, calls
            FROM {FAILURES}
            WHERE start >= %(r0)s AND start < %(r1)s {window.rollup_worker_sql}
        )
        SELECT http_status, code, operation, sum(n) FROM u GROUP BY 1, 2, 3 ORDER BY 4 DESC, 1, 2, 3
    """
    return [Failure(s, c, o, int(n)) for s, c, o, n in fetch_rows(sql, window.params())]


@dataclass(frozen=True)
class Caller:
    tenant_hash: str
    principal_hash: str
    calls: int
    errors: int
    rate_limited: int
    queue_timeouts: int
    queue_full: int
    total_wait_ms: int
    max_wait_ms: int


# Per principal, over the log's rows: what a CallerBucket holds (dashboard/rollup.py too).
CALLER_COLUMNS = """
    count(*),
    count(*) FILTER (WHERE http_status <> 200),
    count(*) FILTER (WHERE admission_outcome = 'rate_limited'),
    count(*) FILTER (WHERE admission_outcome = 'queue_timeout'),
    count(*) FILTER (WHERE admission_outcome = 'queue_full'),
    coalesce(sum(queue_wait_ms), 0), coalesce(max(queue_wait_ms), 0)
"""


def callers(window: Window, *, limit: int = 20) -> list[Caller]:
    """Per principal (and its tenant): who calls, who waits, who is refused; most calls first."""
    sql = f"""
        WITH u (tenant_hash, principal_hash, calls, errors, rate_limited, queue_timeouts,
                queue_full, total_wait, max_wait) AS (
            SELECT tenant_hash, principal_hash, {CALLER_COLUMNS}
            FROM {TABLE}
            WHERE {window.raw_sql} {window.worker_sql}
            GROUP BY 1, 2
            UNION ALL
            SELECT tenant_hash, principal_hash, calls, errors, rate_limited, queue_timeouts,
                   queue_full, total_wait_ms, max_wait_ms
            FROM {CALLERS}
            WHERE start >= %(r0)s AND start < %(r1)s {window.rollup_worker_sql}
        )
        SELECT tenant_hash, principal_hash, sum(calls), sum(errors), sum(rate_limited),
               sum(queue_timeouts), sum(queue_full), sum(total_wait), max(max_wait)
        FROM u GROUP BY 1, 2 ORDER BY 3 DESC, 2 LIMIT %(limit)s
    """
    return [
        Caller(r[0], r[1], *(int(v) for v in r[2:9]))
        for r in fetch_rows(sql, window.params() | {"limit": limit})
    ]


@dataclass(frozen=True)
class DepthPoint:
    t: datetime
    waiting: int
    running: int


def queue_depth(window: Window) -> dict[str, list[DepthPoint]]:
    """Per worker and bucket, the most calls waiting and running in any sample of the bucket.

    From the sampler's rows (dashboard/sampler.py), served by `depth_by_time` or, with a worker
    filter, `depth_by_worker`; a 24 h window's whole buckets from their rollup (DepthBucket). A bucket with no sample (the worker was not registered, or no
    sampler ran) has no point, so the line breaks there.
    """
    sql = f"""
        SELECT worker_id, date_bin(%(step)s, at, {ORIGIN}) AS t, max(waiting), max(running)
        FROM {QueueDepthSample._meta.db_table}
        WHERE ((at >= %(since)s AND at < %(r0)s) OR (at >= %(r1)s AND at < %(until)s))
          {window.worker_sql}
        GROUP BY 1, 2
        UNION ALL
        SELECT worker_id, start, waiting, running FROM {DepthBucket._meta.db_table}
        WHERE start >= %(r0)s AND start < %(r1)s {window.rollup_worker_sql}
        ORDER BY 1, 2
    """
    series: dict[str, list[DepthPoint]] = {}
    for worker_id, t, waiting, running in fetch_rows(sql, window.params()):
        series.setdefault(worker_id, []).append(DepthPoint(t, waiting, running))
    return series
