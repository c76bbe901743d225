"""The floor under benchmarks/overload.py's 429 latency: the same burst of POSTs, through the
same minimal client, against an ASGI application that does nothing but answer 429 (the body
read, no Django, no Redis), under uvicorn started as the API is. What is left between this
figure and overload.py's is Sluice's own work on the loop, and what the rest of a live
instance (workers, drainer, Redis, the other tenant's calls) takes of the same two cores.

    .venv/bin/python benchmarks/http_floor.py [--burst 320] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import harness

from soak.agents import Agent

HERE = Path(__file__).resolve().parent

ANSWER = json.dumps({"error": "The worker's queue is full", "code": "WORKER_QUEUE_FULL"}).encode()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the whole request, answers 429 (uvicorn loads this module as `http_floor:app`)."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"application/json"), (b"retry-after", b"1")]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": ANSWER})


async def _one(url: str) -> float:
    """ms from the request being on the wire to its answer, as overload.py's raw_timed."""
    sent = [time.perf_counter()]

    def on_sent() -> None:
        sent[0] = time.perf_counter()

    body = {"protocolVersion": 1, "operation": "read_file", "workspaceId": "w", "path": "a"}
    headers = {"Authorization": "Bearer floor", "X-LibreChat-Code-Worker-ID": "w"}
    status, _, _ = await Agent.call_and_give_up(url, headers, body, after_s=60, on_sent=on_sent)
    if status != 429:
        raise RuntimeError(f"answered {status}")
    return (time.perf_counter() - sent[0]) * 1000


async def _burst(url: str, n: int) -> list[float]:
    return list(await asyncio.gather(*(_one(url) for _ in range(n))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--burst", type=int, default=320)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "uvicorn", "http_floor:app", "--app-dir", str(HERE)),
            *("--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"),
            "--no-access-log",
        ],
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("uvicorn did not start") from None
                time.sleep(0.1)
        asyncio.run(_burst(url, 10))  # warm: the first connections of a process cost more
        runs = [harness.summary(asyncio.run(_burst(url, args.burst))) for _ in range(args.runs)]
    finally:
        server.terminate()
        server.wait(10)
    print(json.dumps({"burst": args.burst, "429_from_the_wire": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
