"""Who made a call time out: from the completion log alone.

A call that timed out (`queue_timeout`) waited over [arrival, arrival + queue_wait_ms]. The
calls that *held* slots meanwhile are the admitted calls of the same worker whose
[admission, end] overlaps that wait, where admission = arrival + queue_wait_ms and end =
admission + exec_ms. Among them, a holder on the same isolation key is what kept the call
out: calls of one key run one at a time, in arrival order (contract §2.4). Without one, the
call waited for a free slot, and every holder shares the blame.

The dashboard's "recent timeouts" table and `manage.py contention_report` both come from here.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from dashboard.window import TABLE, Window, call_lifetime_ms, fetch_rows

# A busy worker can have dozens of calls overlapping one long wait; a table row lists this many.
HOLDERS_SHOWN = 5


@dataclass(frozen=True)
class Holder:
    request_id: str
    workspace_id: str
    worktree: str
    key_hash: str
    operation: str
    slot_index: int
    admitted_at: datetime
    ended_at: datetime
    http_status: int
    code: str
    same_key: bool

    @property
    def held_ms(self) -> int:
        return int((self.ended_at - self.admitted_at).total_seconds() * 1000)


@dataclass
class Timeout:
    request_id: str
    arrived_at: datetime
    worker_id: str
    workspace_id: str
    worktree: str
    key_hash: str
    operation: str
    queue_wait_ms: int
    holders: list[Holder] = field(default_factory=list)

    @property
    def blamed(self) -> list[Holder]:
        """The holders that kept this call out (see the module docstring)."""
        same = [h for h in self.holders if h.same_key]
        return same or self.holders

    @property
    def holders_shown(self) -> list[Holder]:
        """What a table row lists: the blamed holders first, then a few others for context."""
        same = [h for h in self.holders if h.same_key]
        others = [h for h in self.holders if not h.same_key]
        return same + others[: max(0, HOLDERS_SHOWN - len(same))]

    @property
    def holders_hidden(self) -> int:
        return len(self.holders) - len(self.holders_shown)

    @property
    def verdict(self) -> str:
        same = [h for h in self.holders if h.same_key]
        if same:
            first = same[0]
            return (
                f"its isolation key was held by {first.request_id} "
                f"({first.operation} on {first.workspace_id}, slot {first.slot_index})"
            )
        if self.holders:
            slots = len({h.slot_index for h in self.holders})
            return f"no call on its key held a slot; {slots} slot(s) were busy with other keys"
        return "no holder found in the log (rows still buffered, or pruned)"


_TIMEOUTS_SQL = f"""
    SELECT id, request_id, created_at, worker_id, workspace_id, worktree, isolation_key_hash,
           operation, queue_wait_ms
    FROM {TABLE}
    WHERE admission_outcome = 'queue_timeout'
      AND created_at >= %(since)s AND created_at < %(until)s {{worker_sql}}
    ORDER BY created_at DESC
    LIMIT %(limit)s
