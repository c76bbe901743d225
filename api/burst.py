"""One credential's burst, at about the cost of one call (contract §2.8).

Every call of a burst used to take the whole way through the event loop: Django's request,
DRF, the policy, the rate-limit script, the queue script, the row (2 to 6 ms of CPU here). A burst
of 320 held the loop for over a second, so its own refusals took that long and every other
tenant's calls waited behind it. The edge (config/asgi.py) now reads an execute POST itself,
from the ASGI scope and its body (`read_at_edge`), and sends it through two things before
Django makes a request of it:

* **The gate.** Of one credential's calls (one bearer key, as authentication reads it), at most
  `SLUICE_ADMITTING_PER_KEY` are on their way into admission at once; the others wait their
  turn in arrival order, which costs a future, not CPU. A call leaves the gate once it is in its
  worker's queue, granted or waiting (`Call.on_entered`), or once it is answered: so a waiting
  call holds no share, and another credential's call never waits behind this one's. A call
  still in line when a refusal it would get is learned (below) leaves the line with it at once
  (`Gate.excuse`), not after the views ahead of it: with several API processes, another
  process may have filled the queue.
* **The memory of refusals.** When the view answers a refusal that holds
  (`Refusal.holds_until`: a rate-limit refusal until the bucket could let the call pass or its
  whole seconds tick over; a full queue for `SLUICE_FULL_QUEUE_HOLD_MS`), the answer is kept,
  keyed by credential, worker header and operation. A call that arrives while it holds, or
  comes through the gate while it holds, gets that same answer (status, headers and body as
  the view sent them, sent straight to the server) and a completion row of its own, without
  Django's request, view or response, DRF, Redis or Postgres. Such an answer costs the event
  loop about what uvicorn itself spends on the connection (docs/benchmarks.md).

* **The lines.** Per credential and worker, the process counts its calls from the moment the
  edge read them to their answer (`Lines`, `at_edge`): waiting at the gate, in admission,
  queued or running, each holds or is about to take a place in that worker's queue, whose
  limit counts running calls too.
  A call that arrives when that count has reached the limit (as a view last read it for the
  line) is past the queue by the time its turn would come: it does not wait at the gate.
  When that limit is current (a view read it within the last second, or read it under the
  policy version some call of this process found within the last second: in a burst, the
  calls ahead read it as they go through), the call is refused WORKER_QUEUE_FULL as it
  arrives, with an answer made here as the view makes it (`rendered_refusal`), kept for the
  next such calls for that second (a memory of their own: the calls ahead are never refused
  by it). Otherwise (the limit may have changed since) the first such call goes to the
  view, which reads the policy and refuses it before its rate limit, without entering
  (`Call.in_flight_ahead`); the next ones wait only until some view of the line has read the
  policy, then get the answer made here (each re-checked against the limit read). So a
  burst's refusals leave as its calls are read: not after the calls ahead have gone through
  admission (31 view passes of 2.5 ms each for a queue of 32), nor after one view pass of
  their own, which on a loop busy with the burst took 100 ms (each of its awaits waits
  behind every callback then ready).

A POST past the process's or its credential's share of calls in flight (config/asgi.py) is
answered at the edge too, from its first one on: the answer names no caller, so the edge makes
it as the view makes it (`rendered_refusal`), and the row is the call's own.

What is answered from memory is what the view would answer: the request must be valid (the
view's own parser reads it, from headers the edge reads exactly as Django would, or the edge
leaves the request to Django), its key known to the caller cache (checked before its body was
read), the process not stopping. A rate-limit refusal is exact: the bucket cannot let that
call pass before its time (other operations' calls may still take units meanwhile, so the
seconds it names can fall short of the truth, never the refusal). A full queue is taken as full
for a moment: a place that frees within it goes to another caller's call, or to this caller's
first call after it. A call carrying a request id or a workspaceInstanceId is not refused for a
full queue from memory (the view checks those first and could answer otherwise).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.http import HttpResponse, HttpResponseBase
from django.http.request import split_domain_port, validate_host
from django.utils.http import parse_header_parameters

from admission import deadlines, refusals, shutdown
from admission.completion import CompletionDraft, emit_row
from admission.policy import Policy, version_read, version_seen
from admission.services import call_budgets, isolation_key_hash
from api.workspace_tools import (
    BEYOND_HOLD_S,
    PASSING,
    Holding,
    Passing,
    ReadCall,
    describe_headers,
    read_parts,
    rendered_refusal,
)

EXECUTE_PATH = "/v1/workspace-tools/execute"
# Refusals remembered at most (a burst needs one per credential, worker and operation).
MEMO_MAX = 4096
# The answer's headers the server adds itself; a remembered answer gets its own.
_SERVER_HEADERS = frozenset({"date", "server", "content-length"})


class Gate:
    """Per credential, at most `width` calls pass at once; the rest wait in arrival order. A
    waiting call may leave the line without a place when `excuse` finds it excused (its answer
    is known: a refusal learned meanwhile), without waiting for a place to free."""

    def __init__(self, width: Callable[[], int]) -> None:
        self._width = width
        self._passing: dict[bytes, int] = {}
        self._waiting: dict[bytes, deque[_Turn]] = {}

    async def enter(
        self, credential: bytes, excused: Callable[[], Remembered | None] | None = None
    ) -> Passage | Remembered:
        """A place (a `Passage`), or what `excused` answered when `excuse` asked it."""
        passing = self._passing.get(credential, 0)
        if passing < self._width() and not self._waiting.get(credential):
            self._passing[credential] = passing + 1
            return Passage(self, credential)
        turn = _Turn(asyncio.get_running_loop().create_future(), excused)
        self._waiting.setdefault(credential, deque()).append(turn)
        try:
            given = await turn.given
        except asyncio.CancelledError:
            if turn.given.done() and not turn.given.cancelled():
                if turn.given.result() is _PLACE:
                    self._leave(credential)  # handed a place just as it was cancelled: passed on
            else:
                # Still in line, unless a release already dropped it there as cancelled.
                line = self._waiting.get(credential)
                if line is not None and turn in line:
                    line.remove(turn)
                    if not line:
                        del self._waiting[credential]
            raise
        return Passage(self, credential) if given is _PLACE else given

    def excuse(self, credential: bytes) -> None:
        """Ask the credential's waiting calls whether they are excused now; those that are
        leave the line with their answer, the others keep their places in it."""
        line = self._waiting.get(credential)
        if not line:
            return
        kept: deque[_Turn] = deque()
        for turn in line:
            if turn.given.done():
                continue  # cancelled: a release would only skip it
            answer = turn.excused() if turn.excused is not None else None
            if answer is not None:
                turn.given.set_result(answer)
            else:
                kept.append(turn)
        if kept:
            self._waiting[credential] = kept
        else:
            del self._waiting[credential]

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
            if not turn.given.done():
                turn.given.set_result(_PLACE)  # the place goes to the next in line
                return
            line = self._waiting.get(credential)
        left = self._passing[credential] - 1
        if left:
            self._passing[credential] = left
        else:
            del self._passing[credential]


# What a waiting call's turn is given when a place frees for it.
_PLACE = object()


@dataclass(eq=False)
class _Turn:
    given: asyncio.Future[Any]
    excused: Callable[[], Remembered | None] | None


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


@dataclass(frozen=True)
class Remembered:
    """A refusal that holds, as the view answered it."""

    answer: Answer
    holding: Holding


@dataclass
class Memo:
    """The refusals that hold, by (credential, worker header, operation). When one has run out,
    the first call to find it asks the view again and the others with its key wait for that
    answer instead of all asking at once (one view per moment, not one per gate place)."""

    now: Callable[[], float] = time.monotonic
    held: dict[MemoKey, Remembered] = field(default_factory=dict)
    asking: dict[MemoKey, asyncio.Future[None]] = field(default_factory=dict)

    def holding(self, key: MemoKey) -> Remembered | None:
        """The refusal that holds for `key` now, if any (never waits, never asks)."""
        remembered = self.held.get(key)
        if remembered is not None and remembered.holding.until > self.now():
            return remembered
        return None

    async def recall(self, key: MemoKey, *, refusal_expected: bool = False) -> Remembered | None:
        """The refusal that holds for `key`, or None: then the caller asks the view, `learn`s
        its answer and says when it has `asked`. `refusal_expected`: the caller's answer is
        known to be a refusal, so even with nothing learned yet for `key` the others wait for
        what it learns."""
        while True:
            remembered = self.holding(key)
            if remembered is not None:
                return remembered
            asked = self.asking.get(key)
            if asked is None:
                if key in self.held or refusal_expected:
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
            self.keep(key, Remembered(answer=Answer.of(response), holding=holding))
        else:
            self.held.pop(key, None)

    def keep(self, key: MemoKey, remembered: Remembered) -> None:
        if key not in self.held and len(self.held) >= MEMO_MAX:
            self._forget_expired()
            if len(self.held) >= MEMO_MAX:
                del self.held[next(iter(self.held))]  # the oldest
        self.held[key] = remembered

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
# The answers of calls that arrived beyond their queue's limit (`Lines`), for the next such.
BEYOND = Memo()


def read_at_edge(scope: dict[str, Any], body: bytes) -> ReadCall | None:
    """An execute POST read from its ASGI scope and its whole body, before Django makes a
    request of it, so that a refusal held in memory costs no Django request, view or response.
    None for anything else, and for a request whose reading or answer here could differ from
    Django's (`_edge_headers`). The view takes the reading over (READ_AT_EDGE): the body is parsed once, and the
    call's life counts from here, before its turn at its credential's gate."""
    headers = _edge_headers(scope)
    if headers is None:
        return None
    content_type = parse_header_parameters(headers.get("content-type") or "")[0]
    try:
        return read_parts(headers, content_type, lambda: body, CompletionDraft())
    except Exception:
        return None  # unforeseen: the view meets it in its own reading and answers it


def _edge_headers(scope: dict[str, Any]) -> _EdgeHeaders | None:
    """An execute POST's headers, when the view would read them as they are here: no header
    name with an underscore or given twice (Django folds those), a Host Django accepts, and
    an Accept that DRF answers with plain JSON (another may change the answer: 406, or an
    indented body)."""
    if not gated(scope) or scope.get("root_path") or settings.USE_X_FORWARDED_HOST:
        return None
    headers = _EdgeHeaders()
    for raw_name, raw_value in scope.get("headers") or ():
        name = raw_name.decode("latin-1").lower()
        if "_" in name or name in headers:
            return None
        headers[name] = raw_value.decode("latin-1")
    if not _host_allowed(headers.get("host")):
        return None  # the middleware answers it 400
    if headers.get("accept") not in _PLAIN_ACCEPT:
        return None
    return headers


# Accept headers the JSON renderer answers exactly as it does with none.
_PLAIN_ACCEPT = frozenset({None, "", "*/*", "application/json"})


class _EdgeHeaders(dict[str, str]):
    def get(self, key: str, /) -> str | None:  # type: ignore[override]
        return super().get(key.lower())


def _host_allowed(host: str | None) -> bool:
    """What `HttpRequest.get_host` accepts (config.middleware checks it for the API)."""
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    domain, _ = split_domain_port(host or "")
    return bool(domain) and validate_host(domain, allowed)


def gated(scope: dict[str, Any]) -> bool:
    """The requests that go through the gate: the execute endpoint's POSTs."""
    return scope.get("method") == "POST" and scope.get("path") == EXECUTE_PATH


