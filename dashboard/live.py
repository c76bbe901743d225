"""What every worker's queue holds right now, read from Redis (the admission scripts' own state).

The dashboard's live cards and the `/metrics` gauges both come from here, so they always agree,
and both are correct across any number of API processes: nothing is kept in process memory.
Raw workspace instance ids never leave this module: a busy slot is named by the same keyed
hash the completion rows carry. The lane (worktree) is shown, as the rows show it; so are the
tenant and principal of each call, found by the API key id its entry carries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils import timezone

from admission.connections import sync_queue
from admission.policy import Policy, current_overrides, current_policy, policy_for, policy_sources
from admission.queue import decode_entry, worker_keys
from workspaces.models import ApiKey, Worker
from workspaces.secrets import keyed_hash

# How many characters of an isolation-key hash identify it on screen (rows carry all 32).
SHORT_HASH = 8


def key_hash(worker_id: str, base: str, lane: str) -> str:
    """The completion rows' isolation_key_hash for a live entry (see admission.services)."""
    return keyed_hash("isolation", f"{worker_id}\x1f{base}\x1f{lane}")


@dataclass(frozen=True)
class Who:
    """The caller of a live call, from its API key (blank when the entry names no key)."""

    tenant_id: int | None = None
    tenant: str = ""
    principal_id: int | None = None
    principal: str = ""


@dataclass(frozen=True)
class LiveCall:
    key_hash: str
    workspace_id: str
    operation: str
    age_ms: int  # running: since admission; waiting: since it entered the queue
    entry_id: str = ""
    lane: str = ""
    who: Who = field(default_factory=Who)

    @property
    def key_short(self) -> str:
        return self.key_hash[:SHORT_HASH]


@dataclass(frozen=True)
class Slot:
    index: int
    call: LiveCall | None


@dataclass(frozen=True)
class WaitingGroup:
    """Waiting calls of one isolation key: usually they all queue behind one busy call."""

    key_hash: str
    workspace_id: str
    count: int
    oldest_ms: int

    @property
    def key_short(self) -> str:
        return self.key_hash[:SHORT_HASH]


@dataclass
class WorkerCard:
    worker_id: str
    online: bool
    registered: bool
    capacity: int
    queue_limit: int
    heartbeat_age_s: int | None
    slots: list[Slot] = field(default_factory=list)
    waiting: int = 0
    oldest_wait_ms: int = 0
    waiting_groups: list[WaitingGroup] = field(default_factory=list)
    # Every waiting call in arrival order (of the chosen tenant, when the page filters by one).
    waiting_calls: list[LiveCall] = field(default_factory=list)
    # Drained by an operator: grants nothing until resumed ({"by", "at"} when drained).
    drained: dict[str, Any] | None = None
    # The effective policy of calls on this worker, where it differs from the global row:
    # "queue limit 8 (tenant), rate limit 30/30s (worker)". Empty when nothing is overridden.
    policy_note: str = ""

    @property
    def draining(self) -> bool:
        return self.drained is not None

    @property
    def running(self) -> int:
        return sum(1 for slot in self.slots if slot.call is not None)

    @property
    def held(self) -> int:
        return self.running + self.waiting

    @property
    def fill_pct(self) -> int:
        return min(100, round(100 * self.held / self.queue_limit)) if self.queue_limit else 0


def policy_ceilings() -> tuple[int, int]:
    """(slot ceiling, queue limit): the same policy row the admission scripts are given."""
    policy = current_policy()
    return policy.max_lease_slots, policy.worker_queue_limit


def live_cards(
    *, worker_ids: list[str] | None = None, client: Any = None, tenant_id: int | None = None
) -> list[WorkerCard]:
    """One card per worker in the Worker table (or the named ones), in one Redis round trip.
    With `tenant_id`: the workers of that tenant and those its callers wait for, listing only
    that tenant's waiting calls."""
    workers = list(Worker.objects.order_by("worker_id"))
    if worker_ids is not None:
        workers = [w for w in workers if w.worker_id in worker_ids]
    client = client if client is not None else sync_queue().client
    ceiling, _ = policy_ceilings()
    # The scripts' clock: entry times are Redis TIME, not this host's. Asked outside the
    # pipeline: a cluster pipeline refuses a keyless command.
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    pipe = client.pipeline(transaction=False)
    for worker in workers:
        k = worker_keys(settings.REDIS_KEY_PREFIX, worker.worker_id)
        pipe.hgetall(k.reg)
        pipe.zrange(k.queue, 0, -1)
        pipe.hgetall(k.entries)
        pipe.get(k.drain)
    replies = [None, *pipe.execute()]
    queues = []
    for i in range(len(workers)):
        reg, ids, raw_entries, drained = replies[1 + 4 * i : 5 + 4 * i]
        entries = [decode_entry(raw_entries[e]) for e in ids if e in raw_entries]
        queues.append((reg, entries, _drain_note(drained)))
    callers = _callers({str(e["kid"]) for _, entries, _ in queues for e in entries if "kid" in e})
    cards = []
    for worker, (reg, entries, drained) in zip(workers, queues, strict=True):
        policy = policy_for(worker_id=worker.worker_id, tenant_id=worker.tenant_id)
        card = _card(
            worker,
            reg,
            entries,
            now_ms=now_ms,
            ceiling=ceiling,
            limit=policy.worker_queue_limit,
            callers=callers,
        )
        card.policy_note = _policy_note(worker, policy)
        card.drained = drained
        if tenant_id is not None:
            card.waiting_calls = [c for c in card.waiting_calls if c.who.tenant_id == tenant_id]
            if worker.tenant_id != tenant_id and not card.waiting_calls:
                continue
        cards.append(card)
    return cards


