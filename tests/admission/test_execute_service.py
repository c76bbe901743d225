"""The execute service (admission/services.py `call_execute`) driven directly: a fake clock, real
Redis and Postgres, no HTTP and no processes. The worker's side is played with the worker's own
scripts (SyncQueue.settle, register_incarnation), signed as a worker signs.

Each test names one rule of contract §2.3-§2.5 and fails if that rule breaks.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from django.conf import settings
from django.utils import timezone
from fakeclock import FakeClock
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from sluice_protocol import validate_request

from admission import refusals
from admission.completion import CompletionDraft
from admission.dbthread import in_db_thread
from admission.management.commands.bootstrap import bootstrap
from admission.policy import forget_cached_policy
from admission.queue import AsyncQueue, SyncQueue, request_id_key, worker_keys
from admission.ratelimit import RateLimiter
from admission.selectors import Target
from admission.services import Call, call_execute, workspace_offer_tokens
from workspaces.access import Caller, caller_for_api_key
from workspaces.dispatch import broker_queue_key, worker_queue_name
from workspaces.models import ApiKey
from workspaces.signing import sign, signing_key

TOKEN_HASH = "ab" * 32
OFFER = workspace_offer_tokens(
    operations=["read_file", "execute_command"],
    linked_worktree_lanes=False,
    edit_features=None,
    instruction_files=[],
)
RESULT = {
    "protocolVersion": 1,
    "operation": "read_file",
    "workspaceId": "ws",
    "path": "README.md",
    "content": "# demo",
    "startLine": 1,
    "endLine": 1,
    "truncated": False,
}

pytestmark = pytest.mark.usefixtures("transactional_db")


@dataclass
class Rig:
    """One worker registered with one slot, held by a call entered straight into its queue."""

    worker_id: str
    prefix: str
    sync: redis.Redis
    sq: SyncQueue
    clock: FakeClock
    holder_ticket: int = 0

    def entry(self, entry_id: str) -> dict[str, Any] | None:
        raw = self.sync.hget(worker_keys(self.prefix, self.worker_id).entries, entry_id)
        return None if raw is None else dict(json.loads(str(raw)))

    def state(self, entry_id: str) -> str | None:
        entry = self.entry(entry_id)
        return None if entry is None else str(entry["st"])

    def settle(
        self, entry_id: str, ticket: int, payload: dict[str, Any], incarnation: str = "inc1"
    ) -> bool:
        body = dict(payload)
        body["sig"] = sign(
            signing_key(TOKEN_HASH), "settlement", {"entry": entry_id, "payload": payload}
        )
        return self.sq.settle(
            worker_id=self.worker_id,
            entry_id=entry_id,
            incarnation=incarnation,
            ticket=ticket,
            payload=body,
            now_ms=self.clock.peek_ms(),
        )

    def settle_holder(self) -> None:
        assert self.settle("holder", self.holder_ticket, {"ok": True, "result": {}})

    def settle_with_result(self, call: Call) -> None:
        granted = self.sq.grant_of(worker_id=self.worker_id, entry_id=call.entry_id)
        assert granted is not None
        assert self.settle(call.entry_id, granted["ticket"], {"ok": True, "result": RESULT})

    def broker_messages(self) -> list[str]:
        return [str(m) for m in self.sync.lrange(self.broker_key, 0, -1)]

    @property
    def broker_key(self) -> str:
        return broker_queue_key(worker_queue_name(self.worker_id))


@pytest.fixture
def rig(sync_redis: redis.Redis, redis_prefix: str) -> Iterator[Rig]:
    forget_cached_policy()
    worker_id = f"svc-{uuid.uuid4().hex[:8]}"
    sq = SyncQueue(sync_redis, redis_prefix)
    sq.register_incarnation(
        worker_id=worker_id, incarnation="inc1", slots=1, ttl_ms=60_000, offer={"ws": OFFER}
    )
    made = Rig(worker_id, redis_prefix, sync_redis, sq, FakeClock())
    yield made
    sync_redis.delete(made.broker_key)


def make_call(
    rig: Rig, *, wait_ms: int = 30_000, request_id: str | None = None, caller: Caller | None = None
) -> Call:
    clock = rig.clock
    draft = CompletionDraft(started=clock.now(), started_monotonic=clock.monotonic())
    return Call(
        caller=caller or Caller(1, 1, "tenant-hash", f"principal-{uuid.uuid4().hex[:8]}"),
        request=validate_request(
            {
                "protocolVersion": 1,
                "operation": "read_file",
                "workspaceId": "ws",
                "path": "README.md",
            }
        ),
        worker_id=rig.worker_id,
        queue_wait_header_ms=wait_ms,
        request_id=request_id,
        draft=draft,
        target=worker_target(rig, "inc1"),
    )


def worker_target(rig: Rig, incarnation: str) -> Target:
    """The rig's worker as a lookup finds it, registered as `incarnation`."""
    return Target(
        worker_id=rig.worker_id,
        incarnation_id=incarnation,
        token_hash=TOKEN_HASH,
        workspace_registered=True,
        operations=frozenset({"read_file", "execute_command"}),
        linked_worktree_lanes=False,
        quarantined=False,
    )


