"""The charts' y axes: four gridline steps that each read as a round number."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dashboard.charts import nice_ceiling


def round_number(v: float) -> bool:
    """1, 2, 2.5 or 5 times a power of ten (or zero)."""
    if v == 0:
        return True
    mantissa = v / 10 ** math.floor(math.log10(v) + 1e-12)
    return any(math.isclose(mantissa, m) for m in (1, 2, 2.5, 5))


@pytest.mark.parametrize(
    ("value", "top"),
    [(0, 1), (1, 1), (4, 4), (4.5, 8), (18, 20), (25, 40), (100, 100), (750, 800), (0.3, 0.4)],
)
def test_the_top_is_four_round_steps_at_or_above_the_value(value: float, top: float) -> None:
    assert nice_ceiling(value) == pytest.approx(top)


@pytest.mark.parametrize(("value", "top"), [(0, 4), (1, 4), (3, 4), (5, 8), (18, 20), (25, 40)])
def test_a_count_axis_never_ticks_between_whole_numbers(value: float, top: float) -> None:
    assert nice_ceiling(value, whole=True) == pytest.approx(top)


@given(st.floats(min_value=1e-3, max_value=1e9, allow_nan=False))
def test_every_tick_is_round_and_the_top_is_reached(value: float) -> None:
    top = nice_ceiling(value)
    assert top >= value * (1 - 1e-9)
    assert round_number(top / 4)
    # At most one step of 1/2/2.5/5 too high: the data fills most of the plot.
    assert top < value * 2 + 1e-9
