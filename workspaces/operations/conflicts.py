"""The EDIT_CONFLICT explanation of edits that did not match, in the shape LibreChat parses.

LibreChat's workspace client (``parseEditConflict``) reads these messages back into facts:
which edit failed, whether its ``oldText`` was missing or ambiguous, the line numbers, and
hints. A message that strays from the shape below gives the model no hints at all, so every
sentence here is fixed text around numbers (docs/api.md, "Edit conflict messages"):

* one edit:  ``Workspace edit did not apply and nothing was written: <reason>.``
* a batch:   ``<F> of <N> workspace edits did not apply, so nothing was written. Every other
  edit matched.``, one ``Edit <i>: <reason>.`` line per failing edit (those that do not fit
  the length budget are counted in ``<k> more failing edit(s) not shown.``), and last
  ``Line numbers account for the earlier edits in this batch.``

A reason is ``old_text matched <n> locations[ (<strategy>)] at line(s) ...; include more
surrounding lines so it matches exactly one`` or ``old_text was not found`` plus the hints
that hold. The one piece of file content quoted, the closest line, is cut short and kept on
one line, since a line break in it would end the message's line for the parser.
"""

from __future__ import annotations

import collections
import difflib
import heapq
import itertools
import operator
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

from sluice_protocol import EDIT_MATCH_STRATEGIES, MAX_ERROR_CHARS

from workspaces.operations.errors import Pace
from workspaces.operations.textcache import TextCache

# LibreChat accepts up to 8,192 characters, but the worker cuts any error at MAX_ERROR_CHARS,
# and a cut message no longer parses.
MESSAGE_MAX_CHARS = min(8192, MAX_ERROR_CHARS)
MAX_LISTED_LINES = 5
# The strategy names LibreChat's grammar knows; Sluice's own (§2.2.1) are the same names, and
# a new one must not reach a message before LibreChat can read it.
GRAMMAR_STRATEGIES = frozenset(
    {"exact", "line-trimmed", "whitespace-normalized", "indentation-flexible"}
)
assert EDIT_MATCH_STRATEGIES <= GRAMMAR_STRATEGIES
EXCERPT_MAX_CHARS = 120
# Lines longer than this are not scored for the closest-line hint (minified files).
CLOSEST_LINE_MAX_CHARS = 1000
CLOSEST_CANDIDATES = 20
CLOSEST_MIN_RATIO = 0.6
CLOSEST_TRIES = 3
# difflib's ratio is at most 2 * len(line) / (len(wanted) + len(line)), so a wanted line
# longer than this cannot reach CLOSEST_MIN_RATIO with any scored line; skipping it saves a
# quadratic comparison that could never succeed.
CLOSEST_WANTED_MAX_CHARS = int(CLOSEST_LINE_MAX_CHARS * (2 - CLOSEST_MIN_RATIO) / CLOSEST_MIN_RATIO)
# Longer self-overlapping oldTexts are counted by a paced KMP over the text rather than by a
# lookahead pattern, which compares the whole oldText at every position of the file.
LOOKAHEAD_MAX_CHARS = 64
BATCH_NOTE = "Line numbers account for the earlier edits in this batch."

_ELISION = re.compile(r"(?:#|//|--|;|/\*|<!--|\*)?\s*(?:\.\.\.|…)[\w\s.…'-]*(?:\*/|-->)?")
_LINE_PREFIX = re.compile(r"\s*(\d{1,9})(?::\s?|\t|\s*\|\s?|→)(.*)", re.DOTALL)
_WORD = re.compile(r"\w+")
_BARE_LF = re.compile(r"(?<!\r)\n")


def _line_list(lines: Sequence[int], more: int) -> str:
    label = "line" if len(lines) == 1 and not more else "lines"
    tail = f" and {more} more" if more else ""
    return f"{label} {', '.join(map(str, lines))}{tail}"


def _capped(lines: Iterable[int]) -> tuple[list[int], int]:
    """The first MAX_LISTED_LINES of ascending distinct ``lines``, and how many follow."""
    listed: list[int] = []
    more = 0
    for line in lines:
        if len(listed) < MAX_LISTED_LINES:
            listed.append(line)
        else:
            more += 1
    return listed, more


def locate(text: str, offsets: Iterable[int]) -> tuple[int, list[int], int]:
    """(how many offsets, the first distinct line numbers, how many further distinct lines)
    for ascending ``offsets`` into ``text``."""
    count = 0

    def lines() -> Iterator[int]:
        nonlocal count
        line, counted_to, last = 1, 0, 0
        for offset in offsets:
            count += 1
            line += text.count("\n", counted_to, offset)
            counted_to = offset
            if line != last:
                last = line
                yield line

    listed, more = _capped(lines())
    return count, listed, more


def _borders(old: str, pace: Pace) -> list[int]:
    """KMP's prefix function: per prefix of ``old``, its longest proper border."""
    prefix = [0] * len(old)
    matched = 0
    for index in pace.paced(range(1, len(old))):
        while matched and old[index] != old[matched]:
            matched = prefix[matched - 1]
        if old[index] == old[matched]:
            matched += 1
        prefix[index] = matched
    return prefix


