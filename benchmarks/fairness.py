"""Fair share and shared reads, measured from outside (issue 37): a throwaway database, one
API process and one real worker (4 slots), two principals of one tenant.

* `behind_backlog`: principal A sends twelve 1 s commands to workspace `ws`; once all are in
  the queue, principal B sends one read_file to `ws`. Reported: B's wait (its answer's time)
  and how many of A's commands had finished by then.
* `four_read_files`, `four_searches`, `four_lists`: four concurrent read_file (a small file),
  search_text or list_files calls (1,000 files) on one workspace, against one alone: the wall time of the four and of one (medians
  over the rounds), and the most of them the queue held running at once (sampled every 5 ms). On a CPU-bound machine the wall time of four
  overlapping searches is bounded by the cores, whatever admission does; the sample shows
  whether admission let them overlap.

    .venv/bin/python benchmarks/fairness.py [--reads-rounds 100]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

EXECUTE = "/v1/workspace-tools/execute"


def _call(url: str, headers: dict[str, str], body: dict[str, Any]) -> tuple[int, float]:
    import httpx

    started = time.monotonic()
    with httpx.Client(base_url=url, timeout=120) as http:
        r = http.post(EXECUTE, json=body, headers=headers)
    return r.status_code, time.monotonic() - started


def behind_backlog(url: str, a: dict[str, str], b: dict[str, str], held: Any) -> dict[str, Any]:
    command = {
        "protocolVersion": 1,
        "operation": "execute_command",
        "workspaceId": "ws",
        "command": "sleep 1",
        "timeoutMs": 30_000,
    }
    read = {"protocolVersion": 1, "operation": "read_file", "workspaceId": "ws", "path": "a.txt"}
    wait = {"X-LibreChat-Workspace-Queue-Wait-Ms": "60000"}
    with ThreadPoolExecutor(13) as pool:
        started = time.monotonic()
        commands = [pool.submit(_call, url, a | wait, command) for _ in range(12)]
        # Every command in the queue (or, on a slow machine, already through it) first.
        deadline = time.monotonic() + 60
        while held() + sum(f.done() for f in commands) < 12 and time.monotonic() < deadline:
            time.sleep(0.01)
        ahead = held()
        status, read_s = pool.submit(_call, url, b | wait, read).result()
        read_done = time.monotonic() - started
        finished_before = sum(f.done() for f in commands)
        ends = [f.result() for f in commands]
    return {
        "commands_in_the_queue_when_the_read_was_sent": ahead,
        "read_status": status,
        "read_wait_s": round(read_s, 3),
        "commands_finished_before_the_read": finished_before,
        "read_answered_at_s": round(read_done, 3),
        "commands_statuses": sorted({s for s, _ in ends}),
        "last_command_s": round(max(t for _, t in ends), 3),
    }


def four_reads(
    url: str, a: dict[str, str], body: dict[str, Any], rounds: int, running: Any
) -> dict[str, Any]:
    """Four concurrent reads of one workspace against one alone, each thread with its own
    kept-alive client made before timing (a new client per call costs more CPU than a small
    read, and four of them at once on 2 cores would measure the client)."""
    import httpx

    clients = [httpx.Client(base_url=url, timeout=120, headers=a) for _ in range(4)]
    one, four, together, busy = [], [], [0], [0.0]
    stop = threading.Event()

    def timed(http: httpx.Client) -> tuple[int, float]:
        started = time.monotonic()
        status = http.post(EXECUTE, json=body).status_code
        return status, time.monotonic() - started

    def sample() -> None:
        # How many of the reads the queue held as running at once.
        while not stop.is_set():
            together[0] = max(together[0], running())
            time.sleep(0.005)

    try:
        with ThreadPoolExecutor(5) as pool:
            # Warm every connection, and the tree into the page cache.
            assert [s for s, _ in pool.map(timed, clients)] == [200] * 4
            pool.submit(sample)
            for _ in range(rounds):
                status, seconds = timed(clients[0])
                assert status == 200, status
                one.append(seconds)
                busy_before = _busy_cpu_s()
                started = time.monotonic()
                answers = list(pool.map(timed, clients))
                four.append(time.monotonic() - started)
                busy[0] += _busy_cpu_s() - busy_before
                assert [s for s, _ in answers] == [200] * 4, answers
            stop.set()
    finally:
        for http in clients:
            http.close()
    return {
        "most_running_at_once": together[0],
        "one_ms_median": round(statistics.median(one) * 1000, 2),
        "four_concurrent_ms_median": round(statistics.median(four) * 1000, 2),
        "ratio": round(statistics.median(four) / statistics.median(one), 2),
        # The machine's CPU time (all processes: client, API, worker, Redis) per four reads,
        # and what it bounds four reads' wall time to on these cores however they overlap.
        "busy_cpu_ms_per_four": round(busy[0] / rounds * 1000, 2),
        "cpu_floor_ratio": round(
            busy[0] / rounds / (os.cpu_count() or 1) / statistics.median(one), 2
        ),
        "rounds": rounds,
    }


def _busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat's first line)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reads-rounds", type=int, default=100)
    args = parser.parse_args()
    env = harness.prepare("sluice_bench_fairness", WORKSPACE_TOOLS_RATE_LIMIT="100000/1s")
    import redis
    from django.conf import settings
    from livesupport import Worker, git_workspace, start_api

    from admission.queue import SyncQueue

    sync = SyncQueue(
        redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True),
        settings.REDIS_KEY_PREFIX,
    )

    from admission.management.commands.bootstrap import bootstrap

    first = bootstrap(tenant="bench", user="alice", worker_id="fair-worker")
    second = bootstrap(
        tenant="bench", user="bob", worker_id="fair-worker", rotate_worker_token=True
    )
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"sluice-bench-fair-{os.getpid()}"
    files = {f"src/m{i}/f{j}.txt": "hay\n" * 400 for i in range(40) for j in range(25)}
    files["src/m7/f3.txt"] += "needle\n"
    workspaces = {
        "ws": git_workspace(tmp / "ws", files={"a.txt": "hello\n"}),
        "big": git_workspace(tmp / "big", files=files),
    }
    api = start_api(env)
    worker = Worker(
        second["worker_id"], second["worker_token"], workspaces, api.url, env, slots=4
    ).start()
    a = {"Authorization": f"Bearer {first['api_key']}", "X-LibreChat-Code-Worker-ID": "fair-worker"}
    b = {
        "Authorization": f"Bearer {second['api_key']}",
        "X-LibreChat-Code-Worker-ID": "fair-worker",
    }
    results: dict[str, Any] = {}
    try:
        results["behind_backlog"] = behind_backlog(
            api.url, a, b, lambda: len(sync.snapshot("fair-worker")[1])
        )
        running = lambda: sum(e["st"] == "r" for e in sync.snapshot("fair-worker")[1])  # noqa: E731
        for name, body in (
            ("four_read_files", {"operation": "read_file", "workspaceId": "ws", "path": "a.txt"}),
            (
                "four_searches",
                {"operation": "search_text", "workspaceId": "big", "query": "needle"},
            ),
            ("four_lists", {"operation": "list_files", "workspaceId": "big"}),
        ):
            results[name] = four_reads(
                api.url, a, {"protocolVersion": 1, **body}, args.reads_rounds, running
            )
    finally:
        worker.stop()
        api.process.stop()
    harness.cleanup_redis()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