def _memo_key(read: ReadCall | None, credential: bytes) -> MemoKey | None:
    if read is None or read.parsed is None:
        return None
    return (credential, read.parsed.worker_id or "", read.draft.operation)


def overloaded_at_edge(scope: dict[str, Any]) -> Answer | None:
    """The answer of an execute POST past this process's (or its key's) share of calls in
    flight, made here as the view makes it, its row written; None: the view answers it. The
    answer is the same for every caller (no body is read, nobody is looked up), so it is made
    here from the first such call on: had the edge waited for the view to answer one first,
    every call that arrived meanwhile would have gone through Django's request and the view
    too (on a loop busy with a 2,000-call burst, all 1,501 of its overloaded calls did)."""
    if shutdown.stopping():
        return None  # a stopping process answers SHUTTING_DOWN first
    headers = _edge_headers(scope)
    if headers is None:
        return None
    answer = _overloaded_answer()
    draft = CompletionDraft()
    describe_headers(headers, draft)
    draft.answered(answer.status, refusals.service_overloaded())
    emit_row(draft)
    return answer


def refused_at_edge(scope: dict[str, Any], refusal: refusals.Refusal) -> Answer:
    """The answer of a request the edge refuses before any view runs (its body too slow or
    too large, a bridge route over its rate), made as the execute view makes a refusal; an
    execute POST gets its row, naming what its headers say."""
    answer = Answer.of(rendered_refusal(refusal))
    if gated(scope):
        draft = CompletionDraft()
        headers = _edge_headers(scope)
        if headers is not None:
            describe_headers(headers, draft)
        draft.answered(answer.status, refusal)
        emit_row(draft)
    return answer


