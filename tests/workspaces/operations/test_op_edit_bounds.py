"""An edit plan is bounded by its call's deadline (issue 34, item 5).

Time is injected: the plan's Pace reads a fake clock, either one that counts its own reads or
one that reads the plan's own step count, so "how far past its deadline did it run" is counted
in steps, never in seconds. The hints of a not-found edit are compared with the eager
computation they replaced (``_old_not_found_reason``, kept here verbatim as the oracle).
"""

from __future__ import annotations

import difflib
import heapq
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sluice_protocol import validate_request

from workspaces.operations import OperationError
from workspaces.operations import conflicts as c
from workspaces.operations.edit import (
    NOT_STARTED,
    edit_file,
    plan_edit,
    planning_pace,
    preview_edit,
)
from workspaces.operations.errors import PACE_EVERY, Pace


def source(lines: int, salt: str = "") -> str:
    return "".join(
        f"    value_{n % 500} = compute{salt}(item_{n % 300}, limit={n % 97})\n"
        for n in range(lines)
    )


def missing_edits(count: int) -> list[dict[str, Any]]:
    """Edits whose words the file has but whose lines it does not: each earns every hint."""
    return [
        {
            "oldText": (
                f"    value_{n} = compute(item_{n}, limit={n % 97})\n"
                f"    value_{n + 1} = compute(item_{n}, limit={n % 89})\n"
                f"    return value_{n}\n"
            ),
            "newText": f"    value_{n} = 0\n",
        }
        for n in range(count)
    ]


def request(operation: str, edits: list[dict[str, Any]], **fields: Any) -> dict[str, object]:
    return validate_request(
        {
            "protocolVersion": 1,
            "operation": operation,
            "workspaceId": "ws-1",
            "path": "big.py",
            "edits": edits,
            **fields,
        }
    )


def reads_counter() -> tuple[Callable[[], float], list[int]]:
    """A clock whose time is the number of times it was read."""
    reads = [0]

    def clock() -> float:
        reads[0] += 1
        return reads[0]

    return clock, reads


def step_pace(deadline_steps: float) -> Pace:
    """A Pace whose clock is its own step count: the deadline is a budget of paced steps."""
    pace = planning_pace(deadline_steps, clock=lambda: pace.steps)
    return pace


# A file of the issue's size: 3.6 MB in 84,000 lines.
ISSUE_LINES = 84_000


@pytest.mark.parametrize("matching", [None, "tolerant"])
def test_a_plan_stops_within_one_pace_of_its_deadline_and_writes_nothing(
    workspace: Path, matching: str | None
) -> None:
    text = source(ISSUE_LINES)
    assert len(text.encode()) > 3_500_000
    (workspace / "big.py").write_text(text)
    fields = {"matching": matching} if matching else {}
    deadline_steps = 3 * ISSUE_LINES  # far less than the hints of 100 edits need
    pace = step_pace(deadline_steps)
    with pytest.raises(OperationError) as caught:
        plan_edit(
            request("edit_file", missing_edits(100), **fields), root=str(workspace), pace=pace
        )
    assert caught.value.code == NOT_STARTED == "EDIT_NOT_STARTED"
    assert "not started" in caught.value.message
    assert deadline_steps <= pace.steps < deadline_steps + PACE_EVERY
    assert (workspace / "big.py").read_text() == text
    assert [p.name for p in workspace.iterdir()] == ["big.py"]


@pytest.mark.parametrize("operation", ["edit_file", "preview_edit"])
def test_issue_scenario_ends_not_started_at_the_deadline(workspace: Path, operation: str) -> None:
    text = source(ISSUE_LINES, salt="_b")
    (workspace / "big.py").write_text(text)
    clock, reads = reads_counter()
    handler = edit_file if operation == "edit_file" else preview_edit
    with pytest.raises(OperationError) as caught:
        handler(
            request(operation, missing_edits(100)), root=str(workspace), deadline=40, clock=clock
        )
    assert caught.value.code == "EDIT_NOT_STARTED"
    # Stopped at the first look at the clock past the deadline, not after the plan.
    assert reads[0] == 40
    assert (workspace / "big.py").read_text() == text
    assert [p.name for p in workspace.iterdir()] == ["big.py"]


