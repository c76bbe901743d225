"""Where an edit's ``oldText`` lands in a file: exact, then (when asked) tolerant strategies.

Contract §2.2.1. Each strategy returns the candidate spans it sees, overlapping ones included,
because an edit without ``replaceAll`` must be unambiguous: ``aa`` in ``aaa`` is two places,
not one. A ``replaceAll`` edit then takes the non-overlapping spans from left to right.

Tolerant strategies compare text that differs only in whitespace:

* ``line-trimmed``: whole lines, each compared without its leading and trailing whitespace;
  the replacement is moved from the block's common indentation to the file's;
* ``whitespace-normalized``: whitespace-separated tokens, any run of whitespace (line breaks
  included) counting as one space; whole tokens only, and at least two of them, so a single
  word never lands on an arbitrary identifier;
* ``indentation-flexible``: whole lines, compared after removing the block's common
  indentation (so the block may sit at another depth, but its inner shape must agree); the
  replacement is moved to the file's indentation.

An edit that does not match is not an exception but an ``Unmatched`` carrying its clause of
the EDIT_CONFLICT message (``conflicts.py``), so the caller can try the remaining edits and
name every failure at once.

Line-window matches span whole lines, keep the file's own line terminators and give the
replacement the terminator style (LF or CRLF) found where it lands. Every search is linear in
the file (KMP over lines or tokens), except the indentation check of repeated candidates,
which has a fixed budget: past it the edit is refused rather than left to run for seconds.
Every loop that takes a Python step per line or token is paced (``errors.Pace``): past the
call's deadline it stops with the not-started answer, since nothing has been written yet.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sluice_protocol import TOLERANT_STRATEGIES

from workspaces.operations.conflicts import (
    ambiguous_reason,
    exact_places,
    locate,
    not_found_reason,
)
from workspaces.operations.errors import OperationError, Pace
from workspaces.operations.textcache import TextCache

# Line comparisons the indentation-flexible strategy may spend on one edit.
MAX_INDENT_VERIFICATIONS = 100_000
# Distinct words of oldText looked up before a tolerant search (each is one scan of the file).
TOKEN_SAMPLE = 64
# An exact edit that is not found names the place a tolerant one would have taken only in a
# file up to this size: that search is a Python step per line, which exact edits never pay.
WHITESPACE_HINT_MAX_CHARS = 1024 * 1024
_TOKEN = re.compile(r"\S+")
_INDENT = re.compile(r"[ \t]*")


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    replacement: str


class _Line(NamedTuple):
    start: int
    end: int  # past the content, before "\r\n" or "\n"
    next: int | None  # past the terminator; None for an unterminated last line


class TooRepetitive(Exception):
    pass


_LINES: TextCache[tuple[_Line, ...]] = TextCache()


def _lines(text: str, pace: Pace) -> tuple[_Line, ...]:
    """The file's lines, computed once for the strategies that each walk them."""
    cached = _LINES.get(text)
    if cached is not None:
        return cached
    lines: list[_Line] = []
    start = 0
    pieces = text.split("\n")
    for piece in pace.paced(pieces[:-1]):
        end = start + len(piece)
        content_end = end - 1 if piece.endswith("\r") else end
        lines.append(_Line(start, content_end, end + 1))
        start = end + 1
    lines.append(_Line(start, len(text), None))
    result = tuple(lines)
    _LINES.put(text, result)
    return result


def _needle(old: str) -> tuple[list[str], bool]:
    """oldText as lines; a final line break means "through the end of the last line"."""
    normalized = old.replace("\r\n", "\n")
    through = normalized.endswith("\n")
    return (normalized[:-1] if through else normalized).split("\n"), through