@functools.cache
def _overloaded_answer() -> Answer:
    return Answer.of(rendered_refusal(refusals.service_overloaded()))


@dataclass
class Arrival:
    """A call counted in its line (`LINES`) from the moment the edge read it, not from when its
    task first runs: on a loop busy with a burst that is hundreds of arrivals later, and every
    call read meanwhile would see the line short of its limit and go on, to be refused later
    in `through`, at several times the cost. `ahead`: the line's calls counted before it, when
    they reach its queue's limit (`Lines.beyond`), else None. Leaves its line once, at the end
    of `through` or, when its task never ran (its client went at once), of its request."""

    key: MemoKey | None
    ahead: int | None
    gone: bool = False

    def leave(self) -> None:
        if not self.gone:
            self.gone = True
            LINES.left(self.key)


def at_edge(read: ReadCall | None, credential: bytes) -> Answer | Arrival:
    """An execute POST whose whole body the edge read (`read`: its reading, None when it
    could not read it): the answer held in memory for it now, its row written, or else its
    `Arrival`, counted in its line now, for `through` (its gate, the view). Never waits: a
    call that arrives while a held refusal is being asked again goes to the gate, where it
    waits for that answer."""
    key = _memo_key(read, credential)
    ahead = LINES.beyond(key, read)
    if key is not None and read is not None:
        remembered = MEMO.holding(key)
        if remembered is None and ahead is not None:
            remembered = LINES.refusal(key)
        if remembered is not None and _applies(remembered, read):
            _replayed(remembered, read)
            return remembered.answer
    LINES.arrived(key)
    return Arrival(key, ahead)


