"""One credential's burst of execute calls at about the cost of one (contract §2.8).

A call through the view costs the event loop several milliseconds (Django's request, DRF, the
policy, the rate-limit and queue scripts), so an unchecked burst would hold the loop, and
every other tenant's calls, for seconds. The edge's `Burst` keeps it cheap three ways:

* **The gate** (`Gate`): per credential, at most `SLUICE_ADMITTING_PER_KEY` calls are on their
  way into admission at once; the rest wait in arrival order on a future, not on the CPU. A
  call gives its place back once it is in its worker's queue (the `entered` hook) or answered,
  so a call waiting in the queue holds no place.
* **Refusals that hold** (`Memo`): a refusal with `Refusal.holds_until` (a rate limit until the
  bucket could let the call pass, a full queue for `SLUICE_FULL_QUEUE_HOLD_MS`) is remembered
  per credential, worker and operation. While it holds, a call with that key gets the same
  status, headers and body, and a completion row of its own, without Django, DRF, Redis or
  Postgres. Once it runs out, one call asks the view again and the others wait for its answer.
* **Calls in flight** (`CallsInFlight`): per credential and worker, the calls read and not yet
  answered. Each holds, or will take, a place in that worker's queue, whose limit counts
  running calls too; so a call that arrives with a queue limit's worth of them ahead of it
  ("beyond" the limit, in this module) is refused WORKER_QUEUE_FULL before its rate limit: at
  the edge while the limit a view last read is under `BEYOND_HOLD_S` old, else by its own view
  once the policy is read (the `decided` hook).

An answer is repeated only where the view would give that call the same one now: the call is
valid (read as Django would: `api/execute/reading.py`), the process is not stopping, and for a
full queue the call names no request id or instance binding (the view checks those first).
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

# How long the edge refuses calls beyond the queue limit by the limit a view last read.
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
    """A refusal that holds, and its answer: the view's own, or rendered from the refusal the
    first time it is sent (`rendered` None: most queue limits `CallsInFlight` records are never
    sent)."""

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
        # Per pair: a future while one call's view reads an expired limit again; the other
        # calls beyond it wait on that instead of each asking their own view.
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
        queue by the limit a view last read: under BEYOND_HOLD_S ago, or at any time when not
        `fresh`."""
        limit = self.limits.get(key[:2]) if key is not None else None
        if limit is None or (fresh and limit.holding.until <= self.now()):
            return None
        return limit if ahead >= limit.holding.policy.worker_queue_limit else None

    def fresh(self, key: MemoKey) -> bool:
        limit = self.limits.get(key[:2])
        return limit is not None and limit.holding.until > self.now()

    async def read_again(self, key: MemoKey) -> asyncio.Future[None] | None:
        """For a call beyond a limit read BEYOND_HOLD_S or more ago: waits while another such
        call's view reads the policy again. A future: the limit is still stale and this call's
        view is to read it (then `read`); None: another call's view has read it meanwhile."""
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
        """A view read the pair's policy: record, for the next BEYOND_HOLD_S, the refusal of
        a call beyond its queue limit, and return it."""
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
    """A call counted in flight from the moment the edge read it, and how many calls of its
    pair were ahead of it then. Not from when its task first runs: on a loop busy with a burst
    that is many arrivals later, and those arrivals would not see it. Counted out once."""

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
    """A call's AdmissionHooks. Once its policy is read, the queue limit is recorded and the
    call is refused if the calls of its pair ahead of it fill the queue. Once it is in its
    worker's queue, it gives its gate place to the next call, and the calls of its key waiting
    for its answer go on (entering is no refusal to repeat)."""

    burst: Burst
    passage: Passage | None
    arrival: Arrival
    read: ReadCall | None
    asking: bool
    # Refused by `decided`: a queue-limit answer, kept out of the Memo.
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
        A call beyond a stale limit needs only the limit read again; the others wait their
        turn at the gate. `abandoned` writes the row of a call whose client went away
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
