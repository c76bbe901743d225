"""The wire contract's field rules (protocol v1), shared by sluice-client and the Sluice server.

The server imports this module to validate requests before anything is queued and to check
a worker's result before it is forwarded, so client and server can never disagree on a bound.
Pure Python, no dependencies.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

PROTOCOL_VERSION = 1

OPERATIONS = frozenset(
    {
        "read_file",
        "list_files",
        "search_text",
        "write_file",
        "preview_edit",
        "edit_file",
        "execute_command",
    }
)
# Operations that may change the workspace; their unknown outcome quarantines the key.
MUTATING_OPERATIONS = frozenset({"write_file", "edit_file", "execute_command"})

MAX_PATH_CHARS = 4096
MAX_QUERY_CHARS = 4096
MAX_WRITE_BYTES = 1024 * 1024
MAX_COMMAND_BYTES = 32 * 1024
MAX_OUTPUT_BYTES = 1024 * 1024
DEFAULT_OUTPUT_BYTES = 256 * 1024
MAX_COMMAND_TIMEOUT_MS = 300_000
DEFAULT_COMMAND_TIMEOUT_MS = 30_000
MAX_QUEUE_WAIT_MS = 300_000
DEFAULT_QUEUE_WAIT_MS = 30_000
# A read_file window stops (truncated) before its content would pass this many UTF-8 bytes;
# a first line that alone is larger is refused with READ_LIMIT_EXCEEDED.
READ_MAX_BYTES = 1024 * 1024
# A search match's `text` is its line cut to this many UTF-16 code units: LibreChat's client
# counts a string's length that way (JavaScript's `.length`, where a character outside the
# Basic Multilingual Plane, an emoji say, counts 2) and refuses a longer text.
MATCH_TEXT_MAX_CHARS = 2000

MAX_READ_LINES = 500
DEFAULT_READ_LINES = 200
MAX_LIST_RESULTS = 500
DEFAULT_LIST_RESULTS = 100
MAX_SEARCH_RESULTS = 200
DEFAULT_SEARCH_RESULTS = 50
MAX_EDITS = 100
# Not in the contract: a sanity bound so one edit cannot carry more than a whole write.
MAX_EDIT_TEXT_BYTES = 1024 * 1024
# §2.2.1 instruction reads: the two names a worker may serve whole, and their size bound.
INSTRUCTION_FILES = frozenset({"AGENTS.md", "CLAUDE.md"})
INSTRUCTION_MAX_BYTES = 32 * 1024
EDIT_MATCHING = frozenset({"exact", "tolerant"})
# The order a tolerant edit tries them in, after `exact`.
TOLERANT_STRATEGIES = ("line-trimmed", "whitespace-normalized", "indentation-flexible")
EDIT_MATCH_STRATEGIES = frozenset({"exact", *TOLERANT_STRATEGIES})
MAX_ERROR_CHARS = 4096

INVALID_TOOL_REQUEST = "INVALID_WORKSPACE_TOOL_REQUEST"
INVALID_QUEUE_WAIT = "INVALID_WORKSPACE_QUEUE_WAIT"
INVALID_WORKER_ID = "INVALID_WORKER_ID"
INVALID_REQUEST_ID = "INVALID_REQUEST_ID"
RESULT_INVALID = "RESULT_INVALID"

# Every pattern is used with fullmatch: `$` also matches before a trailing newline, so
# re.match(r"...$") would let "abc\n" through. The classes are spelled out in ASCII because
# \d and \w match non-ASCII digits and letters.
_WORKSPACE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # worker ids and worktree lanes
_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9_-]{16,128}")
_SHA256_HEX_RE = re.compile(r"[0-9a-f]{64}")
_QUEUE_WAIT_RE = re.compile(r"[1-9][0-9]{0,5}")  # at most 6 digits: 300000 is the ceiling
_SIGNAL_RE = re.compile(r"SIG[A-Z0-9]{1,29}")
_UNAVAILABLE_RE = re.compile(r"[A-Z][A-Z_]{0,100}_UNAVAILABLE")
_TIMEOUT_RE = re.compile(r"[A-Z][A-Z_]{0,100}_TIMEOUT")


class ProtocolError(ValueError):
    """A value broke the wire contract; `code` is the §2.5 code to answer with."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions unpickle as cls(*self.args) and args holds only the message, so without
        # this a ProtocolError crossing a process boundary (Celery, multiprocessing) breaks.
        return (type(self), (self.code, self.message))


# --------------------------------------------------------------------------------------------
# Identifiers and headers