def run(
    rig: Rig,
    scenario: Callable[[AsyncQueue], Awaitable[Any]],
    *,
    client_name: str | None = None,
) -> Any:
    """`scenario(queue)` on a fresh loop with its own client (no retries: an error is an error)."""

    async def main() -> Any:
        client = aioredis.Redis.from_url(
            settings.ADMISSION_REDIS_URL,
            decode_responses=True,
            retry=Retry(NoBackoff(), 0),
            client_name=client_name,
        )
        try:
            return await scenario(AsyncQueue(client, rig.prefix))
        finally:
            await client.aclose()

    return asyncio.run(main())


async def hold_the_slot(rig: Rig, queue: AsyncQueue) -> None:
    """Another call takes the worker's one slot (on another workspace: only the slot blocks)."""
    entered = await queue.enter(
        worker_id=rig.worker_id,
        entry_id="holder",
        key=("other", ""),
        queue_budget_ms=1_000,
        exec_budget_ms=600_000,
        queue_limit=32,
        slot_ceiling=8,
        operation="read_file",
        now_ms=rig.clock.peek_ms(),
    )
    assert entered.status == "granted" and entered.ticket is not None
    rig.holder_ticket = entered.ticket


def execute(rig: Rig, queue: AsyncQueue, call: Call) -> asyncio.Task[dict[str, Any]]:
    limiter = RateLimiter(queue.client, prefix=rig.prefix)
    return asyncio.ensure_future(call_execute(call, queue=queue, limiter=limiter, clock=rig.clock))


async def until(predicate: Callable[[], Any], timeout_s: float = 10.0) -> None:
    """Wait on a condition (the bound is real time: it only keeps a broken test from hanging)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        await asyncio.sleep(0.002)


def when_waiting(rig: Rig, call: Call, act: Callable[[], None]) -> None:
    """Run `act` once, at the first reading of the clock after `call` waits in the queue."""
    done = False

    def hook() -> None:
        nonlocal done
        if not done and rig.state(call.entry_id) == "w":
            done = True
            act()

    rig.clock.on_read = hook


async def bounded(task: asyncio.Task[Any]) -> Any:
    """The call's answer; a call stuck waiting (a broken rule) fails the test instead of hanging."""
    return await asyncio.wait_for(task, timeout=20)


async def refused(task: asyncio.Task[Any]) -> refusals.Refusal:
    with pytest.raises(refusals.Refusal) as caught:
        await bounded(task)
    return caught.value


# ---------------------------------------------------------------------------------------
# Queue timeout racing a grant


def test_a_grant_landing_as_the_queue_budget_runs_out_wins(rig: Rig) -> None:
    call = make_call(rig, wait_ms=1_000, request_id="race-grant-01")

    def meanwhile() -> None:
        # The worker finishes the holder (granting the waiting call) and the queue budget
        # passes, both before the waiter looks again: it finds itself past its deadline.
        rig.settle_holder()
        rig.clock.advance(5.0)

    async def scenario(queue: AsyncQueue) -> dict[str, Any]:
        await hold_the_slot(rig, queue)
        when_waiting(rig, call, meanwhile)
        task = execute(rig, queue, call)
        await until(lambda: call.dispatched or task.done())
        if not task.done():
            rig.settle_with_result(call)
        return await bounded(task)

    # The grant wins: the call ran (so it is answered with its result, not a queue timeout).
    assert run(rig, scenario) == RESULT
    assert call.draft.admission_outcome == "admitted" and call.draft.slot_index == 0
    assert rig.sync.get(request_id_key(rig.prefix, call.caller.scope, "race-grant-01")) == "done"


