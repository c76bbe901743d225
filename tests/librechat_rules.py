"""LibreChat's own acceptance rule for a workspace tool result, written out in Python.

LibreChat's client (`packages/api/src/code/workspace.ts`, `isValidResult`) drops any answer
that breaks these rules, so a Sluice answer that fails here is one no LibreChat agent can use.
This is a second, independent reading of that rule, kept apart from sluice-client's own
checks (`protocol.validate_result`) so that a mistake in one is caught by the other. Only the
rules are ported; the names and structure are ours.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

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


def _int(value: object) -> TypeGuard[int]:
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


WRITE_MAX_BYTES = 1024 * 1024
STRATEGIES = {"exact", "line-trimmed", "whitespace-normalized", "indentation-flexible"}
EDIT_KEYS = {"protocolVersion", "operation", "workspaceId", "path", "replacements"}
EDIT_KEYS |= {"bytesWritten", "matches"}
PREVIEW_KEYS = EDIT_KEYS | {"content", "hasUtf8Bom", "baseSha256"}


def _asks_for_matches(request: Mapping[str, Any]) -> bool:
    return "matching" in request or any("replaceAll" in edit for edit in request["edits"])


def _matches_problem(request: Mapping[str, Any], matches: object) -> str | None:
    """areValidEditMatches: present exactly when asked, one per edit, named strategies,
    `exact` unless tolerant, one occurrence unless that edit has replaceAll: true."""
    if not _asks_for_matches(request):
        return None if matches is None else "matches although the request did not ask"
    edits = request["edits"]
    if not isinstance(matches, list) or len(matches) != len(edits):
        return "matches must be a list with one entry per edit"
    for index, match in enumerate(matches):
        if not isinstance(match, dict) or set(match) - {"strategy", "occurrences"}:
            return f"matches[{index}] has other keys"
        strategy, occurrences = match.get("strategy"), match.get("occurrences")
        if strategy not in STRATEGIES:
            return f"matches[{index}].strategy {strategy!r}"
        if request.get("matching") != "tolerant" and strategy != "exact":
            return f"matches[{index}].strategy must be exact"
        if not _int(occurrences) or occurrences < 1:
            return f"matches[{index}].occurrences must be a positive integer"
        if edits[index].get("replaceAll") is not True and occurrences != 1:
            return f"matches[{index}].occurrences must be 1 without replaceAll"
    return None


def edit_result_problem(request: Mapping[str, Any], result: Mapping[str, Any]) -> str | None:
    """Why LibreChat would refuse this preview_edit or edit_file answer, or None."""
    operation = request["operation"]
    if result.get("protocolVersion") != 1 or result.get("operation") != operation:
        return "protocolVersion/operation"
    if result.get("workspaceId") != request["workspaceId"]:
        return "workspaceId"
    keys = PREVIEW_KEYS if operation == "preview_edit" else EDIT_KEYS
    if set(result) - keys:
        return f"unknown keys {sorted(set(result) - keys)}"
    if result.get("path") != request["path"]:
        return "path"
    if result.get("replacements") != len(request["edits"]):
        return "replacements must equal the number of edits"
    written = result.get("bytesWritten")
    if not _int(written) or not 0 <= written <= WRITE_MAX_BYTES:
        return "bytesWritten"
    if operation == "preview_edit":
        content = result.get("content")
        if not isinstance(content, str) or not isinstance(result.get("hasUtf8Bom"), bool):
            return "content/hasUtf8Bom"
        sha = result.get("baseSha256")
        if not isinstance(sha, str) or len(sha) != 64 or set(sha) - set("0123456789abcdef"):
            return "baseSha256"
        if written != _utf8_bytes(content) + (3 if result["hasUtf8Bom"] else 0):
            return "bytesWritten must be the content's UTF-8 bytes plus a BOM"
    return _matches_problem(request, result.get("matches"))


def assert_librechat_accepts_edit(request: Mapping[str, Any], result: Mapping[str, Any]) -> None:
    problem = edit_result_problem(request, result)
    assert problem is None, f"LibreChat would refuse this edit answer: {problem}"


SEARCH_TEXT_MAX_UTF16 = 2000
DEFAULT_COMMAND_OUTPUT_BYTES = 256 * 1024


def _utf16_units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def search_result_problem(request: Mapping[str, Any], result: Mapping[str, Any]) -> str | None:
    """LibreChat's rule for a search_text answer (the match bounds only)."""
    matches = result.get("matches")
    if not isinstance(matches, list) or len(matches) > request.get("maxResults", 50):
        return "matches"
    for match in matches:
        text = match.get("text") if isinstance(match, dict) else None
        if not isinstance(text, str) or _utf16_units(text) > SEARCH_TEXT_MAX_UTF16:
            return "match text over 2000 UTF-16 units"
        if not _int(match.get("line")) or match["line"] < 1:
            return "line"
        if not _int(match.get("column")) or match["column"] < 1:
            return "column"
    return None


