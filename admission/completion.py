"""Completion rows: one per POST to the execute endpoint, admitted or not (contract §5).

The response path never waits for Postgres: a finished call appends its row to a Redis
stream (one XADD) and logs the structured line; the drainer process (`manage.py
drain_completions`, one or more per deployment) moves rows from the stream into Postgres in
batches, acknowledging them only once they are committed. If Postgres is down, rows wait in
the stream and land when it is back; a row is written at most once (its uid is unique). If
Redis itself refuses the XADD, the row is written to Postgres directly instead.

The same round trip bumps the `/metrics` counters and histograms (one Redis hash shared by
every API process, so any process can expose totals for all of them): see `metrics_record`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, overload

from django.conf import settings
from django.db import DatabaseError, DataError, IntegrityError, close_old_connections, transaction
from redis.exceptions import RedisError

from admission.backlog import pace_record
from admission.dbthread import in_db_thread
from admission.models import CompletionLog
from admission.queue import row_cleanup
from admission.refusals import Refusal
from workspaces import outages

log = logging.getLogger("sluice.completion")

GROUP = "drain"
# Bounds the stream if Postgres stays down for a very long time (then the oldest rows go).
STREAM_MAX_ROWS = 2_000_000
# A row another API process read but never acknowledged (it died) is taken over after this.
CLAIM_IDLE_MS = 30_000


def stream_key() -> str:
    return f"{settings.REDIS_KEY_PREFIX}log:completions"


@dataclass
class CompletionDraft:
    """Filled in as a call progresses; emitted once when it ends, however it ends."""

    uid: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.time)
    started_monotonic: float = field(default_factory=time.monotonic)
    request_id: str = ""
    tenant_hash: str = ""
    principal_hash: str = ""
    worker_id: str = ""
    workspace_id: str = ""
    worktree: str = ""
    isolation_key_hash: str = ""
    operation: str = ""
    http_status: int = 0
    code: str = ""
    outcome: str = "completed"
    admission_outcome: str = "rejected_before_queue"
    queue_wait_ms: int = 0
    slot_index: int | None = None
    exec_ms: int | None = None
    duration_ms: int = 0
    deadline_budget_ms: int = 0
    fencing_ticket: int | None = None
    # The flow whose turn it took in its worker's queue, and whether its grant passed a call
    # that entered before it (admission/lua/_common.lua, the fair order).
    flow_hash: str = ""
    granted_out_of_order: bool = False
    # An operator cancelled it while it waited (its outcome is "cancelled" either way).
    operator_cancelled: bool = False
    # (worker id, entry id) when a synchronous call's draft was saved in Redis as it entered
    # its queue (admission/durable.py sweeps it if this process dies): the row's write ends it.
    saved_as: tuple[str, str] | None = None
    # The worker was found in the caller's tenant: /metrics may label the call with it even
    # when it was refused before its queue (a rate limit). Not a column.
    worker_confirmed: bool = False

    # The facts a call reports as it goes. These methods are the only writers of a draft's
    # fields: what the row says of admission and outcome follows from the facts here alone.

    def describe(self, **given: str | int) -> None:
        """What the request and its caller say of the call: who, what, where, its budgets."""
        unknown = set(given) - _GIVEN_FIELDS
        if unknown:
            raise TypeError(f"not a described field: {sorted(unknown)}")
        for name, value in given.items():
            setattr(self, name, value)

    def worker_found(self) -> None:
        """Its worker is the caller tenant's own (not merely the id the request claimed)."""
        self.worker_confirmed = True

    def entered(self, ticket: int) -> None:
        """In its worker's queue, with this fencing ticket."""
        self.fencing_ticket = ticket

    def saved(self, at: tuple[str, str] | None) -> None:
        """Saved in Redis (worker id, entry id) as it enters its queue (a synchronous call's),
        to be swept if this process dies; writing the row here ends the saved one. None: the
        queue refused it, and nothing was saved."""
        self.saved_as = at

    def admitted(self, slot: int, *, waited_ms: int, out_of_order: bool = False) -> None:
        self.slot_index, self.queue_wait_ms = slot, waited_ms
        self.granted_out_of_order = out_of_order
        self.admission_outcome = "admitted"

    def ran(self, exec_ms: int) -> None:
        """From its grant until its result (or until this process stopped waiting for one)."""
        self.exec_ms = exec_ms

    def went_away(self) -> None:
        """Its client disconnected. One that waited in the queue was taken out of it."""
        self.outcome = "disconnected"
        if self.fencing_ticket is not None and self.slot_index is None:
            self.admission_outcome = "cancelled"

    def refused(self, refusal: Refusal) -> None:
        """It will be answered with this refusal, which may decide what the row says of
        admission (queue full, timed out, cancelled, rate limited, ...)."""
        if refusal.admission_outcome is not None:
            self.admission_outcome = refusal.admission_outcome
        if refusal.code == "REQUEST_CANCELLED":
            self.outcome = "cancelled"
            self.operator_cancelled = refusal.by_operator

    def answered(
        self,
        status: int,
        refusal: Refusal | None = None,
        *,
        code: str = "",
        duration_ms: int | None = None,
    ) -> None:
        """The answer the call got: its result (no refusal) or a refusal."""
        self.http_status = status
        self.code = code if refusal is None else refusal.code
        if refusal is not None:
            self.refused(refusal)
        if duration_ms is None:
            duration_ms = int((time.monotonic() - self.started_monotonic) * 1000)
        self.duration_ms = duration_ms

    def unanswered(self) -> None:
        """Its API process ended before it answered (the row is written from the draft it
        saved): whatever the call did, its answer reached nobody."""
        self.outcome = "disconnected"

    def went_away_answered(self) -> None:
        """The answer of a call whose client is gone: 499, which nobody reads."""
        self.went_away()
        self.answered(499, code="CLIENT_DISCONNECTED")

    @classmethod
    def restored(cls, saved: dict[str, Any]) -> CompletionDraft:
        """A draft saved as `row()` (a durable call's), to be completed by its status."""
        draft = cls(**{k: v for k, v in saved.items() if k in _ROW_FIELDS and k != "started"})
        draft.started = float(saved["started"])
        return draft

    def row(self) -> dict[str, Any]:
        # Every field is a plain value: a shallow read, not dataclasses.asdict, whose deep copy
        # is paid by every call's row (docs/benchmarks.md).
        data = {name: getattr(self, name) for name in _ROW_FIELDS}
        data["request_id"] = self.request_id or self.uid
        if self.fencing_ticket is not None and self.slot_index is None and not self.queue_wait_ms:
            # Entered the queue and never admitted (timed out, cancelled, disconnected, worker
            # gone): the call waited for its whole life, and that wait is what attribution needs.
            data["queue_wait_ms"] = self.duration_ms
        return data


