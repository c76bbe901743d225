"""Who a key is, remembered for at most a second: refusals under a burst cost no query.

A burst of calls from one key would otherwise be a burst of identical Postgres reads before
any of them could be refused (rate limit, queue full). Each answer of `call_resolve` (the key,
its principal, the worker and its offer) is kept in this process for `CACHE_TTL_S`, counted
from the moment its query started, so a key revoked (or an offer withdrawn, a workspace
quarantined) stops being honoured here within that second. Concurrent misses for the same
lookup share one query. A call that waits for its grant is dispatched by the script that
grants it, which refuses it when its key was revoked meanwhile (admission/revocation.py writes
a marker the scripts read); where the scripts cannot dispatch (a Redis Cluster), the waiter
checks its key once more, fresh, before it pushes the call itself (`caller_key_valid`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

from sluice_protocol import isolation_key

from admission.dbthread import in_db_thread
from admission.selectors import Resolved, call_resolve
from workspaces.access import Caller, caller_for_api_key, key_param
from workspaces.models import ApiKey

T = TypeVar("T")
CACHE_TTL_S = 1.0
# Unknown keys are remembered too (a flood of bad keys is not a flood of queries); past this
# many entries the oldest half is dropped.
MAX_ENTRIES = 10_000


class TtlCache(Generic[T]):
    """Values for at most `ttl_s` after their load began, on one event loop."""

    def __init__(
        self, *, ttl_s: float = CACHE_TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s, self.clock = ttl_s, clock
        self.items: dict[Hashable, tuple[float, T]] = {}
        self.loading: dict[Hashable, asyncio.Future[T]] = {}

    async def get(
        self, key: Hashable, load: Callable[[], Awaitable[T]], *, fresh: bool = False
    ) -> T:
        """The value, loaded once for everyone who asks meanwhile; `fresh`: not the one
        remembered (a load that is under way still serves)."""
        if fresh:
            self.items.pop(key, None)
        hit = self.items.get(key)
        if hit is not None and self.clock() < hit[0]:
            return hit[1]
        pending = self.loading.get(key)
        if pending is None:
            pending = self.loading[key] = asyncio.ensure_future(self._load(key, load))
        # Shielded: one caller going away must not cancel the query the others wait for.
        return await asyncio.shield(pending)

    async def _load(self, key: Hashable, load: Callable[[], Awaitable[T]]) -> T:
        started = self.clock()
        try:
            value = await load()
        finally:
            self.loading.pop(key, None)
        if len(self.items) >= MAX_ENTRIES:
            for old in list(self.items)[: MAX_ENTRIES // 2]:
                del self.items[old]
        self.items[key] = (started + self.ttl_s, value)
        return value

    def clear(self) -> None:
        self.items.clear()


_caches: dict[int, TtlCache[Any]] = {}


def _cache() -> TtlCache[Any]:
    # One per event loop: the pending futures belong to the loop that made them.
    loop = id(asyncio.get_running_loop())
    if loop not in _caches:
        _caches[loop] = TtlCache()
    return _caches[loop]


def forget_cached_callers() -> None:
    """Drop every remembered lookup in this process: a key it quarantined a moment ago must be
    refused by its very next call here. (Other API processes learn within CACHE_TTL_S.)"""
    for cache in _caches.values():
        cache.clear()


async def cached_resolve(
    *,
    token: str | None,
    worker_id: str | None,
    request: dict[str, Any] | None,
    key_hash: Callable[[str], str],
    fresh: bool = False,
) -> Resolved:
    """`call_resolve`, answered from the last second's identical lookup when there is one
    (unless `fresh`)."""
    key = key_param(token or "")
    if key is None:
        return Resolved(None, None, None)
    lookup: Hashable = (
        ("resolve", key, worker_id, str(request["workspaceId"]), isolation_key(request))
        if request is not None
        else ("caller", key)
    )

    async def load() -> Resolved:
        return await in_db_thread(
            call_resolve, token=token, worker_id=worker_id, request=request, key_hash=key_hash
        )

    resolved: Resolved = await _cache().get(lookup, load, fresh=fresh)
    if request is None:
        # The entry may have been filled by `cached_caller`, which names no worker.
        return Resolved(resolved.caller, worker_id if resolved.caller else None, None)
    return resolved


async def cached_caller(token: str | None) -> Caller | None:
    """The key's caller (for authenticating before a body is read), from the same cache."""
    key = key_param(token or "")
    if key is None:
        return None

    async def load() -> Resolved:
        caller = await in_db_thread(caller_for_api_key, raw_key=token or "")
        return Resolved(caller, None, None)

    resolved: Resolved = await _cache().get(("caller", key), load)
    return resolved.caller


def caller_key_valid(caller: Caller) -> bool:
    """Fresh from Postgres: the caller's key is still unrevoked and its principal active.

    The check a waited call makes before the API process dispatches it itself (a Redis
    Cluster, admission/services.py); elsewhere the grant scripts check the revocation markers."""
    if caller.key_id is None:
        return True
    return ApiKey.objects.filter(
        pk=caller.key_id, revoked_at__isnull=True, principal__is_active=True
    ).exists()