def is_safe_relative_path(value: object, *, allow_empty: bool = False) -> bool:
    """§2.2: a relative path that cannot name anything outside the workspace by its spelling.

    Symlinks are the worker's business: it still resolves the path before touching it.
    """
    if not isinstance(value, str) or len(value) > MAX_PATH_CHARS:
        return False
    if value == "":
        return allow_empty
    if "\x00" in value or "\\" in value or value.startswith("/"):
        return False
    if _utf8_length(value) is None:
        return False
    # A leading, trailing or doubled "/" shows up as an empty segment.
    return all(segment not in ("", ".", "..") for segment in value.split("/"))


def parse_queue_wait_header(value: str | None) -> int:
    """§2.1: the caller's admission allowance in ms; absent means the default."""
    if value is None:
        return DEFAULT_QUEUE_WAIT_MS
    # int() alone would accept " 5", "+5", "5_0" and non-ASCII digits, so the pattern decides
    # and int() only converts; the pattern also caps the length before int() sees it.
    if not isinstance(value, str) or _QUEUE_WAIT_RE.fullmatch(value) is None:
        raise ProtocolError(
            INVALID_QUEUE_WAIT,
            f"X-LibreChat-Workspace-Queue-Wait-Ms must be a whole number of ms in 1..{MAX_QUEUE_WAIT_MS}",
        )
    wait_ms = int(value)
    if wait_ms > MAX_QUEUE_WAIT_MS:
        raise ProtocolError(
            INVALID_QUEUE_WAIT,
            f"X-LibreChat-Workspace-Queue-Wait-Ms must be at most {MAX_QUEUE_WAIT_MS}",
        )
    return wait_ms


def validate_worker_id(value: str) -> str:
    if not isinstance(value, str) or _NAME_RE.fullmatch(value) is None:
        raise ProtocolError(
            INVALID_WORKER_ID, "worker id must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
        )
    return value


def validate_request_id(value: str) -> str:
    if not isinstance(value, str) or _REQUEST_ID_RE.fullmatch(value) is None:
        raise ProtocolError(INVALID_REQUEST_ID, "request id must match ^[A-Za-z0-9_-]{16,128}$")
    return value


# --------------------------------------------------------------------------------------------
# Field checkers, shared by request and result validation. A checker takes the field's name
# (for the message) and its JSON value, returns the value to keep, and raises _Invalid. The
# two callers answer with different codes, so they turn _Invalid into their own ProtocolError.


class _Invalid(Exception):
    pass


_Check = Callable[[str, object], object]


@dataclass(frozen=True)
class _Field:
    check: _Check
    default: object  # a value filled in when absent, or _REQUIRED / _OPTIONAL


_REQUIRED = object()
_OPTIONAL = object()  # may be absent, and stays absent; an explicit null is still refused


