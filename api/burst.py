"""One credential's burst, at about the cost of one call (contract §2.8).

Every call of a burst used to take the whole way through the event loop: Django's request,
DRF, the policy, the rate-limit script, the queue script, the row (2 to 6 ms of CPU here). A burst
of 320 held the loop for over a second, so its own refusals took that long and every other
tenant's calls waited behind it. The edge (config/asgi.py) now sends the execute endpoint's
POSTs through two things first:

* **The gate.** Of one credential's calls (one Authorization header), at most
  `SLUICE_ADMITTING_PER_KEY` are on their way into admission at once; the others wait their
  turn in arrival order, which costs a future, not CPU. A call leaves the gate once it is in its
  worker's queue, granted or waiting (`Call.on_entered`), or once it is answered: so a waiting
  call holds no share, and another credential's call never waits behind this one's.
* **The memory of refusals.** When the view answers a refusal that holds
  (`Refusal.holds_until`: a rate-limit refusal until the bucket could let the call pass or its
  whole seconds tick over; a full queue for `SLUICE_FULL_QUEUE_HOLD_MS`), the answer is kept,
  keyed by credential, worker header and operation. A call that comes through the gate while
  it holds gets that same answer (status, headers and body as the view sent them) and a
  completion row of its own, without Django's view, DRF, Redis or Postgres.

What is answered from memory is what the view would answer: the request must be valid (the
view's own parser reads it), its key known to the caller cache (checked before its body was
read), the process not stopping. A rate-limit refusal is exact: the bucket cannot let that
call pass before its time (other operations' calls may still take units meanwhile, so the
seconds it names can fall short of the truth, never the refusal). A full queue is taken as full
for a moment: a place that frees within it goes to another caller's call, or to this caller's
first call after it. A call carrying a request id or a workspaceInstanceId is not refused for a
full queue from memory (the view checks those first and could answer otherwise).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from admission import deadlines, shutdown
from admission.completion import CompletionDraft
from admission.services import call_budgets, isolation_key_hash
from api.workspace_tools import (
    ON_ENTERED,
    READ_AT_EDGE,
    Holding,
    ReadCall,
    emit_row,
    execute_abandoned,
    read_call,
)

EXECUTE_PATH = "/v1/workspace-tools/execute"
# Refusals remembered at most (a burst needs one per credential, worker and operation).
MEMO_MAX = 4096
# The answer's headers the server adds itself; a remembered answer gets its own.
_SERVER_HEADERS = frozenset({"date", "server", "content-length"})


class Gate:
    """Per credential, at most `width` calls pass at once; the rest wait in arrival order."""

    def __init__(self, width: Callable[[], int]) -> None:
        self._width = width
        self._passing: dict[bytes, int] = {}
        self._waiting: dict[bytes, deque[asyncio.Future[None]]] = {}

    async def enter(self, credential: bytes) -> Passage:
        passing = self._passing.get(credential, 0)
        if passing < self._width() and not self._waiting.get(credential):
            self._passing[credential] = passing + 1
            return Passage(self, credential)
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(credential, deque()).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._leave(credential)  # handed a place just as it was cancelled: passed on
            else:
                line = self._waiting[credential]
                line.remove(turn)
                if not line:
                    del self._waiting[credential]
            raise
        return Passage(self, credential)

    def passing(self, credential: bytes) -> int:
        return self._passing.get(credential, 0)

    def waiting(self, credential: bytes) -> int:
        return len(self._waiting.get(credential, ()))

    def _leave(self, credential: bytes) -> None:
        line = self._waiting.get(credential)
        while line:
            turn = line.popleft()
            if not line:
                del self._waiting[credential]
            if not turn.done():
                turn.set_result(None)  # the place goes to the next in line
                return
            line = self._waiting.get(credential)
        left = self._passing[credential] - 1
        if left:
            self._passing[credential] = left
        else:
            del self._passing[credential]


@dataclass
class Passage:
    gate: Gate
    credential: bytes
    left: bool = False

    def release(self) -> None:
        if not self.left:
            self.left = True
            self.gate._leave(self.credential)


MemoKey = tuple[bytes, str, str]


@dataclass(frozen=True)
class Remembered:
    status: int
    headers: list[tuple[str, str]]
    content: bytes
    holding: Holding


@dataclass
class Memo:
    """The refusals that hold, by (credential, worker header, operation). When one has run out,
    the first call to find it asks the view again and the others with its key wait for that
    answer instead of all asking at once (one view per moment, not one per gate place)."""

    now: Callable[[], float] = time.monotonic
    held: dict[MemoKey, Remembered] = field(default_factory=dict)
    asking: dict[MemoKey, asyncio.Future[None]] = field(default_factory=dict)

    async def recall(self, key: MemoKey) -> Remembered | None:
        """The refusal that holds for `key`, or None: then the caller asks the view, `learn`s
        its answer and says when it has `asked`."""
        while True:
            remembered = self.held.get(key)
            if remembered is not None and remembered.holding.until > self.now():
                return remembered
            asked = self.asking.get(key)
            if asked is None:
                if remembered is not None:
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
            if key not in self.held and len(self.held) >= MEMO_MAX:
                self._forget_expired()
                if len(self.held) >= MEMO_MAX:
                    del self.held[next(iter(self.held))]  # the oldest
            self.held[key] = Remembered(
                status=response.status_code,
                headers=[(k, v) for k, v in response.items() if k.lower() not in _SERVER_HEADERS],
                content=response.content,
                holding=holding,
            )
        else:
            self.held.pop(key, None)

    def asked(self, key: MemoKey) -> None:
        """A call that asked the view for `key` has ended (answered or not): the calls waiting
        for its answer look again, and one of them asks if nothing holds. (Waking them when
        another call of the key ends is harmless: they only look again.)"""
        asked = self.asking.pop(key, None)
        if asked is not None and not asked.done():
            asked.set_result(None)

    def _forget_expired(self) -> None:
        now = self.now()
        for key in [k for k, r in self.held.items() if r.holding.until <= now]:
            del self.held[key]


GATE = Gate(lambda: settings.SLUICE_ADMITTING_PER_KEY)
MEMO = Memo()


def gated(request: HttpRequest) -> bool:
    """The calls that go through the gate: the execute endpoint's POSTs."""
    return request.method == "POST" and request.path_info == EXECUTE_PATH


