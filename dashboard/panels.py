"""The history half of the dashboard: every chart and table for one window, ready to render."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.utils.safestring import SafeString

from dashboard import history
from dashboard.attribution import Blocker, Timeout, blamed_workspaces, blockers, recent_timeouts
from dashboard.charts import Series, line_chart, ms_axis, nice_ceiling, stacked_bars
from dashboard.window import Window

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
# Timeouts looked at for the blame tables; the table lists the newest TIMEOUT_ROWS of them.
BLAME_SAMPLE = 200
TIMEOUT_ROWS = 20


@dataclass
class History:
    window: Window
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


def history_panels(window: Window) -> History:
    step_min = window.step.total_seconds() / 60
    per = "minute" if step_min == 1 else f"{step_min:g} min"

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

    top_ws, top_ws_t = history.top_contended(window, by_key=False)
    top_keys, top_keys_t = history.top_contended(window, by_key=True)
    sample = recent_timeouts(window, limit=BLAME_SAMPLE)
    return History(
        window=window,
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
    )
