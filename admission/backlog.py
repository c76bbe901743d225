"""Retry-After from the backlog: when a call refused for a busy queue is likely to find a place.

A `WORKSPACE_QUEUE_TIMEOUT` is told when the same call, sent again now, is likely to be granted;
a `WORKER_QUEUE_FULL` when the first call in the queue is likely to finish (a place frees then).
Both replay the queue's rules (at most `slots` calls at once, one per isolation key with reads
sharing, the grant's fair order across flows) on one read of the queue (`AsyncQueue.backlog`)
and the worker's pace: the mean execution time of its recent calls per operation, recorded as
each completed call's row is written (`pace_record`). It cannot know of calls that arrive
later or of a call that runs long, so it is a likely time, not a promise.

The answer is whole seconds within 1..30 (LibreChat's first client waits at most 30 s). With
nothing measured on the worker yet it is 2 s for a timeout and 1 s for a full queue.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError
from sluice_protocol import isolation_key

from admission.deadlines import QUEUE_TIMEOUT_RETRY_AFTER_S
from admission.queue import SHARED_OPERATIONS, AsyncQueue, QueueView, pace_sample
from workspaces import outages

log = logging.getLogger("sluice.admission")

MIN_RETRY_S = 1
MAX_RETRY_S = 30
# A full queue whose running calls are about to finish: come back at once (in a second).
QUEUE_FULL_RETRY_S = MIN_RETRY_S
# The mean over every operation, for one the worker has not run lately.
ANY_OPERATION = ""


@dataclass(frozen=True)
class Work:
    """One call as the estimate sees it. `ran_ms` is how long it has run (None: it waits);
    `left_ms` how long until its deadline (exec deadline running, queue deadline waiting):
    a waiting call whose deadline passes leaves without running."""

    operation: str
    base: str
    lane: str
    ran_ms: int | None = None
    left_ms: float = math.inf


def conflicts(a: Work, b: Work) -> bool:
    """The queue's rule (admission/lua/_common.lua): a lane conflicts with itself and with its
    checkout; different workspaces and sibling lanes do not; two reads never do."""
    if a.operation in SHARED_OPERATIONS and b.operation in SHARED_OPERATIONS:
        return False
    return a.base == b.base and (a.lane == "" or b.lane == "" or a.lane == b.lane)


def mean_exec_ms(samples: Iterable[tuple[str, int]]) -> dict[str, float]:
    """Mean execution time by operation, and over all of them (ANY_OPERATION); {} without
    samples."""
    sums: dict[str, list[int]] = {}
    for operation, ms in samples:
        for name in (operation, ANY_OPERATION):
            total = sums.setdefault(name, [0, 0])
            total[0] += ms
            total[1] += 1
    return {name: total / count for name, (total, count) in sums.items()}


def place_in_ms(
    ahead: Sequence[Work], *, slots: int, means: Mapping[str, float], call: Work | None
) -> float | None:
    """Milliseconds from now until `call` would be granted behind `ahead` (the calls before
    it, in arrival order); with `call` None, until the first call in the queue finishes.
    None when it cannot be told: nothing measured, no slot, or (call None) nothing runs."""
    if not means or slots < 1:
        return None

    def takes(work: Work) -> float:
        return means.get(work.operation, means[ANY_OPERATION])

    # (ends at, call) for each running call: what it usually takes, less what it has run,
    # and never past its deadline.
    running = [
        (max(0.0, min(takes(w) - w.ran_ms, w.left_ms)), w) for w in ahead if w.ran_ms is not None
    ]
    waiting = [w for w in ahead if w.ran_ms is None] + ([call] if call is not None else [])
    now = 0.0
    while True:
        waiting = [w for w in waiting if w is call or w.left_ms > now]
        passed: list[Work] = []
        for w in list(waiting):
            if len(running) >= slots:
                break
            if any(conflicts(w, r) for _, r in running) or any(conflicts(w, p) for p in passed):
                passed.append(w)
                continue
            if w is call:
                return now
            running.append((now + takes(w), w))
            waiting.remove(w)
        if not running:
            return None
        first = min(end for end, _ in running)
        if call is None:
            return first
        now = first
        running = [(end, w) for end, w in running if end > now]


def retry_after_s(place_ms: float | None, *, unknown_s: int) -> int:
    """Whole seconds within MIN_RETRY_S..MAX_RETRY_S, rounded up; `unknown_s` without an
    estimate."""
    if place_ms is None:
        return unknown_s
    return max(MIN_RETRY_S, min(MAX_RETRY_S, math.ceil(place_ms / 1000)))


def pace_record(pipe: Any, row: Mapping[str, Any], *, prefix: str) -> None:
    """Queue on `pipe` the execution time of a call that ran to its answer (its completion
    row), for its worker's pace. A call whose answer did not come (an expired assignment, a
    client gone) measured its wait, not the work, and is left out."""
    if row["exec_ms"] is None or row["slot_index"] is None or not row["worker_id"]:
        return
    if row["outcome"] != "completed" or row["code"] == "ASSIGNMENT_EXPIRED":
        return
    pace_sample(
        pipe,
        prefix=prefix,
        worker_id=str(row["worker_id"]),
        operation=str(row["operation"]),
        exec_ms=int(row["exec_ms"]),
    )


def _work(entry: Mapping[str, Any], now_ms: int) -> Work:
    running = entry.get("st") == "r"
    return Work(
        operation=str(entry.get("op", "")),
        base=str(entry.get("base", "")),
        lane=str(entry.get("lane", "")),
        ran_ms=max(0, now_ms - int(entry.get("ta", now_ms))) if running else None,
        left_ms=int(entry.get("dl", now_ms)) - now_ms,
    )


def in_queue(view: QueueView) -> list[Work]:
    """Every call in the view, in arrival order."""
    entries = sorted(view.entries, key=lambda e: int(e.get("seq", 0)))
    return [_work(e, view.now_ms) for e in entries]


def fair_tag(entries: Sequence[Mapping[str, Any]], flow: str) -> int:
    """The virtual start tag a call of `flow` entering now would get (lua/_common.lua
    fair_tag): the smallest tag still waiting (else the largest), or one past its own flow's
    newest when that is later."""
    waiting = [int(e.get("vt", 0)) for e in entries if e.get("st") == "w"]
    own = [int(e.get("vt", 0)) for e in entries if str(e.get("fl", "")) == flow]
    tag = min(waiting) if waiting else max((int(e.get("vt", 0)) for e in entries), default=0)
    return max(tag, max(own) + 1) if own else tag


def ahead_when_sent_again(view: QueueView, flow: str, *, itself: int | None) -> list[Work]:
    """The calls a call of `flow` sent again now would find ahead of it: every running one, and
    the waiting ones the grant's fair order (tag, then ticket) puts before its tag, in that
    order. `itself`: the refused call's own ticket, while its entry is still listed."""
    tag = fair_tag(view.entries, flow)
    others = [e for e in view.entries if itself is None or int(e.get("seq", 0)) != itself]
    running = [e for e in others if e.get("st") == "r"]
    waiting = sorted(
        (e for e in others if e.get("st") == "w" and int(e.get("vt", 0)) <= tag),
        key=lambda e: (int(e.get("vt", 0)), int(e.get("seq", 0))),
    )
    return [_work(e, view.now_ms) for e in running + waiting]


