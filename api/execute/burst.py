"""One credential's burst of execute calls at about the cost of one (contract §2.8).

Each call through the view costs the event loop 2 to 6 ms (Django's request, DRF, the policy,
the rate-limit and queue scripts), so a burst of hundreds held the loop for seconds: its own
refusals came late and every other tenant's calls waited behind it. Two things keep a burst
cheap, both owned by the edge (`Burst`):

* **The gate**: per credential, at most `SLUICE_ADMITTING_PER_KEY` calls are on their way into
  admission at once; the others wait their turn in arrival order (a future, not CPU). A call
  leaves the gate once it is in its worker's queue (the `entered` hook) or answered, so a
  waiting call holds no place and another credential's calls never wait behind it.
* **Refusals that hold**: when the view answers a refusal that holds for a while
  (`Refusal.holds_until`: a rate limit until the bucket could let the call pass, a full queue
  for `SLUICE_FULL_QUEUE_HOLD_MS`), the answer is kept per credential, worker and operation.
  A call of that key that arrives, or reaches the front of the gate, while it holds gets the
  same status, headers and body and a completion row of its own, without Django's request,
  DRF, Redis or Postgres. When it has run out, one call asks the view again and the others of
  its key wait for that answer.

* **Calls in flight**: per credential and worker, the calls the edge has read and not yet
  answered. Each holds, or is about to take, a place in that worker's queue, whose limit counts
  running calls too; so a call that arrives with that many of the same credential's calls to
  the same worker ahead of it finds the queue full by the time its turn comes. It is refused
  WORKER_QUEUE_FULL before its rate limit: at the edge while the limit a view read is at most
  `BEYOND_HOLD_S` old, else by its view as soon as the policy is read (the `decided` hook). A
  burst's refusals thus leave as its calls are read, not after the calls ahead have gone
  through admission.

Only an answer the view would give that call now is repeated: a valid call (the edge read it
as Django would: `api/execute/reading.py`), a process not stopping, and for a full queue a
call without a request id or instance binding (the view checks those first).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from django.http import HttpResponse, HttpResponseBase

from admission import deadlines, refusals, shutdown
from admission.completion import CompletionDraft, emit_row
from admission.policy import Policy
from admission.refusals import Refusal
from admission.services import call_budgets, isolation_key_hash
from api.execute.reading import ReadCall
from api.execute.view import Holding, rendered_refusal

# Refusals kept at most (a burst needs one per credential, worker and operation).
MEMO_MAX = 4096
# The answer's headers the server adds itself; a repeated answer gets its own.
_SERVER_HEADERS = frozenset({"date", "server", "content-length"})

# How long the queue limit a view read answers, at the edge, the calls beyond it.
BEYOND_HOLD_S = 1.0

MemoKey = tuple[bytes, str, str]


@dataclass(frozen=True)
class Answer:
    """An answer as the view sent it (status, the ASGI headers, the body), to send again."""

    status: int
    headers: list[tuple[bytes, bytes]]
    content: bytes

    @classmethod
    def of(cls, response: HttpResponse) -> Answer:
        return cls(
            status=response.status_code,
            headers=[
                (k.encode("ascii"), v.encode("latin-1"))
                for k, v in response.items()
                if k.lower() not in _SERVER_HEADERS
            ],
            content=response.content,
        )

    async def send(self, send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        """The answer, as Django's handler would have sent the view's response."""
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.content, "more_body": False})


class Gate:
    """Per credential, at most `width()` calls pass at once; the rest wait in arrival order."""

    def __init__(self, width: Callable[[], int]) -> None:
        self._width = width
        self._passing: dict[bytes, int] = {}
        self._waiting: dict[bytes, deque[asyncio.Future[None]]] = {}

    async def enter(self, credential: bytes) -> Passage:
        passing = self._passing.get(credential, 0)
        if passing < self._width() and not self._waiting.get(credential):
            self._passing[credential] = passing + 1
            return Passage(self, credential)
        turn = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(credential, deque()).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._leave(credential)  # handed a place just as it was cancelled: passed on
            else:
                self._drop(credential, turn)
            raise
        return Passage(self, credential)

    def passing(self, credential: bytes) -> int:
        return self._passing.get(credential, 0)

    def waiting(self, credential: bytes) -> int:
        return len(self._waiting.get(credential, ()))

    def _drop(self, credential: bytes, turn: asyncio.Future[None]) -> None:
        line = self._waiting.get(credential)
        if line is not None and turn in line:
            line.remove(turn)
            if not line:
                del self._waiting[credential]

    def _leave(self, credential: bytes) -> None:
        """A place frees: it goes to the next call still waiting, else the count drops."""
        line = self._waiting.get(credential)
        while line:
            turn = line.popleft()
            if not line:
                del self._waiting[credential]
            if not turn.done():
                turn.set_result(None)
                return
        count_down(self._passing, credential)


@dataclass
class Passage:
    """A call's place at the gate, given back once."""

    gate: Gate
    credential: bytes
    left: bool = False

    def release(self) -> None:
        if not self.left:
            self.left = True
            self.gate._leave(self.credential)


