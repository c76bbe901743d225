"""Round trip of a small `read_file` (issue 3): HTTP -> admission -> Celery -> worker -> result,
next to the same read done in-process (`workspaces.operations.run_operation`).

    .venv/bin/python benchmarks/roundtrip.py [--calls N]

Starts its own API server (uvicorn) and worker (`manage.py runworker`) on a throwaway database
(`sluice_bench`, recreated and migrated by harness.prepare) under a Redis prefix of its own,
runs N sequential calls each way after a warm-up, and prints p50/p99 of both, the overhead in
ms and the ratio: a table, then one JSON line for the docs.

One more row gives the floor of the HTTP path: the same request with one unknown key, refused
at validation after authentication, before admission, Celery or the worker are involved.
The rate limit stays in the path (every real call pays for it) but is raised so that the
sequential calls never hit it.
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

WORKSPACE = "bench"
# A small file: what is measured is the trip, not the read.
FILE_TEXT = "".join(f"line {n}: the quick brown fox\n" for n in range(1, 21))
# What read_file answers for it: the lines without their terminators (contract §2.2).
READ_CONTENT = FILE_TEXT.removesuffix("\n")
READ = {
    "protocolVersion": 1,
    "operation": "read_file",
    "workspaceId": WORKSPACE,
    "path": "small.txt",
}
WARMUP_CALLS = 50


def measure_in_process(root: Path, calls: int) -> list[float]:
    from sluice_protocol import validate_request

    from workspaces.operations import run_operation

    # What the worker hands run_operation: the validated request, the workspace's realpath.
    request = validate_request(dict(READ))
    real = os.path.realpath(root)
    samples = []
    for i in range(WARMUP_CALLS + calls):
        started = time.perf_counter()
        result = run_operation(request, root=real, deadline=time.monotonic() + 30)
        elapsed_ms = (time.perf_counter() - started) * 1000
        assert result["content"] == READ_CONTENT
        if i >= WARMUP_CALLS:
            samples.append(elapsed_ms)
    return samples


def measure_http(
    api_url: str, headers: dict[str, str], calls: int, body: dict[str, Any], expect: int
) -> list[float]:
    import httpx

    samples = []
    # One keep-alive connection, as an agent calling in a loop would hold.
    with httpx.Client(base_url=api_url, timeout=30) as http:
        for i in range(WARMUP_CALLS + calls):
            started = time.perf_counter()
            response = http.post("/v1/workspace-tools/execute", headers=headers, json=body)
            elapsed_ms = (time.perf_counter() - started) * 1000
            if response.status_code != expect or (
                expect == 200 and response.json()["content"] != READ_CONTENT
            ):
                raise SystemExit(
                    f"call {i}: expected {expect}, got {response.status_code} {response.text[:300]}"
                )
            if i >= WARMUP_CALLS:
                samples.append(elapsed_ms)
    return samples


def report(
    calls: int, local: dict[str, Any], trip: dict[str, Any], floor: dict[str, Any]
) -> dict[str, Any]:
    overhead = {q: round(trip[q] - local[q], 3) for q in ("p50_ms", "p99_ms")}
    ratio = {q.removesuffix("_ms"): round(trip[q] / local[q], 1) for q in ("p50_ms", "p99_ms")}
    rows = [
        ("in-process run_operation", calls, local["p50_ms"], local["p99_ms"]),
        ("HTTP -> Celery -> worker", calls, trip["p50_ms"], trip["p99_ms"]),
        ("  floor: HTTP + auth, 400", calls, floor["p50_ms"], floor["p99_ms"]),
    ]
    print(f"{'small read_file':<28}{'calls':>6}{'p50 ms':>10}{'p99 ms':>10}")
    for name, n, p50, p99 in rows:
        print(f"{name:<28}{n:>6}{p50:>10.3f}{p99:>10.3f}")
    print(f"{'overhead':<28}{'':>6}{overhead['p50_ms']:>10.3f}{overhead['p99_ms']:>10.3f}")
    print(f"{'ratio':<28}{'':>6}{ratio['p50']:>9.1f}x{ratio['p99']:>9.1f}x")
    return {
        "benchmark": "roundtrip_read_file",
        "calls": calls,
        "in_process": local,
        "round_trip": trip,
        "http_floor_400": floor,
        "overhead_ms": overhead,
        "ratio": ratio,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--calls", type=int, default=500, help="measured calls each way (default 500)"
    )
    calls = parser.parse_args().calls
    if calls < 1:
        parser.error("--calls must be at least 1")

    env = harness.prepare("sluice_bench", WORKSPACE_TOOLS_RATE_LIMIT="1000000/1h")
    # Django's logging config (set up by prepare) logs every httpx request at INFO: that would
    # be measured, and would bury the table.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from livesupport import Worker, git_workspace, start_api

    account = harness.account("bench-worker")
    headers = {
        "Authorization": f"Bearer {account['api_key']}",
        "X-LibreChat-Code-Worker-ID": account["worker_id"],
    }
    api = start_api(env)
    worker: Worker | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-bench-") as tmp:
            repo = git_workspace(Path(tmp) / "repo", files={"small.txt": FILE_TEXT})
            worker = Worker(
                account["worker_id"],
                account["worker_token"],
                {WORKSPACE: repo},
                api.url,
                env,
                slots=2,
            )
            worker.start()
            local = harness.summary(measure_in_process(repo, calls))
            trip = harness.summary(measure_http(api.url, headers, calls, READ, 200))
            floor = harness.summary(
                measure_http(api.url, headers, calls, READ | {"unknownKey": 1}, 400)
            )
    finally:
        if worker is not None:
            worker.stop()
        api.process.stop()
        harness.cleanup_redis()
    print(json.dumps(report(calls, local, trip, floor)))


if __name__ == "__main__":
    main()
