"""§2.2.1 request and result rules: replaceAll, matching, matches, instruction reads."""

from __future__ import annotations

from typing import Any

import pytest
from sluice_protocol import ProtocolError, validate_request, validate_result

SHA = "ab" * 32
EDIT = {"oldText": "o", "newText": "n"}


def body(operation: str, **fields: Any) -> dict[str, Any]:
    return {"protocolVersion": 1, "operation": operation, "workspaceId": "ws", **fields}


def accepted(request: dict[str, Any]) -> bool:
    try:
        validate_request(request)
    except ProtocolError as exc:
        assert exc.code == "INVALID_WORKSPACE_TOOL_REQUEST"
        return False
    return True


@pytest.mark.parametrize(
    ("request_body", "ok"),
    [
        (body("edit_file", path="a", edits=[EDIT], matching="tolerant"), True),
        (body("preview_edit", path="a", edits=[EDIT], matching="exact"), True),
        (body("edit_file", path="a", edits=[EDIT], matching="fuzzy"), False),
        (body("edit_file", path="a", edits=[EDIT], matching=None), False),
        (body("edit_file", path="a", edits=[{**EDIT, "replaceAll": False}]), True),
        (body("edit_file", path="a", edits=[{**EDIT, "replaceAll": "yes"}]), False),
        (body("read_file", path="AGENTS.md", instructionSha256=SHA), True),
        (body("read_file", path="CLAUDE.md", instructionSha256=SHA), True),
        (body("read_file", path="README.md", instructionSha256=SHA), False),
        (body("read_file", path="docs/AGENTS.md", instructionSha256=SHA), False),
        (body("read_file", path="AGENTS.md", instructionSha256=SHA.upper()), False),
        (body("read_file", path="AGENTS.md", instructionSha256=SHA[:63]), False),
        (body("read_file", path="AGENTS.md", instructionSha256=SHA, startLine=1), False),
        (body("read_file", path="AGENTS.md", instructionSha256=SHA, maxLines=200), False),
        (body("read_file", path="AGENTS.md", instructionSha256=SHA, worktree="lane"), False),
        (body("list_files", matching="exact"), False),  # unknown keys stay 400
        (body("write_file", path="a", content="", instructionSha256=SHA), False),
        (body("edit_file", path="a", edits=[{**EDIT, "matching": "tolerant"}]), False),
    ],
)
def test_edit_feature_fields_are_validated(request_body: dict[str, Any], ok: bool) -> None:
    assert accepted(request_body) is ok


def test_an_instruction_read_has_no_window_filled_in() -> None:
    checked = validate_request(body("read_file", path="AGENTS.md", instructionSha256=SHA))
    assert "startLine" not in checked and "maxLines" not in checked


def _edit_result(operation: str, **fields: Any) -> dict[str, Any]:
    result: dict[str, Any] = {
        "protocolVersion": 1,
        "operation": operation,
        "workspaceId": "ws",
        "path": "a",
        "replacements": 1,
        "bytesWritten": 1,
    }
    if operation == "preview_edit":
        result.update(content="n", hasUtf8Bom=False, baseSha256=SHA)
    return {**result, **fields}


def _match(strategy: str = "exact", occurrences: int = 1) -> dict[str, Any]:
    return {"strategy": strategy, "occurrences": occurrences}


EXACT = [_match()]
# (request fields, result fields, valid?)
MATCH_CASES = [
    ({}, {}, True),
    ({}, {"matches": EXACT}, False),  # not asked for
    ({"matching": "exact"}, {}, False),  # asked for, missing
    ({"matching": "exact"}, {"matches": EXACT}, True),
    ({"matching": "exact"}, {"matches": [_match("line-trimmed")]}, False),
    ({"matching": "tolerant"}, {"matches": [_match("line-trimmed")]}, True),
    ({"matching": "tolerant"}, {"matches": [_match("fuzzy")]}, False),
    ({"matching": "tolerant"}, {"matches": [_match("exact", 2)]}, False),  # no replaceAll
    ({"matching": "tolerant"}, {"matches": [_match(), _match()]}, False),  # one per edit
    ({"matching": "tolerant"}, {"matches": [{**_match(), "line": 3}]}, False),
    ({"matching": "tolerant"}, {"matches": [_match("exact", 0)]}, False),
    ({"replaceAll": False}, {"matches": EXACT}, True),
    ({"replaceAll": True}, {"matches": [_match("exact", 5)]}, True),
    ({"replaceAll": True}, {"matches": [_match("exact", 5)], "replacements": 5}, False),
    ({"replaceAll": True}, {}, False),
]


@pytest.mark.parametrize(("request_fields", "result_fields", "ok"), MATCH_CASES)
@pytest.mark.parametrize("operation", ["preview_edit", "edit_file"])
def test_matches_follow_the_request(
    operation: str, request_fields: dict[str, Any], result_fields: dict[str, Any], ok: bool
) -> None:
    edit = {
        **EDIT,
        **({"replaceAll": request_fields["replaceAll"]} if "replaceAll" in request_fields else {}),
    }
    extra = {k: v for k, v in request_fields.items() if k == "matching"}
    request = validate_request(body(operation, path="a", edits=[edit], **extra))
    result = _edit_result(operation, **result_fields)
    if ok:
        validate_result(request, result)
    else:
        with pytest.raises(ProtocolError) as caught:
            validate_result(request, result)
        assert caught.value.code == "RESULT_INVALID"


def test_a_preview_must_count_its_bytes_with_the_bom() -> None:
    request = validate_request(body("preview_edit", path="a", edits=[EDIT]))
    validate_result(request, _edit_result("preview_edit", hasUtf8Bom=True, bytesWritten=4))
    with pytest.raises(ProtocolError):
        validate_result(request, _edit_result("preview_edit", hasUtf8Bom=True, bytesWritten=1))


def _read(content: str, **fields: Any) -> dict[str, Any]:
    end = content.count("\n") + 1
    return {
        "protocolVersion": 1,
        "operation": "read_file",
        "workspaceId": "ws",
        "path": "AGENTS.md",
        "content": content,
        "startLine": 1,
        "endLine": end,
        "truncated": False,
        **fields,
    }


@pytest.mark.parametrize(
    ("result", "ok"),
    [
        (_read("a\nb\n"), True),  # three pieces: the final newline counts
        (_read(""), True),
        (_read("a\nb\n", endLine=2), False),  # a line window's count is not enough
        (_read("x" * 32768), True),
        (_read("x" * 32769), False),
        (_read("é" * 16385), False),  # bytes, not characters
        (_read("a", startLine=2, endLine=2), False),
        (_read("a", truncated=True, nextStartLine=2), False),
        (_read("a", nextStartLine=2), False),
    ],
)
def test_instruction_read_results_are_the_whole_file(result: dict[str, Any], ok: bool) -> None:
    request = validate_request(body("read_file", path="AGENTS.md", instructionSha256=SHA))
    if ok:
        validate_result(request, result)
    else:
        with pytest.raises(ProtocolError):
            validate_result(request, result)
