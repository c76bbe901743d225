"""The per-worker admission FIFO in Redis: the only module that talks to Redis for admission.

Every decision is one Lua script (admission/lua/), so it is one round trip and atomic across
any number of API processes and workers. Every key of one worker carries the hash tag
`{w:<worker id>}`, so the scripts run unchanged on Redis Cluster. Key layout (prefix P):

    P adm:{w:ID}:reg          HASH  incarnation, slots, slot ceiling, ticket counter  (TTL 30 s, heartbeats renew)
    P adm:{w:ID}:q            ZSET  entry id by ticket: the FIFO, running entries included
    P adm:{w:ID}:e            HASH  entry id -> JSON entry (state, key, deadline, slot ...)
    P adm:{w:ID}:stats        HASH  counters (queue_full, settle_discarded)           (TTL 7 d)
    P adm:{w:ID}:env          HASH  entry id -> its Celery envelope, until the grant pushes it
    P adm:{w:ID}:pace         LIST  recent execution times, "<operation> <ms>", newest first
                                    (admission/backlog.py: Retry-After)              (TTL 1 h)
    P adm:{w:ID}:drain        STRING  present while an operator drains the worker: no grants
                                    (who and when, JSON; no TTL: it outlives restarts)
    P adm:{w:ID}:wake:<entry> LIST  pushes to one waiting request: grant, result, offline ...
    P adm:{w:ID}:ds:<entry>   STRING  a durable call's status (JSON), or a synchronous one's
                                    while its row draft waits                (TTL >= 10 min)
    P adm:{w:ID}:row:<entry>  STRING  a call's completion row draft, then "done" (durable calls;
                                    a synchronous call's until its process wrote the row)
    P adm:{w:ID}:row:<entry>:req    STRING  a durable call's request (its result is checked against it)
    P adm:{w:ID}:row:<entry>:claim  STRING  who is writing that call's row now        (TTL 30 s)
    P adm:durable             ZSET  "<worker id> <entry id>" by submission: calls whose row is
                                    not written yet (admission/durable.py sweeps it; TTL 1 h)
    P adm:{w:ID}:wake:        shard channel: "<entry>" announced with each push (admission/waiters.py)
    P adm:{w:ID}:inst:<key>   STRING  the principal a conversation instance is bound to   (TTL 24 h)
    P adm:rid:{p:<principal>}:<request id>   STRING  "<worker id> <entry id>" or "done"
    P adm:revoked:<key id>    STRING  an API key revoked lately: grants refuse its waiting calls
    P celery:sluice.worker.ID LIST  the worker's Celery queue (kombu's key; see below)

The grant is the dispatch, and it has two owners, one per side of one decision. Whether the
scripts can reach the workers' Celery queue lists is decided once, by `dispatch_in_redis()`
(one plain Redis for admission and the broker, the default), which `_Scripts.dispatch_keys`
turns into the keys every granting script gets. If they can, `dispatch()` in
lua/_common.lua, run for each call any script grants, pushes the call's envelope, or hands
it to the worker that just settled (`settle_taking_next`). If they cannot (a Redis Cluster,
whose broker is a separate Redis), the grant's wake-up says so (dp = 0) and the waiting API
process pushes it (`_dispatch_if_scripts_could_not` in admission/services.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from sluice_protocol import MUTATING_OPERATIONS, OPERATIONS

from admission.scripts import register
from admission.waiters import SAFETY_LOOK_S, WakeReader, reader_for
from workspaces.dispatch import broker_queue_key, worker_queue_name

STATS_TTL_MS = 7 * 24 * 3600 * 1000
# Finished request ids answer DELETE with "finished" for this long.
REQUEST_ID_DONE_TTL_MS = 10 * 60 * 1000
# A conversation instance stays bound to its principal this long after its last call.
INSTANCE_TTL_MS = 24 * 3600 * 1000
# The placeholder registration of a revoke lives this long at most (it is deleted at once).
REVOKE_TTL_MS = 60_000
# A revoked key's marker outlives any call of it that could still be waiting: the longest
# admission wait (the queue ceiling is at most 300 s), plus a minute for calls that entered
# from a process whose caller cache (1 s) had not yet seen the revocation.
REVOKED_KEY_TTL_MS = 360_000
# The index of durable calls owing a row outlives every member's row draft (budgets are at
# most minutes, a draft lives its budgets plus DURABLE_KEEP_MS): it expires an hour after the
# last durable submission.
DURABLE_INDEX_TTL_MS = 3600 * 1000
# Operations that change nothing in a workspace (reads, instruction reads, edit previews): on
# one isolation key they run together, up to the slots (see conflicts in lua/_common.lua).
SHARED_OPERATIONS = OPERATIONS - MUTATING_OPERATIONS

# The pace list keeps this many execution times per worker, and forgets them after an idle
# hour (an estimate from a morning's load is no guide to the afternoon's).
PACE_SAMPLES = 64
PACE_TTL_MS = 3600 * 1000
# Separates the offer tokens a call needs / a workspace offers (never in a token itself).
OFFER_SEP = "\x1f"
ADMISSION_SCRIPTS = (
    "enter",
    "leave",
    "release",
    "settle",
    "register",
    "heartbeat",
    "deregister",
    "backlog",
    "resume",
)
# What a waiting call's wake list is told when an operator (not its own client) cancelled it.
OPERATOR = "operator"


@dataclass(frozen=True)
class WorkerKeys:
    reg: str
    queue: str
    entries: str
    stats: str
    wake_prefix: str
    instance_prefix: str
    env: str
    status_prefix: str
    row_prefix: str
    pace: str
    drain: str

    def wake(self, entry_id: str) -> str:
        return self.wake_prefix + entry_id

    def status(self, entry_id: str) -> str:
        return self.status_prefix + entry_id

    def row(self, entry_id: str) -> str:
        return self.row_prefix + entry_id


def worker_keys(prefix: str, worker_id: str) -> WorkerKeys:
    tag = f"{prefix}adm:{{w:{worker_id}}}"
    return WorkerKeys(
        reg=f"{tag}:reg",
        queue=f"{tag}:q",
        entries=f"{tag}:e",
        stats=f"{tag}:stats",
        wake_prefix=f"{tag}:wake:",
        instance_prefix=f"{tag}:inst:",
        env=f"{tag}:env",
        status_prefix=f"{tag}:ds:",
        row_prefix=f"{tag}:row:",
        pace=f"{tag}:pace",
        # The grant reads it as the key beside reg (_common.lua drained()): keep the two in step.
        drain=f"{tag}:drain",
    )


def dispatch_in_redis() -> bool:
    """Whether the admission scripts can push onto the workers' Celery queues themselves: the
    broker is the admission Redis itself (never so on a cluster, whose broker is apart)."""
    return not getattr(settings, "ADMISSION_REDIS_CLUSTER", False) and (
        settings.ADMISSION_REDIS_URL == settings.CELERY_BROKER_URL
    )


def offer_tokens(
    *,
    operations: list[str] | frozenset[str],
    lanes: bool,
    edit_features: frozenset[str],
    instruction_files: frozenset[str] | list[str],
) -> str:
    """One workspace's offer as the scripts read it (reg field o:<workspace>)."""
    tokens = [f"op:{o}" for o in sorted(operations)]
    tokens += ["lanes"] if lanes else []
    tokens += [f"ef:{f}" for f in sorted(edit_features)]
    tokens += [f"if:{p}" for p in sorted(instruction_files)]
    return OFFER_SEP + OFFER_SEP.join(tokens) + OFFER_SEP


