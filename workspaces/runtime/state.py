"""What one running worker process knows: its incarnation, workspaces and the fence.

Assignments run on Celery's thread pool inside the `runworker` process; they find the
worker's state here.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from workspaces.operations.treeprocs import TreeProcesses
from workspaces.runtime.config import WorkspaceRoot
from workspaces.sandbox import Sandbox


class SettlementQueue(Protocol):
    """What a running worker needs of admission's queue (admission.queue.SyncQueue, which
    `runworker` hands in): the Redis client for its clock, a call's grant facts, and the
    settle script (which may hand back the next call it granted on this worker)."""

    client: Any

    def grant_of(self, *, worker_id: str, entry_id: str) -> dict[str, Any] | None: ...

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
    ) -> tuple[bool, HandedCall | None]: ...


class HandedCall(Protocol):
    """admission.queue.Handed: the next call's Celery message and its grant facts."""

    @property
    def message(self) -> str: ...

    @property
    def entry_id(self) -> str: ...

    @property
    def grant(self) -> dict[str, Any] | None: ...


# A ticket is remembered until this long after its call's exec deadline (which the worker
# reads on its own clock, corrected by the Redis clock at every heartbeat): a redelivery
# after that is dropped as expired anyway.
TICKET_MARGIN_S = 120.0


class Tickets:
    """The fencing tickets this incarnation has run, each remembered until its call's
    deadline has long passed.

    A look forgets from the oldest end and stops at the first ticket still remembered: O(1)
    amortized however many are remembered. (A scan of them all, as before, cost 7 ms a call
    with an hour's 360,000 tickets at 100 calls/s, on the path from one call's end to the next
    one's start.) A ticket is never forgotten before its time: one behind a longer-lived
    older one waits for it, which only keeps it longer. Calls' budgets are alike (30 s for a
    read, the command's timeout plus 5 s), so that is seldom long.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.remembered: set[int] = set()
        self.order: deque[tuple[float, int]] = deque()  # (when it may be forgotten, ticket)
        # Tickets a look has compared with the clock, in all: what makes its cost testable.
        self.examined = 0

    def first_sight(self, ticket: int, remember_s: float) -> bool:
        """True the first time a ticket is seen (then remembered for `remember_s`); a
        redelivery returns False."""
        now = self.clock()
        while self.order:
            self.examined += 1
            forget_at, oldest = self.order[0]
            if forget_at > now:
                break
            self.order.popleft()
            self.remembered.discard(oldest)
        if ticket in self.remembered:
            return False
        self.remembered.add(ticket)
        self.order.append((now + remember_s, ticket))
        return True

    def clear(self) -> None:
        self.remembered.clear()
        self.order.clear()

    def __len__(self) -> int:
        return len(self.remembered)


def _set_event() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


@dataclass
class WorkerState:
    worker_id: str
    incarnation: str
    workspaces: dict[str, WorkspaceRoot]
    lanes: bool
    queue: SettlementQueue
    # HMAC key shared with the API alone: SHA-256 of this worker's token (workspaces/signing.py).
    signing_key: bytes
    # None only when started with --allow-unsandboxed-commands on a host that cannot sandbox.
    sandbox: Sandbox | None = None
    # Processes for search_text and list_files, one per slot (None: run in the slot's thread).
    walkers: TreeProcesses | None = None
    # Redis clock minus this host's clock, in ms: deadlines are on Redis's clock.
    clock_offset_ms: float = 0.0
    seen: Tickets = field(default_factory=Tickets)
    dropped: dict[str, int] = field(
        default_factory=lambda: {"stale": 0, "duplicate": 0, "expired": 0}
    )
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Set when the worker starts its warm shutdown: a settling thread then takes no next call
    # (those go to the Celery queue, which is no longer consumed, and end at their deadline).
    stopping: threading.Event = field(default_factory=threading.Event)
    # Set while Celery's consumer is connected to the broker and takes this worker's queue
    # (workspaces/runtime/consuming.py): a worker whose registration was lost registers again
    # only then, or its calls would be granted to a queue nobody reads.
    consuming: threading.Event = field(default_factory=threading.Event)
    # Clear while the worker registers again (a new incarnation on its way): the API grants
    # for the new incarnation as soon as it has written it, before the worker has heard the
    # answer, so an assignment for an incarnation the worker has not adopted yet waits for the
    # answer instead of being dropped as stale (its slot would then stay taken until its exec
    # deadline, with nobody to settle it).
    registered: threading.Event = field(default_factory=_set_event)

    def redis_now_ms(self) -> float:
        return time.time() * 1000 + self.clock_offset_ms

    def sync_clock(self) -> None:
        before = time.time()
        seconds, micros = self.queue.client.time()
        after = time.time()
        self.clock_offset_ms = seconds * 1000 + micros / 1000 - (before + after) * 500

    def first_sight(self, ticket: int, remaining_ms: float) -> bool:
        """True the first time this incarnation sees a ticket whose call has `remaining_ms`
        left; a redelivery returns False."""
        with self.lock:
            return self.seen.first_sight(ticket, max(remaining_ms, 0) / 1000 + TICKET_MARGIN_S)

    def reincarnate(self, incarnation: str) -> None:
        """Switch to a new incarnation; tickets restart with it, so the seen set does too."""
        with self.lock:
            self.incarnation = incarnation
            self.seen.clear()

    def count_drop(self, reason: str) -> None:
        with self.lock:
            self.dropped[reason] = self.dropped.get(reason, 0) + 1


_current: WorkerState | None = None


def install(state: WorkerState | None) -> None:
    global _current
    _current = state


def current() -> WorkerState | None:
    return _current
