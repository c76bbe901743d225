"""Admission benchmarks (issue 4): handoff latency, Redis commands per call, memory per waiter,
throughput. Real Redis, real Postgres, real API processes and a real worker.

    .venv/bin/python benchmarks/admission.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import itertools

import harness

from soak.agents import Agent

EXECUTE = "/v1/workspace-tools/execute"
# Prints the command's first and last moment (ns): the gap between one command's end and the
# next one's start is the handoff, as the commands themselves see it.
HANDOFF_COMMAND = "echo $(date +%s%N); echo $(date +%s%N)"


def queue_handoff(n: int) -> dict[str, Any]:
    """Release of one call -> the next same-key waiter holding its grant (the admission path alone)."""
    import redis
    import redis.asyncio as aioredis
    from django.conf import settings

    from admission.queue import AsyncQueue, SyncQueue, worker_keys

    SyncQueue(
        redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True),
        settings.REDIS_KEY_PREFIX,
    ).register_incarnation(worker_id="handoff", incarnation="inc", slots=1, ttl_ms=600_000)

    async def main() -> list[float]:
        waiters = aioredis.Redis.from_url(
            settings.ADMISSION_REDIS_URL, decode_responses=True, max_connections=n + 10
        )
        releaser = aioredis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
        q, r = (
            AsyncQueue(waiters, settings.REDIS_KEY_PREFIX),
            AsyncQueue(releaser, settings.REDIS_KEY_PREFIX),
        )
        keys = worker_keys(settings.REDIS_KEY_PREFIX, "handoff")
        tickets = {}
        for i in range(n):
            entered = await q.enter(
                worker_id="handoff",
                entry_id=f"e{i}",
                key=("ws", ""),
                queue_budget_ms=600_000,
                exec_budget_ms=600_000,
                queue_limit=n + 1,
                slot_ceiling=8,
                operation="write_file",
            )
            tickets[i] = entered.ticket
        got: dict[int, float] = {}

        async def wait(i: int) -> None:
            await q.wait(worker_id="handoff", entry_id=f"e{i}", timeout_ms=600_000)
            got[i] = time.perf_counter()

        tasks = [asyncio.create_task(wait(i)) for i in range(1, n)]
        await asyncio.sleep(0.5)  # every waiter is blocked on its list
        samples = []
        for i in range(n - 1):
            started = time.perf_counter()
            await r.scripts["settle"](
                keys=[keys.reg, keys.queue, keys.entries, keys.stats],
                args=["", f"e{i}", "inc", tickets[i], "{}", keys.wake_prefix, 60_000],
            )
            await tasks[i]
            samples.append((got[i + 1] - started) * 1000)
        await waiters.aclose()
        await releaser.aclose()
        return samples

    return harness.summary(asyncio.run(main()))


async def _minimal_post(url: str, headers: dict[str, str], body: dict[str, Any]) -> Any:
    """One POST through the soak's minimal HTTP/1.1 client (a connection of its own): the
    load generator shares this 2-core machine with the system it measures, and httpx spent
    2.3-2.7 ms of CPU a call here (the minimal client 0.5-0.6 ms), at the very moment a call
    ends, which is when the next one's hand-off and admission happen."""
    status, _, text = await Agent.call_and_give_up(url, headers, body, after_s=120)
    if status != 200:
        raise RuntimeError(f"{status}: {text[:200]}")
    return json.loads(text)


