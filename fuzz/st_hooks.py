"""Schemathesis hooks for `make fuzz`, loaded with SCHEMATHESIS_HOOKS=fuzz.st_hooks.

Steer, never widen. Random worker ids, workspace ids and paths would almost all be refused
before reaching the worker (404, 409), so a valid value is often swapped for one that names the
real worker, workspace or a prepared file or link (fuzz/sandbox.py). Only values that are
already valid are swapped, and schemathesis re-judges a case after this hook edits it, so a
negative case stays negative.

Safety: every command the server would accept is replaced by a harmless one. Generated shell
text is never run, whatever the generator comes up with.
"""

from __future__ import annotations

import json
import os
import random
import re
import uuid
from typing import Any

import schemathesis
from sluice_protocol import (
    ProtocolError,
    is_safe_relative_path,
    validate_request,
    validate_worker_id,
)

from fuzz.known import known_bug
from fuzz.sandbox import LANE, TARGET_DIRS, TARGET_PATHS, WORKSPACE_ID

EXECUTE = "/v1/workspace-tools/execute"
REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{16,128}")
WORKER_ID = os.environ.get("FUZZ_WORKER_ID", "")
SPARE_WORKER_ID = os.environ.get("FUZZ_SPARE_WORKER_ID", "")
SECRETS = tuple(s for s in os.environ.get("FUZZ_SECRETS", "").split(",") if s)
KNOWN_LOG = os.environ.get("FUZZ_KNOWN_LOG", "")
SAFE_COMMANDS = (
    "true",
    "false",
    "echo fuzz",
    "pwd",
    "ls -a",
    "cat README.md",
    "printf '%s' ünï",
    "exit 7",
    "kill -KILL $$",
    "echo out; echo err >&2",
)
_rng = random.Random(int(os.environ.get("FUZZ_SEED", "1")))


def _runnable(command: object) -> bool:
    """Whether the server would accept `command` as an execute_command's command."""
    probe = {"protocolVersion": 1, "operation": "execute_command", "workspaceId": "w"}
    try:
        validate_request({**probe, "command": command})
    except ProtocolError:
        return False
    return True


def _valid_name(value: object) -> bool:
    try:
        validate_worker_id(value)
    except ProtocolError:
        return False
    return True


def _steer_body(body: dict[str, Any]) -> None:
    if _runnable(body.get("command")):
        body["command"] = _rng.choice(SAFE_COMMANDS)
    if isinstance(body.get("workspaceId"), str) and _rng.random() < 0.85:
        body["workspaceId"] = WORKSPACE_ID
    if _valid_name(body.get("worktree")):
        # The lane exists; any other name is not a linked worktree of the workspace.
        choice = _rng.random()
        if choice < 0.4:
            body["worktree"] = LANE
        elif choice < 0.8:
            del body["worktree"]
    for key, choices in (("path", TARGET_PATHS), ("afterPath", TARGET_PATHS), ("cwd", TARGET_DIRS)):
        if is_safe_relative_path(body.get(key), allow_empty=True) and _rng.random() < 0.5:
            body[key] = _rng.choice(choices)


def _steer_execute(case: Any) -> None:
    headers = case.headers if case.headers is not None else {}
    worker = headers.get("X-LibreChat-Code-Worker-ID")
    if _valid_name(worker) and _rng.random() < 0.8:
        headers["X-LibreChat-Code-Worker-ID"] = WORKER_ID
    request_id = headers.get("X-LibreChat-Workspace-Request-Id")
    if isinstance(request_id, str) and REQUEST_ID.fullmatch(request_id) and _rng.random() < 0.9:
        # An id names one call per principal; generated ids repeat ("0000000000000000").
        headers["X-LibreChat-Workspace-Request-Id"] = uuid.uuid4().hex
    if case.headers is not None:
        case.headers = headers
    body = case.body
    if isinstance(body, dict):
        _steer_body(body)
    elif isinstance(body, str | bytes):
        # A negative case may send the body as text; if it happens to parse as a request
        # that could run a command, it is made harmless the same way.
        try:
            parsed = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return
        if isinstance(parsed, dict) and _runnable(parsed.get("command")):
            parsed["command"] = "true"
            text = json.dumps(parsed)
            case.body = text.encode() if isinstance(body, bytes) else text


@schemathesis.hook
def before_call(ctx: Any, case: Any, kwargs: dict[str, Any]) -> None:
    if case.operation.path == EXECUTE:
        _steer_execute(case)
    elif (
        case.operation.path.startswith("/v1/workers/")
        and isinstance(case.body, dict)
        and _valid_name(case.body.get("workerId"))
        and _rng.random() < 0.7
    ):
        # The spare worker has no runworker behind it: registering it is harmless.
        case.body["workerId"] = SPARE_WORKER_ID


@schemathesis.check
def no_canary_leak(ctx: Any, response: Any, case: Any) -> bool | None:
    """A file outside the workspace must never be read: its secret may not come back."""
    text = response.content.decode("utf-8", errors="replace")
    for secret in SECRETS:
        if secret in text:
            raise AssertionError("The response carries the canary's content: a read escaped.")
    return None


def _body_bytes(body: Any) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8", errors="surrogatepass")
    try:
        return json.dumps(body).encode()
    except (TypeError, ValueError):
        return b""


@schemathesis.hook
def filter_failure(ctx: Any, failure: Any, case: Any, response: Any) -> bool:
    """Drop (and log for fuzz/run.py) a failure that a reported bug in fuzz/known.py explains."""
    for check in failure.checks or ("",):
        bug = known_bug(
            case.method.upper(),
            case.operation.path,
            response.status_code,
            _body_bytes(case.body),
            check=check,
        )
        if bug is not None:
            if KNOWN_LOG:
                with open(KNOWN_LOG, "a") as log:
                    log.write(json.dumps({"bug": bug.id, "failure": failure.title}) + "\n")
            return False
    return True