def _drain_note(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        note = json.loads(raw)
    except (ValueError, TypeError):
        note = {}
    return note if isinstance(note, dict) else {}


def _callers(key_ids: set[str]) -> dict[str, Who]:
    """Who holds each API key among the live entries: one query, however many calls wait."""
    ids = [int(k) for k in key_ids if k.isdigit()]
    if not ids:
        return {}
    rows = ApiKey.objects.filter(pk__in=ids).values_list(
        "pk", "principal_id", "principal__name", "principal__tenant_id", "principal__tenant__name"
    )
    return {
        str(pk): Who(tenant_id=tid, tenant=tname, principal_id=pid, principal=pname)
        for pk, pid, pname, tid, tname in rows
    }


def _policy_note(worker: Worker, policy: Policy) -> str:
    overrides, _ = current_overrides()
    sources = policy_sources(overrides, worker_id=worker.worker_id, tenant_id=worker.tenant_id)
    shown = {
        "worker_queue_limit": f"queue limit {policy.worker_queue_limit}",
        "queue_ceiling_ms": f"wait ceiling {policy.queue_ceiling_ms} ms",
        "job_timeout_ms": f"exec ceiling {policy.job_timeout_ms} ms",
        "rate": f"rate limit {policy.rate}",
        "rate_limit_enabled": "rate limit " + ("on" if policy.rate_limit_enabled else "off"),
    }
    return ", ".join(
        f"{text} ({sources[name]})" for name, text in shown.items() if sources[name] != "global"
    )


def _card(
    worker: Worker,
    reg: dict[str, str],
    entries: list[dict[str, Any]],
    *,
    now_ms: int,
    ceiling: int,
    limit: int,
    callers: dict[str, Who] | None = None,
) -> WorkerCard:
    registered = bool(reg.get("inc"))
    capacity = min(int(reg.get("slots") or worker.slots or 0), ceiling) if registered else 0
    heartbeat_age = None
    if worker.last_heartbeat_at is not None:
        heartbeat_age = int((timezone.now() - worker.last_heartbeat_at).total_seconds())
    card = WorkerCard(
        worker_id=worker.worker_id,
        online=registered and worker.is_online,
        registered=registered,
        capacity=capacity,
        queue_limit=limit,
        heartbeat_age_s=heartbeat_age,
    )
    busy: dict[int, LiveCall] = {}
    groups: dict[str, list[LiveCall]] = {}
    for e in entries:
        if int(e.get("dl", 0)) <= now_ms:
            continue  # Past its deadline: the next script run removes it; it holds nothing.
        running = e.get("st") == "r"
        since_ms = int(e.get("ta", now_ms) if running else e.get("t0", now_ms))
        call = LiveCall(
            key_hash=key_hash(worker.worker_id, str(e.get("base", "")), str(e.get("lane", ""))),
            # The workspace id alone, as completion rows show it: never the instance or the lane.
            workspace_id=str(e.get("base", "")).split("\x1f", 1)[0],
            operation=str(e.get("op", "")),
            age_ms=max(0, now_ms - since_ms),
            entry_id=str(e.get("id", "")),
            lane=str(e.get("lane", "")),
            who=(callers or {}).get(str(e.get("kid", "")), Who()),
        )
        if running:
            busy[int(e.get("slot", 0))] = call
        else:
            groups.setdefault(call.key_hash, []).append(call)
            card.waiting_calls.append(call)
    slot_count = max([capacity, *(s + 1 for s in busy)])
    card.slots = [Slot(index=i, call=busy.get(i)) for i in range(slot_count)]
    waiting = [c for calls in groups.values() for c in calls]
    card.waiting = len(waiting)
    card.oldest_wait_ms = max((c.age_ms for c in waiting), default=0)
    card.waiting_groups = sorted(
        (
            WaitingGroup(
                key_hash=k,
                workspace_id=calls[0].workspace_id,
                count=len(calls),
                oldest_ms=max(c.age_ms for c in calls),
            )
            for k, calls in groups.items()
        ),
        key=lambda g: (-g.count, -g.oldest_ms),
    )
    return card


def card_json(card: WorkerCard) -> dict[str, Any]:
    """The live state as the dashboard's JSON endpoint serves it (short hashes only)."""
    return {
        "worker_id": card.worker_id,
        "online": card.online,
        "capacity": card.capacity,
        "running": card.running,
        "waiting": card.waiting,
        "held": card.held,
        "queue_limit": card.queue_limit,
        "policy_overrides": card.policy_note,
        "oldest_wait_ms": card.oldest_wait_ms,
        "heartbeat_age_s": card.heartbeat_age_s,
        "draining": card.draining,
        "slots": [
            {"index": s.index, "busy": False}
            if s.call is None
            else {
                "index": s.index,
                "busy": True,
                "key": s.call.key_short,
                "workspace_id": s.call.workspace_id,
                "operation": s.call.operation,
                "elapsed_ms": s.call.age_ms,
                **_who_json(s.call),
            }
            for s in card.slots
        ],
        "waiting_calls": [
            {
                "entry": c.entry_id,
                "workspace_id": c.workspace_id,
                "operation": c.operation,
                "waited_ms": c.age_ms,
                **_who_json(c),
            }
            for c in card.waiting_calls
        ],
        "waiting_by_key": [
            {
                "key": g.key_short,
                "workspace_id": g.workspace_id,
                "count": g.count,
                "oldest_ms": g.oldest_ms,
            }
            for g in card.waiting_groups
        ],
    }


def _who_json(call: LiveCall) -> dict[str, Any]:
    return {"lane": call.lane, "tenant": call.who.tenant, "user": call.who.principal}