def test_a_queue_budget_that_runs_out_without_a_grant_is_a_timeout_that_never_started(
    rig: Rig,
) -> None:
    call = make_call(rig, wait_ms=1_000, request_id="race-timeout-01")
    when_waiting(rig, call, lambda: rig.clock.advance(1.0))

    async def scenario(queue: AsyncQueue) -> refusals.Refusal:
        await hold_the_slot(rig, queue)
        return await refused(execute(rig, queue, call))

    refusal = run(rig, scenario)
    assert (refusal.code, refusal.started) == ("WORKSPACE_QUEUE_TIMEOUT", False)
    assert refusal.retry_after_s is not None and refusal.retry_after_s >= 1
    assert call.draft.admission_outcome == "queue_timeout" and call.draft.slot_index is None
    # It left the queue (the holder keeps its slot) and its request id is free to resend.
    assert rig.state(call.entry_id) is None and rig.state("holder") == "r"
    assert rig.sync.get(request_id_key(rig.prefix, call.caller.scope, "race-timeout-01")) is None
    assert not rig.broker_messages()


def test_a_queue_timeout_is_never_answered_before_the_allowance_has_run_out(rig: Rig) -> None:
    """Half a millisecond before its 1 s allowance is up, the call still waits (its left time
    was once truncated to whole ms: 0, so it answered WORKSPACE_QUEUE_TIMEOUT with a queue
    wait of 999 ms, found by a contention test as 1,499 ms against 1,500)."""
    call = make_call(rig, wait_ms=1_000, request_id="race-timeout-02")
    when_waiting(rig, call, lambda: rig.clock.advance(0.9995))
    reads_after = 0

    async def scenario(queue: AsyncQueue) -> tuple[bool, refusals.Refusal]:
        nonlocal reads_after
        await hold_the_slot(rig, queue)
        task = execute(rig, queue, call)
        await until(lambda: rig.clock.elapsed_s >= 0.9995 or task.done())

        def count() -> None:
            nonlocal reads_after
            reads_after += 1

        rig.clock.on_read = count
        # The service looks at the clock each time round its wait: after a few looks it has
        # had every chance to give up early.
        await until(lambda: reads_after >= 5 or task.done())
        early = task.done()
        rig.clock.advance(0.001)
        return early, await refused(task)

    early, refusal = run(rig, scenario)
    assert not early
    assert refusal.code == "WORKSPACE_QUEUE_TIMEOUT"
    assert rig.clock.elapsed_s >= 1.0  # answered once the allowance was up, not before


# ---------------------------------------------------------------------------------------
# The exec budget starts at admission


def test_the_exec_budget_starts_at_admission_not_at_arrival(rig: Rig) -> None:
    call = make_call(rig, wait_ms=120_000)
    admitted: dict[str, Any] = {}

    def meanwhile() -> None:
        # A minute in the queue, twice the call's 30 s exec budget; then the slot frees.
        rig.clock.advance(60.0)
        admitted["ms"], admitted["at"] = rig.clock.peek_ms(), rig.clock.monotonic()
        rig.settle_holder()

    async def scenario(queue: AsyncQueue) -> dict[str, Any]:
        await hold_the_slot(rig, queue)
        when_waiting(rig, call, meanwhile)
        task = execute(rig, queue, call)
        await until(lambda: call.dispatched or task.done())
        if not task.done():
            granted = rig.sq.grant_of(worker_id=rig.worker_id, entry_id=call.entry_id)
            assert granted is not None
            admitted["deadline"] = granted["execDeadlineMs"]
            rig.settle_with_result(call)
        return await bounded(task)

    # Still waited for after a minute in the queue: the budget counts from admission.
    assert run(rig, scenario) == RESULT
    assert admitted["deadline"] == admitted["ms"] + 30_000  # what the worker is given
    assert call.exec_deadline == admitted["at"] + 30.0  # how long this process waits for it
    assert call.draft.queue_wait_ms == 60_000
    assert call.draft.exec_ms == 0
    assert call.draft.deadline_budget_ms == 120_000 + 30_000


# ---------------------------------------------------------------------------------------
# Revalidation at the grant: each outcome


