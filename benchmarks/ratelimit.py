"""What the workspace rate limiter adds to a call: latency and Redis commands (issue 5).

Runs `RateLimiter.take` against the local Redis (settings.ADMISSION_REDIS_URL) on a key prefix
of its own, interleaved with plain PINGs on the same connection, so both see the same host,
network and load. The limiter's added latency is take minus PING at each percentile: the
round trip itself is paid by any remote check, the rest is the script and the Python around it.

Commands are counted on the client (a connection class that counts every command it packs),
which is exact whatever else talks to that Redis. INFO commandstats is reported too, as a
server-side cross-check; it is server-wide, so other clients' EVALSHAs inflate it.

Needs Redis only, no database:  .venv/bin/python benchmarks/ratelimit.py [--takes N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.connection import Connection

from admission.ratelimit import RateLimiter, RatePolicy

# Every take is allowed under this policy (the heavier path: it writes the bucket)...
ROOMY = RatePolicy(limit=1_000_000, window_ms=24 * 3_600_000)
# ...and every take after the first is refused under this one (the read-only path).
TIGHT = RatePolicy(limit=1, window_ms=24 * 3_600_000)
WARMUP = 200


class CountingConnection(Connection):
    """Counts each command this connection sends, by name (handshake commands included)."""

    sent: Counter[str] = Counter()

    def pack_command(self, *args: Any) -> list[bytes]:
        name = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
        CountingConnection.sent[name.upper()] += 1
        return super().pack_command(*args)


def percentile(sorted_ns: list[int], q: float) -> float:
    """Nearest-rank percentile, in microseconds."""
    index = min(len(sorted_ns) - 1, max(0, round(q * len(sorted_ns)) - 1))
    return sorted_ns[index] / 1_000


def summary(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    return {"p50_us": percentile(ordered, 0.50), "p99_us": percentile(ordered, 0.99)}


async def evalsha_calls(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def measure(url: str, takes: int) -> dict[str, Any]:
    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    client = aioredis.Redis.from_url(url, connection_class=CountingConnection)
    admin = aioredis.Redis.from_url(url)
    limiter = RateLimiter(client, prefix=prefix)
    try:
        # Warm up: connect (HELLO/SELECT...), load the script, fill the interpreter's caches.
        for _ in range(WARMUP):
            await client.ping()
            await limiter.take(principal_key="warmup", policy=ROOMY)
        await limiter.take(principal_key="refused", policy=TIGHT)

        ping_ns: list[int] = []
        allowed_ns: list[int] = []
        refused_ns: list[int] = []
        CountingConnection.sent.clear()
        server_before = await evalsha_calls(admin)
        for _ in range(takes):
            start = time.perf_counter_ns()
            await client.ping()
            mid = time.perf_counter_ns()
            decision = await limiter.take(principal_key="allowed", policy=ROOMY)
            end = time.perf_counter_ns()
            refusal = await limiter.take(principal_key="refused", policy=TIGHT)
            after = time.perf_counter_ns()
            assert decision.allowed and not refusal.allowed
            ping_ns.append(mid - start)
            allowed_ns.append(end - mid)
            refused_ns.append(after - end)
        server_after = await evalsha_calls(admin)
        sent = dict(CountingConnection.sent)
    finally:
        keys = [key async for key in admin.scan_iter(match=f"{prefix}*")]
        if keys:
            await admin.delete(*keys)
        await client.aclose()
        await admin.aclose()

    pings = sent.pop("PING", 0)
    assert pings == takes, f"expected {takes} PINGs, counted {pings}"
    limiter_commands = sum(sent.values())
    ping, allowed, refused = summary(ping_ns), summary(allowed_ns), summary(refused_ns)
    return {
        "redis_url": url,
        "takes_per_path": takes,
        "ping": ping,
        "take_allowed": allowed,
        "take_refused": refused,
        "added_allowed": {k: round(allowed[k] - ping[k], 1) for k in ping},
        "added_refused": {k: round(refused[k] - ping[k], 1) for k in ping},
        "commands_per_take": limiter_commands / (takes * 2),
        "commands_by_name": sent,
        # Server-wide: includes any other client's EVALSHA during the run.
        "server_evalsha_per_take": (server_after - server_before) / (takes * 2),
    }


def table(result: dict[str, Any]) -> str:
    rows = [
        ("PING (baseline)", result["ping"], None),
        ("take, allowed", result["take_allowed"], result["added_allowed"]),
        ("take, refused", result["take_refused"], result["added_refused"]),
    ]
    # A take is what the limiter adds to a call; "over PING" is what it costs beyond a round trip.
    lines = [f"{'':<16} {'p50 us':>8} {'p99 us':>8} {'over PING p50':>14} {'over PING p99':>14}"]
    for name, stats, added in rows:
        extra = f"{added['p50_us']:>14.1f} {added['p99_us']:>14.1f}" if added else ""
        lines.append(f"{name:<16} {stats['p50_us']:>8.1f} {stats['p99_us']:>8.1f} {extra}".rstrip())
    names = ", ".join(
        f"{name} x{count}" for name, count in sorted(result["commands_by_name"].items())
    )
    lines.append(
        f"Redis commands per take: {result['commands_per_take']:.3f} (client-counted: {names}); "
        f"server saw {result['server_evalsha_per_take']:.3f} EVALSHA per take (server-wide)"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--takes", type=int, default=2_500, help="takes per path (>= 1000)")
    parser.add_argument(
        "--url", default=None, help="Redis URL (default: settings.ADMISSION_REDIS_URL)"
    )
    args = parser.parse_args()
    if args.takes < 1_000:
        parser.error("--takes must be at least 1000")
    result = asyncio.run(measure(args.url or settings.ADMISSION_REDIS_URL, args.takes))
    print(table(result))
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