def command_result_problem(request: Mapping[str, Any], result: Mapping[str, Any]) -> str | None:
    """LibreChat's rule for an execute_command answer."""
    stdout, stderr = result.get("stdout"), result.get("stderr")
    if not isinstance(stdout, str) or not isinstance(stderr, str):
        return "stdout/stderr"
    limit = request.get("maxOutputBytes", DEFAULT_COMMAND_OUTPUT_BYTES)
    if _utf8_bytes(stdout) + _utf8_bytes(stderr) > limit:
        return "stdout + stderr over maxOutputBytes"
    code, timed_out, sig = result.get("exitCode"), result.get("timedOut"), result.get("signal")
    if code is None:
        if not (timed_out is True or sig is not None):
            return "exitCode null without a timeout or signal"
    elif not _int(code) or not 0 <= code <= 255 or timed_out is not False or sig is not None:
        return "exitCode with a timeout or signal, or out of 0..255"
    return None


# --------------------------------------------------------------------------------------------
# EDIT_CONFLICT messages (LibreChat's parseEditConflict, packages/api/src/code/edits.ts)
#
# LibreChat turns a worker's EDIT_CONFLICT text into facts (which edit, why, where) and hints
# for the model; a message outside its grammar gives none. Read from the grammar, not ported:
# the patterns use JavaScript's meanings ("." stops at \n, \r, U+2028 and U+2029; digits are
# ASCII), and this reading is stricter than LibreChat's where the grammar says "exactly"
# (every hint must parse, the batch note ends the message), so a near miss fails a test here.

CONFLICT_MAX_CHARS = 8192
CONFLICT_MAX_EDITS = 100
_JS_DOT = "[^\n\r\u2028\u2029]"
_STRATEGY = "(exact|line-trimmed|whitespace-normalized|indentation-flexible)"
_LINES = "(?:line|lines) ((?:[0-9]{1,9}, ){0,4}[0-9]{1,9})(?: and ([0-9]{1,9}) more)?"
_SINGLE = re.compile(r"Workspace edit did not apply and nothing was written: ([\s\S]+)\.")
_BATCH = re.compile(
    "([0-9]{1,3}) of ([0-9]{1,3}) workspace edits did not apply, so nothing was written\\. "
    "Every other edit matched\\."
)
_BATCH_EDIT = re.compile(f"Edit ([0-9]{{1,3}}): ({_JS_DOT}+)\\.")
_BATCH_HIDDEN = re.compile("([0-9]{1,3}) more failing edits? not shown\\.")
_BATCH_NOTE = "Line numbers account for the earlier edits in this batch."
_AMBIGUOUS = re.compile(
    f"old_text matched ([0-9]{{1,9}}) locations(?: \\({_STRATEGY}\\))? at {_LINES}; "
    "include more surrounding lines so it matches exactly one"
)
_NOT_FOUND = "old_text was not found"
_END = "(?:; |\\Z)"
_HINTS: list[tuple[re.Pattern[str], Callable[[re.Match[str]], dict[str, Any]]]] = [
    (
        re.compile(
            'it contains an elision placeholder \\("\\.\\.\\."\\); copy the exact lines '
            f"instead of abbreviating{_END}"
        ),
        lambda m: {"kind": "elision"},
    ),
    (
        re.compile(
            f"it appears to include line-number prefixes from read_file output; remove them{_END}"
        ),
        lambda m: {"kind": "line_numbers"},
    ),
    (
        re.compile(
            f"the same text exists at line ([0-9]{{1,9}}) with different whitespace "
            f"\\({_STRATEGY}\\); copy that whitespace exactly{_END}"
        ),
        lambda m: {"kind": "whitespace", "line": int(m[1]), "strategy": m[2]},
    ),
    (re.compile(f"the file uses CRLF line endings{_END}"), lambda m: {"kind": "crlf"}),
    (
        re.compile(f"its first line appears at {_LINES}, but the lines after it differ{_END}"),
        lambda m: {"kind": "first_line", "lines": _line_numbers(m[1]), "more": int(m[2] or 0)},
    ),
    # The excerpt after the line number is file content: only the number is a fact.
    (
        re.compile("the closest line is line ([0-9]{1,9}): "),
        lambda m: {"kind": "closest_line", "line": int(m[1])},
    ),
]


def _line_numbers(listed: str) -> list[int]:
    return [int(n) for n in listed.split(", ")]


