"""EDIT_CONFLICT messages in the grammar LibreChat parses (docs/api.md, "Edit conflicts").

Each case runs as preview_edit and as edit_file on a real file; both must refuse with the same
message, write nothing, and the message must give LibreChat exactly the facts listed (read by
tests/librechat_rules.py `edit_conflict_report`, our own reading of LibreChat's grammar).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import pytest
from librechat_rules import edit_conflict_report
from sluice_protocol import MAX_ERROR_CHARS, validate_request

from workspaces.operations import OperationError, run_operation


def _edit(old: str, new: str = "NEW", replace_all: bool | None = None) -> dict[str, Any]:
    edit: dict[str, Any] = {"oldText": old, "newText": new}
    if replace_all is not None:
        edit["replaceAll"] = replace_all
    return edit


def _refusal(root: Path, operation: str, **fields: Any) -> OperationError:
    request = validate_request(
        {"protocolVersion": 1, "operation": operation, "workspaceId": "ws-1", **fields}
    )
    with pytest.raises(OperationError) as caught:
        run_operation(request, root=str(root), deadline=time.monotonic() + 10)
    return caught.value


def _conflict(root: Path, text: str, edits: list[dict[str, Any]], **fields: Any) -> str:
    """The EDIT_CONFLICT message, after checking preview and edit agree and nothing changed."""
    (root / "f.txt").write_bytes(text.encode())
    messages = []
    for operation in ("preview_edit", "edit_file"):
        error = _refusal(root, operation, path="f.txt", edits=edits, **fields)
        assert error.code == "EDIT_CONFLICT", error
        messages.append(error.message)
    assert messages[0] == messages[1]
    assert (root / "f.txt").read_bytes() == text.encode()
    assert [p.name for p in root.iterdir()] == ["f.txt"]
    return messages[0]


def ambiguous(count: int, lines: list[int], more: int = 0, strategy: str = "exact") -> Any:
    return {"kind": "ambiguous", "count": count, "strategy": strategy, "lines": lines, "more": more}


def not_found(*hints: dict[str, Any]) -> Any:
    return {"kind": "not_found", "hints": list(hints)}


ELISION = {"kind": "elision"}
LINE_NUMBERS = {"kind": "line_numbers"}
CRLF = {"kind": "crlf"}


def whitespace(line: int, strategy: str) -> dict[str, Any]:
    return {"kind": "whitespace", "line": line, "strategy": strategy}


def first_line(lines: list[int], more: int = 0) -> dict[str, Any]:
    return {"kind": "first_line", "lines": lines, "more": more}


def closest(line: int) -> dict[str, Any]:
    return {"kind": "closest_line", "line": line}


# (file text, one edit, matching or None, the failure LibreChat must read)
SINGLE_CASES = [
    pytest.param("ab ab\nab\n", _edit("ab"), None, ambiguous(3, [1, 2]), id="exact-three-times-on-two-lines"),
    pytest.param("aaa\n", _edit("aa"), None, ambiguous(2, [1]), id="overlapping-occurrences-count"),
    pytest.param("x\n" * 8, _edit("x"), None, ambiguous(8, [1, 2, 3, 4, 5], more=3), id="five-lines-listed-then-more"),
    pytest.param(
        "  if a:\n    b\n  if a:\n    b\n", _edit("if a:\n  b"), "tolerant",
        ambiguous(2, [1, 3], strategy="line-trimmed"), id="tolerant-ambiguous-names-its-strategy",
    ),
    pytest.param(
        "a x  =  1\nb x   =   1\n", _edit("x = 1"), "tolerant",
        ambiguous(2, [1, 2], strategy="whitespace-normalized"), id="whitespace-normalized-ambiguous",
    ),
    pytest.param("abc\n", _edit("zzz yyy"), None, not_found(), id="not-found-without-hints"),
    pytest.param("abc\n", _edit("zzz yyy"), "tolerant", not_found(), id="tolerant-not-found-without-hints"),
    pytest.param(
        "def f():\n    x = 1\n    return x\n", _edit("x = 1\nreturn x"), None,
        not_found(whitespace(2, "line-trimmed")), id="exact-would-match-line-trimmed",
    ),
    pytest.param(
        "call(alpha,\n     beta)\n", _edit("call(alpha, beta)"), None,
        not_found(whitespace(1, "whitespace-normalized"), closest(1)), id="exact-would-match-whitespace-normalized",
    ),
    pytest.param(
        "k = 1\nk  =  1\n", _edit("k = 1\nk = 1"), "exact", not_found(whitespace(1, "whitespace-normalized")),
        id="explicit-exact-gets-the-whitespace-hint",
    ),
    pytest.param(
        "one\r\ntwo\r\n", _edit("one\ntwo"), None, not_found(whitespace(1, "line-trimmed"), CRLF),
        id="crlf-file-and-bare-lf",
    ),
    pytest.param(
        "one\r\nvalue = 1\r\n", _edit("one\nvalue = 2"), "tolerant", not_found(CRLF, first_line([1]), closest(2)),
        id="crlf-and-a-real-difference-under-tolerant",
    ),
    pytest.param(
        "one\r\nvalue = 1\r\n", _edit("one\r\nvalue = 2"), None, not_found(first_line([1]), closest(2)),
        id="crlf-oldText-gets-no-crlf-hint",
    ),
    pytest.param(
        "def g():\n    a = 1\n    b = 2\n    return a\n", _edit("def g():\n    ...\n    return a"), None,
        not_found(ELISION, first_line([1])), id="elision-placeholder",
    ),
    pytest.param(
        "def g():\n    a = 1\n    return a\n", _edit("def g():\n    # ... existing code ...\n    return b"), None,
        not_found(ELISION, first_line([1]), closest(3)), id="elision-comment-and-closest-line",
    ),
    pytest.param(
        "class P:\n    ...\n", _edit("class P:\n    ...\n    pass"), None, not_found(first_line([1])),
        id="an-ellipsis-the-file-holds-is-not-elision",
    ),
    pytest.param(
        "alpha = 1\nbeta = 2\n", _edit("1\talpha = 1\n2\tbeta = 2"), None, not_found(LINE_NUMBERS, closest(1)),
        id="read-file-line-number-prefixes",
    ),
    pytest.param(
        "x = compute()\n", _edit("  7→x = compute()"), None, not_found(LINE_NUMBERS, closest(1)),
        id="one-prefixed-line-whose-rest-is-in-the-file",
    ),
    pytest.param("a\n", _edit("12: something"), None, not_found(), id="a-number-alone-is-not-a-prefix"),
    pytest.param(
        "if x:\n    a()\nif x:\n    b()\n", _edit("if x:\n    c()"), None, not_found(first_line([1, 3])),
        id="first-line-at-two-places",
    ),
    pytest.param(
        "t = 1\n" * 7 + "u\n", _edit("t = 1\nzz"), None, not_found(first_line([1, 2, 3, 4, 5], more=2)),
        id="first-line-list-is-capped",
    ),
    pytest.param(
        "total = price * count\n", _edit("total = price * amount"), None, not_found(closest(1)),
        id="closest-line",
    ),
    pytest.param("total\n", _edit("x\nzz"), None, not_found(), id="first-line-must-end-a-file-line-at-a-word"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "edit", "matching", "failure"), SINGLE_CASES)
def test_a_single_failing_edit_reads_as_librechat_expects(
    workspace: Path, text: str, edit: dict[str, Any], matching: str | None, failure: dict[str, Any]
) -> None:
    extra = {} if matching is None else {"matching": matching}
    message = _conflict(workspace, text, [edit], **extra)
    assert message.startswith("Workspace edit did not apply and nothing was written: ")
    assert edit_conflict_report(message) == {
        "editCount": 1,
        "failures": [{"edit": 1, **failure}],
        "hidden": 0,
    }, message


# (file text, edits, the failures LibreChat must read; line numbers are in the text as the
# earlier matching edits left it)
BATCH_CASES = [
    pytest.param(
        "a = 1\nb = 2\nb = 2\n", [_edit("a = 1", "A"), _edit("zzz yyy"), _edit("b = 2")],
        [{"edit": 2, **not_found()}, {"edit": 3, **ambiguous(2, [2, 3])}], id="missing-and-ambiguous",
    ),
    pytest.param(
        "a\nb\nc\n", [_edit("a", "x\ny\nz"), _edit("c\nq")], [{"edit": 2, **not_found(first_line([5]))}],
        id="lines-count-the-earlier-edits",
    ),
    pytest.param(
        "one\n", [_edit("one", "two"), _edit("one", "three")], [{"edit": 2, **not_found()}],
        id="gone-after-an-earlier-edit",
    ),
    pytest.param(
        "a b\n", [_edit("missing"), _edit("a", "A"), _edit("A", "Z")], [{"edit": 1, **not_found()}],
        id="a-failed-edit-is-skipped-and-the-rest-go-on",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("text", "edits", "failures"), BATCH_CASES)
def test_a_batch_names_every_failing_edit(
    workspace: Path, text: str, edits: list[dict[str, Any]], failures: list[dict[str, Any]]
) -> None:
    message = _conflict(workspace, text, edits)
    assert edit_conflict_report(message) == {
        "editCount": len(edits),
        "failures": failures,
        "hidden": 0,
    }, message
    assert message.endswith("\nLine numbers account for the earlier edits in this batch.")


def test_a_batch_too_long_to_show_counts_the_hidden_edits(workspace: Path) -> None:
    text = "".join(f"def handler_{i}(request, response):\n    return {i}\n" for i in range(100))
    edits = [_edit(f"def handler_{i}(request, reply):\n    return {i}") for i in range(100)]
    message = _conflict(workspace, text, edits)
    assert len(message) <= MAX_ERROR_CHARS
    report = edit_conflict_report(message)
    assert report is not None, message
    shown = report["failures"]
    assert report["editCount"] == 100 and report["hidden"] == 100 - len(shown) > 0
    assert [f["edit"] for f in shown] == list(range(1, len(shown) + 1))
    assert shown[7] == {"edit": 8, **not_found(closest(15))}


def test_a_file_line_with_line_breaks_of_other_kinds_stays_on_one_line(workspace: Path) -> None:
    # JavaScript's "." stops at U+2028 and \r; an excerpt holding one would end the line.
    text = "alpha\u2028beta\rgamma = 1\n"
    message = _conflict(workspace, text, [_edit("x = 1"), _edit("alpha beta gamma = 2")])
    report = edit_conflict_report(message)
    assert report is not None, message
    assert report["failures"] == [
        {"edit": 1, **not_found()},
        {"edit": 2, **not_found(closest(1))},
    ]


def test_a_stale_base_is_reported_before_the_edits_are_tried(workspace: Path) -> None:
    (workspace / "f.txt").write_text("changed\n")
    stale = hashlib.sha256(b"original\n").hexdigest()
    error = _refusal(
        workspace, "edit_file", path="f.txt", edits=[_edit("original")], expectedBaseSha256=stale
    )
    assert error.code == "EDIT_CONFLICT"
    assert error.message == "'f.txt' changed since expectedBaseSha256 was taken."
    assert edit_conflict_report(error.message) is None
    assert (workspace / "f.txt").read_text() == "changed\n"


# The reading in librechat_rules must itself be able to refuse: near misses of the grammar.
NOT_IN_THE_GRAMMAR = [
    pytest.param("Edit 1: oldText was not found in 'f.txt'.", id="old-wording"),
    pytest.param("Workspace edit did not apply and nothing was written: old_text was not found", id="no-full-stop"),
    pytest.param("Workspace edit did not apply and nothing was written: old_text was not found; it is odd.", id="unknown-hint"),
    pytest.param(
        "Workspace edit did not apply and nothing was written: old_text matched 2 locations (fuzzy) at "
        "lines 1, 2; include more surrounding lines so it matches exactly one.", id="unknown-strategy",
    ),
    pytest.param(
        "Workspace edit did not apply and nothing was written: old_text matched 9 locations at "
        "lines 1, 2, 3, 4, 5, 6; include more surrounding lines so it matches exactly one.", id="six-lines-listed",
    ),
    pytest.param(
        "2 of 3 workspace edits did not apply, so nothing was written. Every other edit matched.\n"
        "Edit 2: old_text was not found.", id="batch-without-the-note",
    ),
    pytest.param(
        "2 of 3 workspace edits did not apply, so nothing was written. Every other edit matched.\n"
        "Edit 2: old_text was not found.\nLine numbers account for the earlier edits in this batch.",
        id="batch-count-disagrees",
    ),
    pytest.param(
        "1 of 3 workspace edits did not apply, so nothing was written. Every other edit matched.\n"
        "Edit 2: old_text was not found; the closest line is line 1: a\rb.\n"
        "Line numbers account for the earlier edits in this batch.", id="excerpt-with-a-carriage-return",
    ),
]  # fmt: skip


@pytest.mark.parametrize("message", NOT_IN_THE_GRAMMAR)
def test_messages_outside_the_grammar_give_no_report(message: str) -> None:
    assert edit_conflict_report(message) is None


def test_a_too_repetitive_search_keeps_its_own_sentence(workspace: Path) -> None:
    # 60,000 two-line candidates that line-trimmed and whitespace-normalized both see, none
    # with the inner shape indentation-flexible wants: past its 100,000-comparison budget.
    text = "a\n  b\n" * 60_000
    message = _conflict(workspace, text, [_edit("a\nb")], matching="tolerant")
    assert message == (
        "Edit 1: oldText has too many repetitive candidates in 'f.txt'; "
        "include more surrounding lines."
    )
    assert edit_conflict_report(message) is None
    # An exact edit is not refused for it: it only loses the whitespace hint.
    report = edit_conflict_report(_conflict(workspace, text, [_edit("a\nb")]))
    assert report is not None
    assert report["failures"] == [{"edit": 1, **not_found(first_line([1, 3, 5, 7, 9], 59_995))}]
