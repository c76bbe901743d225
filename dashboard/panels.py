"""The history half of the dashboard: every chart and table for one window, ready to render."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django.urls import reverse
from django.utils.safestring import SafeString

from dashboard import history
from dashboard.attribution import Blocker, Timeout, blamed_workspaces, blockers, recent_timeouts
from dashboard.charts import Series, line_chart, ms_axis, nice_ceiling, stacked_bars
from dashboard.events import EventRow, worker_events
from dashboard.window import Window, step_label
from workspaces.models import Principal
from workspaces.secrets import keyed_hash

# Colours: calm for "fine", warm for "waited", red for "gave up". Readable on white.
WAIT_COLORS = {"p50": "#2563eb", "p95": "#d97706", "p99": "#dc2626"}
OUTCOME_COLORS = {
    "ok": "#16a34a",
    "worker_error": "#a3a3a3",
    "expired": "#7c2d12",
    "queue_timeout": "#dc2626",
    "queue_full": "#f97316",
    "rate_limited": "#9333ea",
    "cancelled": "#64748b",
    "refused": "#cbd5e1",
}
OUTCOME_LABELS = {
    "ok": "OK",
    "worker_error": "worker error",
    "expired": "expired",
    "queue_timeout": "queue timeout",
    "queue_full": "queue full",
    "rate_limited": "rate limited",
    "cancelled": "cancelled",
    "refused": "refused",
}
EXEC_COLORS = {"p50": "#0891b2", "p95": "#7c3aed", "p99": "#be123c"}
THROUGHPUT_COLORS = {"calls": "#2563eb", "errors": "#dc2626"}
DEPTH_COLORS = {"waiting": "#d97706", "running": "#0d9488"}
# One line per worker on the all-workers depth chart, the busiest first; past this many the
# chart would be noise, so the rest are named in a note (filter by worker to see one).
DEPTH_WORKERS_SHOWN = 8
WORKER_PALETTE = (
    "#2563eb",
    "#d97706",
    "#16a34a",
    "#9333ea",
    "#dc2626",
    "#0891b2",
    "#be123c",
    "#4d7c0f",
)
_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)
# Timeouts looked at for the blame tables; the table lists the newest TIMEOUT_ROWS of them.
BLAME_SAMPLE = 200
TIMEOUT_ROWS = 20


def log_url(window: Window, **filters: Any) -> str:
    """The completion-log admin page listing exactly the rows behind a number on the dashboard."""
    params = {"since": window.since.isoformat(), "until": window.until.isoformat()}
    if window.worker:
        params["worker"] = window.worker
    params.update({k: str(v) for k, v in filters.items() if v not in (None, "")})
    return f"{reverse('admin:admission_completionlog_changelist')}?{urlencode(params)}"


def bucket_starts(window: Window) -> list[datetime]:
    """Every bucket of the window, as date_bin numbers them, so an idle bucket plots as 0."""
    step = window.step
    first = _ORIGIN + ((window.since - _ORIGIN) // step) * step
    starts = []
    t = first
    while t < window.until:
        starts.append(t)
        t += step
    return starts


def principal_names(hashes: set[str]) -> dict[str, str]:
    """principal hash -> "tenant / user" for the hashes on the page (staff may see names)."""
    names = {}
    for pid, tid, user, tenant in Principal.objects.values_list(
        "pk", "tenant_id", "name", "tenant__name"
    ):
        h = principal_hash(tenant_id=tid, principal_id=pid)
        if h in hashes:
            names[h] = f"{tenant} / {user}"
    return names


def principal_hash(*, tenant_id: int, principal_id: int) -> str:
    # The same keyed hash the completion rows carry (workspaces/access.py).
    return keyed_hash("principal", f"{tenant_id}:{principal_id}")


@dataclass
class CallerRow:
    caller: history.Caller
    name: str
    url: str
    errors_url: str
    rate_limited_url: str
    timeouts_url: str


@dataclass
class FailureRow:
    label: str
    calls: int
    url: str


@dataclass
class History:
    window: Window
    throughput_chart: SafeString
    error_rate_chart: SafeString
    exec_chart: SafeString
    failures_by_code: list[FailureRow]
    failures_by_operation: list[FailureRow]
    callers: list[CallerRow]
    errors: int
    links: dict[str, str]
    wait_chart: SafeString
    outcome_chart: SafeString
    usage_chart: SafeString
    legend: list[tuple[str, str, str]]
    top_workspaces: list[history.Contended]
    top_workspaces_timeouts: list[history.Contended]
    top_keys: list[history.Contended]
    top_keys_timeouts: list[history.Contended]
    timeouts: list[Timeout]
    timeouts_total: int
    blockers: list[Blocker]
    blamed: list[dict[str, Any]]
    calls: int
    capacity: int
    depth_chart: SafeString
    depth_legend: list[tuple[str, str]]
    depth_hidden: list[str]
    depth_peak: tuple[int, str, datetime] | None  # (most waiting, worker, bucket)
    worker_events: list[EventRow]
    worker_events_total: int


def depth_panel(
    window: Window,
) -> tuple[SafeString, list[tuple[str, str]], list[str], tuple[int, str, datetime] | None]:
    """(chart, legend of (label, colour), workers left off, the peak) for the queue-depth chart."""
    depth = history.queue_depth(window)
    peaks = [(p.waiting, w, p.t) for w, points in depth.items() for p in points if p.waiting]
    peak = max(peaks, key=lambda p: (p[0], p[2]), default=None)
    if window.worker:
        points = depth.get(window.worker, [])
        series = [
            Series("waiting", DEPTH_COLORS["waiting"], [(p.t, p.waiting) for p in points]),
            Series("running", DEPTH_COLORS["running"], [(p.t, p.running) for p in points]),
        ]
        hidden: list[str] = []
        y_label = "calls (most in the bucket)"
    else:
        busiest = sorted(depth, key=lambda w: (-max(p.waiting for p in depth[w]), w))
        shown, hidden = busiest[:DEPTH_WORKERS_SHOWN], busiest[DEPTH_WORKERS_SHOWN:]
        series = [
            Series(w, WORKER_PALETTE[i], [(p.t, p.waiting) for p in depth[w]])
            for i, w in enumerate(sorted(shown))
        ]
        y_label = "calls waiting (most in the bucket)"
    chart = line_chart(
        title="Queue depth",
        series=series,
        since=window.since,
        until=window.until,
        step=window.step,
        y_label=y_label,
        fmt=lambda v: f"{v:g}",
        y_floor=4,
        empty_text="No queue samples in this window (is drain_completions running?)",
    )
    return chart, [(s.label, s.color) for s in series], hidden, peak


def history_panels(window: Window) -> History:
    per = step_label(window.step)

    waits = history.wait_percentiles(window)
    divisor, unit, fmt = ms_axis(nice_ceiling(max((p.p99_ms for p in waits), default=0)))
    wait_series = [
        Series(name, WAIT_COLORS[name], [(p.t, getattr(p, f"{name}_ms") / divisor) for p in waits])
        for name in ("p99", "p95", "p50")
    ]
    wait_chart = line_chart(
        title="Queue wait percentiles",
        series=wait_series,
        since=window.since,
        until=window.until,
        step=window.step,
        y_label=f"queue wait ({unit})",
        fmt=fmt,
    )

    buckets = history.outcomes(window)
    categories = [(key, OUTCOME_LABELS[key], OUTCOME_COLORS[key]) for key in history.OUTCOMES]
    outcome_chart = stacked_bars(
        title="Outcomes",
        buckets=buckets,
        categories=categories,
        since=window.since,
        until=window.until,
        step=window.step,
        y_label=f"calls per {per}",
    )
    present = {key for counts in buckets.values() for key in counts}

    capacity = history.slot_capacity(window)
    usage = history.slot_usage(window)
    usage_series = [Series("busy", "#0d9488", usage)]
    if capacity:
        usage_series.append(
            Series(
                "capacity",
                "#475569",
                [(window.since, capacity), (window.until - window.step, capacity)],
                dashed=True,
            )
        )
    usage_chart = line_chart(
        title="Slot utilisation",
        series=usage_series,
        since=window.since,
        until=window.until,
        step=window.step,
        y_label="busy slots (average)",
        fmt=lambda v: f"{v:g}",
        y_floor=capacity,
        area=True,
    )

    starts = bucket_starts(window)
    totals = {t: sum(c.values()) for t, c in buckets.items()}
    errors_at = {t: sum(n for k, n in c.items() if k != "ok") for t, c in buckets.items()}
    throughput_chart = line_chart(
        title="Throughput",
        series=[
            Series("calls", THROUGHPUT_COLORS["calls"], [(t, totals.get(t, 0)) for t in starts]),
            Series(
                "errors", THROUGHPUT_COLORS["errors"], [(t, errors_at.get(t, 0)) for t in starts]
            ),
        ],
        since=window.since,
        until=window.until,
        step=window.step,
        y_label=f"calls per {per}",
        fmt=lambda v: f"{v:g}",
    )
    error_rate_chart = line_chart(
        title="Error rate",
        series=[
            Series(
                "error rate",
                THROUGHPUT_COLORS["errors"],
                [(t, 100 * errors_at[t] / totals[t] if totals.get(t) else None) for t in starts],
            )
        ],
        since=window.since,
        until=window.until,
        step=window.step,
        y_label="answers other than 200 (%)",
        fmt=lambda v: f"{v:g}",
        y_floor=100,
        area=True,
    )
    runs = history.exec_percentiles(window)
    e_div, e_unit, e_fmt = ms_axis(nice_ceiling(max((p.p99_ms for p in runs), default=0)))
    exec_chart = line_chart(
        title="Execution time percentiles",
        series=[
            Series(n, EXEC_COLORS[n], [(p.t, getattr(p, f"{n}_ms") / e_div) for p in runs])
            for n in ("p99", "p95", "p50")
        ],
        since=window.since,
        until=window.until,
        step=window.step,
        y_label=f"execution ({e_unit})",
        fmt=e_fmt,
    )
    fails = history.failures(window)
    by_code: dict[tuple[int, str], int] = {}
    by_op: dict[str, int] = {}
    for f in fails:
        by_code[(f.http_status, f.code)] = by_code.get((f.http_status, f.code), 0) + f.calls
        by_op[f.operation] = by_op.get(f.operation, 0) + f.calls
    failures_by_code = [
        FailureRow(f"{status} {code}".strip(), n, log_url(window, http_status=status, code=code))
        for (status, code), n in sorted(by_code.items(), key=lambda i: -i[1])
    ]
    failures_by_operation = [
        FailureRow(op or "(none)", n, log_url(window, operation=op, failed=1))
        for op, n in sorted(by_op.items(), key=lambda i: -i[1])
    ]
    caller_stats = history.callers(window)
    names = principal_names({c.principal_hash for c in caller_stats})
    caller_rows = [
        CallerRow(
            caller=c,
            name=names.get(c.principal_hash, c.principal_hash[:12]),
            url=log_url(window, principal_hash=c.principal_hash),
            errors_url=log_url(window, principal_hash=c.principal_hash, failed=1),
            rate_limited_url=log_url(
                window, principal_hash=c.principal_hash, admission_outcome="rate_limited"
            ),
            timeouts_url=log_url(
                window, principal_hash=c.principal_hash, admission_outcome="queue_timeout"
            ),
        )
        for c in caller_stats
    ]

    top_ws, top_ws_t = history.top_contended(window, by_key=False)
    top_keys, top_keys_t = history.top_contended(window, by_key=True)
    sample = recent_timeouts(window, limit=BLAME_SAMPLE)
    depth_chart, depth_legend, depth_hidden, depth_peak = depth_panel(window)
    events, events_total = worker_events(window)
    return History(
        window=window,
        throughput_chart=throughput_chart,
        error_rate_chart=error_rate_chart,
        exec_chart=exec_chart,
        failures_by_code=failures_by_code,
        failures_by_operation=failures_by_operation,
        callers=caller_rows,
        errors=sum(errors_at.values()),
        links={
            "all": log_url(window),
            "errors": log_url(window, failed=1),
            "timeouts": log_url(window, admission_outcome="queue_timeout"),
            "rate_limited": log_url(window, admission_outcome="rate_limited"),
        },
        wait_chart=wait_chart,
        outcome_chart=outcome_chart,
        usage_chart=usage_chart,
        legend=[c for c in categories if c[0] in present],
        top_workspaces=top_ws,
        top_workspaces_timeouts=top_ws_t,
        top_keys=top_keys,
        top_keys_timeouts=top_keys_t,
        timeouts=sample[:TIMEOUT_ROWS],
        timeouts_total=sum(c.get("queue_timeout", 0) for c in buckets.values()),
        blockers=blockers(sample)[:10],
        blamed=blamed_workspaces(sample)[:10],
        calls=sum(sum(c.values()) for c in buckets.values()),
        capacity=capacity,
        depth_chart=depth_chart,
        depth_legend=depth_legend,
        depth_hidden=depth_hidden,
        depth_peak=depth_peak,
        worker_events=events,
        worker_events_total=events_total,
    )
