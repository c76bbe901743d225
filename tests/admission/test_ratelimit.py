"""The workspace rate limiter against real Redis, on a fixed clock (`now_ms`), never sleeping.

Each scenario is a coroutine run with `asyncio.run`, so every test gets its own event loop and
its own `redis.asyncio` clients; `sync_redis` is requested for its cleanup of `redis_prefix`.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis
import redis.asyncio
from django.conf import settings
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from admission.ratelimit import DEFAULT_POLICY, RateDecision, RateLimiter, RatePolicy

# A fixed server-clock reading; tests move time by adding to it instead of sleeping.
T0 = 1_700_000_000_000
ALICE = "alice-principal-hash"
BOB = "bob-principal-hash"


@asynccontextmanager
async def limiter_on(prefix: str) -> AsyncIterator[RateLimiter]:
    client = redis.asyncio.Redis.from_url(settings.ADMISSION_REDIS_URL)
    try:
        yield RateLimiter(client, prefix=prefix)
    finally:
        await client.aclose()


async def take_many(
    limiter: RateLimiter,
    count: int,
    *,
    policy: RatePolicy,
    now_ms: int,
    principal_key: str = ALICE,
    cost: int = 1,
) -> list[RateDecision]:
    # Sequential on purpose: these tests are about the arithmetic, not about races.
    return [
        await limiter.take(principal_key=principal_key, policy=policy, cost=cost, now_ms=now_ms)
        for _ in range(count)
    ]


def allowed_count(decisions: list[RateDecision]) -> int:
    return sum(decision.allowed for decision in decisions)


# --- The defaults (CONTRACT §3) ---------------------------------------------------------------


def test_the_default_policy_is_120_units_per_30_seconds() -> None:
    assert (DEFAULT_POLICY.limit, DEFAULT_POLICY.window_ms) == (120, 30_000)
    assert str(DEFAULT_POLICY) == "120/30s"


def test_40_calls_spread_evenly_over_one_minute_are_never_limited(
    redis_prefix: str, sync_redis: redis.Redis
) -> None:
    async def scenario() -> list[RateDecision]:
        async with limiter_on(redis_prefix) as limiter:
            return [
                await limiter.take(
                    principal_key=ALICE, policy=DEFAULT_POLICY, now_ms=T0 + i * 1_500
                )
                for i in range(40)
            ]

    decisions = asyncio.run(scenario())
    assert all(decision.allowed for decision in decisions)
    # Each call drains 1.5 s of a 0.25 s/unit backlog, so the bucket is full again every time.
    assert {decision.remaining for decision in decisions} == {119}


def test_40_calls_at_once_are_never_limited(redis_prefix: str, sync_redis: redis.Redis) -> None:
    async def scenario() -> list[RateDecision]:
        async with limiter_on(redis_prefix) as limiter:
            return await take_many(limiter, 40, policy=DEFAULT_POLICY, now_ms=T0)

    decisions = asyncio.run(scenario())
    assert all(decision.allowed for decision in decisions)
    assert decisions[-1].remaining == 80


def test_120_calls_at_once_pass_and_the_121st_is_refused_for_one_second(
    redis_prefix: str, sync_redis: redis.Redis
) -> None:
    async def scenario() -> list[RateDecision]:
        async with limiter_on(redis_prefix) as limiter:
            return await take_many(limiter, 121, policy=DEFAULT_POLICY, now_ms=T0)

    decisions = asyncio.run(scenario())
    assert [d.remaining for d in decisions[:120]] == list(range(119, -1, -1))
    assert all(d.allowed and d.retry_after_s == 0 for d in decisions[:120])
    # The real wait is one emission interval, 30 s / 120 = 250 ms, rounded up to 1 s.
    assert decisions[120] == RateDecision(
        allowed=False, limit=120, remaining=0, reset_s=30, retry_after_s=1
    )


# --- Retry-After is honest ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy_text", "spent", "cost", "asked_at_ms", "real_wait_ms", "retry_after_s"),
    [
        ("120/30s", 120, 1, 0, 250, 1),
        ("10/30s", 10, 1, 0, 3_000, 3),
        # 10 s / 7 = 1428.571 ms: a fractional interval, kept exact by the script's scaling.
        ("7/10s", 7, 1, 0, 1_429, 2),
        ("7/10s", 7, 1, 500, 929, 1),
        # 9 of 10 units spent; a weight-3 call needs 2 more units back, 2 x 3 s.
        ("10/30s", 9, 3, 0, 6_000, 6),
        ("1/1h", 1, 1, 1, 3_599_999, 3_600),
    ],
)
def test_a_refused_call_passes_after_retry_after_and_not_one_second_earlier(
    redis_prefix: str,
    sync_redis: redis.Redis,
    policy_text: str,
    spent: int,
    cost: int,
    asked_at_ms: int,
    real_wait_ms: int,
    retry_after_s: int,
) -> None:
    policy = RatePolicy.parse(policy_text)
    asked = T0 + asked_at_ms

    async def scenario() -> list[RateDecision]:
        async with limiter_on(redis_prefix) as limiter:
            assert allowed_count(await take_many(limiter, spent, policy=policy, now_ms=T0)) == spent

            async def probe(now_ms: int) -> RateDecision:
                return await limiter.take(
                    principal_key=ALICE, policy=policy, cost=cost, now_ms=now_ms
                )

            # Refused probes change nothing, so probing in time order is fair to the last one.
            return [
                await probe(asked),
                await probe(asked + (retry_after_s - 1) * 1_000),
                await probe(asked + real_wait_ms - 1),
                await probe(asked + real_wait_ms),
            ]

    first, one_second_early, one_ms_early, on_time = asyncio.run(scenario())
    assert not first.allowed and first.retry_after_s == retry_after_s
    assert not one_second_early.allowed
    assert not one_ms_early.allowed
    assert on_time.allowed


# --- Exact under concurrency --------------------------------------------------------------


def test_50_concurrent_takes_over_several_connections_let_exactly_10_through(
    redis_prefix: str, sync_redis: redis.Redis
) -> None:
    policy = RatePolicy.parse("10/30s")

    async def scenario() -> list[RateDecision]:
        clients = [redis.asyncio.Redis.from_url(settings.ADMISSION_REDIS_URL) for _ in range(5)]
        try:
            limiters = [RateLimiter(client, prefix=redis_prefix) for client in clients]
            # Connect every pool first so the 50 calls below race instead of queueing on connect.
            await asyncio.gather(*(client.ping() for client in clients))
            return list(
                await asyncio.gather(
                    *(
                        limiters[i % 5].take(principal_key=ALICE, policy=policy, now_ms=T0)
                        for i in range(50)
                    )
                )
            )
        finally:
            await asyncio.gather(*(client.aclose() for client in clients))

    decisions = asyncio.run(scenario())
    assert allowed_count(decisions) == 10
    # Each winner saw a distinct remaining count: the takes were serialised, none double-spent.
    assert sorted(d.remaining for d in decisions if d.allowed) == list(range(10))


PROCESSES = 2
THREADS_PER_PROCESS = 5
TAKES_PER_THREAD = 5


def _take_from_threads(
    url: str,
    prefix: str,
    barrier: Any,
    results: Any,
) -> None:
    """One OS process: several threads, each with its own event loop and Redis client."""
    policy = RatePolicy.parse("10/30s")

    async def one_thread() -> list[bool]:
        client = redis.asyncio.Redis.from_url(url)
        try:
            limiter = RateLimiter(client, prefix=prefix)
            await client.ping()
            # Block this thread's own loop until every thread in both processes is connected,
            # so all 50 takes land on Redis together.
            barrier.wait(timeout=30)
            decisions = await asyncio.gather(
                *(
                    limiter.take(principal_key=ALICE, policy=policy, now_ms=T0)
                    for _ in range(TAKES_PER_THREAD)
                )
            )
            return [decision.allowed for decision in decisions]
        finally:
            await client.aclose()

    try:
        with ThreadPoolExecutor(max_workers=THREADS_PER_PROCESS) as pool:
            futures = [pool.submit(asyncio.run, one_thread()) for _ in range(THREADS_PER_PROCESS)]
            allowed = [flag for future in futures for flag in future.result()]
        results.put(("ok", allowed))
    except BaseException as exc:  # Report, or the parent only sees a timeout.
        results.put(("error", repr(exc)))


def test_50_takes_from_threads_in_two_processes_let_exactly_10_through(
    redis_prefix: str, sync_redis: redis.Redis
) -> None:
    # fork, so the children need not re-import this module (whatever pytest's import mode);
    # each child builds its own clients and event loops and touches nothing of the parent's.
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(PROCESSES * THREADS_PER_PROCESS)
    results = context.Queue()
    processes = [
        context.Process(
            target=_take_from_threads,
            args=(settings.ADMISSION_REDIS_URL, redis_prefix, barrier, results),
        )
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    try:
        outcomes = [results.get(timeout=60) for _ in processes]
    except queue.Empty:
        pytest.fail("a worker process never reported back")
    finally:
        for process in processes:
            process.join(timeout=30)
    assert [status for status, _ in outcomes] == ["ok"] * PROCESSES, outcomes
    allowed = [flag for _, flags in outcomes for flag in flags]
    assert len(allowed) == 50
    assert sum(allowed) == 10


# --- Weights, principals, state ----------------------------------------------------------


def test_a_call_of_weight_3_passes_exactly_3_times_under_10_per_30s(
    redis_prefix: str, sync_redis: redis.Redis
) -> None:
    policy = RatePolicy.parse("10/30s")

    async def scenario() -> tuple[list[RateDecision], RateDecision]:
        async with limiter_on(redis_prefix) as limiter:
            heavy = await take_many(limiter, 5, policy=policy, now_ms=T0, cost=3)
            light = await limiter.take(principal_key=ALICE, policy=policy, now_ms=T0)
            return heavy, light

    heavy, light = asyncio.run(scenario())
    assert [d.allowed for d in heavy] == [True, True, True, False, False]
    assert [d.remaining for d in heavy] == [7, 4, 1, 0, 0]
    # The refused weight-3 calls left the last unit for a weight-1 call.
    assert light.allowed and light.remaining == 0


def test_two_principals_have_independent_budgets(
    redis_prefix: str, sync_redis: redis.Redis
) -> None:
    policy = RatePolicy.parse("10/30s")

    async def scenario() -> tuple[int, int, int]:
        async with limiter_on(redis_prefix) as limiter:
            alice = await take_many(limiter, 15, policy=policy, now_ms=T0)
            bob = await take_many(limiter, 15, policy=policy, now_ms=T0, principal_key=BOB)
            alice_again = await take_many(limiter, 1, policy=policy, now_ms=T0)
            return allowed_count(alice), allowed_count(bob), allowed_count(alice_again)

    assert asyncio.run(scenario()) == (10, 10, 0)


def test_the_bucket_key_expires_when_the_bucket_would_be_full_again(
    redis_prefix: str, sync_redis: redis.Redis
) -> None:
    policy = RatePolicy.parse("10/30s")
    key = f"{redis_prefix}rl:{{p:{ALICE}}}"

    async def scenario(count: int) -> None:
        async with limiter_on(redis_prefix) as limiter:
            await take_many(limiter, count, policy=policy, now_ms=T0)

    asyncio.run(scenario(1))
    # One unit of 10/30s is 3 s of backlog; the TTL is exactly that, minus real elapsed time.
    assert 2_000 < sync_redis.pttl(key) <= 3_000
    asyncio.run(scenario(9))
    assert 29_000 < sync_redis.pttl(key) <= 30_000
    assert sync_redis.hgetall(key) == {"tat_ms": str(T0 + 30_000), "tat_frac": "0"}


def test_a_refused_call_takes_nothing_and_does_not_touch_the_ttl(
    redis_prefix: str, sync_redis: redis.Redis
) -> None:
    policy = RatePolicy.parse("10/30s")
    key = f"{redis_prefix}rl:{{p:{ALICE}}}"

    async def spend(now_ms: int, count: int, cost: int = 1) -> list[RateDecision]:
        async with limiter_on(redis_prefix) as limiter:
            return await take_many(limiter, count, policy=policy, now_ms=now_ms, cost=cost)

    asyncio.run(spend(T0, 10))
    state_before, pttl_before = sync_redis.hgetall(key), sync_redis.pttl(key)

    async def hammer() -> list[RateDecision]:
        # At T0+10 s..T0+10.99 s 3.33..3.66 units have refilled, so weight-4 calls never fit.
        async with limiter_on(redis_prefix) as limiter:
            return [
                await limiter.take(
                    principal_key=ALICE, policy=policy, cost=4, now_ms=T0 + 10_000 + i * 10
                )
                for i in range(100)
            ]

    assert allowed_count(asyncio.run(hammer())) == 0
    assert sync_redis.hgetall(key) == state_before
    # A rewrite at T0+10 s would have set the TTL to about 20 s; it is still the original 30 s.
    assert pttl_before - 1_000 < sync_redis.pttl(key) <= pttl_before
    # Had the refusals consumed anything, the 4 units refilled by T0+12 s would not be there.
    assert [d.allowed for d in asyncio.run(spend(T0 + 12_000, 1, cost=4))] == [True]
    assert [d.allowed for d in asyncio.run(spend(T0 + 12_000, 1))] == [False]


def test_no_double_burst_across_a_fixed_window_boundary(
    redis_prefix: str, sync_redis: redis.Redis
) -> None:
    # The worst case for a fixed window [0 s, 30 s): a fresh principal spends at 29.9 s and
    # again at 30.1 s. A fixed window would let 240 through in 200 ms. GCRA lets through the
    # burst (120) plus what refilled since, one unit per 250 ms.
    async def scenario() -> list[int]:
        async with limiter_on(redis_prefix) as limiter:
            counts = []
            for at_ms in (29_900, 30_100, 30_150, 30_400, 59_900):
                decisions = await take_many(limiter, 200, policy=DEFAULT_POLICY, now_ms=T0 + at_ms)
                counts.append(allowed_count(decisions))
            return counts

    # 29.9 s: the full burst. 30.1 s: 200 ms refilled 0.8 units, nothing passes. 30.15 s:
    # exactly 250 ms, one unit. 30.4 s: another 250 ms, one more. 59.9 s: 29.5 s since the
    # last pass refilled 118 units.
    assert asyncio.run(scenario()) == [120, 0, 1, 1, 118]


def test_a_cost_above_the_limit_is_refused_with_the_window_as_retry_after(
    redis_prefix: str, sync_redis: redis.Redis
) -> None:
    policy = RatePolicy.parse("10/30s")

    async def scenario() -> RateDecision:
        async with limiter_on(redis_prefix) as limiter:
            return await limiter.take(principal_key=ALICE, policy=policy, cost=11, now_ms=T0)

    decision = asyncio.run(scenario())
    assert decision == RateDecision(
        allowed=False, limit=10, remaining=0, reset_s=0, retry_after_s=30
    )
    assert sync_redis.exists(f"{redis_prefix}rl:{{p:{ALICE}}}") == 0


def test_the_redis_server_clock_is_used_when_now_ms_is_omitted(
    redis_prefix: str, sync_redis: redis.Redis
) -> None:
    policy = RatePolicy.parse("1/1h")

    async def scenario() -> tuple[RateDecision, RateDecision]:
        async with limiter_on(redis_prefix) as limiter:
            first = await limiter.take(principal_key=ALICE, policy=policy)
            second = await limiter.take(principal_key=ALICE, policy=policy)
            return first, second

    seconds, microseconds = sync_redis.time()
    first, second = asyncio.run(scenario())
    assert first.allowed
    assert not second.allowed and 3_599 <= second.retry_after_s <= 3_600
    tat_ms = int(str(sync_redis.hget(f"{redis_prefix}rl:{{p:{ALICE}}}", "tat_ms")))
    server_now_ms = seconds * 1_000 + microseconds // 1_000
    assert server_now_ms + 3_600_000 <= tat_ms < server_now_ms + 3_600_000 + 10_000


def test_a_redis_error_propagates_instead_of_allowing(redis_prefix: str) -> None:
    async def scenario() -> RateDecision:
        # Nothing listens on port 1, so the connection is refused at once. No retries: redis-py
        # would otherwise back off for seconds before giving up, and only the outcome matters.
        client = redis.asyncio.Redis(
            host="127.0.0.1", port=1, socket_connect_timeout=2, retry=Retry(NoBackoff(), 0)
        )
        try:
            return await RateLimiter(client, prefix=redis_prefix).take(
                principal_key=ALICE, policy=DEFAULT_POLICY, now_ms=T0
            )
        finally:
            await client.aclose()

    with pytest.raises(redis.RedisError):
        asyncio.run(scenario())


# --- One command per take -----------------------------------------------------------------


def counting_connection_class(sent: list[str]) -> type[redis.asyncio.Connection]:
    class CountingConnection(redis.asyncio.Connection):
        # pack_command is the one path every command takes onto the wire (pipelines included).
        def pack_command(self, *args: Any) -> list[bytes]:
            name = args[0]
            sent.append((name.decode() if isinstance(name, bytes) else str(name)).upper())
            return super().pack_command(*args)

    return CountingConnection


def test_a_take_sends_exactly_one_command(redis_prefix: str, sync_redis: redis.Redis) -> None:
    sent: list[str] = []

    async def scenario() -> None:
        pool = redis.asyncio.ConnectionPool.from_url(
            settings.ADMISSION_REDIS_URL, connection_class=counting_connection_class(sent)
        )
        client = redis.asyncio.Redis(connection_pool=pool)
        try:
            limiter = RateLimiter(client, prefix=redis_prefix)
            # The first take also connects (handshake) and may load the script; not counted.
            await limiter.take(principal_key=ALICE, policy=DEFAULT_POLICY, now_ms=T0)
            sent.clear()
            for i in range(100):
                await limiter.take(principal_key=ALICE, policy=DEFAULT_POLICY, now_ms=T0 + i * 250)
        finally:
            await client.aclose()
            await pool.disconnect()

    asyncio.run(scenario())
    assert sent == ["EVALSHA"] * 100


def test_redis_sees_exactly_one_evalsha_per_take(
    redis_prefix: str, sync_redis: redis.Redis
) -> None:
    # MONITOR shows what the server received, per client address, so other clients of the
    # same Redis (a parallel test run) cannot skew the count. Two ECHO markers bracket the run.
    marker = uuid.uuid4().hex

    async def scenario() -> list[str]:
        watcher = redis.asyncio.Redis.from_url(settings.ADMISSION_REDIS_URL)
        client = redis.asyncio.Redis.from_url(
            settings.ADMISSION_REDIS_URL, single_connection_client=True
        )
        try:
            limiter = RateLimiter(client, prefix=redis_prefix)
            await limiter.take(principal_key=ALICE, policy=DEFAULT_POLICY, now_ms=T0)
            address = (await client.client_info())["addr"]
            async with watcher.monitor() as monitor:
                await client.echo(f"start-{marker}")
                for i in range(100):
                    await limiter.take(
                        principal_key=ALICE, policy=DEFAULT_POLICY, now_ms=T0 + i * 250
                    )
                await client.echo(f"end-{marker}")
                seen: list[str] = []
                while True:
                    entry = await asyncio.wait_for(monitor.next_command(), timeout=10)
                    if f"{entry['client_address']}:{entry['client_port']}" != address:
                        continue
                    if entry["command"] == f"ECHO start-{marker}":
                        seen.clear()
                    elif entry["command"] == f"ECHO end-{marker}":
                        return seen
                    else:
                        seen.append(entry["command"].split(" ", 1)[0].upper())
        finally:
            await client.aclose()
            await watcher.aclose()

    assert asyncio.run(scenario()) == ["EVALSHA"] * 100


def test_bad_arguments_are_rejected_before_redis_is_asked(redis_prefix: str) -> None:
    sent: list[str] = []

    async def scenario() -> list[str]:
        pool = redis.asyncio.ConnectionPool.from_url(
            settings.ADMISSION_REDIS_URL, connection_class=counting_connection_class(sent)
        )
        client = redis.asyncio.Redis(connection_pool=pool)
        limiter = RateLimiter(client, prefix=redis_prefix)
        errors = []
        for kwargs in (
            {"principal_key": ""},
            {"cost": 0},
            {"cost": True},
            {"now_ms": 0},
            {"now_ms": -5},
        ):
            arguments: dict[str, Any] = {"principal_key": ALICE, "now_ms": T0} | kwargs
            with pytest.raises(ValueError) as excinfo:
                await limiter.take(policy=DEFAULT_POLICY, **arguments)
            errors.append(str(excinfo.value))
        await client.aclose()
        await pool.disconnect()
        return errors

    errors = asyncio.run(scenario())
    assert len(errors) == 5
    assert sent == []


# --- RatePolicy ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "limit", "window_ms", "canonical"),
    [
        ("120/30s", 120, 30_000, "120/30s"),
        ("60/1m", 60, 60_000, "60/1m"),
        ("1000/1h", 1_000, 3_600_000, "1000/1h"),
        ("10/s", 10, 1_000, "10/1s"),
        ("60/m", 60, 60_000, "60/1m"),
        ("5/90s", 5, 90_000, "5/90s"),
        ("5/120s", 5, 120_000, "5/2m"),
        ("10/30000ms", 10, 30_000, "10/30s"),
        ("1/1000ms", 1, 1_000, "1/1s"),
        ("1000000/24h", 1_000_000, 86_400_000, "1000000/24h"),
        ("1/86400s", 1, 86_400_000, "1/24h"),
        ("  120/30s\n", 120, 30_000, "120/30s"),
    ],
)
def test_a_policy_parses_and_prints_canonically(
    text: str, limit: int, window_ms: int, canonical: str
) -> None:
    policy = RatePolicy.parse(text)
    assert (policy.limit, policy.window_ms) == (limit, window_ms)
    assert str(policy) == canonical
    assert RatePolicy.parse(str(policy)) == policy


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "expected <limit>/<window>"),
        ("120", "expected <limit>/<window>"),
        ("120/", "expected <limit>/<window>"),
        ("120/30", "expected <limit>/<window>"),
        ("120/30x", "expected <limit>/<window>"),
        ("120/30S", "expected <limit>/<window>"),
        ("120 / 30s", "expected <limit>/<window>"),
        ("-1/30s", "expected <limit>/<window>"),
        ("1.5/30s", "expected <limit>/<window>"),
        ("1_000/30s", "expected <limit>/<window>"),
        ("\u0661\u0662\u0660/30s", "expected <limit>/<window>"),
        ("10/30s/2", "expected <limit>/<window>"),
        ("0/30s", "limit must be 1..1000000 units"),
        ("1000001/1h", "limit must be 1..1000000 units"),
        ("10/0s", "window must be 1s..24h"),
        ("10/500ms", "window must be 1s..24h"),
        ("10/25h", "window must be 1s..24h"),
        ("10/1500ms", "window must be a whole number of seconds"),
    ],
)
def test_a_bad_policy_is_refused_with_a_one_line_reason(text: str, reason: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        RatePolicy.parse(text)
    message = str(excinfo.value)
    assert message.startswith(f"invalid rate limit {text!r}: ")
    assert reason in message
    assert "\n" not in message


def test_a_policy_built_directly_is_validated_too() -> None:
    with pytest.raises(ValueError, match="limit must be"):
        RatePolicy(limit=0, window_ms=30_000)
    with pytest.raises(ValueError, match="limit must be"):
        RatePolicy(limit=True, window_ms=30_000)
    with pytest.raises(ValueError, match="window must be"):
        RatePolicy(limit=10, window_ms=999)


# --- Headers and body ---------------------------------------------------------------------


def test_an_allowed_decision_has_the_rate_limit_headers_and_no_retry_after() -> None:
    decision = RateDecision(allowed=True, limit=120, remaining=119, reset_s=1, retry_after_s=0)
    assert decision.headers(DEFAULT_POLICY) == {
        "RateLimit-Limit": "120",
        "RateLimit-Remaining": "119",
        "RateLimit-Reset": "1",
        "RateLimit-Policy": '"workspace";q=120;w=30',
        "RateLimit": '"workspace";r=119;t=1',
    }
    with pytest.raises(ValueError):
        decision.body()


def test_a_refused_decision_has_retry_after_and_the_429_body(
    redis_prefix: str, sync_redis: redis.Redis
) -> None:
    policy = RatePolicy.parse("10/30s")

    async def scenario() -> RateDecision:
        async with limiter_on(redis_prefix) as limiter:
            return (await take_many(limiter, 11, policy=policy, now_ms=T0))[-1]

    decision = asyncio.run(scenario())
    assert decision.headers(policy) == {
        "RateLimit-Limit": "10",
        "RateLimit-Remaining": "0",
        # Retry-After and Reset name the same moment: when this call would pass.
        "RateLimit-Reset": "3",
        "RateLimit-Policy": '"workspace";q=10;w=30',
        "RateLimit": '"workspace";r=0;t=3',
        "Retry-After": "3",
    }
    assert decision.body() == {
        "error": "rate_limited",
        "message": "Rate limit exceeded for workspace tool calls; retry in 3 seconds.",
        "retry_after_seconds": 3,
    }


def test_headers_refuse_a_policy_other_than_the_one_decided_under() -> None:
    decision = RateDecision(allowed=True, limit=10, remaining=9, reset_s=3, retry_after_s=0)
    with pytest.raises(ValueError):
        decision.headers(DEFAULT_POLICY)
