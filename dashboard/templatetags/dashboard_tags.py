"""Formatting for the dashboard: durations a person reads at a glance."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def duration_ms(value: float | int | None) -> str:
    """850 ms, 1.25 s, 42 s, 3 min 05 s, 1 h 02 min."""
    if value is None:
        return "\u2013"  # an en dash: "no value"
    ms = float(value)
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {sec:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


@register.filter
def short_hash(value: str | None) -> str:
    return (value or "")[:8]