async def through(
    arrival: Arrival,
    read: ReadCall | None,
    credential: bytes,
    view: Callable[[], Awaitable[HttpResponseBase]],
    abandoned: Callable[[], None],
) -> HttpResponseBase | Answer:
    """The call's answer, once through its credential's gate: from memory when a refusal of
    its kind holds (its row written), else from `view`. `read` is the edge's reading of the
    call (None: it could not read it, and the view will); `abandoned` writes the row of a call
    whose client went away before the view saw it.

    A call that arrives with its credential's calls to its worker in flight here already at
    that worker's queue limit (`LINES`) does not wait its turn at the gate: its answer is a
    full queue (those calls hold, or will take, every place). Made here when the limit is
    current (it may have become so since the edge looked); else it waits for an asking call's
    view to read the policy, or is that call: its view refuses it once the policy is read
    (Call.in_flight_ahead)."""
    key, ahead = arrival.key, arrival.ahead
    # A call beyond its queue's limit is answered by what such a call was answered, never by
    # the refusals the others remember (nor they by its): its refusal holds only for it.
    memo = MEMO if ahead is None else BEYOND
    viewed = False
    passage: Passage | None = None
    try:
        try:
            if ahead is None:
                # Out of the line at once when a refusal it would get is learned meanwhile
                # (another process filled the queue, say): not after the views ahead of it.
                turn = await GATE.enter(
                    credential, None if key is None else lambda: _held_for(key, read)
                )
                if isinstance(turn, Passage):
                    passage = turn
                    remembered = await MEMO.recall(key) if key else None
                else:
                    remembered = turn
            else:
                # Made here if the limit read is current (by now), else from an asking call's
                # view.
                assert key is not None
                remembered = LINES.refusal(key) or await BEYOND.recall(key, refusal_expected=True)
        except asyncio.CancelledError:
            _abandoned(read, abandoned)  # gone while it waited for its turn: its row says so
            raise
        if (
            remembered is not None
            and read is not None
            and _applies(remembered, read)
            # Beyond its queue's limit still, as the view has read it since (while it waited).
            and (ahead is None or (key is not None and LINES.still_beyond(key, ahead)))
        ):
            _replayed(remembered, read)
            return remembered.answer
        viewed = True
        # Whether the calls of its key wait for this one's answer (made so just now, by recall).
        asking = key is not None and key in memo.asking

        def entered() -> None:
            if passage is not None:
                passage.release()
            if asking and key is not None:
                # Not a refusal: they go on now, not after the whole of this call.
                memo.asked(key)

        token = PASSING.set(
            Passing(
                entered=entered,
                decided=lambda draft, policy: LINES.decided(key, draft, policy),
                in_flight_ahead=ahead,
            )
        )
        try:
            response = await view()
        finally:
            PASSING.reset(token)
        if key is not None:
            memo.learn(key, response)
            if memo is MEMO and MEMO.holding(key) is not None:
                GATE.excuse(credential)  # the calls in line that would get it get it now
        return response
    finally:
        arrival.leave()
        if passage is not None:
            passage.release()
        if viewed and key is not None:
            memo.asked(key)