# A row's fields: the draft's, less what means something to this process only (its monotonic
# start, where its draft was saved, whether its worker was confirmed).
_ROW_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(CompletionDraft)
    if f.name not in ("started_monotonic", "saved_as", "worker_confirmed")
)

# What `describe` may set: everything the request, its caller and its budgets say.
_GIVEN_FIELDS = frozenset(
    {
        "request_id",
        "tenant_hash",
        "principal_hash",
        "worker_id",
        "workspace_id",
        "worktree",
        "isolation_key_hash",
        "operation",
        "deadline_budget_ms",
        "flow_hash",
    }
)


def _model_row(data: dict[str, Any]) -> CompletionLog:
    values = dict(data)
    created = datetime.fromtimestamp(float(values.pop("started")), tz=UTC)
    return CompletionLog(created_at=created, **values)


# A row's one field in the stream: the row as JSON. One field, not one per column: redis-py
# packs every argument of a command in Python, and per-column rows made that packing a large
# part of what a burst's refusals cost (docs/benchmarks.md).
ROW_FIELD = "row"


def _encode(data: dict[str, Any]) -> dict[str, str]:
    return {ROW_FIELD: json.dumps(data, separators=(",", ":"))}


_INT_FIELDS = {
    "http_status",
    "queue_wait_ms",
    "slot_index",
    "exec_ms",
    "duration_ms",
    "deadline_budget_ms",
    "fencing_ticket",
}


