"""The workspace endpoint's per-principal rate limit (CONTRACT §3).

One GCRA bucket per principal (tenant + user), decided by one atomic Lua call
(`lua/ratelimit.lua`) on the Redis server's clock, so every API process shares one exact
budget. This module only decides; the endpoint turns a refusal into a typed 429 and a
`redis.RedisError` into a typed 503. It never allows on error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from admission.scripts import register

if TYPE_CHECKING:
    from redis.asyncio import Redis

# The name in the IETF draft RateLimit / RateLimit-Policy fields. One policy, one name.
POLICY_NAME = "workspace"

MIN_LIMIT = 1
MAX_LIMIT = 1_000_000
MIN_WINDOW_MS = 1_000
MAX_WINDOW_MS = 24 * 3_600_000
# The Lua script relies on limit * window_ms < 2^53 to stay exact in Lua's doubles.
assert MAX_LIMIT * MAX_WINDOW_MS < 2**53

_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000}
# ASCII digits only: `\d` would also accept e.g. Arabic-Indic digits, which int() understands.
_POLICY_RE = re.compile(r"(?P<limit>[0-9]+)/(?P<count>[0-9]*)(?P<unit>ms|s|m|h)")


@dataclass(frozen=True)
class RatePolicy:
    """`limit` units per `window_ms`; a fresh principal may spend all of them at once."""

    limit: int
    window_ms: int

    def __post_init__(self) -> None:
        # `type(...) is int` because bool is an int subclass and True/1s is surely a typo.
        if type(self.limit) is not int or not MIN_LIMIT <= self.limit <= MAX_LIMIT:
            raise ValueError(f"limit must be {MIN_LIMIT}..{MAX_LIMIT} units (got {self.limit!r})")
        if type(self.window_ms) is not int or not MIN_WINDOW_MS <= self.window_ms <= MAX_WINDOW_MS:
            raise ValueError(f"window must be 1s..24h (got {self.window_ms!r} ms)")
        # RateLimit-Policy's w= is whole seconds; a 1.5 s window could only be shown rounded.
        if self.window_ms % 1_000:
            raise ValueError(f"window must be a whole number of seconds (got {self.window_ms}ms)")

    @classmethod
    def parse(cls, text: str) -> RatePolicy:
        """Parse `<limit>/<n><unit>` (unit ms, s, m or h) or `<limit>/<unit>` (n = 1)."""
        match = _POLICY_RE.fullmatch(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise ValueError(
                f"invalid rate limit {text!r}: expected <limit>/<window> such as 120/30s, "
                "60/1m, 1000/1h or 10/s"
            )
        count = int(match["count"]) if match["count"] else 1
        try:
            return cls(limit=int(match["limit"]), window_ms=count * _UNIT_MS[match["unit"]])
        except ValueError as exc:
            raise ValueError(f"invalid rate limit {text!r}: {exc}") from None

    @property
    def window_s(self) -> int:
        return self.window_ms // 1_000

    def __str__(self) -> str:
        # The largest unit that divides the window exactly, so parse(str(p)) == p.
        for unit in ("h", "m", "s"):
            if self.window_ms % _UNIT_MS[unit] == 0:
                return f"{self.limit}/{self.window_ms // _UNIT_MS[unit]}{unit}"
        raise AssertionError("unreachable: windows are whole seconds")  # pragma: no cover


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    limit: int
    remaining: int  # units that would still pass right now; 0 when refused
    reset_s: int  # whole seconds until the bucket is full again, rounded up
    retry_after_s: int  # whole seconds (>= 1) until this request would pass; 0 when allowed
    # The same in whole ms, rounded up (0 when allowed): a finer reading of retry_after_s.
    retry_after_ms: int = field(default=0, compare=False)

    def headers(self, policy: RatePolicy) -> dict[str, str]:
        """Response headers: the classic trio, the IETF draft fields, Retry-After on refusal."""
        if policy.limit != self.limit:
            raise ValueError("headers() needs the policy this decision was taken under")
        # Reset names the moment more units are available to this caller. While some remain
        # that is when the bucket is full again; once refused it is the moment this call would
        # pass, the same moment Retry-After names (IETF RateLimit fields draft: a client that
        # reads either must come back at the same time). The bucket being full later is not
        # something a refused client can act on.
        reset_s = self.reset_s if self.allowed else self.retry_after_s
        headers = {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(self.remaining),
            "RateLimit-Reset": str(reset_s),
            "RateLimit-Policy": f'"{POLICY_NAME}";q={policy.limit};w={policy.window_s}',
            "RateLimit": f'"{POLICY_NAME}";r={self.remaining};t={reset_s}',
        }
        if not self.allowed:
            headers["Retry-After"] = str(self.retry_after_s)
        return headers

    def body(self) -> dict[str, object]:
        """The 429 body. An allowed call has no rate-limit body, so asking for one is a bug."""
        if self.allowed:
            raise ValueError("an allowed decision has no 429 body")
        return {
            "error": "rate_limited",
            "message": (
                "Rate limit exceeded for workspace tool calls; "
                f"retry in {self.retry_after_s} seconds."
            ),
            "retry_after_seconds": self.retry_after_s,
        }


# CONTRACT §3: 120 units per 30 s per principal; every operation weighs 1 unless configured.
DEFAULT_POLICY = RatePolicy(limit=120, window_ms=30_000)


def ratelimit_key(prefix: str, principal_key: str) -> str:
    """The bucket key. The hash tag keeps the house rule (one principal, one cluster slot)."""
    return f"{prefix}rl:{{p:{principal_key}}}"


class RateLimiter:
    """Takes units from a principal's budget: exactly one EVALSHA per `take`.

    (After a Redis restart the first call per process also sends SCRIPT LOAD and retries,
    which redis-py does on NOSCRIPT; that is the only exception.)
    """

    def __init__(self, client: Redis, *, prefix: str) -> None:
        self._prefix = prefix
        self._script: Any = register(client, "ratelimit")

    async def take(
        self,
        *,
        principal_key: str,
        policy: RatePolicy,
        cost: int = 1,
        now_ms: int | None = None,
    ) -> RateDecision:
        """Take `cost` units now, or refuse and take nothing. Redis errors propagate."""
        if not principal_key:
            raise ValueError("principal_key must be a non-empty string")
        if type(cost) is not int or cost < 1:
            raise ValueError(f"cost must be an integer >= 1 (got {cost!r})")
        # 0 tells the script to read Redis TIME, so a caller-supplied 0 would silently mean
        # "now" instead of the epoch; refuse it rather than guess.
        if now_ms is not None and (type(now_ms) is not int or now_ms < 1):
            raise ValueError(f"now_ms must be a positive integer or None (got {now_ms!r})")
        raw = await self._script(
            keys=[ratelimit_key(self._prefix, principal_key)],
            args=[policy.limit, policy.window_ms, cost, now_ms or 0],
        )
        allowed, remaining, reset_s, retry_after_s, retry_after_ms = (int(value) for value in raw)
        return RateDecision(
            allowed=allowed == 1,
            limit=policy.limit,
            remaining=remaining,
            reset_s=reset_s,
            retry_after_s=retry_after_s,
            retry_after_ms=retry_after_ms,
        )