@dataclass(frozen=True)
class Learned:
    """What a view read for a line when it last decided a call's admission: the policy (the
    worker's queue limit is in it) and the row facts of the caller and worker, at `at`."""

    policy: Policy
    tenant_hash: str
    principal_hash: str
    worker_id: str
    at: float
    # The policy version it was read under (None: unreadable then).
    version: int | None = None


class Lines:
    """Per credential and worker header: this process's calls in `through` (waiting their turn,
    in admission, queued or running: each holds, or is about to take, a place in the worker's
    queue), and that worker's queue limit as the view last read it for the credential. The
    answer of a call beyond that limit is kept in `memo` (BEYOND)."""

    def __init__(
        self,
        memo: Memo,
        *,
        seen: Callable[[], tuple[int, float] | None] = version_seen,
        read: Callable[[], int | None] = version_read,
    ) -> None:
        self.memo = memo
        self.seen, self.read = seen, read
        self.in_flight: dict[tuple[bytes, str], int] = {}
        self.learned: dict[tuple[bytes, str], Learned] = {}

    def beyond(self, key: MemoKey | None, read: ReadCall | None) -> int | None:
        """How many calls are ahead of this one, when they reach its queue's limit (else None:
        it goes through the gate). Not for a call the view could answer before its queue (a
        request id, an instance binding), nor when no limit is known for its line yet."""
        if key is None or read is None or read.parsed is None:
            return None
        if read.parsed.request_id is not None or read.parsed.body.get("workspaceInstanceId"):
            return None
        ahead = self.in_flight.get(key[:2], 0)
        return ahead if self.still_beyond(key, ahead) else None

    def still_beyond(self, key: MemoKey, ahead: int) -> bool:
        """Whether `ahead` calls fill the line's queue, by the limit the view read last."""
        learned = self.learned.get(key[:2])
        return learned is not None and ahead >= learned.policy.worker_queue_limit

    def refusal(self, key: MemoKey) -> Remembered | None:
        """The answer of a call beyond its line's limit, without a view: the one held in
        `memo`, or, while the limit learned is current, a new one (kept for BEYOND_HOLD_S);
        None: a view must read the policy first (the limit may have changed)."""
        remembered = self.memo.holding(key)
        if remembered is None:
            learned = self.learned.get(key[:2])
            if learned is not None and self._current(learned):
                remembered = self._refused(key, learned)
        return remembered

    def _current(self, learned: Learned) -> bool:
        """Whether the limit learned is the policy's as of at most BEYOND_HOLD_S ago: read
        then, or read under the version any call of this process found that recently."""
        now = self.memo.now()
        if now - learned.at <= BEYOND_HOLD_S:
            return True
        seen = self.seen()
        return (
            learned.version is not None
            and seen is not None
            and seen[0] == learned.version
            and now - seen[1] <= BEYOND_HOLD_S
        )

    def _refused(self, key: MemoKey, learned: Learned) -> Remembered:
        """What the view answers a call beyond the limit (Call.in_flight_ahead), made here."""
        refusal = refusals.queue_full(
            learned.worker_id,
            learned.policy.worker_queue_limit,
            holds_until=self.memo.now() + BEYOND_HOLD_S,
        )
        remembered = Remembered(
            answer=Answer.of(rendered_refusal(refusal)),
            holding=Holding(
                refusal=refusal,
                tenant_hash=learned.tenant_hash,
                principal_hash=learned.principal_hash,
                worker_id=learned.worker_id,
                policy=learned.policy,
            ),
        )
        self.memo.keep(key, remembered)
        return remembered

    def arrived(self, key: MemoKey | None) -> None:
        if key is not None:
            line = key[:2]
            self.in_flight[line] = self.in_flight.get(line, 0) + 1

    def left(self, key: MemoKey | None) -> None:
        if key is not None:
            line = key[:2]
            left = self.in_flight[line] - 1
            if left:
                self.in_flight[line] = left
            else:
                del self.in_flight[line]

    def decided(self, key: MemoKey | None, draft: CompletionDraft, policy: Policy) -> None:
        """A view of the line read its policy. The line's calls beyond the limit that wait for
        an asking call's answer (nothing fresh was known when they came) get theirs now, not
        once that call's whole view is done: each looks again (and still checks its count
        against the limit read here)."""
        if key is None:
            return
        line = key[:2]
        if line not in self.learned and len(self.learned) >= MEMO_MAX:
            del self.learned[next(iter(self.learned))]  # the oldest
        learned = self.learned[line] = Learned(
            policy=policy,
            tenant_hash=draft.tenant_hash,
            principal_hash=draft.principal_hash,
            worker_id=draft.worker_id,
            at=self.memo.now(),
            version=self.read(),
        )
        for waited in [k for k in self.memo.asking if k[:2] == line]:
            self._refused(waited, learned)
            self.memo.asked(waited)