async def through(
    request: HttpRequest,
    credential: bytes,
    view: Callable[[HttpRequest], Awaitable[HttpResponseBase]],
) -> HttpResponseBase:
    """The call's answer: from memory when a refusal of its kind holds, else from `view`
    (`request` is an execute POST whose body was read whole)."""
    read = _read(request)
    parsed = read.parsed if read is not None else None
    operation = read.draft.operation if read is not None else ""
    key = (credential, request.headers.get("X-LibreChat-Code-Worker-ID") or "", operation)
    viewed = False
    try:
        passage = await GATE.enter(credential)
    except asyncio.CancelledError:
        execute_abandoned(request)  # gone while it waited for its turn: its row says so
        raise
    try:
        remembered = await MEMO.recall(key) if parsed is not None else None
        if read is not None and remembered is not None and _applies(remembered, read):
            return _replayed(remembered, read)
        viewed = True
        token = ON_ENTERED.set(passage.release)
        try:
            response = await view(request)
        finally:
            ON_ENTERED.reset(token)
        if parsed is not None:
            MEMO.learn(key, response)
        return response
    except asyncio.CancelledError:
        if not viewed:
            execute_abandoned(request)
        raise
    finally:
        passage.release()
        if viewed and parsed is not None:
            MEMO.asked(key)


def _read(request: HttpRequest) -> ReadCall | None:
    """The call read once, here, for the view to take over (READ_AT_EDGE); None if reading
    it failed unforeseen, which the view then meets and answers itself."""
    try:
        read = read_call(request, CompletionDraft())
    except Exception:
        return None
    request.META[READ_AT_EDGE] = read
    return read


def _applies(remembered: Remembered, read: ReadCall) -> bool:
    """Whether the view would answer this call the remembered way now."""
    assert read.parsed is not None
    if shutdown.stopping():
        return False  # the view answers it SHUTTING_DOWN first
    if remembered.holding.refusal.code == "WORKER_QUEUE_FULL":
        # The view checks a request id and an instance binding before the queue.
        return read.parsed.request_id is None and not read.parsed.body.get("workspaceInstanceId")
    return True


def _replayed(remembered: Remembered, read: ReadCall) -> HttpResponse:
    """The remembered answer, and this call's own row: what the view would have written."""
    holding, draft = remembered.holding, read.draft
    assert read.parsed is not None
    response = HttpResponse(remembered.content, status=remembered.status)
    for name, value in remembered.headers:
        response[name] = value
    queue_ms, exec_ms = call_budgets(read.parsed.body, read.parsed.queue_wait_ms, holding.policy)
    draft.describe(
        tenant_hash=holding.tenant_hash,
        principal_hash=holding.principal_hash,
        worker_id=holding.worker_id,
        isolation_key_hash=isolation_key_hash(holding.worker_id, read.parsed.body),
        deadline_budget_ms=deadlines.deadline_budget_ms(queue_ms=queue_ms, exec_ms=exec_ms),
    )
    draft.answered(remembered.status, holding.refusal)
    emit_row(draft)
    return response