def row_cleanup(pipe: Any, *, prefix: str, worker_id: str, entry_id: str) -> None:
    """Queue on `pipe` what ends a synchronous call's saved row draft once its own process has
    written the row (AsyncQueue.enter saved it): the draft and status go, the call leaves the
    index of calls owing a row."""
    k = worker_keys(prefix, worker_id)
    pipe.delete(k.row(entry_id), k.status(entry_id))
    pipe.zrem(durable_index_key(prefix), f"{worker_id} {entry_id}")


def pace_sample(pipe: Any, *, prefix: str, worker_id: str, operation: str, exec_ms: int) -> None:
    """Queue on `pipe` one call's execution time on its worker (no round trip of its own):
    what the Retry-After estimate learns the worker's pace from."""
    key = worker_keys(prefix, worker_id).pace
    pipe.lpush(key, f"{operation} {exec_ms}")
    pipe.ltrim(key, 0, PACE_SAMPLES - 1)
    pipe.pexpire(key, PACE_TTL_MS)


def revoked_key_prefix(prefix: str) -> str:
    """Where the revocation marks API keys for the grant scripts (no hash tag: only a plain
    Redis, where the scripts dispatch, reads it; see `_Scripts.revoked_prefix`)."""
    return f"{prefix}adm:revoked:"


def request_id_key(prefix: str, scope: str, request_id: str) -> str:
    return f"{prefix}adm:rid:{{p:{scope}}}:{request_id}"


def durable_index_key(prefix: str) -> str:
    # Not under a worker's hash tag: only ever touched by single-key commands. (Durable
    # requests are offered only where the scripts dispatch, never on a cluster.)
    return f"{prefix}adm:durable"


@dataclass(frozen=True)
class Grant:
    ticket: int
    slot: int
    incarnation: str
    admitted_ms: int
    exec_deadline_ms: int
    # The script pushed the envelope onto the worker's queue; else the waiter must.
    dispatched: bool = False
    # Granted while a call that entered before it still waited (another flow's turn, or a
    # free key passing a busy one).
    out_of_order: bool = False


