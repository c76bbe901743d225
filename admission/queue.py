"""The per-worker admission FIFO in Redis: the only module that talks to Redis for admission.

Every decision is one Lua script (admission/lua/), so it is one round trip and atomic across
any number of API processes and workers. Every key of one worker carries the hash tag
`{w:<worker id>}`, so the scripts run unchanged on Redis Cluster. Key layout (prefix P):

    P adm:{w:ID}:reg          HASH  incarnation, slots, slot ceiling, ticket counter  (TTL 30 s, heartbeats renew)
    P adm:{w:ID}:q            ZSET  entry id by ticket: the FIFO, running entries included
    P adm:{w:ID}:e            HASH  entry id -> JSON entry (state, key, deadline, slot ...)
    P adm:{w:ID}:stats        HASH  counters (queue_full, settle_discarded)           (TTL 7 d)
    P adm:{w:ID}:wake:<entry> LIST  pushes to one waiting request: grant, result, offline ...
    P adm:{w:ID}:wake:        shard channel: "<entry>" announced with each push (admission/waiters.py)
    P adm:{w:ID}:inst:<key>   STRING  the principal a conversation instance is bound to   (TTL 24 h)
    P adm:rid:{p:<principal>}:<request id>   STRING  "<worker id> <entry id>" or "done"
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from admission.scripts import register
from admission.waiters import SAFETY_LOOK_S, WakeReader, reader_for

STATS_TTL_MS = 7 * 24 * 3600 * 1000
# Finished request ids answer DELETE with "finished" for this long.
REQUEST_ID_DONE_TTL_MS = 10 * 60 * 1000
# A conversation instance stays bound to its principal this long after its last call.
INSTANCE_TTL_MS = 24 * 3600 * 1000
ADMISSION_SCRIPTS = ("enter", "leave", "release", "settle", "register", "heartbeat", "deregister")


@dataclass(frozen=True)
class WorkerKeys:
    reg: str
    queue: str
    entries: str
    stats: str
    wake_prefix: str
    instance_prefix: str

    def wake(self, entry_id: str) -> str:
        return self.wake_prefix + entry_id


def worker_keys(prefix: str, worker_id: str) -> WorkerKeys:
    tag = f"{prefix}adm:{{w:{worker_id}}}"
    return WorkerKeys(
        reg=f"{tag}:reg",
        queue=f"{tag}:q",
        entries=f"{tag}:e",
        stats=f"{tag}:stats",
        wake_prefix=f"{tag}:wake:",
        instance_prefix=f"{tag}:inst:",
    )


def request_id_key(prefix: str, scope: str, request_id: str) -> str:
    return f"{prefix}adm:rid:{{p:{scope}}}:{request_id}"


@dataclass(frozen=True)
class Grant:
    ticket: int
    slot: int
    incarnation: str
    admitted_ms: int
    exec_deadline_ms: int


@dataclass(frozen=True)
class Entered:
    status: str  # granted | waiting | full | offline
    ticket: int | None = None
    incarnation: str = ""
    grant: Grant | None = None
    now_ms: int = 0
    queue_deadline_ms: int = 0
    held: int = 0


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _grant(raw: list[Any]) -> Grant:
    return Grant(
        ticket=int(raw[0]),
        slot=int(raw[1]),
        incarnation=_s(raw[2]),
        admitted_ms=int(raw[3]),
        exec_deadline_ms=int(raw[4]),
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
    return Entered(status)


def parse_left(raw: list[Any]) -> tuple[str, Grant | None]:
    status = _s(raw[0])
    return status, (_grant(raw[1:]) if status == "running" else None)


def _now(now_ms: int | None) -> str:
    return "" if now_ms is None else str(now_ms)


def decode_entry(raw: Any) -> dict[str, Any]:
    return dict(json.loads(raw))


class _Scripts:
    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.scripts = {
            name: register(client, name, with_common=True) for name in ADMISSION_SCRIPTS
        }

    def keys(self, worker_id: str) -> WorkerKeys:
        return worker_keys(self.prefix, worker_id)


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
        now_ms: int | None = None,
    ) -> Entered:
        k = self.keys(worker_id)
        raw = await self.scripts["enter"](
            keys=[k.reg, k.queue, k.entries, k.stats],
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
            ],
        )
        return parse_entered(raw)

    async def wait(
        self, *, worker_id: str, entry_id: str, timeout_ms: int
    ) -> dict[str, Any] | None:
        """Wait until something is pushed for this entry, or the timeout passes (None)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_ms, 1) / 1000
        keys = self.keys(worker_id)
        async with self.waiters.watch(keys.wake_prefix, entry_id) as woken:
            while True:
                # Cleared before the look: a notification arriving after it sets the event
                # again, so none falls between the look and the wait.
                woken.clear()
                message = await self.poll(worker_id=worker_id, entry_id=entry_id)
                if message is not None:
                    return message
                left = deadline - loop.time()
                if left <= 0:
                    return None
                try:
                    await asyncio.wait_for(woken.wait(), min(left, SAFETY_LOOK_S))
                except TimeoutError:
                    continue

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
        now_ms: int | None = None,
    ) -> tuple[str, Grant | None]:
        k = self.keys(worker_id)
        raw = await self.scripts["leave"](
            keys=[k.reg, k.queue, k.entries],
            args=[
                _now(now_ms),
                entry_id,
                slot_ceiling,
                k.wake_prefix,
                json.dumps(message) if message else "",
            ],
        )
        return parse_left(raw)

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
            keys=[k.reg, k.queue, k.entries],
            args=[_now(now_ms), entry_id, ticket, slot_ceiling, k.wake_prefix],
        )
        return _s(raw[0]) == "released"

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
        self, *, scope: str, request_id: str, worker_id: str, entry_id: str, ttl_ms: int
    ) -> bool:
        """Bind a caller-chosen request id to this call; False when it names a live call already."""
        key = request_id_key(self.prefix, scope, request_id)
        return bool(await self.client.set(key, f"{worker_id} {entry_id}", px=ttl_ms, nx=True))

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
        worker_id, _, entry_id = _s(bound).partition(" ")
        if not entry_id:
            return "finished"
        status, _ = await self.leave(
            worker_id=worker_id,
            entry_id=entry_id,
            slot_ceiling=slot_ceiling,
            message={"t": "cancelled"},
        )
        return {"left": "cancelled", "running": "running"}.get(status, "finished")


class SyncQueue(_Scripts):
    """The worker-facing side (plain redis): registration, heartbeats, settlement, snapshots."""

    def register_incarnation(
        self, *, worker_id: str, incarnation: str, slots: int, ttl_ms: int
    ) -> tuple[int, int]:
        k = self.keys(worker_id)
        raw = self.scripts["register"](
            keys=[k.reg, k.queue, k.entries], args=[incarnation, slots, ttl_ms, k.wake_prefix]
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
                keys=[k.reg, k.queue, k.entries], args=[incarnation, k.wake_prefix]
            )
        )

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
        k = self.keys(worker_id)
        raw = self.scripts["settle"](
            keys=[k.reg, k.queue, k.entries, k.stats],
            args=[
                _now(now_ms),
                entry_id,
                incarnation,
                ticket,
                json.dumps(payload),
                k.wake_prefix,
                STATS_TTL_MS,
            ],
        )
        return _s(raw[0]) == "accepted"

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