def _kmp_ends(sought: Sequence[str], values: Iterator[str]) -> Iterator[int]:
    """Indexes in ``values`` where a run equal to ``sought`` ends, overlapping runs included."""
    prefix = [0] * len(sought)
    matched = 0
    for index in range(1, len(sought)):
        while matched and sought[index] != sought[matched]:
            matched = prefix[matched - 1]
        if sought[index] == sought[matched]:
            matched += 1
        prefix[index] = matched
    matched = 0
    for index, value in enumerate(values):
        while matched and value != sought[matched]:
            matched = prefix[matched - 1]
        if value == sought[matched]:
            matched += 1
        if matched == len(sought):
            yield index
            matched = prefix[matched - 1]


def _ending_near(text: str, lines: Sequence[_Line], first: int) -> str:
    for line in (lines[first], lines[first - 1] if first else None):
        if line is not None and line.next is not None:
            return "\r\n" if line.end < line.next - 1 else "\n"
    return "\r\n" if "\r\n" in text else "\n"


def _with_ending(value: str, ending: str) -> str:
    normalized = value.replace("\r\n", "\n")
    return normalized.replace("\n", "\r\n") if ending == "\r\n" else normalized


def _common_indent(lines: Sequence[str]) -> str:
    common: str | None = None
    for line in lines:
        if not line.strip():
            continue
        indent = _INDENT.match(line).group()  # type: ignore[union-attr]
        if common is None:
            common = indent
            continue
        shared = 0
        while shared < min(len(common), len(indent)) and common[shared] == indent[shared]:
            shared += 1
        common = common[:shared]
    return common or ""


def _dedent(line: str, indent: str) -> str:
    return (line[len(indent) :] if line.startswith(indent) else line.lstrip()).rstrip()


def _reindent(value: str, old_indent: str, new_indent: str) -> str:
    if old_indent == new_indent:
        return value
    return "\n".join(
        new_indent + line[len(old_indent) :]
        if line.strip() and line.startswith(old_indent)
        else line
        for line in value.replace("\r\n", "\n").split("\n")
    )


def _line_windows(
    text: str, old: str, new: str, *, flexible: bool, limit: int | None, pace: Pace
) -> list[Span]:
    needle, through = _needle(old)
    if not any(line.strip() for line in needle):
        return []
    lines = _lines(text, pace)
    if len(needle) > len(lines):
        return []
    needle_indent = _common_indent(needle)
    wanted = [_dedent(line, needle_indent) for line in needle]
    spans: list[Span] = []
    budget = max(MAX_INDENT_VERIFICATIONS, len(needle))
    # Both strategies prefilter on stripped lines: an indentation-flexible match is always a
    # line-trimmed one, so only those candidates need their relative indentation checked.
    keys = (text[line.start : line.end].strip() for line in pace.paced(lines))
    for last in _kmp_ends([line.strip() for line in needle], keys):
        first = last - len(needle) + 1
        end = lines[last].next if through else lines[last].end
        if end is None:
            continue
        if flexible:
            budget -= len(needle)
            if budget < 0:
                raise TooRepetitive
        window = [text[lines[i].start : lines[i].end] for i in range(first, last + 1)]
        indent = _common_indent(window)
        if flexible and [_dedent(line, indent) for line in window] != wanted:
            continue
        # Both carry newText from the indentation the caller wrote to the file's own: a block
        # quoted without its indentation must not lose it in the file.
        replacement = _reindent(new, needle_indent, indent)
        ending = _ending_near(text, lines, first)
        spans.append(Span(lines[first].start, end, _with_ending(replacement, ending)))
        if limit is not None and len(spans) >= limit:
            break
    return spans


def _peel(value: str, boundary: str, *, leading: bool) -> str:
    """Whitespace the caller wrapped around oldText is outside the token match, so the same
    wrapper on newText is dropped rather than inserted a second time."""
    if not boundary:
        return value
    if leading and value.startswith(boundary):
        return value[len(boundary) :]
    if not leading and value.endswith(boundary):
        return value[: len(value) - len(boundary)]
    return value


def _ending_at(text: str, offset: int) -> str:
    """The terminator of the line holding ``offset`` (or of the line before an unterminated
    last line); a file without line breaks gets LF."""
    newline = text.find("\n", offset)
    if newline < 0:
        newline = text.rfind("\n", 0, offset)
    return "\r\n" if newline > 0 and text[newline - 1] == "\r" else "\n"