def sluice_gaps(
    api_url: str, headers: dict[str, str], calls: int, workspace_id: str = "w0"
) -> list[float]:
    """A command's end -> the next same-key command's start (ms), by the commands' own clocks,
    with 8 clients keeping the key's queue full through Sluice."""
    body = {
        "protocolVersion": 1,
        "operation": "execute_command",
        "workspaceId": workspace_id,
        "command": HANDOFF_COMMAND,
    }
    waiting = headers | {"X-LibreChat-Workspace-Queue-Wait-Ms": "120000"}
    spans: list[tuple[int, int]] = []
    clients = 8

    async def client_loop(k: int) -> None:
        for _ in range(k):
            answer = await _minimal_post(api_url, waiting, body)
            start, end = (int(x) for x in answer["stdout"].split())
            spans.append((start, end))

    async def main() -> None:
        await asyncio.gather(*(client_loop(max(1, calls // clients)) for _ in range(clients)))

    asyncio.run(main())
    spans.sort()
    # The first commands of a round start together, before the queue is full: skip them.
    return [(b[0] - a[1]) / 1e6 for a, b in itertools.pairwise(spans)][clients:]


def shell_loop_gaps(workspaces: list[Path], calls: int) -> list[float]:
    """The same gap with no Sluice in between: the same command started back to back in the
    first workspace, in the sandbox the worker builds for it (bwrap, prlimit, sh; prepared
    while the previous command runs, as the worker's are), by the commands' own clocks. The very same sandbox: every other workspace of the worker hidden
    and the workspaces' directories shared, as runworker and livesupport.Worker set it up
    (hiding a workspace costs two mounts at every start: with a one-workspace sandbox here,
    the worker's 7 other workspaces read as 1.1-2.6 ms of "hand-off" per call)."""
    from django.conf import settings

    from workspaces.operations.command import Confinement, execute_command
    from workspaces.sandbox import worker_sandbox

    roots = [os.path.realpath(w) for w in workspaces]
    root = roots[0]
    sandbox = worker_sandbox(
        base_dir=str(settings.BASE_DIR),
        workspace_roots=roots,
        shared_dirs=sorted({str(Path(w).parent) for w in workspaces}),
    )
    confinement = Confinement(sandbox, root)
    request = {"command": HANDOFF_COMMAND, "timeoutMs": 30_000, "maxOutputBytes": 4096}
    spans: list[tuple[int, int]] = []
    for _ in range(calls):
        result = execute_command(
            request, root=root, deadline=time.monotonic() + 60, confinement=confinement
        )
        start, end = (int(x) for x in str(result["stdout"]).split())
        spans.append((start, end))
    return [(b[0] - a[1]) / 1e6 for a, b in itertools.pairwise(spans)]


def plain_shell_loop_gaps(workspaces: list[Path], calls: int) -> list[float]:
    """The same gap with neither Sluice nor a sandbox: `sh -c` started back to back by a
    shell `for` loop in the first workspace (what issue 37 measures the hand-off against)."""
    loop = f"for i in $(seq {calls}); do sh -c {shlex.quote(HANDOFF_COMMAND)}; done"
    done = subprocess.run(
        ["sh", "-c", loop], cwd=workspaces[0], capture_output=True, text=True, check=True
    )
    stamps = [int(x) for x in done.stdout.split()]
    spans = list(zip(stamps[::2], stamps[1::2], strict=True))
    return [(b[0] - a[1]) / 1e6 for a, b in itertools.pairwise(spans)]


def e2e_handoff(
    api_url: str,
    headers: dict[str, str],
    workspaces: list[Path],
    calls: int,
    rounds: int = 4,
    workspace_id: str = "w0",
) -> dict[str, Any]:
    """Handoff between same-key calls, the outside way (issue 15): the gap between one
    command's end and the next one's start through Sluice, minus the same gap in a local loop
    starting the same sandboxed shells in the first of `workspaces` (`workspace_id`, through
    Sluice), and minus a plain shell loop's (no sandbox: the sandbox's start included). Rounds
    alternate so that all see the same machine (a noisy 2-core box drifts by more than the
    figure being measured)."""
    through: list[float] = []
    local: list[float] = []
    plain: list[float] = []
    for _ in range(rounds):
        through += sluice_gaps(api_url, headers, calls // rounds, workspace_id)
        local += shell_loop_gaps(workspaces, calls // rounds)
        plain += plain_shell_loop_gaps(workspaces, calls // rounds)

    def added(base: list[float]) -> dict[str, float]:
        return {
            f"{q}_ms": round(harness.percentile(through, p) - harness.percentile(base, p), 3)
            for q, p in (("p50", 50), ("p90", 90), ("p99", 99))
        }

    return {
        "through_sluice": harness.summary(through),
        "shell_loop": harness.summary(local),
        "plain_shell_loop": harness.summary(plain),
        "added_by_sluice": added(local),
        "added_over_plain_shell_loop": added(plain),
    }


def count_redis_commands(api_url: str, headers: dict[str, str], calls: int) -> dict[str, Any]:
    """Every command Redis received during `calls` sequential reads, by what it was for (MONITOR)."""
    import httpx
    import redis
    from django.conf import settings

    prefix = settings.REDIS_KEY_PREFIX
    counts: dict[str, int] = {}
    stop = threading.Event()
    ready = threading.Event()

    def monitor() -> None:
        client = redis.Redis.from_url(settings.REDIS_URL)
        with client.monitor() as m:
            ready.set()
            for event in m.listen():
                if stop.is_set():
                    break
                command = event["command"]
                # Commands a script runs show up as client "lua": the script call itself is counted.
                if event.get("client_type") == "lua" or prefix not in command:
                    continue
                kind = "other"
                for label, marker in (
                    ("admission", "adm:"),
                    ("rate_limit", "rl:"),
                    ("completion", "log:"),
                    ("celery", "celery:"),
                ):
                    if prefix + marker in command:
                        kind = label
                        break
                verb = command.split(" ", 1)[0].upper()
                counts[f"{kind}:{verb}"] = counts.get(f"{kind}:{verb}", 0) + 1

    thread = threading.Thread(target=monitor, daemon=True)
    thread.start()
    ready.wait(5)
    time.sleep(0.3)
    counts.clear()
    body = {
        "protocolVersion": 1,
        "operation": "read_file",
        "workspaceId": "w1",
        "path": "README.md",
    }
    with httpx.Client(base_url=api_url, timeout=30) as http:
        for _ in range(calls):
            http.post(EXECUTE, json=body, headers=headers).raise_for_status()
    time.sleep(0.5)
    stop.set()
    redis.Redis.from_url(settings.REDIS_URL).ping()  # wakes the monitor so it sees `stop`
    per_call = {
        k: round(v / calls, 2)
        for k, v in sorted(counts.items())
        if not k.startswith(("completion:XREADGROUP", "completion:XAUTOCLAIM"))
    }
    admission = sum(v for k, v in per_call.items() if k.startswith("admission:"))
    return {
        "calls": calls,
        "per_call": per_call,
        "admission_commands_per_call": round(admission, 2),
    }


def rss_with_waiters(env: dict[str, str], waiters: int, workers: int) -> dict[str, Any]:
    """One API process holding `waiters` waiting calls spread over `workers` busy workers."""
    import httpx
    import redis
    from django.conf import settings
    from django.utils import timezone
    from livesupport import start_api

    from admission.queue import AsyncQueue, SyncQueue
    from admission.services import workspace_offer_tokens
    from workspaces.models import Worker, WorkerWorkspace

    offer = workspace_offer_tokens(
        operations=["read_file"],
        linked_worktree_lanes=False,
        edit_features=None,
        instruction_files=[],
    )
    sync = SyncQueue(
        redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True),
        settings.REDIS_KEY_PREFIX,
    )
    key = harness.account("rss-0", tenant="rss")["api_key"]
    ids = [f"rss-{i}" for i in range(workers)]
    for worker_id in ids[1:]:
        harness.account(worker_id, tenant="rss")
    for worker_id in ids:
        Worker.objects.filter(worker_id=worker_id).update(
            incarnation_id="inc", slots=1, last_heartbeat_at=timezone.now()
        )
        WorkerWorkspace.objects.get_or_create(
            worker=Worker.objects.get(worker_id=worker_id),
            workspace_id="ws",
            defaults={"operations": ["read_file"]},
        )
        # With the workspace's offer, as a real registration writes it: without one, the scripts
        # refuse every waiting call WORKER_MISMATCH (the offer is checked at the grant).
        sync.register_incarnation(
            worker_id=worker_id,
            incarnation="inc",
            slots=1,
            ttl_ms=600_000,
            offer={"ws": offer},
        )

    async def occupy() -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
        q = AsyncQueue(client, settings.REDIS_KEY_PREFIX)
        for worker_id in ids:  # one running call per worker keeps its key busy
            await q.enter(
                worker_id=worker_id,
                entry_id="holder",
                key=("ws", ""),
                queue_budget_ms=600_000,
                exec_budget_ms=600_000,
                queue_limit=64,
                slot_ceiling=8,
                operation="write_file",
            )
        await client.aclose()

    asyncio.run(occupy())
    api = start_api(env | {"WORKER_QUEUE_LIMIT": "64"})
    pid = api.process.proc.pid

    def rss_mb() -> float:
        text = Path(f"/proc/{pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) / 1024  # type: ignore[union-attr]

    async def hold() -> dict[str, Any]:
        limits = httpx.Limits(max_connections=waiters + 50, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=api.url, timeout=600, limits=limits) as http:
            # Warm the process up (imports, pools) before the baseline.
            await http.get("/healthz")
            baseline = rss_mb()
            body = {
                "protocolVersion": 1,
                "operation": "read_file",
                "workspaceId": "ws",
                "path": "x",
            }
            tasks = []
            for i in range(waiters):
                headers = {
                    "Authorization": f"Bearer {key}",
                    "X-LibreChat-Code-Worker-ID": ids[i % workers],
                    "X-LibreChat-Workspace-Queue-Wait-Ms": "300000",
                }
                tasks.append(asyncio.create_task(http.post(EXECUTE, json=body, headers=headers)))
            deadline = time.monotonic() + 60
            waiting = 0
            while time.monotonic() < deadline:
                waiting = sum(sum(e["st"] == "w" for e in sync.snapshot(w)[1]) for w in ids)
                if waiting >= waiters:
                    break
                await asyncio.sleep(0.25)
            await asyncio.sleep(1.0)
            holding = rss_mb()
            finished = [
                t.result()
                for t in tasks
                if t.done() and not t.cancelled() and t.exception() is None
            ]
            early = sorted({f"{r.status_code} {r.json().get('code', '')}" for r in finished})
            failed = [
                repr(t.exception())[:120]
                for t in tasks
                if t.done() and not t.cancelled() and t.exception()
            ]
            fifo = all(
                [e["seq"] for e in sync.snapshot(w)[1]]
                == sorted(e["seq"] for e in sync.snapshot(w)[1])
                for w in ids
            )
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            cancelled = time.monotonic()
            left = waiting
            while time.monotonic() - cancelled < 10 and left:
                left = sum(sum(e["st"] == "w" for e in sync.snapshot(w)[1]) for w in ids)
                await asyncio.sleep(0.05)
            return {
                "waiters": waiters,
                "workers": workers,
                "waiting_seen": waiting,
                "fifo_by_ticket": fifo,
                "rss_baseline_mb": round(baseline, 1),
                "rss_holding_mb": round(holding, 1),
                "rss_per_waiter_kb": round((holding - baseline) * 1024 / waiters, 1),
                "waiters_left_after_disconnect": left,
                "answered_early": len(finished),
                "early_answers": early,
                "client_errors": failed[:3],
                "disconnect_cleanup_s": round(time.monotonic() - cancelled, 2),
            }

    try:
        return asyncio.run(hold())
    finally:
        api.process.stop()
        import os as _os

        if _os.environ.get("BENCH_DEBUG"):
            print(
                "\n".join(line for line in api.process.lines if "Redis unavailable" in line)[:3000]
            )


def throughput(
    api_urls: list[str], headers: dict[str, str], calls: int, concurrency: int
) -> dict[str, Any]:
    """Small reads from `concurrency` clients at once through the minimal client
    (`_minimal_post`), spread over the API processes; the client's own CPU a call beside."""
    latencies: list[float] = []

    async def loop(k: int, idx: int) -> None:
        body = {
            "protocolVersion": 1,
            "operation": "read_file",
            "workspaceId": f"w{idx % 8}",
            "path": "README.md",
        }
        for _ in range(k):
            t = time.perf_counter()
            await _minimal_post(api_urls[idx % len(api_urls)], headers, body)
            latencies.append((time.perf_counter() - t) * 1000)

    async def main() -> None:
        await asyncio.gather(*(loop(calls // concurrency, i) for i in range(concurrency)))

    cpu_before = time.process_time()
    started = time.perf_counter()
    asyncio.run(main())
    elapsed = time.perf_counter() - started
    return {
        "calls": len(latencies),
        "concurrency": concurrency,
        "slots": 8,
        "api_processes": len(api_urls),
        "calls_per_s": round(len(latencies) / elapsed, 1),
        "client_cpu_ms_per_call": round(
            (time.process_time() - cpu_before) * 1000 / max(1, len(latencies)), 2
        ),
        **harness.summary(latencies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer calls, for a smoke run")
    args = parser.parse_args()
    scale = 0.2 if args.quick else 1.0
    env = harness.prepare("sluice_bench_admission", WORKSPACE_TOOLS_RATE_LIMIT="100000/1s")
    from livesupport import Worker, git_workspace, start_api

    results: dict[str, Any] = {}
    results["queue_handoff"] = queue_handoff(int(500 * scale))
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"sluice-bench-{os.getpid()}"
    acct = harness.account("bench-worker")
    apis = [start_api(env), start_api(env)]
    workspaces = {
        f"w{i}": git_workspace(tmp / f"w{i}", files={"README.md": "hello\n" * 20}) for i in range(8)
    }
    worker = Worker(
        acct["worker_id"], acct["worker_token"], workspaces, apis[0].url, env, slots=8
    ).start()
    headers = {
        "Authorization": f"Bearer {acct['api_key']}",
        "X-LibreChat-Code-Worker-ID": acct["worker_id"],
    }
    try:
        results["e2e_handoff"] = e2e_handoff(
            apis[0].url, headers, list(workspaces.values()), int(320 * scale)
        )
        results["redis_commands"] = count_redis_commands(apis[0].url, headers, int(200 * scale))
        results["throughput"] = throughput([a.url for a in apis], headers, int(2000 * scale), 16)
    finally:
        worker.stop()
        for a in apis:
            a.process.stop()
    results["rss_1000_waiters"] = rss_with_waiters(env, int(1000 * scale), 32)
    harness.cleanup_redis()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