def _hints(text: str) -> list[dict[str, Any]] | None:
    """Each hint at most once, in any order, the closest line last; None if any is off."""
    hints: list[dict[str, Any]] = []
    rest = text
    while rest:
        found = next(
            ((match, build) for pattern, build in _HINTS if (match := pattern.match(rest))),
            None,
        )
        if found is None:
            return None
        match, build = found
        hint = build(match)
        if any(seen["kind"] == hint["kind"] for seen in hints):
            return None
        hints.append(hint)
        if hint["kind"] == "closest_line":
            return hints  # the rest is the excerpt
        rest = rest[match.end() :]
    return hints


def _reason(edit: int, reason: str) -> dict[str, Any] | None:
    ambiguous = _AMBIGUOUS.fullmatch(reason)
    if ambiguous:
        return {
            "edit": edit,
            "kind": "ambiguous",
            "count": int(ambiguous[1]),
            "strategy": ambiguous[2] or "exact",
            "lines": _line_numbers(ambiguous[3]),
            "more": int(ambiguous[4] or 0),
        }
    if reason == _NOT_FOUND:
        return {"edit": edit, "kind": "not_found", "hints": []}
    if not reason.startswith(_NOT_FOUND + "; "):
        return None
    hints = _hints(reason[len(_NOT_FOUND) + 2 :])
    return None if not hints else {"edit": edit, "kind": "not_found", "hints": hints}


def edit_conflict_report(message: str) -> dict[str, Any] | None:
    """The facts LibreChat recovers from an EDIT_CONFLICT message, or None when it falls
    outside the grammar: {"editCount", "failures": [...], "hidden"}."""
    if len(message) > CONFLICT_MAX_CHARS:
        return None
    single = _SINGLE.fullmatch(message)
    if single:
        failure = _reason(1, single[1])
        return None if failure is None else {"editCount": 1, "failures": [failure], "hidden": 0}
    header, *lines = message.split("\n")
    batch = _BATCH.fullmatch(header)
    if not batch or not lines or lines[-1] != _BATCH_NOTE:
        return None
    failed, edit_count = int(batch[1]), int(batch[2])
    if not 2 <= edit_count <= CONFLICT_MAX_EDITS or not 1 <= failed <= edit_count:
        return None
    failures: list[dict[str, Any]] = []
    hidden = 0
    for line in lines[:-1]:
        edit = _BATCH_EDIT.fullmatch(line)
        if edit and not hidden:
            index = int(edit[1])
            if not 1 <= index <= edit_count or (failures and index <= failures[-1]["edit"]):
                return None
            failure = _reason(index, edit[2])
            if failure is None:
                return None
            failures.append(failure)
            continue
        more = _BATCH_HIDDEN.fullmatch(line)
        if not more or hidden or not failures:
            return None
        hidden = int(more[1])
    if len(failures) + hidden != failed:
        return None
    return {"editCount": edit_count, "failures": failures, "hidden": hidden}


# LibreChat's durable client (`packages/api/src/code/workspace.ts`, `executeWorkspaceTool`
# with durable requests): a `failed` status is reported as a rejection with the status its code
# stands for. A code outside this table is reported as 422 WORKSPACE_TOOL_REJECTED, which the
# agent takes as final: the call "failed" for a reason it cannot act on.
DURABLE_FAILED_STATUS = {
    "WORKER_OFFLINE": 503,
    "WORKSPACE_QUEUE_TIMEOUT": 503,
    "WORKER_QUEUE_FULL": 429,
    "ASSIGNMENT_EXPIRED": 504,
    "SEARCH_TIMEOUT": 504,
    "RESULT_INVALID": 502,
    "WORKER_UNAUTHORIZED": 403,
    "WRITE_DISABLED": 403,
    "WRITE_LIMIT_EXCEEDED": 413,
    "ASSIGNMENT_INVALID": 400,
    "NOT_FOUND": 422,
    "EXECUTION_ABORTED": 422,
    "EDIT_CONFLICT": 409,
    "FILE_EXISTS": 409,
    "WORKSPACE_QUARANTINED": 409,
}
DURABLE_UNMAPPED = (422, "WORKSPACE_TOOL_REJECTED")


def librechat_durable_failure(status: Mapping[str, Any]) -> tuple[int, str]:
    """(status, code) LibreChat reports for a `failed` durable status."""
    error = status.get("error")
    code = error.get("code") if isinstance(error, Mapping) else None
    if isinstance(code, str) and code in DURABLE_FAILED_STATUS:
        return DURABLE_FAILED_STATUS[code], code
    return DURABLE_UNMAPPED