class Remembered:
    """A refusal that holds, and its answer: as the view sent it, or made from the refusal
    when first sent (`rendered` None: most limits learned are never sent)."""

    def __init__(self, holding: Holding, rendered: Answer | None = None) -> None:
        self.holding = holding
        self.rendered = rendered

    @property
    def answer(self) -> Answer:
        if self.rendered is None:
            self.rendered = Answer.of(rendered_refusal(self.holding.refusal))
        return self.rendered


@dataclass
class Memo:
    """The refusals that hold, by (credential, worker header, operation). When one has run out,
    the first call to find it asks the view again and the others with its key wait for that
    answer instead of all asking at once."""

    now: Callable[[], float] = time.monotonic
    held: dict[MemoKey, Remembered] = field(default_factory=dict)
    asking: dict[MemoKey, asyncio.Future[None]] = field(default_factory=dict)

    def holding(self, key: MemoKey) -> Remembered | None:
        """The refusal that holds for `key` now, if any (never waits, never asks)."""
        remembered = self.held.get(key)
        if remembered is not None and remembered.holding.until > self.now():
            return remembered
        return None

    async def recall(self, key: MemoKey) -> Remembered | None:
        """The refusal that holds for `key`, or None: then the caller asks the view, `learn`s
        its answer and says when it has `asked`."""
        while True:
            remembered = self.holding(key)
            if remembered is not None:
                return remembered
            asked = self.asking.get(key)
            if asked is None:
                if key in self.held:
                    # Ran out: this call asks again; the next ones wait for what it learns.
                    self.asking[key] = asyncio.get_running_loop().create_future()
                return None
            await asyncio.shield(asked)

    def learn(self, key: MemoKey, response: HttpResponseBase) -> None:
        holding = getattr(response, "holds", None)
        if (
            isinstance(response, HttpResponse)
            and isinstance(holding, Holding)
            and holding.until > self.now()
        ):
            self._keep(key, Remembered(holding, Answer.of(response)))
        else:
            self.held.pop(key, None)

    def asked(self, key: MemoKey) -> None:
        """The call that asked the view for `key` has ended or entered its queue: the calls
        waiting for its answer look again, and one of them asks if nothing holds."""
        asked = self.asking.pop(key, None)
        if asked is not None and not asked.done():
            asked.set_result(None)

    def _keep(self, key: MemoKey, remembered: Remembered) -> None:
        if key not in self.held and len(self.held) >= MEMO_MAX:
            now = self.now()
            for old in [k for k, r in self.held.items() if r.holding.until <= now]:
                del self.held[old]
            if len(self.held) >= MEMO_MAX:
                del self.held[next(iter(self.held))]  # the oldest
        self.held[key] = remembered