def _decode(fields: dict[str, str]) -> dict[str, Any]:
    """A stream entry's row: one JSON field, or (written by an API process of an earlier
    release, still in the stream after an upgrade) one string field per column, where "" is
    None. Raises ValueError, TypeError or KeyError for anything else."""
    if ROW_FIELD in fields:
        data = json.loads(fields[ROW_FIELD])
        if not isinstance(data, dict):
            raise TypeError("a completion row is a JSON object")
        return data
    return {
        key: (int(value) if value != "" else None) if key in _INT_FIELDS else value
        for key, value in fields.items()
    }


# ---------------------------------------------------------------------------------------
# Metrics: one Redis hash, field -> integer. Fields (W = worker label, "" when unconfirmed):
#   a|W                admitted calls          r|W|<reason>   refusals (never ran)
#   c|W|<code>         every POST by code ("OK" for a 200)
#   qw|W|<i>, qw|W|sum_ms, qw|W|n   queue-wait histogram (bucket i is NOT cumulative)
#   ex|W|<i>, ex|W|sum_ms, ex|W|n   execution histogram
# No isolation keys or principals ever appear in a field.

# Histogram upper bounds in seconds, up to the 300 s ceilings of waiting and of commands.
METRIC_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
_REASONS = {
    "WORKER_QUEUE_FULL": "queue_full",
    "WORKSPACE_QUEUE_TIMEOUT": "queue_timeout",
    "RATE_LIMITED": "rate_limited",
    "REQUEST_CANCELLED": "cancelled",
    "CLIENT_DISCONNECTED": "disconnected",
    "WORKSPACE_QUARANTINED": "quarantined",
}
# Admission outcomes and codes that are only reached once the worker was found in the caller's
# tenant. Anything earlier carries a worker id the caller merely claimed, and labelling by it
# would let any caller grow the metrics without bound.
_CONFIRMED_OUTCOMES = {"admitted", "queue_full", "queue_timeout", "cancelled"}
_CONFIRMED_CODES = {"WORKER_MISMATCH", "WORKSPACE_QUARANTINED", "WORKER_OFFLINE"}


def metrics_key() -> str:
    return f"{settings.REDIS_KEY_PREFIX}metrics:calls"


def metrics_worker_label(data: dict[str, Any], *, worker_confirmed: bool = False) -> str:
    confirmed = (
        worker_confirmed
        or data["admission_outcome"] in _CONFIRMED_OUTCOMES
        or data["code"] in _CONFIRMED_CODES
    )
    return str(data["worker_id"]) if confirmed and data["tenant_hash"] else ""


def rejection_reason(data: dict[str, Any]) -> str | None:
    """Why a call was refused without running, or None when it was dispatched or succeeded."""
    if data["http_status"] == 200 or data["exec_ms"] is not None:
        return None
    code = str(data["code"]) or "unknown"
    return _REASONS.get(code, code.lower())


def metric_bucket(value_ms: int) -> int:
    """Index of the first bucket holding value_ms; len(METRIC_BUCKETS_S) is +Inf."""
    seconds = value_ms / 1000
    return next(
        (i for i, le in enumerate(METRIC_BUCKETS_S) if seconds <= le), len(METRIC_BUCKETS_S)
    )