def _utf8_length(value: str) -> int | None:
    """Bytes in UTF-8, or None when the string holds a lone surrogate (JSON allows "\\ud800")."""
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def _integer(lo: int | None = None, hi: int | None = None) -> _Check:
    if lo is None:
        wanted = "an integer"
    elif hi is None:
        wanted = f"an integer >= {lo}"
    else:
        wanted = f"an integer in {lo}..{hi}"

    def check(name: str, value: object) -> int:
        # bool is an int subclass in Python but not a JSON number; 5.0 is a JSON number but
        # not an integer, and accepting it would hand a float to code expecting an int.
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid(f"{name} must be {wanted}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise _Invalid(f"{name} must be {wanted}")
        return value

    return check


def _boolean(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"{name} must be true or false")
    return value


def _text(
    *,
    min_chars: int = 0,
    max_chars: int | None = None,
    max_bytes: int | None = None,
    forbidden: str = "",
    non_blank: bool = False,
) -> _Check:
    def check(name: str, value: object) -> str:
        if not isinstance(value, str):
            raise _Invalid(f"{name} must be a string")
        if len(value) < min_chars:
            raise _Invalid(f"{name} must not be empty")
        if max_chars is not None and len(value) > max_chars:
            raise _Invalid(f"{name} must be at most {max_chars} characters")
        # UTF-8 never takes fewer bytes than characters, so a value that is too long in
        # characters is refused before paying to encode it.
        if max_bytes is not None and len(value) > max_bytes:
            raise _Invalid(f"{name} must be at most {max_bytes} bytes in UTF-8")
        size = _utf8_length(value)
        if size is None:
            raise _Invalid(f"{name} must be valid Unicode (no lone surrogates)")
        if max_bytes is not None and size > max_bytes:
            raise _Invalid(f"{name} must be at most {max_bytes} bytes in UTF-8")
        if any(char in value for char in forbidden):
            raise _Invalid(f"{name} must not contain {forbidden!r}"[:200])
        if non_blank and value.isspace():
            raise _Invalid(f"{name} must not be blank")
        return value

    return check


def _matching(pattern: re.Pattern[str], wanted: str) -> _Check:
    def check(name: str, value: object) -> str:
        if not isinstance(value, str) or pattern.fullmatch(value) is None:
            raise _Invalid(f"{name} must be {wanted}")
        return value

    return check


def _relative_path(*, allow_empty: bool) -> _Check:
    wanted = "a safe relative path" + (" or empty" if allow_empty else "")

    def check(name: str, value: object) -> str:
        if not is_safe_relative_path(value, allow_empty=allow_empty):
            raise _Invalid(
                f"{name} must be {wanted} (at most {MAX_PATH_CHARS} characters, no NUL, "
                "no backslash, no leading '/', no '.', '..' or empty segment)"
            )
        assert isinstance(value, str)
        return value

    return check


def _one_of(values: frozenset[str]) -> _Check:
    def check(name: str, value: object) -> str:
        if not isinstance(value, str) or value not in values:
            raise _Invalid(f"{name} must be one of {', '.join(sorted(values))}")
        return value

    return check


def _nullable(inner: _Check) -> _Check:
    def check(name: str, value: object) -> object:
        return None if value is None else inner(name, value)

    return check


def _protocol_version(name: str, value: object) -> int:
    if isinstance(value, bool) or value != PROTOCOL_VERSION or not isinstance(value, int):
        raise _Invalid(f"{name} must be {PROTOCOL_VERSION}")
    return value


def _worktree_name(name: str, value: object) -> str:
    # git refuses a worktree named "*.lock" (it collides with its own lock files).
    if not isinstance(value, str) or _NAME_RE.fullmatch(value) is None or value.endswith(".lock"):
        raise _Invalid(
            f"{name} must match ^[A-Za-z0-9][A-Za-z0-9._-]{{0,127}}$ and not end in '.lock'"
        )
    return value


def _key_label(prefix: str, key: object) -> str:
    # Unknown keys come from the caller: cut and escape them before they reach a message.
    shown = key if isinstance(key, str) and key.isprintable() and len(key) <= 64 else repr(key)[:64]
    return f"{prefix}.{shown}" if prefix else shown


def _check_object(name: str, value: object, fields: Mapping[str, _Field]) -> dict[str, object]:
    """Exact key set: unknown keys and missing required keys are refused, defaults filled in."""
    if not isinstance(value, dict):
        raise _Invalid(f"{name or 'body'} must be a JSON object")
    for key in value:
        if key not in fields:
            raise _Invalid(f"unknown field {_key_label(name, key)}")
    checked: dict[str, object] = {}
    for key, field in fields.items():
        label = _key_label(name, key)
        if key in value:
            checked[key] = field.check(label, value[key])
        elif field.default is _REQUIRED:
            raise _Invalid(f"missing field {label}")
        elif field.default is not _OPTIONAL:
            checked[key] = field.default
    return checked


def _object(fields: Mapping[str, _Field]) -> _Check:
    def check(name: str, value: object) -> dict[str, object]:
        return _check_object(name, value, fields)

    return check


def _list_of(item: _Check, *, min_items: int = 0, max_items: int) -> _Check:
    def check(name: str, value: object) -> list[object]:
        if not isinstance(value, list):
            raise _Invalid(f"{name} must be a list")
        if not min_items <= len(value) <= max_items:
            raise _Invalid(f"{name} must hold {min_items}..{max_items} items")
        return [item(f"{name}[{index}]", element) for index, element in enumerate(value)]

    return check


def _required(check: _Check) -> _Field:
    return _Field(check, _REQUIRED)


def _optional(check: _Check) -> _Field:
    return _Field(check, _OPTIONAL)


def _defaults_to(check: _Check, default: object) -> _Field:
    return _Field(check, default)


# --------------------------------------------------------------------------------------------
# Requests (§2.2)

_PATH = _relative_path(allow_empty=False)
_PATH_OR_ROOT = _relative_path(allow_empty=True)
_SHA256_HEX = _matching(_SHA256_HEX_RE, "64 lowercase hex digits")

_COMMON_REQUEST_FIELDS: dict[str, _Field] = {
    "protocolVersion": _required(_protocol_version),
    "operation": _required(_one_of(OPERATIONS)),
    "workspaceId": _required(
        _matching(_WORKSPACE_ID_RE, "a workspace id matching ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
    ),
    "workspaceInstanceId": _optional(_SHA256_HEX),
    "worktree": _optional(_worktree_name),
}

_EDITS = _list_of(
    _object(
        {
            "oldText": _required(_text(min_chars=1, max_bytes=MAX_EDIT_TEXT_BYTES)),
            "newText": _required(_text(max_bytes=MAX_EDIT_TEXT_BYTES)),
            # Optional without a default: a request that names replaceAll at all (even false)
            # asks for `matches` in its result, as LibreChat's client expects (§2.2.1).
            "replaceAll": _optional(_boolean),
        }
    ),
    min_items=1,
    max_items=MAX_EDITS,
)

# Optional fields sent as null are refused rather than read as "absent": a client that sends
# null means something, and guessing what would make two implementations disagree.
_OPERATION_REQUEST_FIELDS: dict[str, dict[str, _Field]] = {
    "read_file": {
        "path": _required(_PATH),
        "startLine": _defaults_to(_integer(1), 1),
        "maxLines": _defaults_to(_integer(1, MAX_READ_LINES), DEFAULT_READ_LINES),
        "instructionSha256": _optional(_SHA256_HEX),
    },
    "list_files": {
        "path": _defaults_to(_PATH_OR_ROOT, ""),
        "maxResults": _defaults_to(_integer(1, MAX_LIST_RESULTS), DEFAULT_LIST_RESULTS),
        "afterPath": _optional(_PATH),
    },
    "search_text": {
        "query": _required(_text(min_chars=1, max_chars=MAX_QUERY_CHARS, forbidden="\x00\r\n")),
        "path": _defaults_to(_PATH_OR_ROOT, ""),
        "maxResults": _defaults_to(_integer(1, MAX_SEARCH_RESULTS), DEFAULT_SEARCH_RESULTS),
    },
    "write_file": {
        "path": _required(_PATH),
        "content": _required(_text(max_bytes=MAX_WRITE_BYTES)),
        "overwrite": _defaults_to(_boolean, False),
    },
    "preview_edit": {
        "path": _required(_PATH),
        "edits": _required(_EDITS),
        "matching": _optional(_one_of(EDIT_MATCHING)),
    },
    "edit_file": {
        "path": _required(_PATH),
        "edits": _required(_EDITS),
        "matching": _optional(_one_of(EDIT_MATCHING)),
        # Lowercase only: it is compared with the hexdigest the worker computes.
        "expectedBaseSha256": _optional(_SHA256_HEX),
    },
    "execute_command": {
        "command": _required(
            _text(min_chars=1, max_bytes=MAX_COMMAND_BYTES, forbidden="\x00", non_blank=True)
        ),
        "cwd": _defaults_to(_PATH_OR_ROOT, ""),
        "timeoutMs": _defaults_to(_integer(1, MAX_COMMAND_TIMEOUT_MS), DEFAULT_COMMAND_TIMEOUT_MS),
        "maxOutputBytes": _defaults_to(_integer(1, MAX_OUTPUT_BYTES), DEFAULT_OUTPUT_BYTES),
    },
}
_REQUEST_FIELDS = {
    operation: {**_COMMON_REQUEST_FIELDS, **fields}
    for operation, fields in _OPERATION_REQUEST_FIELDS.items()
}


def validate_request(body: object) -> dict[str, object]:
    """Check a decoded request body against §2.2; return a new dict with defaults filled in.

    Every failure is ProtocolError("INVALID_WORKSPACE_TOOL_REQUEST") naming the field. The
    result holds workspaceInstanceId and worktree only when the caller sent them.
    """
    try:
        if not isinstance(body, dict):
            raise _Invalid("body must be a JSON object")
        # The version and the operation decide which fields exist, so they are judged first:
        # a v2 body gets "protocolVersion must be 1", not a list of fields v1 does not know.
        for key in ("protocolVersion", "operation"):
            if key not in body:
                raise _Invalid(f"missing field {key}")
            _COMMON_REQUEST_FIELDS[key].check(key, body[key])
        checked = _check_object("", body, _REQUEST_FIELDS[body["operation"]])
        if "instructionSha256" in checked:
            _check_instruction_read(body, checked)
        return checked
    except _Invalid as exc:
        raise ProtocolError(INVALID_TOOL_REQUEST, str(exc)) from None


def is_instruction_read(request: Mapping[str, object]) -> bool:
    """A validated read_file that asks for a whole instruction file (§2.2.1)."""
    return request.get("operation") == "read_file" and "instructionSha256" in request


def edit_reports_matches(request: Mapping[str, object]) -> bool:
    """Whether an edit request opted into per-edit `matches` in its result (§2.2.1): it named
    `matching`, or `replaceAll` on any edit, whatever the value."""
    edits = request.get("edits")
    return "matching" in request or (
        isinstance(edits, list) and any(isinstance(e, dict) and "replaceAll" in e for e in edits)
    )


def _check_instruction_read(body: Mapping[str, object], checked: dict[str, object]) -> None:
    # Judged on what the caller sent, not on the filled-in defaults: an instruction read is
    # the whole file, so a window of any kind (even the default one spelled out) is refused.
    if checked["path"] not in INSTRUCTION_FILES:
        raise _Invalid("instructionSha256 is only allowed with path AGENTS.md or CLAUDE.md")
    for key in ("startLine", "maxLines"):
        if key in body:
            raise _Invalid(f"instructionSha256 does not combine with {key}")
    if "worktree" in body:
        # LibreChat never routes an instruction read to a lane; the file is the checkout's.
        raise _Invalid("instructionSha256 does not combine with worktree")
    del checked["startLine"], checked["maxLines"]


# --------------------------------------------------------------------------------------------
# Isolation keys (§2.4)


def isolation_key(request: Mapping[str, object]) -> tuple[str, str]:
    """(base, lane) of a validated request; lane "" is the checkout itself."""
    base = str(request["workspaceId"])
    instance = request.get("workspaceInstanceId")
    if instance is not None:
        # \x1f cannot occur in a workspace id, so distinct pairs never join to the same base.
        base = f"{base}\x1f{instance}"
    worktree = request.get("worktree")
    return base, "" if worktree is None else str(worktree)


def keys_conflict(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """A lane conflicts with itself and with its checkout; sibling lanes run side by side."""
    return a[0] == b[0] and (a[1] == "" or b[1] == "" or a[1] == b[1])


# --------------------------------------------------------------------------------------------
# Worker errors (§2.5)

WORKER_ERROR_STATUS: dict[str, int] = {
    "NOT_FOUND": 422,
    "INVALID_PATH": 422,
    "INVALID_REQUEST": 422,
    "READ_LIMIT_EXCEEDED": 422,
    "WRITE_DISABLED": 403,
    "COMMAND_DISABLED": 403,
    "EDIT_CONFLICT": 409,
    "FILE_EXISTS": 409,
    "WRITE_LIMIT_EXCEEDED": 413,
    "WORKER_MISMATCH": 409,
    # An edit whose plan ran out of the call's time: nothing was written, so it is not started.
    "EDIT_NOT_STARTED": 503,
}

# Codes the API itself answers with. A worker must not be able to speak them: a client treats
# WORKSPACE_QUEUE_TIMEOUT as "not started" and may resend, though the worker did run the call.
_SERVICE_CODES = frozenset(
    {
        "INVALID_WORKSPACE_TOOL_REQUEST",
        "INVALID_WORKSPACE_QUEUE_WAIT",
        "INVALID_WORKER_ID",
        "INVALID_REQUEST_ID",
        "UNAUTHENTICATED",
        "WORKER_NOT_FOUND",
        "WORKSPACE_QUARANTINED",
        "REQUEST_TOO_LARGE",
        "UNSUPPORTED_MEDIA_TYPE",
        "WORKER_QUEUE_FULL",
        "WORKSPACE_QUEUE_TIMEOUT",
        "WORKER_OFFLINE",
        "NO_WORKER_SELECTED",
        "SERVICE_SHUTTING_DOWN",
        "ASSIGNMENT_EXPIRED",
        "RESULT_INVALID",
        "REQUEST_CANCELLED",
    }
)


def worker_error_status(code: str) -> int | None:
    """HTTP status for a code a worker may answer with, or None when it may not use it."""
    if not isinstance(code, str):
        return None
    if code in WORKER_ERROR_STATUS:
        return WORKER_ERROR_STATUS[code]
    if code in _SERVICE_CODES:
        return None
    if _UNAVAILABLE_RE.fullmatch(code):
        return 503
    if _TIMEOUT_RE.fullmatch(code):
        return 504
    return None


def validate_error_result(body: object) -> tuple[int, str, str]:
    """A worker's typed refusal -> (status, code, error); anything else is RESULT_INVALID."""
    if not isinstance(body, dict) or set(body) != {"error", "code"}:
        raise ProtocolError(RESULT_INVALID, "worker error must be exactly {error, code}")
    try:
        error = _text(max_chars=MAX_ERROR_CHARS)("error", body["error"])
    except _Invalid as exc:
        raise ProtocolError(RESULT_INVALID, f"worker error: {exc}") from None
    code = body["code"]
    status = worker_error_status(code) if isinstance(code, str) else None
    if status is None:
        raise ProtocolError(RESULT_INVALID, "worker error code is not one a worker may send")
    assert isinstance(code, str) and isinstance(error, str)
    return status, code, error


# --------------------------------------------------------------------------------------------
# Results (§2.2): the exact key set and types per operation, then what must agree with the
# request. A result that breaks either is answered 502 RESULT_INVALID instead of forwarded.

_COMMON_RESULT_FIELDS: dict[str, _Field] = {
    "protocolVersion": _required(_protocol_version),
    "operation": _required(_one_of(OPERATIONS)),
    "workspaceId": _required(_text(max_chars=128)),
}

# One per edit; whether it may appear at all, and which values fit which edit, is decided
# against the request in _edit_matches_agree.
_EDIT_MATCHES = _list_of(
    _object(
        {
            "strategy": _required(_one_of(EDIT_MATCH_STRATEGIES)),
            "occurrences": _required(_integer(1)),
        }
    ),
    min_items=1,
    max_items=MAX_EDITS,
)

_OPERATION_RESULT_FIELDS: dict[str, dict[str, _Field]] = {
    "read_file": {
        "path": _required(_PATH),
        # UTF-8 bytes of the decoded text, as LibreChat counts them: the worker budgets what it
        # sends, so a binary line whose bytes decode to U+FFFD (3 bytes each) is cut sooner.
        "content": _required(_text(max_bytes=READ_MAX_BYTES)),
        "startLine": _required(_integer(1)),
        "endLine": _required(_integer(0)),
        "truncated": _required(_boolean),
        "nextStartLine": _optional(_integer(1)),
    },
    "list_files": {
        "paths": _required(_list_of(_PATH, max_items=MAX_LIST_RESULTS)),
        "truncated": _required(_boolean),
        "nextAfterPath": _optional(_PATH),
    },
    "search_text": {
        "matches": _required(
            _list_of(
                _object(
                    {
                        "path": _required(_PATH),
                        "line": _required(_integer(1)),
                        "column": _required(_integer(1)),
                        "text": _required(_text(max_chars=MATCH_TEXT_MAX_CHARS)),
                    }
                ),
                max_items=MAX_SEARCH_RESULTS,
            )
        ),
        "truncated": _required(_boolean),
    },
    "write_file": {
        "path": _required(_PATH),
        "created": _required(_boolean),
        "bytesWritten": _required(_integer(0, MAX_WRITE_BYTES)),
    },
    "preview_edit": {
        "path": _required(_PATH),
        # No size bound of our own: the edited file may be larger than any write we accept,
        # and the worker owns that limit (WRITE_LIMIT_EXCEEDED).
        "content": _required(_text()),
        "hasUtf8Bom": _required(_boolean),
        "baseSha256": _required(_SHA256_HEX),
        "replacements": _required(_integer(1)),
        "bytesWritten": _required(_integer(0)),
        "matches": _optional(_EDIT_MATCHES),
    },
    "edit_file": {
        "path": _required(_PATH),
        "replacements": _required(_integer(1)),
        "bytesWritten": _required(_integer(0)),
        "matches": _optional(_EDIT_MATCHES),
    },
    "execute_command": {
        "exitCode": _required(_nullable(_integer())),
        "signal": _optional(_matching(_SIGNAL_RE, "a signal name such as SIGKILL")),
        # The worker cuts raw output at maxOutputBytes and then decodes, so the text never
        # has more characters than that; the per-request bound is checked below.
        "stdout": _required(_text(max_chars=MAX_OUTPUT_BYTES)),
        "stderr": _required(_text(max_chars=MAX_OUTPUT_BYTES)),
        "truncated": _required(_boolean),
        "timedOut": _required(_boolean),
    },
}
_RESULT_FIELDS = {
    operation: {**_COMMON_RESULT_FIELDS, **fields}
    for operation, fields in _OPERATION_RESULT_FIELDS.items()
}


def _get(mapping: Mapping[str, object], key: str, kind: type[Any]) -> Any:
    """A field already checked by _check_object (or by validate_request), typed for mypy."""
    value = mapping.get(key)
    if not isinstance(value, kind):
        # For the request this is a caller bug (it did not come from validate_request).
        raise TypeError(f"{key} must be {kind.__name__}, got {type(value).__name__}")
    return value


def _inside(path: str, directory: str) -> bool:
    return directory == "" or path == directory or path.startswith(directory + "/")


def _window_lines(content: str) -> int | None:
    """How many lines `content` holds under §2.2: its pieces split on "\\n". An empty content
    is zero lines or one empty line, so it fits either count (None)."""
    return None if content == "" else content.count("\n") + 1


def _check_continuation(result: Mapping[str, object], key: str, expected: object) -> None:
    """`key` is present exactly when the result is truncated, and then equals `expected`."""
    if _get(result, "truncated", bool):
        if expected is None or result.get(key) != expected:
            raise _Invalid(f"a truncated result must carry {key} where the next page starts")
    elif key in result:
        raise _Invalid(f"{key} is only allowed when truncated")


def _instruction_read_agrees(result: Mapping[str, object]) -> None:
    """§2.2.1: the whole file, exact text, final newline kept; endLine counts the pieces
    content splits into, so a file ending in a newline counts the empty piece after it."""
    content = _get(result, "content", str)
    if _utf8_length(content) is None or len(content.encode("utf-8")) > INSTRUCTION_MAX_BYTES:
        raise _Invalid(f"an instruction read holds at most {INSTRUCTION_MAX_BYTES} bytes")
    if _get(result, "startLine", int) != 1:
        raise _Invalid("an instruction read starts at line 1")
    if _get(result, "endLine", int) != content.count("\n") + 1:
        raise _Invalid("an instruction read's endLine must be the number of pieces of content")
    # Stricter than LibreChat (which takes either boolean): Sluice serves the whole file or
    # refuses it, so a truncated instruction read cannot be one of ours.
    if _get(result, "truncated", bool) or "nextStartLine" in result:
        raise _Invalid("an instruction read is never truncated")


def _read_file_agrees(request: Mapping[str, object], result: Mapping[str, object]) -> None:
    """§2.2 line windows, the equalities LibreChat's client checks on every read."""
    if is_instruction_read(request):
        _instruction_read_agrees(result)
        return
    start, max_lines = _get(request, "startLine", int), _get(request, "maxLines", int)
    if _get(result, "startLine", int) != start:
        raise _Invalid("startLine differs from the request")
    end = _get(result, "endLine", int)
    if not start - 1 <= end <= start + max_lines - 1:
        raise _Invalid("endLine is outside the requested window")
    reported = end - start + 1
    lines = _window_lines(_get(result, "content", str))
    if lines is None and reported > 1:
        raise _Invalid("an empty content stands for at most one (empty) line")
    if lines is not None and lines != reported:
        raise _Invalid(f"content holds {lines} lines where startLine..endLine names {reported}")
    # A truncated page without a single line would send a paging client round in circles.
    if _get(result, "truncated", bool) and end < start:
        raise _Invalid("a truncated result must hold at least one line")
    _check_continuation(result, "nextStartLine", end + 1)


def _list_files_agrees(request: Mapping[str, object], result: Mapping[str, object]) -> None:
    directory = _get(request, "path", str)
    after = request.get("afterPath")
    paths: list[str] = _get(result, "paths", list)
    if len(paths) > _get(request, "maxResults", int):
        raise _Invalid("paths holds more than maxResults entries")
    for index, path in enumerate(paths):
        if not _inside(path, directory):
            raise _Invalid(f"paths[{index}] is outside the requested path")
        if isinstance(after, str) and path <= after:
            raise _Invalid(f"paths[{index}] is not after afterPath")
        if index and path <= paths[index - 1]:
            raise _Invalid(f"paths[{index}] breaks the strictly ascending order")
    _check_continuation(result, "nextAfterPath", paths[-1] if paths else None)


def utf16_length(text: str) -> int:
    """The length JavaScript gives `text`: a character beyond U+FFFF is two code units."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def cut_utf16(text: str, max_units: int) -> str:
    """The longest prefix of `text` of at most `max_units` UTF-16 code units (never half of a
    surrogate pair)."""
    if len(text) * 2 <= max_units or utf16_length(text) <= max_units:
        return text
    units = 0
    for index, ch in enumerate(text):
        units += 2 if ord(ch) > 0xFFFF else 1
        if units > max_units:
            return text[:index]
    return text


def _search_text_agrees(request: Mapping[str, object], result: Mapping[str, object]) -> None:
    directory = _get(request, "path", str)
    matches: list[dict[str, object]] = _get(result, "matches", list)
    if len(matches) > _get(request, "maxResults", int):
        raise _Invalid("matches holds more than maxResults entries")
    for index, match in enumerate(matches):
        if not _inside(_get(match, "path", str), directory):
            raise _Invalid(f"matches[{index}].path is outside the requested path")
        if utf16_length(_get(match, "text", str)) > MATCH_TEXT_MAX_CHARS:
            raise _Invalid(
                f"matches[{index}].text is longer than {MATCH_TEXT_MAX_CHARS} UTF-16 units"
            )


def _write_file_agrees(request: Mapping[str, object], result: Mapping[str, object]) -> None:
    # The worker writes exactly the content it was given, so the byte count is known.
    if _get(result, "bytesWritten", int) != _utf8_length(_get(request, "content", str)):
        raise _Invalid("bytesWritten differs from the size of the content sent")
    if not _get(request, "overwrite", bool) and not _get(result, "created", bool):
        raise _Invalid("created is false although overwrite was not allowed")


def _edit_matches_agree(request: Mapping[str, object], result: Mapping[str, object]) -> None:
    """§2.2.1, as LibreChat's areValidEditMatches reads it: `matches` is present exactly when
    the request asked, one per edit, `exact` unless matching was tolerant, and more than one
    occurrence only for a replaceAll edit."""
    if not edit_reports_matches(request):
        if "matches" in result:
            raise _Invalid("matches is only allowed when the request set matching or replaceAll")
        return
    if "matches" not in result:
        raise _Invalid("a request that sets matching or replaceAll must get matches")
    edits: list[dict[str, object]] = _get(request, "edits", list)
    matches: list[dict[str, object]] = _get(result, "matches", list)
    if len(matches) != len(edits):
        raise _Invalid("matches must hold one entry per edit")
    tolerant = request.get("matching") == "tolerant"
    for index, (edit, match) in enumerate(zip(edits, matches, strict=True)):
        if not tolerant and match["strategy"] != "exact":
            raise _Invalid(f"matches[{index}].strategy must be exact without tolerant matching")
        if edit.get("replaceAll") is not True and match["occurrences"] != 1:
            raise _Invalid(f"matches[{index}].occurrences must be 1 without replaceAll")


def _edit_agrees(request: Mapping[str, object], result: Mapping[str, object]) -> None:
    edits: list[dict[str, object]] = _get(request, "edits", list)
    # Edits applied, not occurrences replaced (those go in `matches`): an edit either applies
    # or the whole call fails, so the count is always the number sent.
    if _get(result, "replacements", int) != len(edits):
        raise _Invalid("replacements differs from the number of edits sent")
    if result.get("operation") == "preview_edit":
        expected = len(_get(result, "content", str).encode("utf-8")) + (
            3 if _get(result, "hasUtf8Bom", bool) else 0
        )
        if _get(result, "bytesWritten", int) != expected:
            raise _Invalid("bytesWritten differs from the size of the previewed content")
    _edit_matches_agree(request, result)


def _execute_command_agrees(request: Mapping[str, object], result: Mapping[str, object]) -> None:
    # One budget for both streams, in UTF-8 bytes, as LibreChat's client counts it.
    limit = _get(request, "maxOutputBytes", int)
    size = sum(_utf8_length(_get(result, stream, str)) or 0 for stream in ("stdout", "stderr"))
    if size > limit:
        raise _Invalid("stdout and stderr together are longer than maxOutputBytes")
    if result["exitCode"] is None and "signal" not in result and not result["timedOut"]:
        raise _Invalid("exitCode is null without a signal or a timeout")


_RESULT_AGREES: dict[str, Callable[[Mapping[str, object], Mapping[str, object]], None]] = {
    "read_file": _read_file_agrees,
    "list_files": _list_files_agrees,
    "search_text": _search_text_agrees,
    "write_file": _write_file_agrees,
    "preview_edit": _edit_agrees,
    "edit_file": _edit_agrees,
    "execute_command": _execute_command_agrees,
}


def validate_result(request: Mapping[str, object], result: object) -> None:
    """Refuse a worker's success result that breaks §2.2 for this request (RESULT_INVALID).

    `request` is what validate_request returned; passing anything else is a programming
    error and raises TypeError or KeyError instead.
    """
    operation = _get(request, "operation", str)
    try:
        checked = _check_object("", result, _RESULT_FIELDS[operation])
        for key in ("operation", "workspaceId"):
            if checked[key] != request[key]:
                raise _Invalid(f"{key} differs from the request")
        if "path" in checked and checked["path"] != request["path"]:
            raise _Invalid("path differs from the request")
        _RESULT_AGREES[operation](request, checked)
    except _Invalid as exc:
        raise ProtocolError(RESULT_INVALID, f"worker result: {exc}") from None