class CallsInFlight:
    """Per pair (credential, worker header): the calls read and not yet answered, and the refusal
    of a call beyond the worker's queue limit as a view last read that limit."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self.now = now
        self.in_flight: dict[tuple[bytes, str], int] = {}
        self.limits: dict[tuple[bytes, str], Remembered] = {}
        # Per pair: set once a view has read the policy again for the calls beyond an old
        # limit.
        self.reading: dict[tuple[bytes, str], asyncio.Future[None]] = {}

    def ahead(self, key: MemoKey | None) -> int:
        return self.in_flight.get(key[:2], 0) if key is not None else 0

    def arrived(self, key: MemoKey | None) -> None:
        if key is not None:
            self.in_flight[key[:2]] = self.in_flight.get(key[:2], 0) + 1

    def left(self, key: MemoKey | None) -> None:
        if key is not None:
            count_down(self.in_flight, key[:2])

    def beyond(self, key: MemoKey | None, ahead: int, *, fresh: bool = True) -> Remembered | None:
        """The refusal of a call with `ahead` calls of its pair before it, when they fill the
        queue by the limit a view read at most BEYOND_HOLD_S ago (any time, not `fresh`)."""
        limit = self.limits.get(key[:2]) if key is not None else None
        if limit is None or (fresh and limit.holding.until <= self.now()):
            return None
        return limit if ahead >= limit.holding.policy.worker_queue_limit else None

    def fresh(self, key: MemoKey) -> bool:
        limit = self.limits.get(key[:2])
        return limit is not None and limit.holding.until > self.now()

    async def read_again(self, key: MemoKey) -> asyncio.Future[None] | None:
        """For a call beyond an old limit: waits while another such call's view reads the
        policy again. A future: the limit is still old, and this call's view is to read it
        (`read` once it has)."""
        while (reading := self.reading.get(key[:2])) is not None:
            await asyncio.shield(reading)
        if self.fresh(key):
            return None
        reading = self.reading[key[:2]] = asyncio.get_running_loop().create_future()
        return reading

    def read(self, key: MemoKey, reading: asyncio.Future[None] | None = None) -> None:
        """The pair's policy was read (or `reading`, one call's reading, ended): the calls
        waiting look again."""
        if reading is None or self.reading.get(key[:2]) is reading:
            reading = self.reading.pop(key[:2], None)
        if reading is not None and not reading.done():
            reading.set_result(None)

    def learn(self, key: MemoKey, draft: CompletionDraft, policy: Policy) -> Refusal:
        """A view read the pair's policy: the refusal of a call beyond its limit, for the
        next BEYOND_HOLD_S."""
        refusal = refusals.queue_full(
            draft.worker_id, policy.worker_queue_limit, holds_until=self.now() + BEYOND_HOLD_S
        )
        holding = Holding(
            refusal,
            draft.tenant_hash,
            draft.principal_hash,
            draft.worker_id,
            policy,
            flow_hash=draft.flow_hash,
            worker_confirmed=draft.worker_confirmed,
        )
        if key[:2] not in self.limits and len(self.limits) >= MEMO_MAX:
            del self.limits[next(iter(self.limits))]  # the oldest
        self.limits[key[:2]] = Remembered(holding)
        self.read(key)  # the calls waiting for it look again now, not after this view
        return refusal


@dataclass
class Arrival:
    """A call counted in flight from the moment the edge read it (not from when its task
    first runs, which on a loop busy with a burst is hundreds of arrivals later), and how many
    calls of its pair were ahead of it then. Counted out once."""

    calls: CallsInFlight
    key: MemoKey | None
    ahead: int
    # Whether a full queue may answer it before the view's own checks (`queue_checked_first`).
    countable: bool
    # The calls ahead fill the queue by the last limit read: a full queue answers it, if any.
    beyond: bool = False
    gone: bool = False

    def leave(self) -> None:
        if not self.gone:
            self.gone = True
            self.calls.left(self.key)


@dataclass
class GateHooks:
    """A call's AdmissionHooks. Once its policy is read, the queue limit is learned, and the
    call is refused if the calls of its pair ahead of it fill the queue. Once it is in its worker's
    queue, it gives its gate place to the next call, and the calls of its key waiting for its
    answer go on (it is no refusal)."""

    burst: Burst
    passage: Passage | None
    arrival: Arrival
    read: ReadCall | None
    asking: bool
    # Refused by `decided`: its answer is for the calls beyond, not one for the memo.
    beyond: bool = False

    def decided(self, policy: Policy) -> Refusal | None:
        key = self.arrival.key
        if key is None or self.read is None:
            return None
        refusal = self.burst.in_flight.learn(key, self.read.draft, policy)
        self.beyond = self.arrival.countable and self.arrival.ahead >= policy.worker_queue_limit
        return refusal if self.beyond else None

    def entered(self) -> None:
        if self.passage is not None:
            self.passage.release()
        if self.asking and self.arrival.key is not None:
            self.burst.memo.asked(self.arrival.key)


View = Callable[[GateHooks | None], Awaitable[HttpResponseBase]]


class Burst:
    """The gate, the refusals that hold and the calls in flight, for one process's edge."""

    def __init__(self, width: Callable[[], int]) -> None:
        self.gate = Gate(width)
        self.memo = Memo()
        self.in_flight = CallsInFlight()

    def arrive(self, read: ReadCall | None, credential: bytes) -> Answer | Arrival:
        """The answer held for this call as it arrives (its row written), or its `Arrival`,
        counted in flight, for `through`."""
        key = memo_key(read, credential)
        ahead, countable = self.in_flight.ahead(key), queue_checked_first(read)
        beyond = countable and self.in_flight.beyond(key, ahead, fresh=False) is not None
        arrival = Arrival(self.in_flight, key, ahead, countable, beyond)
        answer = self._held(read, arrival)
        if answer is not None:
            return answer
        self.in_flight.arrived(key)
        return arrival

    def _held(self, read: ReadCall | None, arrival: Arrival) -> Answer | None:
        """The answer that holds for this call now, its row written; None: a view answers."""
        key = arrival.key
        if key is None or read is None:
            return None
        if arrival.beyond:
            remembered = self.in_flight.beyond(key, arrival.ahead)
        else:
            remembered = self.memo.holding(key)
        if remembered is None or not applies(remembered, read):
            return None
        replayed(remembered, read)
        return remembered.answer

    async def through(
        self,
        arrival: Arrival,
        read: ReadCall | None,
        credential: bytes,
        view: View,
        abandoned: Callable[[], None],
    ) -> HttpResponseBase | Answer:
        """The call's answer: a refusal that holds for it (its row written), else its view's.
        A call beyond an old limit needs only the limit read again; the others wait
        their turn at the gate. `abandoned` writes the row of a call whose client went away
        while it waited."""
        passage, reading, asking = None, None, False
        try:
            if arrival.beyond and arrival.key is not None:
                reading = await self.in_flight.read_again(arrival.key)
            else:
                passage, asking = await self._turn(arrival, credential)
        except asyncio.CancelledError:
            arrival.leave()
            abandoned()
            raise
        hooks = GateHooks(self, passage, arrival, read, asking)
        try:
            return await self._answered(arrival, read, view, hooks)
        finally:
            if passage is not None:
                passage.release()
            arrival.leave()
            if arrival.key is not None and reading is not None:
                self.in_flight.read(arrival.key, reading)
            if arrival.key is not None and asking:
                self.memo.asked(arrival.key)

    async def _answered(
        self, arrival: Arrival, read: ReadCall | None, view: View, hooks: GateHooks
    ) -> HttpResponseBase | Answer:
        answer = self._held(read, arrival)
        if answer is not None:
            return answer
        response = await view(hooks)
        if arrival.key is not None and not hooks.beyond and not arrival.beyond:
            self.memo.learn(arrival.key, response)
        return response

    async def _turn(self, arrival: Arrival, credential: bytes) -> tuple[Passage, bool]:
        """A place at the gate, once no other call of its key is asking the view; and whether
        this call is the one to ask now (its key's held refusal ran out)."""
        passage = await self.gate.enter(credential)
        if arrival.key is None:
            return passage, False
        try:
            remembered = await self.memo.recall(arrival.key)
        except asyncio.CancelledError:
            passage.release()
            raise
        return passage, remembered is None and arrival.key in self.memo.asking