def metrics_record(pipe: Any, data: dict[str, Any], *, worker_confirmed: bool = False) -> None:
    """Queue the counter and histogram updates for one finished call on `pipe` (no round trip)."""
    key = metrics_key()
    worker = metrics_worker_label(data, worker_confirmed=worker_confirmed)
    pipe.hincrby(key, f"c|{worker}|{data['code'] or 'OK'}", 1)
    if data["slot_index"] is not None:
        pipe.hincrby(key, f"a|{worker}", 1)
    reason = rejection_reason(data)
    if reason is not None:
        pipe.hincrby(key, f"r|{worker}|{reason}", 1)
    if data["fencing_ticket"] is not None:
        _observe(pipe, key, f"qw|{worker}", int(data["queue_wait_ms"] or 0))
    if data["exec_ms"] is not None:
        _observe(pipe, key, f"ex|{worker}", int(data["exec_ms"]))


def _observe(pipe: Any, key: str, name: str, value_ms: int) -> None:
    pipe.hincrby(key, f"{name}|{metric_bucket(value_ms)}", 1)
    pipe.hincrby(key, f"{name}|sum_ms", value_ms)
    pipe.hincrby(key, f"{name}|n", 1)


class _Counts:
    """Metric increments summed in this process, to go to the hash as one HINCRBY each. Used
    for a batch's own rows, and as `_unrecorded` for the counters of rows that went to Postgres
    because Redis was away: those ride along with the next batch that reaches Redis, so every
    call is counted once in /metrics even through an overload's Redis timeouts."""

    def __init__(self) -> None:
        self.fields: dict[str, int] = {}

    def hincrby(self, _key: str, name: str, amount: int) -> None:
        self.fields[name] = self.fields.get(name, 0) + amount

    def take(self) -> dict[str, int]:
        taken, self.fields = self.fields, {}
        return taken

    def give_back(self, fields: dict[str, int]) -> None:
        for name, amount in fields.items():
            self.hincrby("", name, amount)


_unrecorded = _Counts()


# Rows emitted and not sent yet gather for ROW_GATHER_S, then go in one round trip: in a burst
# the pipeline and the connection's turn are paid once per batch, not once per row.
ROW_GATHER_S = 0.005
_batch: list[CompletionDraft] = []
_background: set[asyncio.Task[Any]] = set()


@overload
def emit_row(draft: CompletionDraft, client: Any | None = None) -> None: ...


@overload
def emit_row(draft: CompletionDraft, client: Any, *, wait: Literal[True]) -> Awaitable[None]: ...


def emit_row(
    draft: CompletionDraft, client: Any | None = None, *, wait: bool = False
) -> Awaitable[None] | None:
    """The one way a call's completion row leaves this process: to the Redis stream (the
    drainer lands it in Postgres) with its metrics, or straight to Postgres when the stream is
    away. `client`: the Redis client to write with (default: this process's admission client).

    By default the row goes in the background, with the rows of the next ROW_GATHER_S. With
    `wait=True` it returns an awaitable that writes this row alone, for a writer whose next
    step must come after the row has left (admission/durable.py marks a row done only then)."""
    if wait:
        return completion_emit_many([draft], _client(client))
    _batch.append(draft)
    if len(_batch) == 1:
        asyncio.get_running_loop().call_later(ROW_GATHER_S, _flush, client)
    return None


async def emitted_rows_flush(timeout_s: float = 5.0) -> None:
    """Write the rows gathered and not sent yet, and wait for them (a process about to stop)."""
    _flush(None)
    if _background:
        await asyncio.wait(set(_background), timeout=timeout_s)


def _client(client: Any | None) -> Any:
    if client is not None:
        return client
    from admission.connections import async_queue

    return async_queue().client


def _flush(client: Any | None) -> None:
    if not _batch:
        return
    drafts = list(_batch)
    _batch.clear()
    # The task is kept referenced until it is done.
    task = asyncio.get_running_loop().create_task(completion_emit_many(drafts, _client(client)))
    _background.add(task)
    task.add_done_callback(_background.discard)