def test_an_edit_planned_in_time_but_past_its_deadline_before_the_write_is_not_started(
    workspace: Path,
) -> None:
    (workspace / "big.py").write_text("a = 1\nb = 2\n")
    edits = [{"oldText": "a = 1", "newText": "a = 3"}]
    clock, reads = reads_counter()
    edit_file(request("edit_file", edits), root=str(workspace), deadline=float("inf"), clock=clock)
    looks = reads[0]
    (workspace / "big.py").write_text("a = 1\nb = 2\n")
    clock, reads = reads_counter()
    with pytest.raises(OperationError) as caught:
        # The clock passes the deadline at its last look, the one just before the write.
        edit_file(request("edit_file", edits), root=str(workspace), deadline=looks, clock=clock)
    assert caught.value.code == "EDIT_NOT_STARTED"
    assert (workspace / "big.py").read_text() == "a = 1\nb = 2\n"


def _steps(workspace: Path, lines: int, salt: str, **fields: Any) -> int:
    (workspace / "big.py").write_text(source(lines, salt))
    pace = step_pace(float("inf"))
    with pytest.raises(OperationError) as caught:
        plan_edit(
            request("edit_file", missing_edits(100), **fields), root=str(workspace), pace=pace
        )
    assert caught.value.code == "EDIT_CONFLICT"
    return pace.steps


@pytest.mark.parametrize("matching", [None, "tolerant"])
def test_the_cost_of_a_failing_plan_is_linear_in_the_file(
    workspace: Path, matching: str | None
) -> None:
    fields = {"matching": matching} if matching else {}
    small = _steps(workspace, 5_000, f"_s{matching}", **fields)
    large = _steps(workspace, 10_000, f"_l{matching}", **fields)
    # Twice the file, at most twice the steps (plus one pace of rounding).
    assert small > 5_000
    assert large <= 2 * small + 2 * PACE_EVERY


def test_only_the_failures_the_message_shows_pay_for_their_hints(workspace: Path) -> None:
    (workspace / "big.py").write_text(source(5_000, "_share"))
    costs, shown = [], 0
    for count in (1, 100):
        pace = step_pace(float("inf"))
        with pytest.raises(OperationError) as caught:
            plan_edit(request("edit_file", missing_edits(count)), root=str(workspace), pace=pace)
        costs.append(pace.steps)
        shown = sum(1 for line in caught.value.message.splitlines() if line.startswith("Edit "))
    # The file's lines are split once per text, not once per edit, and the reasons of the
    # failures past the message's length (all but the first ~40 here) are never computed;
    # one more is, to find that it does not fit.
    assert 10 < shown < 100
    assert costs[1] <= (shown + 1) * costs[0]


# --------------------------------------------------------------------------------------------
# The hints are what the eager computation gave.


def _old_closest(wanted: str, lines: Sequence[str]) -> tuple[int, str] | None:
    words = set(c._WORD.findall(wanted))
    if not words:
        return None
    scored = (
        (-len(words.intersection(c._WORD.findall(line))), number, line)
        for number, line in enumerate(lines, start=1)
        if len(line) <= c.CLOSEST_LINE_MAX_CHARS
    )
    best: tuple[float, int, str] | None = None
    for shared, number, line in heapq.nsmallest(c.CLOSEST_CANDIDATES, scored):
        if not shared:
            break
        ratio = difflib.SequenceMatcher(None, wanted, line.strip()).ratio()
        if best is None or (ratio, -number) > (best[0], -best[1]):
            best = (ratio, number, line)
    if best is None or best[0] < c.CLOSEST_MIN_RATIO:
        return None
    return best[1], c._excerpt(best[2])


def _old_present(piece: str, index: int, count: int, stripped: set[str]) -> bool:
    wanted = piece.strip()
    if index == 0:
        return any(c._starts_line(line, wanted) for line in stripped)
    if index == count - 1:
        return any(line.startswith(wanted) for line in stripped)
    return wanted in stripped


def _old_not_found_reason(text: str, old: str, *, whitespace: tuple[int, str] | None) -> str:
    pieces = c._pieces(old)
    file_lines = text.split("\n")
    stripped = [line.strip() for line in file_lines]
    distinct = set(stripped)
    hints: list[str] = []
    if c._has_elision(pieces, distinct):
        hints.append(
            'it contains an elision placeholder ("..."); copy the exact lines instead of '
            "abbreviating"
        )
    if c._has_line_numbers(pieces, text):
        hints.append(
            "it appears to include line-number prefixes from read_file output; remove them"
        )
    if whitespace is not None:
        line, strategy = whitespace
        hints.append(
            f"the same text exists at line {line} with different whitespace ({strategy}); "
            "copy that whitespace exactly"
        )
    if "\r\n" in text and c._BARE_LF.search(old):
        hints.append("the file uses CRLF line endings")
    first = pieces[0].strip()
    if len(pieces) > 1 and first and whitespace is None:
        lines, more = c._capped(
            number
            for number, line in enumerate(stripped, start=1)
            if line.endswith(first) and c._starts_line(line, first)
        )
        if lines:
            hints.append(
                f"its first line appears at {c._line_list(lines, more)}, "
                "but the lines after it differ"
            )
    missing = [
        piece.strip()
        for index, piece in enumerate(pieces)
        if piece.strip()
        and not c._ELISION.fullmatch(piece.strip())
        and not _old_present(piece, index, len(pieces), distinct)
    ]
    closest = next(
        (found for line in missing[: c.CLOSEST_TRIES] if (found := _old_closest(line, file_lines))),
        None,
    )
    if closest is not None:
        hints.append(f"the closest line is line {closest[0]}: {closest[1]}")
    return "; ".join(["old_text was not found", *hints])


