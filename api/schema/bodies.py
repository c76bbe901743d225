"""Request and result bodies per operation (contract §2.2), from the protocol's field tables.

Field names, which are required and their defaults come from `sluice_protocol`; bounds
from its constants. Only each field's JSON type and bounds are written here, once.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import sluice_protocol as p

from api.schema.patterns import PATTERNS

Schema = dict[str, Any]


def string(pattern: str | None = None, **bounds: Any) -> Schema:
    schema: Schema = {"type": "string", **bounds}
    if pattern is not None:
        schema["pattern"] = PATTERNS[pattern]
    return schema


def _utf8(max_bytes: int, **extra: Any) -> Schema:
    # JSON Schema counts characters; the protocol counts UTF-8 bytes, which is never fewer.
    return {
        "type": "string",
        "maxLength": max_bytes,
        "x-maxUtf8Bytes": max_bytes,
        "description": f"At most {max_bytes} bytes in UTF-8; no lone surrogates.",
        **extra,
    }


def integer(minimum: int | None = None, maximum: int | None = None) -> Schema:
    # JSON Schema counts 5.0 as an integer; the protocol does not (it would hand a float on).
    schema: Schema = {"type": "integer", "description": INTEGER_LITERAL}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


INTEGER_LITERAL = "An integer literal: 5.0 or 5e0 is refused."
BOOLEAN: Schema = {"type": "boolean"}
_PATH = string(
    "path",
    maxLength=p.MAX_PATH_CHARS,
    description="A safe relative path: no leading '/', no backslash or NUL, "
    "no '.', '..' or empty segment.",
)
_PATH_OR_ROOT = {**_PATH, "pattern": PATTERNS["pathOrRoot"], "description": '"" is the root.'}
_EDITS: Schema = {
    "type": "array",
    "minItems": 1,
    "maxItems": p.MAX_EDITS,
    "items": {
        "type": "object",
        "required": ["oldText", "newText"],
        "additionalProperties": False,
        "properties": {
            "oldText": _utf8(p.MAX_EDIT_TEXT_BYTES, minLength=1),
            "newText": _utf8(p.MAX_EDIT_TEXT_BYTES),
            "replaceAll": {
                **BOOLEAN,
                "description": "Replace every occurrence (else oldText must occur exactly once). "
                "Naming it at all, even false, asks for `matches` in the result.",
            },
        },
    },
}
_MATCHING: Schema = {
    "type": "string",
    "enum": sorted(p.EDIT_MATCHING),
    "description": "exact (the default) or tolerant: when the exact text is not found, try "
    + ", ".join(p.TOLERANT_STRATEGIES)
    + " in this order. Naming it asks for `matches` in the result.",
}
_MATCHES: Schema = {
    "type": "array",
    "minItems": 1,
    "maxItems": p.MAX_EDITS,
    "description": "One per edit, in request order; present exactly when the request set "
    "matching or any replaceAll.",
    "items": {
        "type": "object",
        "required": ["strategy", "occurrences"],
        "additionalProperties": False,
        "properties": {
            "strategy": {"type": "string", "enum": sorted(p.EDIT_MATCH_STRATEGIES)},
            "occurrences": integer(1),
        },
    },
}

_COMMON_REQUEST_SCHEMAS: dict[str, Schema] = {
    "protocolVersion": {
        "type": "integer",
        "const": p.PROTOCOL_VERSION,
        "description": INTEGER_LITERAL,
    },
    "operation": string(),  # narrowed to the operation's name per variant
    "workspaceId": string("workspaceId"),
    "workspaceInstanceId": string("sha256", description="A conversation worktree (64 hex)."),
    "worktree": string("worktree", description="A linked-worktree lane."),
}
_OPERATION_REQUEST_SCHEMAS: dict[str, dict[str, Schema]] = {
    "read_file": {
        "path": _PATH,
        "startLine": integer(1),
        "maxLines": integer(1, p.MAX_READ_LINES),
        "instructionSha256": string(
            "sha256",
            description="An instruction read: path AGENTS.md or CLAUDE.md, no startLine or "
            "maxLines, no worktree; the whole file (at most "
            f"{p.INSTRUCTION_MAX_BYTES} bytes) when its SHA-256 is this one.",
        ),
    },
    "list_files": {
        "path": _PATH_OR_ROOT,
        "maxResults": integer(1, p.MAX_LIST_RESULTS),
        "afterPath": _PATH,
    },
    "search_text": {
        "query": string("query", minLength=1, maxLength=p.MAX_QUERY_CHARS),
        "path": _PATH_OR_ROOT,
        "maxResults": integer(1, p.MAX_SEARCH_RESULTS),
    },
    "write_file": {
        "path": _PATH,
        "content": _utf8(p.MAX_WRITE_BYTES),
        "overwrite": BOOLEAN,
    },
    "preview_edit": {"path": _PATH, "edits": _EDITS, "matching": _MATCHING},
    "edit_file": {
        "path": _PATH,
        "edits": _EDITS,
        "matching": _MATCHING,
        "expectedBaseSha256": string("sha256"),
    },
    "execute_command": {
        "command": {
            **_utf8(p.MAX_COMMAND_BYTES, minLength=1, pattern=PATTERNS["command"]),
            "description": f"Not blank, no NUL, at most {p.MAX_COMMAND_BYTES} bytes in UTF-8.",
        },
        "cwd": _PATH_OR_ROOT,
        "timeoutMs": integer(1, p.MAX_COMMAND_TIMEOUT_MS),
        "maxOutputBytes": integer(1, p.MAX_OUTPUT_BYTES),
    },
}

_COMMON_RESULT_SCHEMAS: dict[str, Schema] = {
    "protocolVersion": {"type": "integer", "const": p.PROTOCOL_VERSION},
    "operation": string(),
    "workspaceId": string("workspaceId"),
}
_OPERATION_RESULT_SCHEMAS: dict[str, dict[str, Schema]] = {
    "read_file": {
        "path": _PATH,
        "content": string(maxLength=p.READ_MAX_BYTES),
        "startLine": integer(1),
        "endLine": integer(0),
        "truncated": BOOLEAN,
        "nextStartLine": integer(1),
    },
    "list_files": {
        "paths": {"type": "array", "maxItems": p.MAX_LIST_RESULTS, "items": _PATH},
        "truncated": BOOLEAN,
        "nextAfterPath": _PATH,
    },
    "search_text": {
        "matches": {
            "type": "array",
            "maxItems": p.MAX_SEARCH_RESULTS,
            "items": {
                "type": "object",
                "required": ["path", "line", "column", "text"],
                "additionalProperties": False,
                "properties": {
                    "path": _PATH,
                    "line": integer(1),
                    "column": integer(1),
                    "text": string(maxLength=p.MATCH_TEXT_MAX_CHARS),
                },
            },
        },
        "truncated": BOOLEAN,
    },
    "write_file": {
        "path": _PATH,
        "created": BOOLEAN,
        "bytesWritten": integer(0, p.MAX_WRITE_BYTES),
    },
    "preview_edit": {
        "path": _PATH,
        "content": string(),
        "hasUtf8Bom": BOOLEAN,
        "baseSha256": string("sha256"),
        "replacements": integer(1),
        "bytesWritten": integer(0),
        "matches": _MATCHES,
    },
    "edit_file": {
        "path": _PATH,
        "replacements": integer(1),
        "bytesWritten": integer(0),
        "matches": _MATCHES,
    },
    "execute_command": {
        "exitCode": {"type": ["integer", "null"]},
        "signal": string("signal"),
        "stdout": string(maxLength=p.MAX_OUTPUT_BYTES),
        "stderr": string(maxLength=p.MAX_OUTPUT_BYTES),
        "truncated": BOOLEAN,
        "timedOut": BOOLEAN,
    },
}


def title(operation: str, kind: str) -> str:
    return "".join(part.title() for part in operation.split("_")) + kind


def _object_from_fields(
    operation: str, fields: Mapping[str, Any], schemas: Mapping[str, Schema], kind: str
) -> Schema:
    """An exact object: the protocol's field table decides the keys, required ones, defaults."""
    if set(fields) != set(schemas):
        raise RuntimeError(
            f"api/schema/ and sluice_protocol disagree on the {operation} {kind} "
            f"fields: {sorted(set(fields) ^ set(schemas))}"
        )
    properties: dict[str, Schema] = {}
    required: list[str] = []
    for name, field in fields.items():
        schema = copy.deepcopy(schemas[name])
        if field.default is p._REQUIRED:
            required.append(name)
        elif field.default is not p._OPTIONAL:
            schema["default"] = field.default
        properties[name] = schema
    properties["operation"] = {"type": "string", "const": operation}
    return {
        "title": title(operation, kind),
        "type": "object",
        "required": required,
        "additionalProperties": False,
        "properties": properties,
    }


def request_schema(operation: str) -> Schema:
    fields = {**p._COMMON_REQUEST_FIELDS, **p._OPERATION_REQUEST_FIELDS[operation]}
    schemas = {**_COMMON_REQUEST_SCHEMAS, **_OPERATION_REQUEST_SCHEMAS[operation]}
    schema = _object_from_fields(operation, fields, schemas, "Request")
    if operation == "read_file":
        # §2.2.1: an instruction read is the whole AGENTS.md or CLAUDE.md of the checkout.
        schema["if"] = {"required": ["instructionSha256"]}
        schema["then"] = {
            "properties": {"path": {"enum": sorted(p.INSTRUCTION_FILES)}},
            "not": {"anyOf": [{"required": [k]} for k in ("startLine", "maxLines", "worktree")]},
        }
    return schema


def result_schema(operation: str) -> Schema:
    fields = {**p._COMMON_RESULT_FIELDS, **p._OPERATION_RESULT_FIELDS[operation]}
    schemas = {**_COMMON_RESULT_SCHEMAS, **_OPERATION_RESULT_SCHEMAS[operation]}
    return _object_from_fields(operation, fields, schemas, "Result")