def _overlapping_count(text: str, old: str, prefix: list[int], pace: Pace) -> int:
    """Occurrences of ``old`` in ``text``, overlapping ones included: one step per character
    of the text, however ``old`` repeats itself."""
    count = matched = 0
    for char in pace.paced(text):
        while matched and char != old[matched]:
            matched = prefix[matched - 1]
        if char == old[matched]:
            matched += 1
        if matched == len(old):
            count += 1
            matched = prefix[matched - 1]
    return count


def exact_places(text: str, old: str, *, pace: Pace) -> tuple[int, list[int], int]:
    """``locate`` for every occurrence of ``old``, overlapping ones included, without a Python
    step per occurrence ("a" in four million "a"s is one line and one C-level count)."""
    prefix = _borders(old, pace)
    if not prefix[-1]:
        count = text.count(old)  # without a border no occurrence can overlap another
    elif len(old) <= LOOKAHEAD_MAX_CHARS:
        count = len(re.findall(f"(?={re.escape(old)})", text))
    else:
        count = _overlapping_count(text, old, prefix, pace)
    if "\n" not in old:
        # Two C-level passes over the lines: the first few that hold ``old``, and how many do.
        pace.check()
        lines = _view(text, pace).lines
        holds = operator.methodcaller("__contains__", old)
        listed = list(
            itertools.islice(
                itertools.compress(itertools.count(1), map(holds, lines)), MAX_LISTED_LINES
            )
        )
        pace.check()
        return count, listed, sum(map(holds, lines)) - len(listed)

    def line_starts() -> Iterator[int]:
        # One offset per line that an occurrence starts on.
        position = text.find(old)
        while position >= 0:
            yield position
            newline = text.find("\n", position)
            position = text.find(old, newline + 1)

    _, listed, more = locate(text, pace.paced(line_starts()))
    return count, listed, more


def ambiguous_reason(strategy: str, places: tuple[int, list[int], int]) -> str:
    count, lines, more = places
    how = "" if strategy == "exact" else f" ({strategy})"
    return (
        f"old_text matched {count} locations{how} at {_line_list(lines, more)}; "
        "include more surrounding lines so it matches exactly one"
    )


def _pieces(old: str) -> list[str]:
    normalized = old.replace("\r\n", "\n")
    return (normalized[:-1] if normalized.endswith("\n") else normalized).split("\n")


def _starts_line(line: str, first: str) -> bool:
    """A stripped file line that oldText's stripped first line can begin in: the whole line,
    or its tail from a word boundary (oldText may start mid-line)."""
    if not line.endswith(first):
        return False
    cut = len(line) - len(first)
    return cut == 0 or not (line[cut - 1].isalnum() and first[0].isalnum())


def _has_elision(pieces: Sequence[str], file_lines: set[str]) -> bool:
    # A line the file holds itself (a Python "..." body) is not a placeholder.
    return any(
        _ELISION.fullmatch(piece.strip()) and piece.strip() not in file_lines for piece in pieces
    )


def _has_line_numbers(pieces: Sequence[str], text: str) -> bool:
    """Every non-blank line starts with a number, the numbers count up by one, and (for a
    single line, where one number proves little) the rest of the line is in the file."""
    numbered = [_LINE_PREFIX.fullmatch(piece) for piece in pieces if piece.strip()]
    if not numbered or not all(numbered):
        return False
    numbers = [int(m.group(1)) for m in numbered if m]
    if any(b != a + 1 for a, b in itertools.pairwise(numbers)):
        return False
    rest = numbered[0].group(2).strip() if numbered[0] else ""
    return len(numbers) > 1 or bool(rest and rest in text)


def _present(piece: str, index: int, count: int, stripped: set[str], pace: Pace) -> bool:
    # The first and last lines of oldText may be parts of a file line; inner ones are whole.
    wanted = piece.strip()
    if index == 0:
        return any(_starts_line(line, wanted) for line in pace.paced(stripped))
    if index == count - 1:
        return any(line.startswith(wanted) for line in pace.paced(stripped))
    return wanted in stripped


def _excerpt(line: str) -> str:
    flat = "".join(
        " " if unicodedata.category(ch) in ("Cc", "Zl", "Zp") else ch for ch in line.strip()
    )
    return flat if len(flat) <= EXCERPT_MAX_CHARS else flat[: EXCERPT_MAX_CHARS - 1] + "…"


class _View(NamedTuple):
    lines: list[str]
    stripped: list[str]
    distinct: set[str]  # of the stripped lines
    counts: collections.Counter[str]  # of the stripped lines
    distinct_lines: set[str]


_VIEWS: TextCache[_View] = TextCache()


def _view(text: str, pace: Pace) -> _View:
    """The file's lines, stripped and as a set, once per text: every failing edit of a call
    sees the same text."""
    view = _VIEWS.get(text)
    if view is None:
        # C-level passes over the lines (a few milliseconds per megabyte), checked between.
        lines = text.split("\n")
        stripped = list(map(str.strip, lines))
        pace.check()
        counts = collections.Counter(stripped)
        pace.check()
        view = _View(lines, stripped, set(counts), counts, set(lines))
        _VIEWS.put(text, view)
    return view