LINES = Lines(BEYOND)


def _abandoned(read: ReadCall | None, otherwise: Callable[[], None]) -> None:
    """The row of a call whose client went away before the view saw it."""
    if read is None:
        otherwise()
        return
    if read.parsed is not None and read.parsed.worker_id:
        read.draft.describe(worker_id=read.parsed.worker_id)
    read.draft.went_away_answered()
    emit_row(read.draft)


def _held_for(key: MemoKey, read: ReadCall | None) -> Remembered | None:
    """The refusal held in memory for this call now, when the view would answer it so."""
    remembered = MEMO.holding(key)
    if remembered is None or read is None or not _applies(remembered, read):
        return None
    return remembered


def _applies(remembered: Remembered, read: ReadCall) -> bool:
    """Whether the view would answer this call the remembered way now."""
    assert read.parsed is not None
    if shutdown.stopping():
        return False  # the view answers it SHUTTING_DOWN first
    if remembered.holding.refusal.code == "WORKER_QUEUE_FULL":
        # The view checks a request id and an instance binding before the queue.
        return read.parsed.request_id is None and not read.parsed.body.get("workspaceInstanceId")
    return True


def _replayed(remembered: Remembered, read: ReadCall) -> None:
    """This call's own row for the remembered answer: what the view would have written."""
    holding, draft = remembered.holding, read.draft
    assert read.parsed is not None
    queue_ms, exec_ms = call_budgets(read.parsed.body, read.parsed.queue_wait_ms, holding.policy)
    draft.describe(
        tenant_hash=holding.tenant_hash,
        principal_hash=holding.principal_hash,
        worker_id=holding.worker_id,
        isolation_key_hash=isolation_key_hash(holding.worker_id, read.parsed.body),
        deadline_budget_ms=deadlines.deadline_budget_ms(queue_ms=queue_ms, exec_ms=exec_ms),
    )
    draft.answered(remembered.answer.status, holding.refusal)
    emit_row(draft)