_PIECES = ["value", "x", "1", "2:", " ", "  ", "\t", "\n", "\r\n", "...", "# ...", "ab", "a b"]
texts = st.lists(st.sampled_from(_PIECES), max_size=40).map("".join)
olds = st.lists(st.sampled_from(_PIECES), min_size=1, max_size=12).map("".join)
hints_of_whitespace = st.sampled_from([None, (3, "line-trimmed")])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts, old=olds, whitespace=hints_of_whitespace)
def test_not_found_hints_are_those_of_the_eager_computation(
    text: str, old: str, whitespace: tuple[int, str] | None
) -> None:
    pace = Pace(float("inf"), "X", "x")
    new = c.not_found_reason(text, old, whitespace=whitespace, pace=pace)
    assert new == _old_not_found_reason(text, old, whitespace=whitespace)
    # A second look at the same text comes from the cache and says the same.
    assert c.not_found_reason(text, old, whitespace=whitespace, pace=pace) == new


@pytest.mark.parametrize("extra", [-1, 0, 1, 2])
def test_a_wanted_line_skipped_as_too_long_could_never_have_been_the_closest(extra: int) -> None:
    # The most alike a line of CLOSEST_LINE_MAX_CHARS can be to a longer wanted line: its
    # prefix. At CLOSEST_WANTED_MAX_CHARS it still just reaches the ratio; one more, never.
    line = "w " * (c.CLOSEST_LINE_MAX_CHARS // 2 - 1) + "wx"
    assert len(line) == c.CLOSEST_LINE_MAX_CHARS
    wanted = (line + " " + "z" * c.CLOSEST_WANTED_MAX_CHARS)[: c.CLOSEST_WANTED_MAX_CHARS + extra]
    text = f"other\n{line}\n"
    pace = Pace(float("inf"), "X", "x")
    found = c.not_found_reason(text, wanted, whitespace=None, pace=pace)
    assert found == _old_not_found_reason(text, wanted, whitespace=None)
    assert ("closest line is line 2" in found) == (extra <= 0)


def test_the_pace_checks_the_clock_every_pace_of_items() -> None:
    clock, reads = reads_counter()
    pace = Pace(float("inf"), "X", "x", clock)
    assert sum(1 for _ in pace.paced(range(3 * PACE_EVERY + 5))) == 3 * PACE_EVERY + 5
    assert (reads[0], pace.steps) == (3, 3 * PACE_EVERY + 5)
    for _ in itertools.islice(pace.paced(range(10)), 4):
        pass
    assert pace.steps == 3 * PACE_EVERY + 9


def test_repeated_lines_take_the_candidate_places_they_took_before() -> None:
    # Twenty-five copies of a line sharing both words come first, so the eager scan never
    # looked at the better line after them; scoring distinct lines must not either.
    text = "alpha beta gamma delta epsilon\n" * 25 + "alpha beta\n"
    pace = Pace(float("inf"), "X", "x")
    found = c.not_found_reason(text, "alpha beta zeta", whitespace=None, pace=pace)
    assert found == _old_not_found_reason(text, "alpha beta zeta", whitespace=None)


@pytest.mark.parametrize(
    ("text", "old"),
    [
        ("a" * 5_000, "a" * 100),
        ("ab" * 3_000 + "a", "ab" * 50 + "a"),
        ("xyzxy" * 40 + "\nxyzxy xyzxy\n", "xyzxy" * 15),
        ("abc" * 1_000, "abcab" * 20),
    ],
)
def test_long_self_overlapping_old_texts_are_counted_in_one_pass(text: str, old: str) -> None:
    expected = sum(1 for i in range(len(text)) if text.startswith(old, i))
    lines = [n for n, line in enumerate(text.split("\n"), start=1) if old in line]
    pace = Pace(float("inf"), "X", "x")
    count, listed, more = c.exact_places(text, old, pace=pace)
    assert (count, listed, more) == (expected, lines[:5], len(lines[5:]))
    assert pace.steps <= len(text) + len(old)
