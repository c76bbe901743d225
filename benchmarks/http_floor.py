"""The floor under benchmarks/overload.py's figures: the same burst of POSTs, through the
same minimal client, against an ASGI application that does nothing but answer (the body read,
no Django, no Redis), under uvicorn started as the API is. What is left between these figures
and overload.py's is Sluice's own work on the loop, and what the rest of a live instance
(workers, drainer, Redis) takes of the same two cores.

    .venv/bin/python benchmarks/http_floor.py [--burst 320] [--runs 3]

Two figures per run:

* the burst's 429 latency from the wire (overload.py's target: p99 within 100 ms);
* the other tenant's: overload.py's own neighbour (`neighbour_process`, httpx, a process of
  its own) calls the same application, answered 200, 30 times before the burst and 30 times
  during it. `neighbour_added_p99_ms` is what the burst added to its p99: Sluice runs the
  same uvicorn, client and kernel, so it adds at least about as much. overload.py's target
  is the neighbour's p99 within 2x its baseline; with Sluice's baseline p99 of B ms, a floor
  that adds more than B ms already misses it, whatever Sluice's own work costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import harness
from livesupport import free_port, wait_until
from overload import neighbour_process

from soak.agents import Agent

HERE = Path(__file__).resolve().parent

ANSWER = json.dumps({"error": "The worker's queue is full", "code": "WORKER_QUEUE_FULL"}).encode()
# The other tenant's credential, answered 200 with a small read's answer.
NEIGHBOUR = "Bearer neighbour"
READ = json.dumps(
    {"protocolVersion": 1, "operation": "read_file", "workspaceId": "w", "content": "x" * 200}
).encode()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the whole request, answers 429, or 200 to the other tenant (uvicorn loads this
    module as `http_floor:app`)."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    theirs = (b"authorization", NEIGHBOUR.encode()) in scope["headers"]
    headers = [(b"content-type", b"application/json"), (b"retry-after", b"1")]
    status = 200 if theirs else 429
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": READ if theirs else ANSWER})


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


async def _burst(urls: list[str], n: int) -> list[float]:
    return list(await asyncio.gather(*(_one(urls[i % len(urls)]) for i in range(n))))


def _run(urls: list[str], n: int) -> dict[str, Any]:
    """One burst, with the other tenant calling the first process before and during it."""
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    neighbour = multiprocessing.get_context("spawn").Process(
        target=neighbour_process, args=(urls[0], {"Authorization": NEIGHBOUR}, theirs), daemon=True
    )
    neighbour.start()
    try:
        baseline = ours.recv()
        ours.send("go")
        refused_429 = asyncio.run(_burst(urls, n))
        during, refused, _ = ours.recv()
    finally:
        neighbour.join(timeout=30)
    if refused or len(during) != len(baseline):
        raise RuntimeError(f"the other tenant was answered otherwise: {refused}")
    calm, busy = harness.summary(baseline), harness.summary(during)
    return {
        "429_from_the_wire": harness.summary(refused_429),
        "neighbour_baseline": calm,
        "neighbour_during": busy,
        "neighbour_added_p99_ms": round(busy["p99_ms"] - calm["p99_ms"], 2),
        "neighbour_p99_ratio": round(busy["p99_ms"] / calm["p99_ms"], 2),
    }


def _serve() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "uvicorn", "http_floor:app", "--app-dir", str(HERE)),
            *("--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"),
            "--no-access-log",
        ],
    )

    def answering() -> bool:
        if server.poll() is not None:
            raise RuntimeError("uvicorn did not start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    try:
        wait_until(answering, timeout_s=30, interval_s=0.1)
    except (AssertionError, RuntimeError):
        server.kill()
        raise
    return server, f"http://127.0.0.1:{port}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--burst", type=int, default=320)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--api-processes", type=int, default=1, help="as overload.py: the burst goes round"
    )
    args = parser.parse_args()
    servers: list[subprocess.Popen[bytes]] = []
    try:
        urls = []
        for _ in range(args.api_processes):
            server, url = _serve()
            servers.append(server)
            urls.append(url)
        for url in urls:
            asyncio.run(_burst([url], 10))  # warm: the first connections of a process cost more
        runs = [_run(urls, args.burst) for _ in range(args.runs)]
    finally:
        for server in servers:
            server.terminate()
            server.wait(10)
    print(
        json.dumps(
            {"burst": args.burst, "api_processes": args.api_processes, "runs": runs}, indent=2
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
