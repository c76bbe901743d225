"""Server-side SVG charts: lines, stacked bars and an area, with labelled axes and units.

Drawn as inline SVG so the page needs no chart library and works offline. Every value that
reaches the markup is a number we computed or text we escaped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 640, 240
LEFT, RIGHT, TOP, BOTTOM = 58, 14, 12, 36
# Candidate x tick spacings, in minutes: at most ~8 labels fit across the plot.
_X_STEPS_MIN = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880, 10080)


@dataclass(frozen=True)
class Series:
    label: str
    color: str
    points: Sequence[tuple[datetime, float | None]]
    dashed: bool = False


@dataclass(frozen=True)
class Frame:
    since: datetime
    until: datetime
    step: timedelta
    y_max: float

    @property
    def plot_w(self) -> float:
        return WIDTH - LEFT - RIGHT

    @property
    def plot_h(self) -> float:
        return HEIGHT - TOP - BOTTOM

    def x(self, t: datetime) -> float:
        span = (self.until - self.since).total_seconds() or 1.0
        return LEFT + self.plot_w * (t - self.since).total_seconds() / span

    def y(self, v: float) -> float:
        return TOP + self.plot_h * (1 - v / self.y_max if self.y_max else 1)

    def bar_w(self) -> float:
        span = (self.until - self.since).total_seconds() or 1.0
        return max(self.plot_w * self.step.total_seconds() / span, 1.0)


def nice_ceiling(value: float, *, whole: bool = False) -> float:
    """The y axis top: four gridline steps of 1/2/2.5/5 x 10^n, the smallest that reach value,
    so every tick reads as a round number (never 6.25 or 18.75); `whole` keeps steps of counts
    at 1 or more."""
    quarter = max(value, 0) / 4
    if quarter <= 0:
        return 4.0 if whole else 1.0
    exp = 10 ** math.floor(math.log10(quarter))
    step = next(m * exp for m in (1, 2, 2.5, 5, 10) if m * exp >= quarter * (1 - 1e-9))
    return 4 * max(step, 1.0) if whole else 4 * step


def _y_axis(frame: Frame, fmt: Callable[[float], str], label: str) -> list[str]:
    parts = []
    for i in range(5):
        v = frame.y_max * i / 4
        y = frame.y(v)
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        parts.append(
            f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(fmt(v))}</text>'
        )
    mid = TOP + frame.plot_h / 2
    parts.append(
        f'<text class="axis-label" transform="translate(14 {mid:.1f}) rotate(-90)" text-anchor="middle">'
        f"{escape(label)}</text>"
    )
    return parts


def _x_axis(frame: Frame) -> list[str]:
    span_min = (frame.until - frame.since).total_seconds() / 60
    step_min = next((s for s in _X_STEPS_MIN if span_min / s <= 8), _X_STEPS_MIN[-1])
    epoch_min = math.ceil(frame.since.timestamp() / 60 / step_min) * step_min
    parts = [
        f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + frame.plot_h}" y2="{TOP + frame.plot_h}"/>'
    ]
    tick = datetime.fromtimestamp(epoch_min * 60, tz=frame.since.tzinfo)
    label_fmt = "%H:%M" if span_min <= 1440 else "%a %H:%M"
    while tick <= frame.until:
        x = frame.x(tick)
        parts.append(
            f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP + frame.plot_h}" y2="{TOP + frame.plot_h + 4}"/>'
        )
        parts.append(
            f'<text class="tick" x="{x:.1f}" y="{HEIGHT - 16}" text-anchor="middle">{tick.strftime(label_fmt)}</text>'
        )
        tick += timedelta(minutes=step_min)
    parts.append(
        f'<text class="axis-label" x="{WIDTH - RIGHT}" y="{HEIGHT - 2}" text-anchor="end">time (UTC)</text>'
    )
    return parts


def _svg(parts: list[str], title: str) -> SafeString:
    body = "\n".join(parts)
    # Safe: every interpolated value above is a number we computed or escaped text.
    return mark_safe(
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}" '
        f'preserveAspectRatio="xMidYMid meet" xmlns="http://www.w3.org/2000/svg">{body}</svg>'
    )


def _empty(frame: Frame, parts: list[str], text: str = "No calls in this window") -> None:
    parts.append(
        f'<text class="empty" x="{LEFT + frame.plot_w / 2:.1f}" y="{TOP + frame.plot_h / 2:.1f}" '
        f'text-anchor="middle">{escape(text)}</text>'
    )


def line_chart(
    *,
    title: str,
    series: list[Series],
    since: datetime,
    until: datetime,
    step: timedelta,
    y_label: str,
    fmt: Callable[[float], str],
    y_floor: float = 0.0,
    area: bool = False,
    empty_text: str = "No calls in this window",
) -> SafeString:
    """One polyline per series, broken where a bucket has no value; points sit mid-bucket."""
    values = [v for s in series for _, v in s.points if v is not None]
    frame = Frame(since, until, step, nice_ceiling(max([y_floor, *values]) if values else 1.0))
    parts = _y_axis(frame, fmt, y_label) + _x_axis(frame)
    if not any(s.points for s in series if not s.dashed):
        _empty(frame, parts, empty_text)
    half = step / 2
    for s in series:
        runs: list[list[tuple[float, float]]] = [[]]
        last: datetime | None = None
        for t, v in s.points:
            if v is None or (last is not None and t - last > step and not s.dashed):
                runs.append([])
            if v is not None:
                runs[-1].append((frame.x(t + half), frame.y(v)))
                last = t
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        for run in filter(None, runs):
            pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
            if area and not s.dashed:
                base = frame.y(0)
                parts.append(
                    f'<polygon points="{run[0][0]:.1f},{base:.1f} {pts} {run[-1][0]:.1f},{base:.1f}" '
                    f'fill="{s.color}" fill-opacity="0.18" stroke="none"/>'
                )
            if len(run) == 1:
                x, y = run[0]
                parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{s.color}"/>')
            else:
                parts.append(
                    f'<polyline points="{pts}" fill="none" stroke="{s.color}" stroke-width="1.8"{dash} '
                    'stroke-linejoin="round"/>'
                )
    return _svg(parts, title)


def stacked_bars(
    *,
    title: str,
    buckets: dict[datetime, dict[str, int]],
    categories: list[tuple[str, str, str]],
    since: datetime,
    until: datetime,
    step: timedelta,
    y_label: str,
) -> SafeString:
    """One bar per bucket, stacked by category (key, label, color) from the bottom up."""
    totals = [sum(counts.values()) for counts in buckets.values()]
    frame = Frame(since, until, step, nice_ceiling(max(totals, default=1), whole=True))
    parts = _y_axis(frame, lambda v: f"{v:g}", y_label) + _x_axis(frame)
    if not buckets:
        _empty(frame, parts)
    width = frame.bar_w()
    gap = 1.0 if width > 4 else 0.0
    for t, counts in sorted(buckets.items()):
        x = frame.x(t)
        if x < LEFT - 0.5:
            continue
        tip = ", ".join(f"{label} {counts[key]}" for key, label, _ in categories if counts.get(key))
        group = [f"<g><title>{t:%H:%M:%S} UTC: {escape(tip)}</title>"]
        acc = 0
        for key, _, color in categories:
            n = counts.get(key, 0)
            if not n:
                continue
            y_top, y_bottom = frame.y(acc + n), frame.y(acc)
            group.append(
                f'<rect x="{x + gap / 2:.1f}" y="{y_top:.1f}" width="{max(width - gap, 0.6):.1f}" '
                f'height="{max(y_bottom - y_top, 0.5):.1f}" fill="{color}"/>'
            )
            acc += n
        group.append("</g>")
        parts.append("".join(group))
    return _svg(parts, title)


def ms_axis(max_ms: float) -> tuple[float, str, Callable[[float], str]]:
    """(divisor, unit, tick formatter) so a wait axis reads in ms or in seconds."""
    if max_ms >= 2000:
        return 1000.0, "s", lambda v: f"{v:g}"
    return 1.0, "ms", lambda v: f"{v:g}"
