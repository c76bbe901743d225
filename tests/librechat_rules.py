"""LibreChat's own acceptance rule for a workspace tool result, written out in Python.

LibreChat's client (`packages/api/src/code/workspace.ts`, `isValidResult`) drops any answer
that breaks these rules, so a Sluice answer that fails here is one no LibreChat agent can use.
This is a second, independent reading of that rule, kept apart from sluice-client's own
checks (`protocol.validate_result`) so that a mistake in one is caught by the other. Only the
rules are ported; the names and structure are ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_READ_BYTES = 1024 * 1024
INSTRUCTION_MAX_BYTES = 32 * 1024
READ_KEYS = {
    "protocolVersion",
    "operation",
    "workspaceId",
    "path",
    "content",
    "startLine",
    "endLine",
    "truncated",
    "nextStartLine",
}


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _utf8_bytes(text: str) -> int:
    return len(text.encode("utf-8"))


def read_result_problem(request: Mapping[str, Any], result: Mapping[str, Any]) -> str | None:
    """Why LibreChat would refuse this read_file answer, or None when it accepts it."""
    if result.get("protocolVersion") != 1 or result.get("operation") != "read_file":
        return "protocolVersion/operation"
    if result.get("workspaceId") != request["workspaceId"]:
        return "workspaceId"
    if set(result) - READ_KEYS:
        return f"unknown keys {sorted(set(result) - READ_KEYS)}"
    if result.get("path") != request["path"]:
        return "path"
    content = result.get("content")
    if not isinstance(content, str):
        return "content is not a string"
    if "instructionSha256" in request:
        if _utf8_bytes(content) > INSTRUCTION_MAX_BYTES:
            return "instruction content over 32 KiB"
        if result.get("startLine") != 1 or result.get("endLine") != len(content.split("\n")):
            return "instruction read: endLine must be len(content.split('\\n'))"
        if not isinstance(result.get("truncated"), bool) or "nextStartLine" in result:
            return "instruction read: truncated/nextStartLine"
        return None
    start = request.get("startLine", 1)
    max_lines = request.get("maxLines", 200)
    end = result.get("endLine")
    if not isinstance(result.get("truncated"), bool):
        return "truncated is not a boolean"
    if _utf8_bytes(content) > MAX_READ_BYTES:
        return "content over 1 MiB of UTF-8"
    if result.get("startLine") != start:
        return "startLine"
    if (
        not isinstance(end, int)
        or isinstance(end, bool)
        or not start - 1 <= end < start + max_lines
    ):
        return "endLine outside the window"
    reported = end - start + 1
    actual = reported if content == "" else len(content.split("\n"))
    if content == "" and reported > 1:
        return "empty content for more than one line"
    if actual != reported:
        return f"content has {actual} lines, endLine - startLine + 1 = {reported}"
    if result["truncated"]:
        if not _int(result.get("nextStartLine")) or result["nextStartLine"] != end + 1:
            return "truncated without nextStartLine = endLine + 1"
    elif result.get("nextStartLine") is not None:
        return "nextStartLine without truncated"
    return None


def assert_librechat_accepts_read(request: Mapping[str, Any], result: Mapping[str, Any]) -> None:
    problem = read_result_problem(request, result)
    assert problem is None, f"LibreChat would refuse this read: {problem}"