def test_a_call_still_offered_at_its_grant_is_dispatched_once(rig: Rig) -> None:
    call = make_call(rig)

    async def scenario(queue: AsyncQueue) -> dict[str, Any]:
        await hold_the_slot(rig, queue)
        task = execute(rig, queue, call)
        await until(lambda: rig.state(call.entry_id) == "w")
        assert rig.broker_messages() == []
        rig.settle_holder()
        await until(lambda: call.dispatched or task.done())
        rig.settle_with_result(call)
        return await bounded(task)

    assert run(rig, scenario) == RESULT
    # Re-checked and still offered: its envelope went to the worker, once.
    assert len(rig.broker_messages()) == 1


def test_a_worker_restarted_while_the_call_waits_refuses_it_as_offline_not_started(
    rig: Rig,
) -> None:
    call = make_call(rig, request_id="restarted-01")

    async def scenario(queue: AsyncQueue) -> refusals.Refusal:
        await hold_the_slot(rig, queue)
        task = execute(rig, queue, call)
        await until(lambda: rig.state(call.entry_id) == "w")
        rig.sq.register_incarnation(
            worker_id=rig.worker_id, incarnation="inc2", slots=1, ttl_ms=60_000, offer={}
        )
        return await refused(task)

    refusal = run(rig, scenario)
    assert (refusal.code, refusal.started) == ("WORKER_OFFLINE", False)
    assert rig.sync.get(request_id_key(rig.prefix, call.caller.scope, "restarted-01")) is None


def _restart_worker(rig: Rig) -> Target:
    """The worker registers again (incarnation inc2) with the same token and offer; what a
    fresh lookup of it answers."""
    rig.sq.register_incarnation(
        worker_id=rig.worker_id, incarnation="inc2", slots=1, ttl_ms=60_000, offer={"ws": OFFER}
    )
    return worker_target(rig, "inc2")


async def runs_on_inc2(rig: Rig, queue: AsyncQueue, call: Call) -> dict[str, Any]:
    """The call, granted for incarnation inc2 and settled by it."""
    task = execute(rig, queue, call)
    await until(lambda: call.dispatched or task.done())
    granted = rig.sq.grant_of(worker_id=rig.worker_id, entry_id=call.entry_id)
    assert granted is not None and granted["incarnation"] == "inc2"
    assert rig.settle(call.entry_id, granted["ticket"], {"ok": True, "result": RESULT}, "inc2")
    result: dict[str, Any] = await bounded(task)
    return result


def test_a_call_signed_for_a_worker_that_restarted_since_enters_once_more_for_the_new_one(
    rig: Rig,
) -> None:
    # The API process still knew the old incarnation (its caller cache lives a second): the
    # queue refuses the call at once, never queued, so it is looked up again and enters anew.
    fresh = _restart_worker(rig)
    lookups: list[str] = []

    async def refresh() -> Target | None:
        lookups.append("lookup")
        return fresh

    call = make_call(rig, request_id="restart-02")
    call.refresh_target = refresh

    assert run(rig, lambda queue: runs_on_inc2(rig, queue, call)) == RESULT
    assert lookups == ["lookup"]
    # One message reached the worker: the one signed for the incarnation that runs it.
    [message] = rig.broker_messages()
    [carried], _kwargs, _embed = json.loads(base64.b64decode(json.loads(message)["body"]))
    assert carried["incarnation"] == "inc2"
    assert call.draft.admission_outcome == "admitted"


def test_a_worker_seen_offline_a_moment_ago_is_looked_up_again_before_the_call_is_refused(
    rig: Rig,
) -> None:
    # This process's cache still says "not registered" (it looked while the worker was down);
    # the worker is back: one fresh lookup, and the call runs.
    fresh = _restart_worker(rig)
    call = make_call(rig, request_id="restart-04")
    assert call.target is not None
    call.target = replace(call.target, incarnation_id="")
    lookups: list[str] = []

    async def refresh() -> Target | None:
        lookups.append("lookup")
        return fresh

    call.refresh_target = refresh

    assert run(rig, lambda queue: runs_on_inc2(rig, queue, call)) == RESULT
    assert lookups == ["lookup"]