@dataclass(frozen=True)
class Handed:
    """The next call a settlement granted on the settling worker and handed to it: its Celery
    message, and its grant facts as `SyncQueue.grant_of` reads them, taken from the entry the
    same script step saved (so the worker needs no second read)."""

    message: str
    entry_id: str
    # None only if the entry does not run (never, for one the step granted): then read it.
    grant: dict[str, Any] | None


@dataclass(frozen=True)
class Entered:
    status: str  # granted | waiting | full | offline | refused
    ticket: int | None = None
    incarnation: str = ""
    grant: Grant | None = None
    now_ms: int = 0
    queue_deadline_ms: int = 0
    held: int = 0
    code: str = ""


@dataclass(frozen=True)
class QueueView:
    """A worker's queue as one read-only step saw it (AsyncQueue.backlog): its entries in no
    particular order, its slots, and its recent execution times, newest first."""

    now_ms: int
    slots: int
    entries: list[dict[str, Any]]
    samples: list[tuple[str, int]]


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _grant(raw: list[Any]) -> Grant:
    return Grant(
        ticket=int(raw[0]),
        slot=int(raw[1]),
        incarnation=_s(raw[2]),
        admitted_ms=int(raw[3]),
        exec_deadline_ms=int(raw[4]),
        dispatched=len(raw) > 5 and int(raw[5]) == 1,
        out_of_order=len(raw) > 6 and int(raw[6]) == 1,
    )


def parse_entered(raw: list[Any]) -> Entered:
    status = _s(raw[0])
    if status == "granted":
        grant = _grant(raw[1:])
        return Entered(status, grant.ticket, grant.incarnation, grant, grant.admitted_ms)
    if status == "waiting":
        return Entered(status, int(raw[1]), _s(raw[2]), None, int(raw[3]), int(raw[4]))
    if status == "full":
        return Entered(status, held=int(raw[1]))
    if status == "refused":
        return Entered(status, code=_s(raw[1]))
    return Entered(status)


def parse_left(raw: list[Any]) -> tuple[str, Grant | None]:
    status = _s(raw[0])
    return status, (_grant(raw[1:]) if status == "running" else None)


def _opt(value: Any) -> str | None:
    return None if value is None else _s(value)


def _now(now_ms: int | None) -> str:
    return "" if now_ms is None else str(now_ms)


def decode_entry(raw: Any) -> dict[str, Any]:
    return dict(json.loads(raw))


def _running_grant(entry: dict[str, Any]) -> dict[str, Any] | None:
    """A running entry's grant facts, as the worker uses them; None unless it runs."""
    if entry.get("st") != "r":
        return None
    return {
        "ticket": int(entry["seq"]),
        "slot": int(entry["slot"]),
        "incarnation": str(entry["inc"]),
        "execDeadlineMs": int(entry["dl"]),
    }


class _Scripts:
    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.scripts = {
            name: register(client, name, with_common=True) for name in ADMISSION_SCRIPTS
        }
        self.dispatching = dispatch_in_redis()
        # Where the scripts dispatch they check revocations themselves; where they cannot
        # (a cluster: the marker is in another slot), the waiter re-checks in Postgres.
        self.revoked_prefix = revoked_key_prefix(prefix) if self.dispatching else ""

    def keys(self, worker_id: str) -> WorkerKeys:
        return worker_keys(self.prefix, worker_id)

    def leave_call(
        self,
        worker_id: str,
        entry_id: str,
        *,
        slot_ceiling: int,
        message: dict[str, Any] | None,
        code: str,
        now_ms: int | None,
        by: str,
    ) -> dict[str, list[Any]]:
        """The keys and arguments of leave.lua, for the async and the sync face alike."""
        k = self.keys(worker_id)
        return {
            "keys": [k.reg, k.queue, k.entries, *self.dispatch_keys(worker_id)],
            "args": [
                _now(now_ms),
                entry_id,
                slot_ceiling,
                k.wake_prefix,
                json.dumps(message) if message else "",
                k.status_prefix,
                code,
                self.revoked_prefix,
                by,
            ],
        }

    def dispatch_keys(self, worker_id: str) -> list[str]:
        """The env HASH and, when the scripts can reach it, the worker's Celery queue list."""
        k = self.keys(worker_id)
        if not self.dispatching:
            return [k.env]
        return [k.env, broker_queue_key(worker_queue_name(worker_id))]