def _whitespace_normalized(
    text: str, old: str, new: str, *, limit: int | None, pace: Pace
) -> list[Span]:
    normalized = old.replace("\r\n", "\n")
    tokens = _TOKEN.findall(normalized)
    if len(tokens) < 2:
        return []
    lead = normalized[: len(normalized) - len(normalized.lstrip())]
    trail = normalized[len(normalized.rstrip()) :]
    replacement = _peel(_peel(new.replace("\r\n", "\n"), lead, leading=True), trail, leading=False)
    # _kmp_ends reports a match right after consuming its last token, so at that moment the
    # ring buffer still holds where each of the last len(tokens) tokens began.
    starts = [0] * len(tokens)
    last_end = [0]

    def words() -> Iterator[str]:
        for index, word in enumerate(pace.paced(_TOKEN.finditer(text))):
            starts[index % len(tokens)] = word.start()
            last_end[0] = word.end()
            yield word.group()

    spans: list[Span] = []
    for last in _kmp_ends(tokens, words()):
        start = starts[(last + 1) % len(tokens)]
        spans.append(Span(start, last_end[0], _with_ending(replacement, _ending_at(text, start))))
        if limit is not None and len(spans) >= limit:
            break
    return spans


_Finder = Callable[[str, str, str, int | None, Pace], list[Span]]

_TOLERANT: dict[str, _Finder] = {
    "line-trimmed": lambda t, o, n, lim, p: _line_windows(
        t, o, n, flexible=False, limit=lim, pace=p
    ),
    "whitespace-normalized": lambda t, o, n, lim, p: _whitespace_normalized(
        t, o, n, limit=lim, pace=p
    ),
    "indentation-flexible": lambda t, o, n, lim, p: _line_windows(
        t, o, n, flexible=True, limit=lim, pace=p
    ),
}
assert tuple(_TOLERANT) == TOLERANT_STRATEGIES


def _disjoint(spans: list[Span]) -> list[Span]:
    taken: list[Span] = []
    for span in spans:
        if not taken or span.start >= taken[-1].end:
            taken.append(span)
    return taken


def _exact(text: str, old: str, replace_all: bool) -> tuple[int, int]:
    """(spans seen for the ambiguity rule, at most 2 when not replace_all; non-overlapping count)."""
    if replace_all:
        count = text.count(old)
        return count, count
    first = text.find(old)
    if first < 0:
        return 0, 0
    # Overlapping counts: "aa" is ambiguous in "aaa".
    return (1 if text.find(old, first + 1) < 0 else 2), 1


@dataclass(frozen=True)
class Applied:
    text: str
    strategy: str
    occurrences: int


def _projected(text: str, spans: list[Span], max_chars: int) -> None:
    # A character is at least one UTF-8 byte, so a result longer than the byte limit in
    # characters is refused before it is built (a replaceAll could ask for terabytes).
    growth = sum(len(s.replacement) - (s.end - s.start) for s in spans)
    if len(text) + growth > max_chars:
        raise OperationError(
            "WRITE_LIMIT_EXCEEDED", f"The edited file would exceed {max_chars} bytes."
        )


def _splice(text: str, spans: list[Span]) -> str:
    parts: list[str] = []
    cursor = 0
    for span in spans:
        parts.append(text[cursor : span.start])
        parts.append(span.replacement)
        cursor = span.end
    parts.append(text[cursor:])
    return "".join(parts)


@dataclass(frozen=True)
class Unmatched:
    """An edit that did not apply; ``reason()`` is its clause of the EDIT_CONFLICT message.

    Computed on demand: the message shows only the failures that fit its length, and the
    hints of a not-found edit each take a pass over the file."""

    reason: Callable[[], str]