@pytest.mark.parametrize("fresh_incarnation", [None, "inc1"])
def test_a_call_whose_fresh_lookup_finds_no_new_incarnation_is_offline_not_started(
    rig: Rig, fresh_incarnation: str | None
) -> None:
    _restart_worker(rig)
    stale = make_call(rig).target
    lookups: list[str] = []

    async def refresh() -> Target | None:
        lookups.append("lookup")
        # Gone from Postgres too, or the lookup still names the incarnation that was refused.
        return stale if fresh_incarnation else None

    call = make_call(rig, request_id="restart-03")
    call.refresh_target = refresh

    async def scenario(queue: AsyncQueue) -> refusals.Refusal:
        return await refused(execute(rig, queue, call))

    refusal = run(rig, scenario)
    assert (refusal.code, refusal.started) == ("WORKER_OFFLINE", False)
    assert lookups == ["lookup"]  # looked up once, never in a loop
    assert rig.broker_messages() == []
    assert rig.sync.get(request_id_key(rig.prefix, call.caller.scope, "restart-03")) is None


def test_an_offer_withdrawn_while_the_call_waits_refuses_it_as_a_mismatch_not_started(
    rig: Rig,
) -> None:
    call = make_call(rig)

    async def scenario(queue: AsyncQueue) -> refusals.Refusal:
        await hold_the_slot(rig, queue)
        task = execute(rig, queue, call)
        await until(lambda: rig.state(call.entry_id) == "w")
        # Same incarnation, "ws" no longer offers read_file; then the slot frees.
        withdrawn = workspace_offer_tokens(
            operations=["execute_command"],
            linked_worktree_lanes=False,
            edit_features=None,
            instruction_files=[],
        )
        rig.sq.register_incarnation(
            worker_id=rig.worker_id,
            incarnation="inc1",
            slots=1,
            ttl_ms=60_000,
            offer={"ws": withdrawn},
        )
        rig.settle_holder()
        return await refused(task)

    refusal = run(rig, scenario)
    assert (refusal.code, refusal.started) == ("WORKER_MISMATCH", False)
    assert rig.broker_messages() == []


def test_a_call_entering_with_an_older_view_of_the_worker_is_refused_as_offline(rig: Rig) -> None:
    call = make_call(rig)
    assert call.target is not None
    call.target = Target(**{**call.target.__dict__, "incarnation_id": "inc0"})

    async def scenario(queue: AsyncQueue) -> refusals.Refusal:
        await hold_the_slot(rig, queue)
        return await refused(execute(rig, queue, call))

    refusal = run(rig, scenario)
    assert (refusal.code, refusal.started) == ("WORKER_OFFLINE", False)
    assert rig.state(call.entry_id) is None


def test_a_key_revoked_while_the_call_waits_is_never_dispatched(rig: Rig) -> None:
    account = bootstrap(tenant="t-revoke", user="u", worker_id=f"w-{uuid.uuid4().hex[:6]}")
    caller = caller_for_api_key(account["api_key"])
    assert caller is not None and caller.key_id is not None
    key_id = caller.key_id
    call = make_call(rig, caller=caller, request_id="revoked-01")

    def revoke() -> None:
        ApiKey.objects.filter(pk=key_id).update(revoked_at=timezone.now())

    async def scenario(queue: AsyncQueue) -> refusals.Refusal:
        # The broker is not reachable from the scripts (as on a Redis Cluster): the waiter
        # dispatches, so it can re-check the key first.
        queue.dispatching = rig.sq.dispatching = False
        await hold_the_slot(rig, queue)
        task = execute(rig, queue, call)
        await until(lambda: rig.state(call.entry_id) == "w")
        await in_db_thread(revoke)
        rig.settle_holder()
        return await refused(task)

    refusal = run(rig, scenario)
    assert (refusal.code, refusal.started) == ("UNAUTHENTICATED", False)
    assert rig.broker_messages() == []
    # Its slot is free again and its request id may be sent again.
    assert rig.state(call.entry_id) is None
    assert rig.sync.get(request_id_key(rig.prefix, caller.scope, "revoked-01")) is None


# ---------------------------------------------------------------------------------------
# Not started versus ambiguous at the enqueue boundary


def _drop_connections(sync: redis.Redis, name: str) -> None:
    """Close every connection of the client named `name` from Redis's side."""
    dropped = 0
    for client in sync.client_list():
        if client.get("name") == name:
            sync.client_kill_filter(_id=client["id"])
            dropped += 1
    assert dropped


