"""Deadlines of contract §2.3, as pure functions.

    queue_budget   = min(header or 30000, WORKSPACE_QUEUE_CEILING_MS)
    cmd_timeout    = min(timeoutMs or 30000, JOB_TIMEOUT)            execute_command
    exec_budget    = cmd_timeout + 5000                              execute_command
                   = min(JOB_TIMEOUT, 30000)                         every other operation

The exec budget starts at admission, so waiting never eats execution time.

Time is a parameter: the execute service (admission/services.py) reads it only from a `Clock`,
`SYSTEM_CLOCK` unless a test passes its own, so a unit test owns every deadline it drives.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

from sluice_protocol import DEFAULT_COMMAND_TIMEOUT_MS

SETTLE_MS = 5_000
DEFAULT_EXEC_MS = 30_000
# Retry-After for WORKSPACE_QUEUE_TIMEOUT when the worker's pace is not known yet
# (admission/backlog.py estimates it from the backlog otherwise).
QUEUE_TIMEOUT_RETRY_AFTER_S = 2


def queue_budget_ms(*, header_ms: int, ceiling_ms: int) -> int:
    return min(header_ms, ceiling_ms)


def command_timeout_ms(*, request: Mapping[str, object], job_timeout_ms: int) -> int:
    timeout = request.get("timeoutMs")
    requested = timeout if isinstance(timeout, int) else DEFAULT_COMMAND_TIMEOUT_MS
    return min(requested, job_timeout_ms)


def exec_budget_ms(*, request: Mapping[str, object], job_timeout_ms: int) -> int:
    if request["operation"] == "execute_command":
        return command_timeout_ms(request=request, job_timeout_ms=job_timeout_ms) + SETTLE_MS
    return min(job_timeout_ms, DEFAULT_EXEC_MS)


def deadline_budget_ms(*, queue_ms: int, exec_ms: int) -> int:
    return queue_ms + exec_ms


class Clock(Protocol):
    """Where the execute service reads time. `now()` is wall-clock seconds (what a message's
    expiry is stamped with), `monotonic()` what deadlines in this process are measured by, and
    `scripts_ms()` the now the admission scripts decide by: None leaves them to Redis's own
    clock (one clock every API host and worker agrees on)."""

    def now(self) -> float: ...

    def monotonic(self) -> float: ...

    def scripts_ms(self) -> int | None: ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def scripts_ms(self) -> int | None:
        return None


SYSTEM_CLOCK: Clock = SystemClock()