def _tokens_present(text: str, old: str) -> bool:
    """False when some word of ``old`` is nowhere in ``text``: every strategy only forgives
    whitespace, so then none can match, and a not-found edit is told so without a Python step
    per line. A sample of the words keeps this cheap for a large ``old``."""
    words = dict.fromkeys(_TOKEN.findall(old))
    return all(word in text for word in list(words)[:TOKEN_SAMPLE])


def _first_tolerant(
    text: str, old: str, new: str, replace_all: bool, pace: Pace
) -> tuple[str, list[Span]] | str | None:
    """What a tolerant edit takes: (strategy, spans) of the first strategy that matches
    unambiguously, else the name of the first one that matched more than once, else None.
    Raises TooRepetitive."""
    pace.check()
    if not _tokens_present(text, old):
        return None
    first_ambiguous: str | None = None
    for strategy, find in _TOLERANT.items():
        spans = find(text, old, new, None if replace_all else 2, pace)
        if replace_all:
            spans = _disjoint(spans)
        if len(spans) == 1 or (replace_all and spans):
            return strategy, spans
        if spans and first_ambiguous is None:
            first_ambiguous = strategy
    return first_ambiguous


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _not_found(
    text: str, old: str, new: str, replace_all: bool, *, tolerant: bool, pace: Pace
) -> Unmatched:
    def reason() -> str:
        whitespace: tuple[int, str] | None = None
        if not tolerant and len(text) <= WHITESPACE_HINT_MAX_CHARS:
            # The hint names the place a tolerant edit would have taken; a search too
            # repetitive to finish only loses the hint.
            try:
                found = _first_tolerant(text, old, new, replace_all, pace)
            except TooRepetitive:
                found = None
            if isinstance(found, tuple):
                strategy, spans = found
                whitespace = (_line_of(text, spans[0].start), strategy)
        return not_found_reason(text, old, whitespace=whitespace, pace=pace)

    return Unmatched(reason)


def apply_one(
    text: str,
    edit: dict[str, object],
    *,
    tolerant: bool,
    number: int,
    where: str,
    max_chars: int,
    pace: Pace,
) -> Applied | Unmatched:
    """Apply edit ``number`` (1-based) to ``text``, or say why it does not match.

    Raises EDIT_CONFLICT only when the search itself is refused (too repetitive),
    WRITE_LIMIT_EXCEEDED when the result would be too large, and ``pace``'s code past the
    deadline."""
    pace.check()
    old, new = str(edit["oldText"]), str(edit["newText"])
    replace_all = edit.get("replaceAll") is True
    seen, occurrences = _exact(text, old, replace_all)
    if seen == 1 or (replace_all and seen):
        growth = occurrences * (len(new) - len(old))
        if len(text) + growth > max_chars:
            raise OperationError(
                "WRITE_LIMIT_EXCEEDED", f"The edited file would exceed {max_chars} bytes."
            )
        result = text.replace(old, new) if replace_all else text.replace(old, new, 1)
        return Applied(result, "exact", occurrences)
    if seen > 1:
        return Unmatched(lambda: ambiguous_reason("exact", exact_places(text, old, pace=pace)))
    if not tolerant:
        return _not_found(text, old, new, replace_all, tolerant=False, pace=pace)
    try:
        found = _first_tolerant(text, old, new, replace_all, pace)
    except TooRepetitive:
        raise OperationError(
            "EDIT_CONFLICT",
            f"Edit {number}: oldText has too many repetitive candidates in {where}; "
            "include more surrounding lines.",
        ) from None
    if isinstance(found, tuple):
        strategy, spans = found
        _projected(text, spans, max_chars)
        return Applied(_splice(text, spans), strategy, len(spans))
    if found is not None:
        # Never indentation-flexible: its every match is a line-trimmed one, so line-trimmed
        # was ambiguous first (or applied). Counting every place therefore cannot run into
        # the indentation budget.
        ambiguous = found
        spans = _TOLERANT[ambiguous](text, old, new, None, pace)
        places = locate(text, [span.start for span in spans])
        return Unmatched(lambda: ambiguous_reason(ambiguous, places))
    return _not_found(text, old, new, replace_all, tolerant=True, pace=pace)