def test_redis_failing_before_the_enqueue_is_answered_not_started(rig: Rig) -> None:
    name = f"unit-{uuid.uuid4().hex[:8]}"
    call = make_call(rig, request_id="before-enqueue-01")

    async def scenario(queue: AsyncQueue) -> refusals.Refusal:
        await queue.client.ping()
        _drop_connections(rig.sync, name)
        return await refused(execute(rig, queue, call))

    refusal = run(rig, scenario, client_name=name)
    assert (refusal.code, refusal.started) == ("ADMISSION_UNAVAILABLE", False)
    assert call.draft.admission_outcome == "rejected_before_queue"
    assert rig.state(call.entry_id) is None


def test_redis_failing_on_the_enqueue_itself_is_answered_ambiguous(rig: Rig) -> None:
    name = f"unit-{uuid.uuid4().hex[:8]}"
    call = make_call(rig, request_id="on-enqueue-01")
    dropped = False

    def as_the_enqueue_is_sent() -> None:
        # The clock is read for the enqueue's arguments once the request id is bound: the
        # connection goes now, so the enqueue's reply (if it ran) never arrives.
        nonlocal dropped
        key = request_id_key(rig.prefix, call.caller.scope, "on-enqueue-01")
        if not dropped and rig.sync.get(key) is not None:
            dropped = True
            _drop_connections(rig.sync, name)

    rig.clock.on_read = as_the_enqueue_is_sent

    async def scenario(queue: AsyncQueue) -> refusals.Refusal:
        return await refused(execute(rig, queue, call))

    refusal = run(rig, scenario, client_name=name)
    assert dropped
    # The service cannot tell a lost reply from a lost request, and an enqueue that ran may
    # have been granted and dispatched in the same step: it may have run.
    assert (refusal.code, refusal.started) == ("ASSIGNMENT_EXPIRED", None)
    # Its request id stays spent: a resend under it is refused, never run a second time.
    assert rig.sync.get(request_id_key(rig.prefix, call.caller.scope, "on-enqueue-01")) == "done"


# ---------------------------------------------------------------------------------------
# The allowance counts from the request's start


def test_time_spent_before_entering_counts_against_the_queue_allowance(rig: Rig) -> None:
    # (Scaled down: the service's wait for a grant is a real one, as long as what is left.)
    call = make_call(rig, wait_ms=1_000, request_id="late-entry-01")
    # The request arrived 0.5 s ago (a process busy with a burst reached it only now).
    rig.clock.advance(0.5)
    entered_at = rig.clock.peek_ms()

    async def scenario(queue: AsyncQueue) -> refusals.Refusal:
        await hold_the_slot(rig, queue)
        task = execute(rig, queue, call)
        await until(lambda: rig.state(call.entry_id) == "w")
        entry = rig.entry(call.entry_id)
        assert entry is not None
        # Redis holds it for the 500 ms left, not for a fresh second.
        assert entry["dl"] == entered_at + 500
        rig.clock.advance(0.5)
        return await refused(task)

    refusal = run(rig, scenario)
    assert refusal.code == "WORKSPACE_QUEUE_TIMEOUT" and refusal.started is False


def test_a_call_that_arrives_with_its_allowance_spent_still_takes_a_free_slot(rig: Rig) -> None:
    call = make_call(rig, wait_ms=1, request_id="late-entry-02")
    rig.clock.advance(0.5)

    async def scenario(queue: AsyncQueue) -> dict[str, Any]:
        task = execute(rig, queue, call)
        await until(lambda: call.dispatched or task.done())
        if not task.done():
            rig.settle_with_result(call)
        return await bounded(task)

    assert run(rig, scenario) == RESULT


def test_a_call_reaching_its_queue_over_a_second_past_its_allowance_is_refused_unqueued(
    rig: Rig,
) -> None:
    call = make_call(rig, wait_ms=1_000, request_id="late-entry-03")
    # A swamped process reached it 2.5 s after it arrived: its 1 s allowance ran out 1.5 s ago.
    rig.clock.advance(2.5)

    async def scenario(queue: AsyncQueue) -> refusals.Refusal:
        return await refused(execute(rig, queue, call))

    refusal = run(rig, scenario)
    assert refusal.code == "WORKSPACE_QUEUE_TIMEOUT" and refusal.started is False
    # It never entered (its slot was free: entering would have granted it at once).
    assert rig.entry(call.entry_id) is None and not call.dispatched
    assert rig.broker_messages() == []