def _closest(wanted: str, view: _View, pace: Pace) -> tuple[int, str] | None:
    """The file line most like ``wanted``: lines sharing most words with it, then the best
    difflib ratio among those (ties to the earlier line), if it is at least CLOSEST_MIN_RATIO."""
    if len(wanted) > CLOSEST_WANTED_MAX_CHARS:
        return None
    words = set(_WORD.findall(wanted))
    if not words:
        return None
    # Each distinct line is scored once (a repetitive file has far fewer than its lines), and
    # one C-level pass finds the numbers of the lines that share a word.
    shared: dict[str, int] = {}
    for line in pace.paced(view.distinct_lines):
        if len(line) <= CLOSEST_LINE_MAX_CHARS:
            count = len(words.intersection(_WORD.findall(line)))
            if count:
                shared[line] = -count
    pace.check()
    numbers = itertools.compress(itertools.count(1), map(shared.__contains__, view.lines))
    scored = ((shared[view.lines[number - 1]], number) for number in pace.paced(numbers))
    best: tuple[float, int, str] | None = None
    for _, number in heapq.nsmallest(CLOSEST_CANDIDATES, scored):
        line = view.lines[number - 1]
        ratio = difflib.SequenceMatcher(None, wanted, line.strip()).ratio()
        if best is None or (ratio, -number) > (best[0], -best[1]):
            best = (ratio, number, line)
    if best is None or best[0] < CLOSEST_MIN_RATIO:
        return None
    return best[1], _excerpt(best[2])


def not_found_reason(text: str, old: str, *, whitespace: tuple[int, str] | None, pace: Pace) -> str:
    """``old_text was not found`` and each hint that holds for this text; ``whitespace`` is
    (line, strategy) of the one place a tolerant edit would have taken, if any."""
    pieces = _pieces(old)
    view = _view(text, pace)
    distinct = view.distinct
    hints: list[str] = []
    if _has_elision(pieces, distinct):
        hints.append(
            'it contains an elision placeholder ("..."); copy the exact lines instead of '
            "abbreviating"
        )
    if _has_line_numbers(pieces, text):
        hints.append(
            "it appears to include line-number prefixes from read_file output; remove them"
        )
    if whitespace is not None:
        line, strategy = whitespace
        hints.append(
            f"the same text exists at line {line} with different whitespace ({strategy}); "
            "copy that whitespace exactly"
        )
    if "\r\n" in text and _BARE_LF.search(old):
        hints.append("the file uses CRLF line endings")
    first = pieces[0].strip()
    # Beside a whitespace hint it would only repeat that place less precisely.
    if len(pieces) > 1 and first and whitespace is None:
        starting = {
            line
            for line in pace.paced(distinct)
            if line.endswith(first) and _starts_line(line, first)
        }
        numbers = itertools.compress(itertools.count(1), map(starting.__contains__, view.stripped))
        lines = list(itertools.islice(numbers, MAX_LISTED_LINES))
        more = sum(view.counts[line] for line in starting) - len(lines)
        if lines:
            hints.append(
                f"its first line appears at {_line_list(lines, more)}, "
                "but the lines after it differ"
            )
    # Placeholders are not meant to match anything; each other line the file lacks gets a
    # look, the first few only (each look is a pass over the file).
    missing = [
        piece.strip()
        for index, piece in enumerate(pieces)
        if piece.strip()
        and not _ELISION.fullmatch(piece.strip())
        and not _present(piece, index, len(pieces), distinct, pace)
    ]
    closest = next(
        (found for line in missing[:CLOSEST_TRIES] if (found := _closest(line, view, pace))),
        None,
    )
    if closest is not None:
        hints.append(f"the closest line is line {closest[0]}: {closest[1]}")
    return "; ".join(["old_text was not found", *hints])


def conflict_message(edit_count: int, failures: Sequence[tuple[int, Callable[[], str]]]) -> str:
    """The whole EDIT_CONFLICT message for ``failures`` ((edit number, reason), in order).
    Each reason is computed only if its line is shown."""
    if edit_count == 1:
        return f"Workspace edit did not apply and nothing was written: {failures[0][1]()}."
    header = (
        f"{len(failures)} of {edit_count} workspace edits did not apply, so nothing was "
        "written. Every other edit matched."
    )
    hidden_line = "{} more failing edits not shown."
    budget = MESSAGE_MAX_CHARS - len(header) - len(BATCH_NOTE) - len(hidden_line) - 8
    shown: list[str] = []
    used = 0
    for number, reason in failures:
        line = f"Edit {number}: {reason()}."
        if shown and used + len(line) + 1 > budget:
            break
        shown.append(line)
        used += len(line) + 1
    hidden = len(failures) - len(shown)
    if hidden:
        shown.append(f"{hidden} more failing edit{'' if hidden == 1 else 's'} not shown.")
    return "\n".join([header, *shown, BATCH_NOTE])
