"""Edit strategies, `matches` and instruction reads (contract §2.2.1) on real files.

Each request goes through `validate_request` first, as the API sends it, and each answer is
held to both sluice-client's result check and LibreChat's own rule (tests/librechat_rules.py).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import pytest
from librechat_rules import (
    assert_librechat_accepts_edit,
    assert_librechat_accepts_read,
    edit_conflict_report,
)
from sluice_protocol import validate_request, validate_result

from workspaces.operations import OperationError, run_operation
from workspaces.operations.instructions import instruction_files

BOM = b"\xef\xbb\xbf"


def _body(operation: str, **fields: Any) -> dict[str, Any]:
    return validate_request(
        {"protocolVersion": 1, "operation": operation, "workspaceId": "ws-1", **fields}
    )


def _run(root: Path, operation: str, **fields: Any) -> dict[str, Any]:
    request = _body(operation, **fields)
    result = run_operation(request, root=str(root), deadline=time.monotonic() + 10)
    validate_result(request, result)
    if operation == "read_file":
        assert_librechat_accepts_read(request, result)
    else:
        assert_librechat_accepts_edit(request, result)
    return result


def _refused(root: Path, operation: str, **fields: Any) -> OperationError:
    with pytest.raises(OperationError) as caught:
        run_operation(_body(operation, **fields), root=str(root), deadline=time.monotonic() + 10)
    return caught.value


def _edit(old: str, new: str, replace_all: bool | None = None) -> dict[str, Any]:
    edit: dict[str, Any] = {"oldText": old, "newText": new}
    if replace_all is not None:
        edit["replaceAll"] = replace_all
    return edit


# (file text, edit, expected text, strategy, occurrences) under matching: tolerant.
TOLERANT_CASES = [
    pytest.param("a = 1\nb = 2\n", _edit("b = 2", "b = 3"), "a = 1\nb = 3\n", "exact", 1, id="exact-first"),
    pytest.param(
        "def f():\n    x = 1   \n    return x\n",
        _edit("x = 1\nreturn x\n", "x = 2\nreturn x\n"),
        "def f():\n    x = 2\n    return x\n",
        "line-trimmed", 1, id="line-trimmed-moves-newText-to-the-file-indentation",
    ),
    pytest.param(
        # The window's common indentation is "" (third has none), so newText keeps its own.
        "one\r\n  two\r\nthree\r\n",
        _edit("two\nthree", "TWO\nTHREE"),
        "one\r\nTWO\r\nTHREE\r\n",
        "line-trimmed", 1, id="line-trimmed-keeps-crlf",
    ),
    pytest.param(
        "call(alpha,\n     beta)\n",
        _edit("call(alpha, beta)", "call(gamma)"),
        "call(gamma)\n",
        "whitespace-normalized", 1, id="whitespace-normalized-across-lines",
    ),
    pytest.param(
        "x  =  1\ny = 2\n",
        _edit("x = 1", "x = 9"),
        "x = 9\ny = 2\n",
        "whitespace-normalized", 1, id="whitespace-normalized-in-a-line",
    ),
    pytest.param(
        # line-trimmed and whitespace-normalized see both blocks; only the second has the
        # same inner shape (b one level deeper than a), so indentation-flexible is unambiguous.
        "a\nb\n    a\n        b\n",
        _edit("  a\n      b", "  A\n      B"),
        "a\nb\n    A\n        B\n",
        "indentation-flexible", 1, id="indentation-flexible-when-looser-ones-are-ambiguous",
    ),
    pytest.param(
        # A token match leaves the whitespace around it alone (the indentation stays).
        "k = 1\n  k  =  1\nk = 1\n",
        _edit("k  = 1", "k = 2", replace_all=True),
        "k = 2\n  k = 2\nk = 2\n",
        "whitespace-normalized", 3, id="replace-all-tolerant-counts-every-occurrence",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("text", "edit", "expected", "strategy", "occurrences"), TOLERANT_CASES)
def test_tolerant_strategies_apply_the_first_unambiguous_match(
    workspace: Path, text: str, edit: dict[str, Any], expected: str, strategy: str, occurrences: int
) -> None:
    (workspace / "f.py").write_bytes(text.encode())
    result = _run(workspace, "edit_file", path="f.py", edits=[edit], matching="tolerant")
    assert (workspace / "f.py").read_bytes() == expected.encode()
    assert result["replacements"] == 1
    assert result["matches"] == [{"strategy": strategy, "occurrences": occurrences}]


# (file text, edit, matching or None, the failure LibreChat reads from the refusal)
AMBIGUOUS_EXACT = {"kind": "ambiguous", "strategy": "exact"}
NOT_FOUND = {"kind": "not_found"}
CONFLICT_CASES = [
    pytest.param("ab ab\n", _edit("ab", "x"), None, AMBIGUOUS_EXACT, id="exact-twice"),
    pytest.param("aaa\n", _edit("aa", "x"), None, AMBIGUOUS_EXACT, id="overlapping-counts"),
    pytest.param("ab ab\n", _edit("ab", "x"), "tolerant", AMBIGUOUS_EXACT, id="exact-ambiguous-does-not-fall-back"),
    pytest.param("x = 1\n", _edit("x  =  1", "y"), None, NOT_FOUND, id="exact-only-without-tolerant"),
    pytest.param("x = 1\n", _edit("x  =  1", "y"), "exact", NOT_FOUND, id="explicit-exact"),
    pytest.param(
        "  if a:\n    b\n  if a:\n    b\n", _edit("if a:\n  b", "Q"), "tolerant",
        {"kind": "ambiguous", "strategy": "line-trimmed"}, id="tolerant-ambiguous-everywhere",
    ),
    pytest.param("abc\n", _edit("zzz yyy", "q"), "tolerant", NOT_FOUND, id="tolerant-not-found"),
    pytest.param("alpha beta\n", _edit("alph  beta", "q"), "tolerant", NOT_FOUND, id="whole-tokens-only"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "edit", "matching", "failure"), CONFLICT_CASES)
@pytest.mark.parametrize("operation", ["preview_edit", "edit_file"])
def test_a_missing_or_ambiguous_edit_is_a_conflict_and_writes_nothing(
    workspace: Path,
    operation: str,
    text: str,
    edit: dict[str, Any],
    matching: str | None,
    failure: dict[str, str],
) -> None:
    (workspace / "f.txt").write_bytes(text.encode())
    extra = {} if matching is None else {"matching": matching}
    error = _refused(workspace, operation, path="f.txt", edits=[edit], **extra)
    assert error.code == "EDIT_CONFLICT"
    report = edit_conflict_report(error.message)
    assert report is not None, error.message
    [reported] = report["failures"]
    assert {key: reported.get(key) for key in failure} == failure
    assert (workspace / "f.txt").read_bytes() == text.encode()
    assert [p.name for p in workspace.iterdir()] == ["f.txt"]


def test_a_later_failing_edit_leaves_the_earlier_ones_unwritten(workspace: Path) -> None:
    (workspace / "f.txt").write_text("one two\n")
    edits = [_edit("one", "1", replace_all=True), _edit("missing", "x")]
    assert _refused(workspace, "edit_file", path="f.txt", edits=edits).code == "EDIT_CONFLICT"
    assert (workspace / "f.txt").read_text() == "one two\n"


@pytest.mark.parametrize(
    ("fields", "has_matches"),
    [
        ({}, False),
        ({"matching": "exact"}, True),
        ({"matching": "tolerant"}, True),
        ({"replace_all": False}, True),  # naming replaceAll at all asks for matches
    ],
)
def test_matches_are_present_exactly_when_asked(
    workspace: Path, fields: dict[str, Any], has_matches: bool
) -> None:
    (workspace / "f.txt").write_text("a b\n")
    extra = {k: v for k, v in fields.items() if k == "matching"}
    edits = [_edit("a", "A", fields.get("replace_all")), _edit("b", "B")]
    for operation in ("preview_edit", "edit_file"):
        (workspace / "f.txt").write_text("a b\n")
        result = _run(workspace, operation, path="f.txt", edits=edits, **extra)
        assert ("matches" in result) is has_matches
        assert result["replacements"] == 2
        if has_matches:
            assert result["matches"] == [{"strategy": "exact", "occurrences": 1}] * 2


def test_replace_all_takes_non_overlapping_occurrences(workspace: Path) -> None:
    (workspace / "f.txt").write_text("aaaa a\n")
    result = _run(workspace, "edit_file", path="f.txt", edits=[_edit("aa", "b", True)])
    assert (workspace / "f.txt").read_text() == "bb a\n"
    assert result["matches"] == [{"strategy": "exact", "occurrences": 2}]


def test_a_replace_all_that_would_explode_is_refused_before_it_is_built(workspace: Path) -> None:
    (workspace / "f.txt").write_text("a" * 100_000)
    error = _refused(workspace, "edit_file", path="f.txt", edits=[_edit("a", "b" * 100, True)])
    assert error.code == "WRITE_LIMIT_EXCEEDED"
    assert (workspace / "f.txt").read_text() == "a" * 100_000


def test_preview_and_edit_agree_byte_for_byte_with_bom_and_crlf(workspace: Path) -> None:
    original = BOM + b"first\r\n    second  \r\n    third\r\n"
    request = {
        "path": "f.txt",
        "edits": [_edit("second\nthird", "2nd\n3rd")],
        "matching": "tolerant",
    }
    (workspace / "f.txt").write_bytes(original)
    preview = _run(workspace, "preview_edit", **request)
    assert (workspace / "f.txt").read_bytes() == original  # a preview writes nothing
    edited = _run(workspace, "edit_file", **request)
    written = (workspace / "f.txt").read_bytes()
    assert written == BOM + b"first\r\n    2nd\r\n    3rd\r\n"
    assert written == (BOM if preview["hasUtf8Bom"] else b"") + preview["content"].encode()
    assert preview["bytesWritten"] == edited["bytesWritten"] == len(written)
    assert (
        preview["matches"] == edited["matches"] == [{"strategy": "line-trimmed", "occurrences": 1}]
    )


# --------------------------------------------------------------------------------------------
# Instruction reads


@pytest.mark.parametrize(
    "raw",
    [b"# Rules\n\nBe kind.\n", b"no final newline", BOM + b"bom\r\nand crlf\r\n", b"", b"\n"],
)
def test_an_instruction_read_answers_the_exact_bytes(workspace: Path, raw: bytes) -> None:
    (workspace / "AGENTS.md").write_bytes(raw)
    [advertised] = instruction_files(str(workspace))
    assert advertised == {
        "path": "AGENTS.md",
        "bytes": len(raw),
        "sha256": hashlib.sha256(raw).hexdigest(),
    }
    result = _run(workspace, "read_file", path="AGENTS.md", instructionSha256=advertised["sha256"])
    assert result["content"].encode() == raw
    assert result["startLine"] == 1
    assert result["endLine"] == len(result["content"].split("\n"))
    assert result["truncated"] is False and "nextStartLine" not in result


def test_an_instruction_read_with_another_sha256_is_refused(workspace: Path) -> None:
    (workspace / "CLAUDE.md").write_text("v2\n")
    stale = hashlib.sha256(b"v1\n").hexdigest()
    error = _refused(workspace, "read_file", path="CLAUDE.md", instructionSha256=stale)
    assert error.code == "INVALID_PATH" and "changed" in error.message


def test_an_instruction_file_over_32_kib_is_neither_advertised_nor_served(workspace: Path) -> None:
    raw = b"x" * (32 * 1024 + 1)
    (workspace / "AGENTS.md").write_bytes(raw)
    assert instruction_files(str(workspace)) == []
    sha = hashlib.sha256(raw).hexdigest()
    error = _refused(workspace, "read_file", path="AGENTS.md", instructionSha256=sha)
    assert error.code == "READ_LIMIT_EXCEEDED"


def test_exactly_32_kib_is_served(workspace: Path) -> None:
    raw = b"y" * (32 * 1024)
    (workspace / "AGENTS.md").write_bytes(raw)
    sha = hashlib.sha256(raw).hexdigest()
    assert (
        _run(workspace, "read_file", path="AGENTS.md", instructionSha256=sha)["content"]
        == "y" * 32768
    )


def test_only_servable_instruction_files_are_advertised(workspace: Path, outside: Path) -> None:
    (workspace / "AGENTS.md").symlink_to(outside / "secret.txt")
    (workspace / "CLAUDE.md").write_bytes(b"bad \xff utf-8\n")
    assert instruction_files(str(workspace)) == []
    sha = hashlib.sha256((outside / "secret.txt").read_bytes()).hexdigest()
    error = _refused(workspace, "read_file", path="AGENTS.md", instructionSha256=sha)
    assert error.code == "INVALID_PATH"
    (workspace / "CLAUDE.md").write_text("fine\n")
    assert [f["path"] for f in instruction_files(str(workspace))] == ["CLAUDE.md"]