async def completion_emit_many(drafts: list[CompletionDraft], client: Any) -> None:
    """The writer behind `emit_row`: calls' rows, with their metrics, in one round trip to the
    stream (a burst's rows go together); if the stream is away, straight to Postgres."""
    rows = [draft.row() for draft in drafts]
    # The batch's counters summed here, carried ones included: one HINCRBY per counter, not
    # three to five per row (a burst's refusals share theirs).
    counts = _Counts()
    counts.give_back(_unrecorded.take())
    for draft, data in zip(drafts, rows, strict=True):
        log.info(
            "Workspace tool request completed",
            extra={k: v for k, v in data.items() if k != "started"},
        )
        metrics_record(counts, data, worker_confirmed=draft.worker_confirmed)
    try:
        # Not a transaction: if the metrics part failed after the XADDs, the fallback below
        # writes the rows once more, and their unique uids keep that from making second rows.
        pipe = client.pipeline(transaction=False)
        for data in rows:
            pipe.xadd(stream_key(), _encode(data), maxlen=STREAM_MAX_ROWS, approximate=True)
            pace_record(pipe, data, prefix=settings.REDIS_KEY_PREFIX)
        for draft in drafts:
            if draft.saved_as is not None:
                # After its row, in the same round trip: a draft left behind (this batch went
                # to Postgres instead) is swept later under the same uid, kept once.
                worker_id, entry_id = draft.saved_as
                row_cleanup(pipe, prefix=settings.REDIS_KEY_PREFIX, worker_id=worker_id,
                            entry_id=entry_id)  # fmt: skip
        key = metrics_key()
        for name, amount in counts.fields.items():
            pipe.hincrby(key, name, amount)
        await pipe.execute()
    except Exception as exc:
        _unrecorded.give_back(counts.fields)
        outages.warn(
            log,
            "completion stream unavailable; writing the rows to Postgres directly",
            exc,
            rows=len(rows),
        )
        await in_db_thread(completion_write, rows=rows)


def completion_write(rows: list[dict[str, Any]]) -> None:
    CompletionLog.objects.bulk_create([_model_row(r) for r in rows], ignore_conflicts=True)


def _land(entries: list[tuple[str, dict[str, str]]]) -> list[CompletionLog]:
    """Write a batch from the stream. A malformed entry (anyone with broker access can XADD)
    is logged and dropped instead of blocking the stream for every drainer; an unavailable
    Postgres raises, and the batch stays pending."""
    rows: list[CompletionLog] = []
    for stream_id, fields in entries:
        try:
            rows.append(_model_row(_decode(fields)))
        except (ValueError, TypeError, KeyError):
            log.warning("malformed completion row dropped", extra={"stream_id": stream_id})
    try:
        CompletionLog.objects.bulk_create(rows, ignore_conflicts=True)
    except (DataError, IntegrityError):
        for row in rows:
            try:
                with transaction.atomic():
                    CompletionLog.objects.bulk_create([row], ignore_conflicts=True)
            except (DataError, IntegrityError):
                log.warning("completion row refused by Postgres dropped", extra={"uid": row.uid})
    return rows


