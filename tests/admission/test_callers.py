"""The caller cache: a revoked key stops being honoured within its 1 s bound (fake clock,
real Postgres), and a burst of identical lookups is one query."""

from __future__ import annotations

import asyncio
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
