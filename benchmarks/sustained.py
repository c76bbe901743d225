"""Sustained load on the instance `make run` started: does a call cost the same after a hundred
thousand calls as after a few? N clients (processes of their own) each send small `read_file`
calls one after another to the demo workspace for D seconds, through the standard library's
HTTP client on a kept-alive connection. Reported: calls per second, the p50 and p99 of the
first and the last tenth of each client's calls, and the RSS of the API processes and the demo
worker before and after.

    make run            # in another terminal, then:
    .venv/bin/python manage.py set_policy WORKSPACE_TOOLS_RATE_LIMIT=100000/30s
    .venv/bin/python benchmarks/sustained.py [--clients 4] [--seconds 240]
    .venv/bin/python manage.py set_policy WORKSPACE_TOOLS_RATE_LIMIT=120/30s

The worker's duplicate-delivery check once scanned every ticket of the last hour on each call:
the last tenth's p50 was 1.6x the first's after 4 minutes at 530 calls/s (docs/benchmarks.md).
Not in `make bench`: it needs the running instance.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

ROOT = Path(__file__).resolve().parent.parent
EXECUTE = "/v1/workspace-tools/execute"
BODY = json.dumps(
    {"protocolVersion": 1, "operation": "read_file", "workspaceId": "app", "path": "README.md"}
)


def client(url: str, seconds: float, out: Any) -> None:
    """One client: calls one after another for `seconds`; sends (ms of each 200, other answers)."""
    parts = urlsplit(url)
    headers = {
        "Authorization": f"Bearer {(ROOT / 'var/demo-api-key').read_text().strip()}",
        "X-LibreChat-Code-Worker-ID": "demo-worker",
        "Content-Type": "application/json",
    }
    times: list[float] = []
    others: dict[str, int] = {}
    # http.client opens the connection again by itself after a close (ours, or the server's
    # `Connection: close` once the answer is read).
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80)
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        started = time.perf_counter()
        try:
            conn.request("POST", EXECUTE, BODY, headers)
            response = conn.getresponse()
            response.read()
        except (OSError, http.client.HTTPException) as exc:
            others[type(exc).__name__] = others.get(type(exc).__name__, 0) + 1
            conn.close()
            continue
        if response.status == 200:
            times.append((time.perf_counter() - started) * 1000)
        else:
            others[str(response.status)] = others.get(str(response.status), 0) + 1
    out.send((times, others))


def rss_mb(url: str) -> dict[str, float]:
    """RSS of the API processes (children of the uvicorn serving `url`'s port, or uvicorn
    itself with one process) and of the demo worker, in MB by process."""
    port = f"--port {urlsplit(url).port or 80}"
    listing = subprocess.run(
        ["ps", "-eo", "pid=,ppid=,rss=,args="], capture_output=True, text=True, check=True
    ).stdout
    rows = [line.split(None, 3) for line in listing.splitlines()]
    servers = {pid for pid, _, _, args in rows if "uvicorn config.asgi" in args and port in args}
    found: dict[str, float] = {}
    for pid, ppid, rss, args in rows:
        if "runworker --worker-id demo-worker" in args:
            found[f"worker {pid}"] = round(int(rss) / 1024, 1)
        elif ppid in servers and "resource_tracker" not in args:
            found[f"api {pid}"] = round(int(rss) / 1024, 1)
    if not any(name.startswith("api") for name in found):
        for pid, _, rss, _ in (row for row in rows if row[0] in servers):
            found[f"api {pid}"] = round(int(rss) / 1024, 1)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=240)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    before = rss_mb(args.url)
    pipes, processes = [], []
    started = time.monotonic()
    for _ in range(args.clients):
        ours, theirs = context.Pipe()
        process = context.Process(target=client, args=(args.url, args.seconds, theirs))
        process.start()
        pipes.append(ours)
        processes.append(process)
    results = [pipe.recv() for pipe in pipes]
    elapsed = time.monotonic() - started
    for process in processes:
        process.join(30)
    first: list[float] = []
    last: list[float] = []
    others: dict[str, int] = {}
    for times, refused in results:
        tenth = max(1, len(times) // 10)
        first += times[:tenth]
        last += times[-tenth:]
        for key, n in refused.items():
            others[key] = others.get(key, 0) + n
    calls = sum(len(times) for times, _ in results)
    print(
        json.dumps(
            {
                "clients": args.clients,
                "seconds": round(elapsed, 1),
                "calls_200": calls,
                "calls_per_s": round(calls / elapsed, 1),
                "other_answers": others,
                "first_tenth": harness.summary(first),
                "last_tenth": harness.summary(last),
                "rss_mb_before": before,
                "rss_mb_after": rss_mb(args.url),
            },
            indent=2,
        )
    )
    return 0 if calls and not others else 1


if __name__ == "__main__":
    sys.exit(main())
