"""A durable call's added latency (contract §2.7) against a synchronous one, same small read.

    .venv/bin/python benchmarks/durable.py [--calls N] [--poll-ms MS ...]

Starts its own API server (uvicorn), completion drainer and worker (`manage.py runworker`) on
a throwaway database (`sluice_bench`, through harness.prepare) under a Redis prefix of its
own. Then, after a warm-up, N sequential calls of each kind on one keep-alive connection:

* sync     `POST /v1/workspace-tools/execute`, answered with the result;
* durable  `POST /v1/workspace-tools/requests` (202), then `GET .../requests/<id>` every
           poll interval until the status is completed, as LibreChat's durable transport
           does (the contract has no long poll). One row per poll interval given.

Prints p50/p99 of each and the durable call's added latency over the synchronous one: a
table, then one JSON line for the docs. The poll interval bounds most of the difference.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from roundtrip import FILE_TEXT, READ, READ_CONTENT, WORKSPACE

WARMUP_CALLS = 20
REQUESTS = "/v1/workspace-tools/requests"


def measure_sync(http: Any, headers: dict[str, str], calls: int) -> list[float]:
    samples = []
    for i in range(WARMUP_CALLS + calls):
        started = time.perf_counter()
        response = http.post("/v1/workspace-tools/execute", headers=headers, json=READ)
        elapsed_ms = (time.perf_counter() - started) * 1000
        if response.status_code != 200 or response.json()["content"] != READ_CONTENT:
            raise SystemExit(f"sync call {i}: {response.status_code} {response.text[:300]}")
        if i >= WARMUP_CALLS:
            samples.append(elapsed_ms)
    return samples


def measure_durable(
    http: Any, headers: dict[str, str], calls: int, poll_ms: int
) -> tuple[list[float], list[int]]:
    """(latencies, status lookups per call)."""
    samples, lookups = [], []
    for i in range(WARMUP_CALLS + calls):
        request_id = "bench-" + uuid.uuid4().hex
        started = time.perf_counter()
        response = http.post(
            REQUESTS, headers=headers | {"X-LibreChat-Workspace-Request-Id": request_id}, json=READ
        )
        if response.status_code != 202:
            raise SystemExit(f"durable call {i}: {response.status_code} {response.text[:300]}")
        status, polls = response.json(), 0
        while status["state"] in ("queued", "admitted"):
            time.sleep(poll_ms / 1000)
            status = http.get(f"{REQUESTS}/{request_id}", headers=headers).json()
            polls += 1
        elapsed_ms = (time.perf_counter() - started) * 1000
        if status["state"] != "completed" or status["result"]["content"] != READ_CONTENT:
            raise SystemExit(f"durable call {i}: {json.dumps(status)[:300]}")
        if i >= WARMUP_CALLS:
            samples.append(elapsed_ms)
            lookups.append(polls)
    return samples, lookups


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="measured calls each (default 200)")
    parser.add_argument(
        "--poll-ms", type=int, nargs="+", default=[10, 100], help="poll intervals (default 10 100)"
    )
    args = parser.parse_args()
    if args.calls < 1 or min(args.poll_ms) < 1:
        parser.error("--calls and --poll-ms must be at least 1")

    env = harness.prepare("sluice_bench", WORKSPACE_TOOLS_RATE_LIMIT="1000000/1h")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    import httpx
    from livesupport import Worker, git_workspace, start_api

    account = harness.account("bench-worker")
    headers = {
        "Authorization": f"Bearer {account['api_key']}",
        "X-LibreChat-Code-Worker-ID": account["worker_id"],
    }
    api = start_api(env)
    worker: Worker | None = None
    figures: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-bench-") as tmp:
            repo = git_workspace(Path(tmp) / "repo", files={"small.txt": FILE_TEXT})
            worker = Worker(
                account["worker_id"], account["worker_token"], {WORKSPACE: repo}, api.url, env,
                slots=2,
            )  # fmt: skip
            worker.start()
            with httpx.Client(base_url=api.url, timeout=30) as http:
                figures["sync"] = harness.summary(measure_sync(http, headers, args.calls))
                for poll_ms in args.poll_ms:
                    samples, lookups = measure_durable(http, headers, args.calls, poll_ms)
                    figures[f"durable_poll_{poll_ms}ms"] = harness.summary(samples) | {
                        "lookups_per_call": round(sum(lookups) / len(lookups), 2)
                    }
    finally:
        if worker is not None:
            worker.stop()
        api.process.stop()
        harness.cleanup_redis()
    sync = figures["sync"]
    print(
        f"{'small read_file':<26}{'calls':>6}{'p50 ms':>10}{'p99 ms':>10}{'+p50':>9}{'+p99':>9}{'GETs':>6}"
    )
    for name, f in figures.items():
        added = (f["p50_ms"] - sync["p50_ms"], f["p99_ms"] - sync["p99_ms"])
        gets = f.get("lookups_per_call", 0)
        print(
            f"{name:<26}{f['n']:>6}{f['p50_ms']:>10.3f}{f['p99_ms']:>10.3f}"
            f"{added[0]:>9.1f}{added[1]:>9.1f}{gets:>6}"
        )
    added_ms = {
        name: {q: round(f[q] - sync[q], 3) for q in ("p50_ms", "p99_ms")}
        for name, f in figures.items()
        if name != "sync"
    }
    print(
        json.dumps(
            {
                "benchmark": "durable_vs_sync_read_file",
                "calls": args.calls,
                **figures,
                "added_ms": added_ms,
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
            }
        )
    )


if __name__ == "__main__":
    main()
