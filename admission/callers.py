"""Who a key is, remembered for at most a second: refusals under a burst cost no query.

A burst of calls from one key would otherwise be a burst of identical Postgres reads before
any of them could be refused (rate limit, queue full). Each answer of `call_resolve` (the key,
its principal, the worker and its offer) is kept in this process for `CACHE_TTL_S`, counted
from the moment its query started, so a key revoked (or an offer withdrawn, a workspace
quarantined) stops being honoured here within that second. Concurrent misses for the same
lookup share one query, and a value asked for in the second half of its second is loaded again
in the background meanwhile, so a key in steady use never waits for its lookup. A call that
waits for its grant is dispatched by the script that grants it, which refuses it when its key
was revoked meanwhile (admission/revocation.py writes a marker the scripts read); where the
scripts cannot dispatch (a Redis Cluster), the waiter checks its key once more, fresh, before
it pushes the call itself (`caller_key_valid`).
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
# A value asked for at this age is renewed in the background (TtlCache).
RENEW_AFTER_S = 0.5
# Unknown keys are remembered too (a flood of bad keys is not a flood of queries); past this
# many entries the oldest half is dropped.
MAX_ENTRIES = 10_000


class TtlCache(Generic[T]):
    """Values for at most `ttl_s` after their load began, on one event loop. A value asked for
    once it is `renew_after_s` old is loaded again in the background while it still serves, so
    a key in steady use never makes its callers wait for a load: under a burst, a load's answer
    waits behind everything then ready on the loop (25-75 ms of a 320-call burst here), and
    every call of the key in this process waited with it once a second."""

    def __init__(
        self,
        *,
        ttl_s: float = CACHE_TTL_S,
        renew_after_s: float = RENEW_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s, self.renew_after_s, self.clock = ttl_s, renew_after_s, clock
        self.items: dict[Hashable, tuple[float, T]] = {}
        self.loading: dict[Hashable, asyncio.Future[T]] = {}
        # Background loads of values still served; a `fresh` ask does not wait for one (it
        # began before the ask).
        self.renewing: dict[Hashable, asyncio.Future[T]] = {}
        # Counts `clear`s: a load begun before one does not keep its value.
        self.cleared = 0

    async def get(
        self, key: Hashable, load: Callable[[], Awaitable[T]], *, fresh: bool = False
    ) -> T:
        """The value, loaded once for everyone who asks meanwhile; `fresh`: not the one
        remembered (a load that is under way still serves, unless it is a renewal)."""
        if fresh:
            self.items.pop(key, None)
        hit = self.items.get(key)
        now = self.clock()
        if hit is not None and now < hit[0]:
            if (
                now >= hit[0] - self.ttl_s + self.renew_after_s
                and key not in self.renewing
                and key not in self.loading
            ):
                renewal = self.renewing[key] = asyncio.ensure_future(
                    self._load(key, load, self.renewing)
                )
                renewal.add_done_callback(_retrieved)  # a failed renewal: the value expires
            return hit[1]
        pending = self.loading.get(key) or (None if fresh else self.renewing.get(key))
        if pending is None:
            pending = self.loading[key] = asyncio.ensure_future(self._load(key, load, self.loading))
        # Shielded: one caller going away must not cancel the query the others wait for.
        return await asyncio.shield(pending)

    async def _load(
        self,
        key: Hashable,
        load: Callable[[], Awaitable[T]],
        pending: dict[Hashable, asyncio.Future[T]],
    ) -> T:
        started, cleared = self.clock(), self.cleared
        try:
            value = await load()
        finally:
            pending.pop(key, None)
        if len(self.items) >= MAX_ENTRIES:
            for old in list(self.items)[: MAX_ENTRIES // 2]:
                del self.items[old]
        held = self.items.get(key)
        if cleared == self.cleared and (held is None or held[0] < started + self.ttl_s):
            self.items[key] = (started + self.ttl_s, value)  # never over a later load's value
        return value

    def clear(self) -> None:
        self.items.clear()
        self.cleared += 1


def _retrieved(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()


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