"""
# The holders of those timeouts, one row each: a separate statement so a timeout's own columns
# are not sent again with each of its (often dozens of) holders.
_HOLDERS_SQL = f"""
    WITH t AS (
        SELECT id, worker_id, created_at,
               created_at + queue_wait_ms * INTERVAL '1 millisecond' AS gave_up_at
        FROM {TABLE} WHERE id = ANY(%(ids)s)
    )
    -- Which calls held a slot while each one waited: from completion_holders alone (an
    -- index-only scan over one call lifetime of the worker's calls) ...
    , m AS (
        SELECT t.id AS tid, h.id AS hid
        FROM t JOIN LATERAL (
            SELECT h.id FROM {TABLE} h
            WHERE h.worker_id = t.worker_id
              AND h.created_at >= t.created_at - %(lookback)s AND h.created_at < t.gave_up_at
              AND h.slot_index IS NOT NULL AND h.id <> t.id
              AND h.created_at + h.queue_wait_ms * INTERVAL '1 millisecond' < t.gave_up_at
              AND h.created_at + (h.queue_wait_ms + coalesce(h.exec_ms, 0))
                  * INTERVAL '1 millisecond' > t.created_at
            -- A fence: without it the planner merges every timeout with all of the worker's
            -- calls (measured: 18 s) instead of one index range per timeout.
            OFFSET 0
        ) h ON true
    )
    -- ... and only those are read from the table.
    -- Times as epoch microseconds: thousands of timestamptz values cost more to load in
    -- Python (Django's time-zone-aware loader) than the query takes to run.
    SELECT m.tid, h.request_id, h.workspace_id, h.worktree, h.isolation_key_hash, h.operation,
           h.slot_index, h.http_status, h.code,
           (extract(epoch FROM h.created_at) * 1000000)::bigint AS arrived_us,
           h.queue_wait_ms, coalesce(h.exec_ms, 0)
    FROM m JOIN {TABLE} h ON h.id = m.hid
    ORDER BY m.tid, h.slot_index, h.created_at + h.queue_wait_ms * INTERVAL '1 millisecond'
"""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def recent_timeouts(window: Window, *, limit: int = 20) -> list[Timeout]:
    """The newest `limit` timeouts in the window, each with the calls that held slots meanwhile."""
    params = window.params() | {"limit": limit}
    found = fetch_rows(_TIMEOUTS_SQL.format(worker_sql=window.worker_sql), params)
    timeouts = {row[0]: Timeout(*row[1:9]) for row in found}
    if not timeouts:
        return []
    holders = fetch_rows(
        _HOLDERS_SQL,
        {"ids": list(timeouts), "lookback": timedelta(milliseconds=call_lifetime_ms())},
    )
    for tid, rid, ws, lane, key, op, slot, status, code, arrived_us, wait_ms, exec_ms in holders:
        t = timeouts[tid]
        admitted = _EPOCH + timedelta(microseconds=arrived_us + wait_ms * 1000)
        t.holders.append(
            Holder(
                rid,
                ws,
                lane,
                key,
                op,
                slot,
                admitted,
                admitted + timedelta(milliseconds=exec_ms),
                status,
                code,
                same_key=bool(key) and key == t.key_hash,
            )
        )
    return list(timeouts.values())


@dataclass(frozen=True)
class Blocker:
    """One call that held a slot while others timed out, and how many it kept out."""

    holder: Holder
    worker_id: str
    timeouts: int


def blockers(timeouts: list[Timeout]) -> list[Blocker]:
    """The blamed holders across timeouts, most timeouts first."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    holders: dict[tuple[str, str], Holder] = {}
    for t in timeouts:
        for h in t.blamed:
            counts[(t.worker_id, h.request_id)] += 1
            holders[(t.worker_id, h.request_id)] = h
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [Blocker(holder=holders[k], worker_id=k[0], timeouts=n) for k, n in ranked]


def blamed_workspaces(timeouts: list[Timeout]) -> list[dict[str, Any]]:
    """Timeouts per (worker, workspace) of the calls that kept them out."""
    counts: dict[tuple[str, str], set[str]] = defaultdict(set)
    for t in timeouts:
        for h in t.blamed:
            counts[(t.worker_id, h.workspace_id)].add(t.request_id)
    return [
        {"worker_id": w, "workspace_id": ws, "timeouts": len(ids)}
        for (w, ws), ids in sorted(counts.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    ]


def timeout_json(t: Timeout) -> dict[str, Any]:
    return {
        "request_id": t.request_id,
        "arrived_at": t.arrived_at.isoformat(),
        "worker_id": t.worker_id,
        "workspace_id": t.workspace_id,
        "worktree": t.worktree,
        "isolation_key_hash": t.key_hash,
        "operation": t.operation,
        "queue_wait_ms": t.queue_wait_ms,
        "verdict": t.verdict,
        "holders": [holder_json(h) | {"blamed": h in t.blamed} for h in t.holders],
    }


def holder_json(h: Holder) -> dict[str, Any]:
    return {
        "request_id": h.request_id,
        "workspace_id": h.workspace_id,
        "worktree": h.worktree,
        "isolation_key_hash": h.key_hash,
        "operation": h.operation,
        "slot_index": h.slot_index,
        "admitted_at": h.admitted_at.isoformat(),
        "ended_at": h.ended_at.isoformat(),
        "held_ms": h.held_ms,
        "http_status": h.http_status,
        "code": h.code,
        "same_key": h.same_key,
    }
