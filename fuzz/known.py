"""Bugs the fuzzer found that are reported but not fixed yet (the `make fuzz` allowlist).

A finding that one of these explains is reported as KNOWN and does not fail the run; anything
else does. Each bug also has a deterministic probe (fuzz/probes.py, `known_bug=`) and an
xfail(strict=True) test in tests/test_openapi_schema.py: once the bug is fixed the probe
passes, `make fuzz` fails with "XPASS" and the test fails too, until the entry is deleted here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

EXECUTE = "/v1/workspace-tools/execute"
WORKER_FIELDS = {"workerId", "workspaces", "slots", "incarnationId"}


@dataclass(frozen=True)
class KnownBug:
    id: str
    where: str
    summary: str
    matches: Callable[[str, str, int, bytes], bool]  # method, path, status, request body
    # Schemathesis checks whose failures it explains; empty: a failing response of any kind.
    checks: frozenset[str] = frozenset()
    # An ERROR record the API or worker logs because of it (JSON lines of config/logging.py).
    logs: Callable[[dict[str, Any]], bool] | None = None


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def nesting_depth(body: bytes) -> int:
    """The deepest [ / { nesting of a JSON text, counted outside strings."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            escaped = not escaped and byte == 0x5C
            in_string = escaped or byte != 0x22
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def too_long(path: object, root_bytes: int = 300) -> bool:
    """Whether no filesystem here can hold `path`: a segment over NAME_MAX (255 bytes), or the
    whole path, under a root of about `root_bytes`, over PATH_MAX (4096 bytes)."""
    if not isinstance(path, str):
        return False
    size = len(path.encode("utf-8", "surrogatepass"))
    segments = path.split("/")
    return root_bytes + 1 + size >= 4096 or any(
        len(s.encode("utf-8", "surrogatepass")) > 255 for s in segments
    )


# Every bug the fuzz run found has been fixed; a new one goes here with its probe.
KNOWN_BUGS: tuple[KnownBug, ...] = ()


def known_log(record: dict[str, Any]) -> KnownBug | None:
    """The known bug that explains an ERROR record a process logged, if any."""
    return next((bug for bug in KNOWN_BUGS if bug.logs is not None and bug.logs(record)), None)


def known_bug(
    method: str, path: str, status: int, body: bytes, *, check: str = ""
) -> KnownBug | None:
    """The known bug that explains a failing answer to this request, if any."""
    for bug in KNOWN_BUGS:
        if bug.checks and check not in bug.checks:
            continue
        if bug.matches(method, path, status, body):
            return bug
    return None


def by_id(bug_id: str) -> KnownBug:
    return next(bug for bug in KNOWN_BUGS if bug.id == bug_id)
