"""The caller cache: a revoked key stops being honoured within its 1 s bound (fake clock,
real Postgres), and a burst of identical lookups is one query."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone

from admission.callers import CACHE_TTL_S, TtlCache, caller_key_valid
from admission.dbthread import in_db_thread
from workspaces.access import Caller, caller_for_api_key
from workspaces.models import ApiKey
from workspaces.secrets import hash_secret


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.django_db(transaction=True)
def test_a_revoked_key_is_dropped_within_one_second(account_factory: Any) -> None:
    owner = account_factory()
    clock = FakeClock()
    queries = 0

    async def scenario() -> list[Caller | None]:
        cache: TtlCache[Caller | None] = TtlCache(clock=clock)

        async def load() -> Caller | None:
            nonlocal queries
            queries += 1
            return await in_db_thread(caller_for_api_key, raw_key=owner.api_key)

        seen = [await cache.get("k", load)]
        clock.now = 100.3
        await in_db_thread(
            lambda: ApiKey.objects.filter(key_hash=hash_secret(owner.api_key)).update(
                revoked_at=timezone.now()
            )
        )
        clock.now = 100.9  # 0.9 s after the lookup began: still the cached caller
        seen.append(await cache.get("k", load))
        clock.now = 101.0  # 1.0 s: dropped, asked again
        seen.append(await cache.get("k", load))
        return seen

    first, cached, fresh = asyncio.run(scenario())
    assert CACHE_TTL_S <= 1.0
    assert first is not None and cached == first
    assert fresh is None
    assert queries == 2
    assert caller_key_valid(first) is False


def test_concurrent_misses_share_one_load() -> None:
    loads = 0

    async def scenario() -> list[int]:
        cache: TtlCache[int] = TtlCache(clock=FakeClock())
        gate = asyncio.Event()

        async def load() -> int:
            nonlocal loads
            loads += 1
            await gate.wait()
            return 7

        tasks = [asyncio.create_task(cache.get("k", load)) for _ in range(500)]
        await asyncio.sleep(0)
        gate.set()
        return await asyncio.gather(*tasks)

    assert asyncio.run(scenario()) == [7] * 500
    assert loads == 1


def test_a_value_in_steady_use_is_renewed_while_it_serves() -> None:
    """Asked for in the second half of its second, a value is loaded again in the background
    while it still answers at once; the next second is served from the renewal, with no wait
    and no load of its own. A value nobody asks for meanwhile is not renewed."""
    clock = FakeClock()
    loads: list[float] = []
    let_load = asyncio.Event()

    async def scenario() -> None:
        cache: TtlCache[int] = TtlCache(clock=clock)

        async def load() -> int:
            loads.append(clock.now)
            await let_load.wait()
            return len(loads)

        let_load.set()
        assert await cache.get("k", load) == 1
        let_load.clear()  # loads from now on wait until let through
        clock.now = 100.4
        assert await asyncio.wait_for(cache.get("k", load), 1) == 1  # young: not renewed
        assert loads == [100.0]
        clock.now = 100.6
        assert await asyncio.wait_for(cache.get("k", load), 1) == 1  # served while it renews
        assert await asyncio.wait_for(cache.get("k", load), 1) == 1  # one renewal, not two
        assert loads == [100.0, 100.6]
        let_load.set()
        await asyncio.wait_for(asyncio.gather(*cache.renewing.values()), 1)
        let_load.clear()
        clock.now = 101.05  # the first value has expired: the renewal's serves, no wait
        assert await asyncio.wait_for(cache.get("k", load), 1) == 2
        clock.now = 102.0  # the renewal's own second is over too: nobody asked meanwhile
        waiting = asyncio.create_task(cache.get("k", load))
        await _until(lambda: len(loads) == 3)
        assert not waiting.done() and loads == [100.0, 100.6, 102.0]
        let_load.set()
        assert await asyncio.wait_for(waiting, 1) == 3

    asyncio.run(scenario())


def test_a_renewal_begun_before_a_clear_or_a_fresh_ask_does_not_answer_it() -> None:
    """`clear` (a key quarantined here) and `fresh` (a worker looked up past the cache) want
    the state as of the moment they ask: a renewal begun earlier neither answers them nor
    leaves its value behind."""
    clock = FakeClock()
    loads: list[asyncio.Event] = []
    values = iter(["before", "after"])

    async def scenario() -> tuple[str, str, str]:
        cache: TtlCache[str] = TtlCache(clock=clock)

        async def load() -> str:
            value = next(values, "later")
            let = asyncio.Event()
            loads.append(let)
            await let.wait()
            return value

        first = asyncio.create_task(cache.get("k", load))
        await _until(lambda: len(loads) == 1)
        loads[0].set()
        await first
        clock.now = 100.6
        await cache.get("k", load)  # renewal begun: it will read "after"...
        await _until(lambda: len(loads) == 2)
        cache.clear()  # ...but it began before this clear
        fresh = asyncio.create_task(cache.get("k", load, fresh=True))
        await _until(lambda: len(loads) == 3)  # the fresh ask loads on its own
        loads[1].set()
        await asyncio.wait_for(asyncio.gather(*cache.renewing.values()), 1)
        kept_after_renewal = cache.items.get("k")
        loads[2].set()
        return await fresh, str(kept_after_renewal), await cache.get("k", load)

    fresh, kept, next_ask = asyncio.run(scenario())
    assert fresh == "later"
    assert kept == "None"  # the renewal's value was dropped, not kept over the clear
    assert next_ask == "later"


async def _until(condition: Callable[[], bool]) -> None:
    """Let the loop run until `condition` holds (a few steps; never a sleep of time)."""
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("not reached in 100 steps of the loop")