async def _view(
    queue: AsyncQueue, *, worker_id: str, slot_ceiling: int, now_ms: int | None
) -> QueueView | None:
    try:
        return await queue.backlog(worker_id=worker_id, slot_ceiling=slot_ceiling, now_ms=now_ms)
    except (RedisError, ValueError, TypeError, KeyError) as exc:
        # The refusal stands without its estimate: a Redis gone now is the next call's problem.
        outages.warn(log, "could not read the backlog for Retry-After", exc)
        return None


async def queue_timeout_retry_s(
    queue: AsyncQueue,
    *,
    worker_id: str,
    request: Mapping[str, Any],
    ticket: int | None,
    slot_ceiling: int,
    flow: str = "",
    now_ms: int | None = None,
) -> int:
    """Retry-After for a call that timed out in its queue: when the same call of `flow`, sent
    again now, is likely to be granted (`ticket`: its own entry, left out if still listed)."""
    view = await _view(queue, worker_id=worker_id, slot_ceiling=slot_ceiling, now_ms=now_ms)
    if view is None:
        return QUEUE_TIMEOUT_RETRY_AFTER_S
    base, lane = isolation_key(dict(request))
    call = Work(operation=str(request["operation"]), base=base, lane=lane)
    place = place_in_ms(
        ahead_when_sent_again(view, flow, itself=ticket),
        slots=view.slots,
        means=mean_exec_ms(view.samples),
        call=call,
    )
    return retry_after_s(place, unknown_s=QUEUE_TIMEOUT_RETRY_AFTER_S)


async def queue_full_retry_s(
    queue: AsyncQueue, *, worker_id: str, slot_ceiling: int, now_ms: int | None = None
) -> int:
    """Retry-After for a call its worker's full queue refused: until the first call in it is
    likely to finish."""
    view = await _view(queue, worker_id=worker_id, slot_ceiling=slot_ceiling, now_ms=now_ms)
    if view is None:
        return QUEUE_FULL_RETRY_S
    place = place_in_ms(
        in_queue(view), slots=view.slots, means=mean_exec_ms(view.samples), call=None
    )
    return retry_after_s(place, unknown_s=QUEUE_FULL_RETRY_S)