class CompletionDrainer(threading.Thread):
    """Moves rows from the stream to Postgres. Any number may run, in processes of their own
    (`drain_completions` runs one in the foreground) or as a thread.

    It lands rows in batches: once a row arrives it keeps reading rows as they come for up to
    `linger_s`, then writes them all in one INSERT. Rows it has read are out of Redis's hands
    (a Redis that restarts empty does not lose them), and unacknowledged until they are in
    Postgres (a drainer that dies leaves them pending, for another to take over). It looks for
    pending rows (its own after a failure, those of a drainer that died) only every
    `recheck_s`.
    """

    def __init__(
        self,
        client: Any,
        *,
        batch: int = 500,
        block_ms: int = 1000,
        linger_s: float = 0.25,
        recheck_s: float = 5.0,
        on_landed: Callable[[list[CompletionLog]], None] | None = None,
    ) -> None:
        super().__init__(name="completion-drainer", daemon=True)
        self.client = client
        self.batch = batch
        self.block_ms = block_ms
        self.linger_s = linger_s
        self.recheck_s = recheck_s
        # Told each batch once it is committed (the dashboard's rollup marks its buckets).
        self.on_landed = on_landed
        self.consumer = f"{socket.gethostname()}:{os.getpid()}"
        self.stopping = threading.Event()
        self._recheck_at = 0.0  # now: the first pass looks for pending rows

    def ensure_group(self) -> None:
        try:
            self.client.xgroup_create(stream_key(), GROUP, id="0", mkstream=True)
        except Exception as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _pending(self, key: str) -> list[Any]:
        """Rows delivered before and not acknowledged: this drainer's own first (a batch that
        failed to land), then those idle past CLAIM_IDLE_MS of drainers that died."""
        messages = self.client.xreadgroup(GROUP, self.consumer, {key: "0"}, count=self.batch)
        pending = messages[0][1] if messages else []
        if not pending:
            claimed = self.client.xautoclaim(
                key, GROUP, self.consumer, CLAIM_IDLE_MS, "0-0", count=self.batch
            )
            pending = claimed[1] if claimed else []
        return list(pending)

    def _new(self, key: str, *, count: int, block_ms: int) -> list[Any]:
        messages = self.client.xreadgroup(
            GROUP, self.consumer, {key: ">"}, count=count, block=block_ms
        )
        return list(messages[0][1]) if messages else []

    def _gather(self, key: str) -> list[Any]:
        """New rows: wait for one, then take what else arrives within linger_s."""
        rows = self._new(key, count=self.batch, block_ms=self.block_ms)
        until = time.monotonic() + self.linger_s
        while rows and len(rows) < self.batch and not self.stopping.is_set():
            left_ms = int((until - time.monotonic()) * 1000)
            if left_ms <= 0:  # (a block of 0 would wait for ever)
                break
            try:
                more = self._new(key, count=self.batch - len(rows), block_ms=left_ms)
            except RedisError:
                break  # land what was read; the next pass meets the error again
            if not more:
                break
            rows.extend(more)
        return rows

    def drain_once(self) -> int:
        """Land one batch (pending rows when it is time to look for them, else new ones)."""
        key = stream_key()
        pending: list[Any] = []
        if time.monotonic() >= self._recheck_at:
            pending = self._pending(key)
            if not pending:
                self._recheck_at = time.monotonic() + self.recheck_s
        if not pending:
            pending = self._gather(key)
        entries = [(mid, fields) for mid, fields in pending if fields]
        if entries:
            # If landing fails, the batch stays pending for this consumer; run() then makes
            # the next pass look for pending rows first.
            close_old_connections()
            landed = _land(entries)
            if self.on_landed is not None:
                self.on_landed(landed)
            self._recheck_at = time.monotonic() + self.recheck_s
        ids = [mid for mid, _ in pending]
        if ids:
            pipe = self.client.pipeline(transaction=False)
            pipe.xack(key, GROUP, *ids)
            pipe.xdel(key, *ids)
            pipe.execute()
        return len(entries)

    def run(self) -> None:
        delay = 0.5
        grouped = False
        while not self.stopping.is_set():
            try:
                if not grouped:
                    self.ensure_group()
                    grouped = True
                self.drain_once()
                delay = 0.5
            except (DatabaseError, Exception) as exc:
                # Postgres or Redis is away: the rows stay in the stream, unacknowledged.
                outages.warn(log, "completion drainer waiting for Postgres/Redis", exc)
                # Redis may have come back empty: make the group again before reading.
                grouped = False
                self._recheck_at = 0.0
                self.stopping.wait(delay)
                delay = min(delay * 2, 10.0)

    def stop(self) -> None:
        self.stopping.set()
