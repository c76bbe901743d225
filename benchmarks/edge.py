"""What one refusal costs Sluice's own code, in this process, on the real ASGI application
(no uvicorn, no client): a refusal that holds (api/execute/burst.py) answered at the edge, and the
same call answered by the view (Django's request, DRF, the policy and rate-limit scripts).

    .venv/bin/python benchmarks/edge.py [--calls 2000]

The rate limit is set to 1 per 30 s, so after the first call every call is a rate-limit
refusal; `SLUICE_ADMITTING_PER_KEY` is irrelevant (one call at a time). "By the view" forgets
the memory before each call. Real Postgres (a throwaway database) and Redis (its own prefix);
the rows go to the Redis stream as in production. The figure is wall time per call of this one
event loop, which is the loop's CPU here: nothing else runs on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    harness.prepare("sluice_bench_edge", WORKSPACE_TOOLS_RATE_LIMIT="1/30s")
    owner = harness.account("edge-w", tenant="edge")
    from livesupport import asgi_scope

    from config.asgi import application

    edge = application.edge

    body = json.dumps(
        {"protocolVersion": 1, "operation": "read_file", "workspaceId": "repo", "path": "a"}
    ).encode()
    headers = [
        (b"host", b"127.0.0.1:8000"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"authorization", f"Bearer {owner['api_key']}".encode()),
        (b"x-librechat-code-worker-id", owner["worker_id"].encode()),
    ]
    statuses: list[int] = []

    stay = asyncio.Event()  # the client stays until its answer (never set)

    async def call() -> None:
        given = False

        async def receive() -> dict[str, Any]:
            nonlocal given
            if given:
                await stay.wait()
            given = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await application(asgi_scope(headers), receive, send)

    async def timed(forget: bool) -> float:
        started = time.perf_counter()
        for _ in range(args.calls):
            if forget:
                edge.burst.memo.held.clear()
            await call()
        await edge.emissions.flush()
        return (time.perf_counter() - started) * 1e6 / args.calls

    async def run() -> dict[str, Any]:
        for _ in range(20):  # the first takes the unit; caches, connections, scripts warm up
            await call()
        statuses.clear()
        edge_us = await timed(forget=False)
        view_us = await timed(forget=True)
        return {
            "calls": args.calls,
            "answers": sorted(set(statuses)),
            "refusal_from_memory_at_the_edge_us": round(edge_us),
            "refusal_by_the_view_us": round(view_us),
        }

    results = asyncio.run(run())
    harness.cleanup_redis()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