def count_down(counts: dict[Any, int], key: Any) -> None:
    """One less for `key`; its entry goes with its last one (the counts stay bounded)."""
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


def memo_key(read: ReadCall | None, credential: bytes) -> MemoKey | None:
    if read is None or read.parsed is None:
        return None
    return (credential, read.parsed.worker_id or "", read.draft.operation)


def queue_checked_first(read: ReadCall | None) -> bool:
    """Whether the view would come to the call's queue before any other check of its own: not
    for a request id or an instance binding, which it checks first."""
    if read is None or read.parsed is None:
        return False
    return read.parsed.request_id is None and not read.parsed.body.get("workspaceInstanceId")


def applies(remembered: Remembered, read: ReadCall) -> bool:
    """Whether the view would answer this call the remembered way now."""
    if shutdown.stopping():
        return False  # the view answers it SHUTTING_DOWN first
    if remembered.holding.refusal.code == "WORKER_QUEUE_FULL":
        return queue_checked_first(read)
    return True


def replayed(remembered: Remembered, read: ReadCall) -> None:
    """This call's own row for the remembered answer: what the view would have written."""
    holding, draft = remembered.holding, read.draft
    assert read.parsed is not None
    queue_ms, exec_ms = call_budgets(read.parsed.body, read.parsed.queue_wait_ms, holding.policy)
    draft.describe(
        tenant_hash=holding.tenant_hash,
        principal_hash=holding.principal_hash,
        flow_hash=holding.flow_hash,
        worker_id=holding.worker_id,
        isolation_key_hash=isolation_key_hash(holding.worker_id, read.parsed.body),
        deadline_budget_ms=deadlines.deadline_budget_ms(queue_ms=queue_ms, exec_ms=exec_ms),
    )
    if holding.worker_confirmed:
        draft.worker_found()
    draft.answered(remembered.answer.status, holding.refusal)
    emit_row(draft)