class AsyncQueue(_Scripts):
    """The API's side (redis.asyncio): enter, wait for pushes, leave, release, cancel.

    Waiting holds no connection: `wait` parks on this process's wake-up reader
    (admission/waiters.py), which one subscriber connection per Redis node serves for every
    waiter, and pops its wake list with one LPOP when told something arrived.
    """

    def __init__(self, client: Any, prefix: str, *, waiters: WakeReader | None = None) -> None:
        super().__init__(client, prefix)
        self.waiters = waiters or reader_for(client, idle_channel=f"{prefix}adm:idle")

    async def enter(
        self,
        *,
        worker_id: str,
        entry_id: str,
        key: tuple[str, str],
        queue_budget_ms: int,
        exec_budget_ms: int,
        queue_limit: int,
        slot_ceiling: int,
        operation: str,
        workspace_id: str = "",
        needs: list[str] | None = None,
        envelope: str = "",
        durable: bool = False,
        incarnation: str = "",
        key_id: int | None = None,
        row: str = "",
        row_ttl_ms: int = 0,
        flow: str = "",
        flow_share_percent: int = 100,
        now_ms: int | None = None,
    ) -> Entered:
        """Enter a call. `needs` (offer tokens) makes every grant re-check the offer; `envelope`
        is the call's Celery message, pushed to the worker by whichever script grants it;
        `key_id` (the caller's API key) makes every grant check the key was not revoked; `row`
        (a synchronous call's completion row draft) is saved, listed and given a status if the
        call enters, in the same step (see `row_cleanup` for its end). `flow` names whose
        turn the call takes in the fair order (the caller's principal); while another flow is
        in the queue, one flow holds at most `flow_share_percent` of `queue_limit`."""
        k = self.keys(worker_id)
        index = durable_index_key(self.prefix) if self.dispatching else ""
        raw = await self.scripts["enter"](
            keys=[k.reg, k.queue, k.entries, k.stats, *self.dispatch_keys(worker_id)],
            args=[
                _now(now_ms),
                entry_id,
                key[0],
                key[1],
                queue_budget_ms,
                exec_budget_ms,
                queue_limit,
                slot_ceiling,
                k.wake_prefix,
                operation,
                STATS_TTL_MS,
                workspace_id,
                OFFER_SEP.join(needs) if needs else "",
                envelope,
                "1" if durable else "",
                k.status_prefix,
                incarnation,
                "" if key_id is None else str(key_id),
                self.revoked_prefix,
                row,
                k.row(entry_id),
                row_ttl_ms,
                index,
                f"{worker_id} {entry_id}",
                DURABLE_INDEX_TTL_MS,
                flow,
                flow_share_percent,
                "1" if operation in SHARED_OPERATIONS else "",
            ],
        )
        return parse_entered(raw)

    @contextlib.asynccontextmanager
    async def watching(self, *, worker_id: str, entry_id: str) -> AsyncIterator[asyncio.Event]:
        """An event set whenever something may have been pushed for this entry from now on
        (and once at the start, when the process could not confirm its subscription: then the
        waiter must look for itself). Held from before the entry is entered, it lets `wait`
        look at the list only when told: a push can only follow the enter."""
        async with self.waiters.watch(self.keys(worker_id).wake_prefix, entry_id) as woken:
            yield woken

    async def wait(
        self,
        *,
        worker_id: str,
        entry_id: str,
        timeout_ms: int,
        woken: asyncio.Event | None = None,
    ) -> dict[str, Any] | None:
        """Wait until something is pushed for this entry, or the timeout passes (None). With
        `woken` (from `watching`, entered before the entry was), the list is looked at when the
        event is set, and once more as the timeout passes; without, a watch of its own is taken
        and the list looked at first (a push may have come before it)."""
        if woken is None:
            async with self.watching(worker_id=worker_id, entry_id=entry_id) as own:
                own.set()
                return await self._wait(worker_id, entry_id, timeout_ms, own)
        return await self._wait(worker_id, entry_id, timeout_ms, woken)

    async def _wait(
        self, worker_id: str, entry_id: str, timeout_ms: int, woken: asyncio.Event
    ) -> dict[str, Any] | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_ms, 1) / 1000
        while True:
            if woken.is_set():
                # Cleared before the look: a notification arriving after it sets the event
                # again, so none falls between the look and the wait.
                woken.clear()
                message = await self.poll(worker_id=worker_id, entry_id=entry_id)
                if message is not None:
                    # One look pops one message, but one clear may have covered two pushes
                    # (a grant and a quick result): the next wait looks first.
                    woken.set()
                    return message
                if loop.time() >= deadline:
                    return None  # nothing, by a look made as the time ran out
            left = deadline - loop.time()
            if left <= 0:
                woken.set()  # the last look, before giving up
                continue
            try:
                # asyncio.timeout, never wait_for: on Python 3.11 wait_for returns the result
                # when the waiter is cancelled in the instant it is woken, and the cancel (a
                # client gone away) is lost (tests/admission/test_cancel_race.py).
                async with asyncio.timeout(min(left, SAFETY_LOOK_S)):
                    await woken.wait()
            except TimeoutError:
                woken.set()  # the periodic look (a lost notification), or the last one

    async def poll(self, *, worker_id: str, entry_id: str) -> dict[str, Any] | None:
        raw = await self.client.lpop(self.keys(worker_id).wake(entry_id))
        return None if raw is None else dict(json.loads(raw))

    async def leave(
        self,
        *,
        worker_id: str,
        entry_id: str,
        slot_ceiling: int,
        message: dict[str, Any] | None = None,
        code: str = "",
        now_ms: int | None = None,
        by: str = "",
    ) -> tuple[str, Grant | None]:
        """Take a waiting call out; `code` is what its durable status says (a failure code, or
        REQUEST_CANCELLED for 'cancelled'), `by` who cancelled it when not its own client."""
        call = self.leave_call(
            worker_id,
            entry_id,
            slot_ceiling=slot_ceiling,
            message=message,
            code=code,
            now_ms=now_ms,
            by=by,
        )
        return parse_left(await self.scripts["leave"](**call))

    async def release(
        self,
        *,
        worker_id: str,
        entry_id: str,
        ticket: int,
        slot_ceiling: int,
        now_ms: int | None = None,
    ) -> bool:
        k = self.keys(worker_id)
        raw = await self.scripts["release"](
            keys=[k.reg, k.queue, k.entries, *self.dispatch_keys(worker_id)],
            args=[
                _now(now_ms),
                entry_id,
                ticket,
                slot_ceiling,
                k.wake_prefix,
                k.status_prefix,
                self.revoked_prefix,
            ],
        )
        return _s(raw[0]) == "released"

    async def backlog(
        self, *, worker_id: str, slot_ceiling: int, now_ms: int | None = None
    ) -> QueueView:
        """The queue and the worker's pace, read in one step that changes nothing."""
        k = self.keys(worker_id)
        now, slots, ceiling, entries, samples = await self.scripts["backlog"](
            keys=[k.reg, k.entries, k.pace], args=[_now(now_ms), PACE_SAMPLES]
        )
        registered = int(_s(slots) or 0)
        ceil = slot_ceiling or int(_s(ceiling) or registered)
        parsed = [_s(x).split(" ", 1) for x in samples]
        return QueueView(
            now_ms=int(now),
            slots=min(registered, ceil),
            entries=[decode_entry(raw) for raw in entries],
            samples=[(p[0], int(p[1])) for p in parsed if len(p) == 2 and p[1].isdigit()],
        )

    async def entry(self, *, worker_id: str, entry_id: str) -> dict[str, Any] | None:
        raw = await self.client.hget(self.keys(worker_id).entries, entry_id)
        return None if raw is None else decode_entry(raw)

    async def bind_instance(self, *, worker_id: str, base: str, scope: str) -> bool:
        """Bind a conversation instance (workspace + instance id) to the first principal using it."""
        key = self.keys(worker_id).instance_prefix + base
        owner = await self.client.set(key, scope, nx=True, get=True, px=INSTANCE_TTL_MS)
        if owner is not None and _s(owner) != scope:
            return False
        await self.client.pexpire(key, INSTANCE_TTL_MS)
        return True

    async def claim_request_id(
        self,
        *,
        scope: str,
        request_id: str,
        worker_id: str,
        entry_id: str,
        ttl_ms: int,
        durable: bool = False,
    ) -> bool:
        """Bind a caller-chosen request id to this call; False when it names a live call already."""
        key = request_id_key(self.prefix, scope, request_id)
        value = f"{worker_id} {entry_id}" + (" d" if durable else "")
        return bool(await self.client.set(key, value, px=ttl_ms, nx=True))

    async def request_binding(self, *, scope: str, request_id: str) -> tuple[str, str, bool] | None:
        """(worker id, entry id, durable) a request id is bound to; None when unknown or finished."""
        bound = await self.client.get(request_id_key(self.prefix, scope, request_id))
        if bound is None:
            return None
        parts = _s(bound).split(" ")
        if len(parts) < 2:
            return None
        return parts[0], parts[1], parts[2:] == ["d"]

    async def durable_status(self, *, worker_id: str, entry_id: str) -> dict[str, Any] | None:
        raw = await self.client.get(self.keys(worker_id).status(entry_id))
        return None if raw is None else dict(json.loads(raw))

    async def redis_now_ms(self) -> int:
        seconds, micros = await self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def row_draft_save(
        self,
        *,
        worker_id: str,
        entry_id: str,
        row: str,
        request: str,
        ttl_ms: int,
        submitted_ms: int,
    ) -> None:
        """A durable call's row draft and its request, listed in the index of calls owing a
        row (admission/durable.py), before the call enters its queue."""
        key = self.keys(worker_id).row(entry_id)
        index = durable_index_key(self.prefix)
        pipe = self.client.pipeline(transaction=False)
        pipe.set(key, row, px=ttl_ms)
        pipe.set(key + ":req", request, px=ttl_ms)
        pipe.zadd(index, {f"{worker_id} {entry_id}": submitted_ms})
        pipe.pexpire(index, DURABLE_INDEX_TTL_MS)
        await pipe.execute()

    async def row_request(self, *, worker_id: str, entry_id: str) -> dict[str, Any] | None:
        raw = await self.client.get(self.keys(worker_id).row(entry_id) + ":req")
        return None if raw is None else dict(json.loads(raw))

    async def row_claim(
        self, *, worker_id: str, entry_id: str, token: str, lease_ms: int
    ) -> tuple[str, str | None]:
        """Claim the writing of a durable call's row: ("claimed", draft) to exactly one caller
        while the claim lasts, ("busy", None) while another holds it, ("done", None) once the
        row is written (or its draft is gone). One MULTI, so nothing falls between the two."""
        key = self.keys(worker_id).row(entry_id)
        pipe = self.client.pipeline(transaction=True)
        pipe.set(key + ":claim", token, nx=True, px=lease_ms)
        pipe.get(key)
        got, raw = await pipe.execute()
        if raw is None or _s(raw) == "done":
            return "done", None
        return ("claimed", _s(raw)) if got else ("busy", None)

    async def row_done(self, *, worker_id: str, entry_id: str, ttl_ms: int) -> None:
        """The row is written: the draft becomes "done" (so no claim after this one writes)
        and the call leaves the index. The claim goes last."""
        key = self.keys(worker_id).row(entry_id)
        await self.client.set(key, "done", px=ttl_ms, xx=True)
        pipe = self.client.pipeline(transaction=False)
        pipe.zrem(durable_index_key(self.prefix), f"{worker_id} {entry_id}")
        pipe.delete(key + ":claim")
        await pipe.execute()

    async def row_forget(self, *, worker_id: str, entry_id: str) -> None:
        """A durable call that never entered its queue owes no row: its draft goes."""
        key = self.keys(worker_id).row(entry_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(key, key + ":req")
        pipe.zrem(durable_index_key(self.prefix), f"{worker_id} {entry_id}")
        await pipe.execute()

    async def rows_owed(
        self, *, start: int, limit: int
    ) -> list[tuple[str, str, str | None, str | None]]:
        """`limit` durable calls of the index from position `start`, oldest first: (worker id,
        entry id, status JSON, row draft or "done"), in two round trips."""
        members = await self.client.zrange(durable_index_key(self.prefix), start, start + limit - 1)
        pairs = [tuple(_s(m).split(" ", 1)) for m in members]
        pairs = [p for p in pairs if len(p) == 2]
        if not pairs:
            return []
        pipe = self.client.pipeline(transaction=False)
        for worker_id, entry_id in pairs:
            k = self.keys(worker_id)
            pipe.get(k.status(entry_id))
            pipe.get(k.row(entry_id))
        got = await pipe.execute()
        return [(w, e, _opt(got[2 * i]), _opt(got[2 * i + 1])) for i, (w, e) in enumerate(pairs)]

    async def settlement_of(self, *, worker_id: str, entry_id: str) -> dict[str, Any] | None:
        """The worker's settlement of a synchronous call as pushed to its wake list (for
        WAKE_TTL_MS), when nobody took it: the one message there of type "result"."""
        pushed = await self.client.lrange(self.keys(worker_id).wake(entry_id), 0, -1)
        for raw in reversed(pushed or []):
            with contextlib.suppress(ValueError, TypeError):
                message = json.loads(raw)
                if isinstance(message, dict) and message.get("t", "result") == "result":
                    return message
        return None

    async def row_unlist(self, *, worker_id: str, entry_id: str) -> None:
        await self.client.zrem(durable_index_key(self.prefix), f"{worker_id} {entry_id}")

    async def finish_request_id(self, *, scope: str, request_id: str, dispatched: bool) -> None:
        """Mark a call's id finished, or free it when the call was never dispatched.

        Only the call that claimed the id calls this, and nobody else can claim it meanwhile
        (SET NX), so a plain DEL cannot free another call's binding.
        """
        key = request_id_key(self.prefix, scope, request_id)
        if dispatched:
            await self.client.set(key, "done", px=REQUEST_ID_DONE_TTL_MS)
        else:
            await self.client.delete(key)

    async def cancel(self, *, scope: str, request_id: str, slot_ceiling: int) -> str | None:
        """DELETE by request id: 'cancelled' | 'running' | 'finished', or None when unknown."""
        bound = await self.client.get(request_id_key(self.prefix, scope, request_id))
        if bound is None:
            return None
        worker_id, _, rest = _s(bound).partition(" ")
        entry_id = rest.partition(" ")[0]
        if not entry_id:
            return "finished"
        status, _ = await self.leave(
            worker_id=worker_id,
            entry_id=entry_id,
            slot_ceiling=slot_ceiling,
            message={"t": "cancelled"},
            code="REQUEST_CANCELLED",
        )
        return {"left": "cancelled", "running": "running"}.get(status, "finished")


class SyncQueue(_Scripts):
    """The worker-facing side (plain redis): registration, heartbeats, settlement, snapshots."""

    def register_incarnation(
        self,
        *,
        worker_id: str,
        incarnation: str,
        slots: int,
        ttl_ms: int,
        offer: dict[str, str] | None = None,
    ) -> tuple[int, int]:
        """`offer`: workspace id -> `offer_tokens(...)`, what every grant checks calls against."""
        k = self.keys(worker_id)
        raw = self.scripts["register"](
            keys=[k.reg, k.queue, k.entries, k.env],
            args=[
                incarnation,
                slots,
                ttl_ms,
                k.wake_prefix,
                k.status_prefix,
                json.dumps(offer) if offer is not None else "",
            ],
        )
        return int(raw[0]), int(raw[1])

    def heartbeat(self, *, worker_id: str, incarnation: str, ttl_ms: int) -> int:
        """1 renewed, 0 replaced by another incarnation, -1 no registration left (lost)."""
        return int(
            self.scripts["heartbeat"](keys=[self.keys(worker_id).reg], args=[incarnation, ttl_ms])
        )

    def deregister(self, *, worker_id: str, incarnation: str) -> int:
        k = self.keys(worker_id)
        return int(
            self.scripts["deregister"](
                keys=[k.reg, k.queue, k.entries, k.env],
                args=[incarnation, k.wake_prefix, k.status_prefix],
            )
        )

    def registration(self, *, worker_id: str) -> tuple[str | None, int]:
        """(the registered incarnation, ms left before the registration expires) for the
        bridge's status; (None, 0) when the worker is not registered."""
        reg = self.keys(worker_id).reg
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(reg, "inc")
        pipe.pttl(reg)
        incarnation, ttl_ms = pipe.execute()
        if incarnation is None or int(ttl_ms) <= 0:
            return None, 0
        return _s(incarnation), int(ttl_ms)

    def revoke(self, *, worker_id: str) -> int:
        """A revoked worker (bridge, §4.5): calls waiting for it are told 'offline' (not
        started), calls running on it 'vanished' (outcome unknown), and its registration is
        gone, so new calls are refused as offline. Returns how many calls were told.

        Two existing scripts, not a new one: registering an incarnation nobody holds, with no
        slots, drops the queue exactly as a replacement does and grants nothing; deregistering
        it then tells whatever entered in between and deletes the registration."""
        tombstone = "revoked-" + uuid.uuid4().hex
        waiting, running = self.register_incarnation(
            worker_id=worker_id, incarnation=tombstone, slots=0, ttl_ms=REVOKE_TTL_MS
        )
        return (
            waiting + running + max(self.deregister(worker_id=worker_id, incarnation=tombstone), 0)
        )

    def mark_keys_revoked(self, *, key_ids: list[int], ttl_ms: int = REVOKED_KEY_TTL_MS) -> None:
        """Tell every grant script that these API keys are revoked: from now on their waiting
        calls are refused (401, not started) instead of dispatched, and calls entering from
        a process that still remembers the key are refused at their first grant."""
        if not key_ids:
            return
        pipe = self.client.pipeline(transaction=False)
        for key_id in key_ids:
            pipe.set(revoked_key_prefix(self.prefix) + str(key_id), "1", px=ttl_ms)
        pipe.execute()

    def unmark_keys_revoked(self, *, key_ids: list[int]) -> None:
        """Undo `mark_keys_revoked` for keys that are good again (a principal enabled again)."""
        if key_ids:
            self.client.delete(*(revoked_key_prefix(self.prefix) + str(k) for k in key_ids))

    def settle(
        self,
        *,
        worker_id: str,
        entry_id: str,
        incarnation: str,
        ticket: int,
        payload: dict[str, Any],
        now_ms: int | None = None,
    ) -> bool:
        accepted, _ = self.settle_taking_next(
            worker_id=worker_id,
            entry_id=entry_id,
            incarnation=incarnation,
            ticket=ticket,
            payload=payload,
            now_ms=now_ms,
            take_next=False,
        )
        return accepted

    def settle_taking_next(
        self,
        *,
        worker_id: str,
        entry_id: str,
        incarnation: str,
        ticket: int,
        payload: dict[str, Any],
        now_ms: int | None = None,
        take_next: bool = True,
    ) -> tuple[bool, Handed | None]:
        """Settle, and (take_next) receive the Celery message and grant facts of the first
        call this settlement granted instead of it being pushed onto the worker's queue: the
        settling worker thread runs it next, so a same-worker handoff costs no broker hop and
        no read of the grant. Returns (accepted, the handed call or None)."""
        k = self.keys(worker_id)
        raw = self.scripts["settle"](
            keys=[k.reg, k.queue, k.entries, k.stats, *self.dispatch_keys(worker_id)],
            args=[
                _now(now_ms),
                entry_id,
                incarnation,
                ticket,
                json.dumps(payload),
                k.wake_prefix,
                STATS_TTL_MS,
                k.status_prefix,
                self.revoked_prefix,
                "1" if take_next else "0",
            ],
        )
        accepted = _s(raw[0]) == "accepted"
        taken = _s(raw[1]) if accepted and len(raw) > 1 else ""
        if not taken:
            return accepted, None
        entry = decode_entry(_s(raw[2]))
        return accepted, Handed(taken, str(entry["id"]), _running_grant(entry))

    def grant_of(self, *, worker_id: str, entry_id: str) -> dict[str, Any] | None:
        """The grant facts of a running entry (ticket, slot, incarnation, exec deadline), which
        the worker takes from here rather than from the message that carried the assignment."""
        raw = self.client.hget(self.keys(worker_id).entries, entry_id)
        return None if raw is None else _running_grant(decode_entry(raw))

    def snapshot(
        self, worker_id: str
    ) -> tuple[dict[str, str], list[dict[str, Any]], dict[str, str]]:
        """(registration, entries in arrival order, counters) for metrics and the dashboard."""
        k = self.keys(worker_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(k.reg)
        pipe.zrange(k.queue, 0, -1)
        pipe.hgetall(k.entries)
        pipe.hgetall(k.stats)
        reg, ids, entries, stats = pipe.execute()
        ordered = [decode_entry(entries[i]) for i in ids if i in entries]
        return (
            {_s(a): _s(b) for a, b in reg.items()},
            ordered,
            {_s(a): _s(b) for a, b in stats.items()},
        )

    # Operators (admission/operator.py): cancel a waiting call, drain and resume a worker.

    def cancel_waiting(
        self, *, worker_id: str, entry_id: str, slot_ceiling: int, now_ms: int | None = None
    ) -> str:
        """An operator takes a waiting call out exactly as its client's DELETE does, told that
        an operator did it: 'cancelled', 'running' (untouched) or 'gone' (not in the queue)."""
        call = self.leave_call(
            worker_id,
            entry_id,
            slot_ceiling=slot_ceiling,
            message={"t": "cancelled", "by": OPERATOR},
            code="REQUEST_CANCELLED",
            now_ms=now_ms,
            by=OPERATOR,
        )
        status, _ = parse_left(self.scripts["leave"](**call))
        return {"left": "cancelled"}.get(status, status)

    def find_request(self, *, scopes: list[str], request_id: str) -> tuple[str, str] | str | None:
        """Which call a request id names among these principals' (one pipelined GET each):
        (worker id, entry id), "finished", or None when none of them holds it."""
        pipe = self.client.pipeline(transaction=False)
        for scope in scopes:
            pipe.get(request_id_key(self.prefix, scope, request_id))
        finished = False
        for bound in pipe.execute() if scopes else []:
            if bound is None:
                continue
            worker_id, _, rest = _s(bound).partition(" ")
            entry_id = rest.partition(" ")[0]
            if entry_id:
                return worker_id, entry_id
            finished = True
        return "finished" if finished else None

    def drain(self, *, worker_id: str, note: dict[str, Any]) -> bool:
        """Stop granting this worker's queue (True: it was not drained before). No TTL: the
        flag lasts until `resume`, through API and worker restarts alike."""
        return bool(self.client.set(self.keys(worker_id).drain, json.dumps(note), nx=True))

    def resume(
        self, *, worker_id: str, slot_ceiling: int, now_ms: int | None = None
    ) -> tuple[bool, int]:
        """Grant again, in arrival order, in the same step: (it was drained, calls granted)."""
        k = self.keys(worker_id)
        raw = self.scripts["resume"](
            keys=[k.reg, k.queue, k.entries, k.drain, *self.dispatch_keys(worker_id)],
            args=[_now(now_ms), slot_ceiling, k.wake_prefix, k.status_prefix, self.revoked_prefix],
        )
        return int(raw[0]) == 1, int(raw[1])

    def drained(self, worker_ids: list[str]) -> dict[str, dict[str, Any]]:
        """The drained ones among these workers, with who drained them and when."""
        pipe = self.client.pipeline(transaction=False)
        for worker_id in worker_ids:
            pipe.get(self.keys(worker_id).drain)
        found = {}
        for worker_id, raw in zip(worker_ids, pipe.execute() if worker_ids else [], strict=True):
            if raw is not None:
                with contextlib.suppress(ValueError, TypeError):
                    found[worker_id] = dict(json.loads(raw))
                found.setdefault(worker_id, {})
        return found
