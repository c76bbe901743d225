"""`make soak`: many simulated agents against two API processes and three workers, then checks.

    SOAK_SECONDS=60 .venv/bin/python soak/run.py        # a quick run
    .venv/bin/python soak/run.py                        # the full 10 minutes

Everything runs for real on this machine: two uvicorn API processes, three `runworker`
processes (2-3 git workspaces each; two of them offer linked-worktree lanes), a throwaway
database (`sluice_soak`, recreated by benchmarks/harness.py) and a Redis prefix of the run's
own on the Redis at REDIS_URL. SOAK_AGENTS agents (default 40) call their tenant's worker
through either API process with mixed operations (see soak/agents.py), and some give up while
their call waits. Half-way through, worker 0 is stopped with SIGTERM and started again; a bit
later worker 1 is killed with SIGKILL and started again. When the time is up the agents stop,
the completion drain gets a bounded time, and soak/checks.py decides. The exit status is
non-zero when any check fails. The summary is printed and, unless SOAK_WRITE_DOCS=0, written
to docs/soak.md between the figure markers.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import random
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "benchmarks")]
import harness  # noqa: E402  (sets Django up on the throwaway database)

SECONDS = int(os.environ.get("SOAK_SECONDS", "600"))
AGENTS = int(os.environ.get("SOAK_AGENTS", "40"))
WORKERS = int(os.environ.get("SOAK_WORKERS", "3"))
WRITE_DOCS = os.environ.get("SOAK_WRITE_DOCS", "1") != "0"
RSS_EVERY_S = 10.0
DRAIN_S = 60.0
DOCS = ROOT / "docs" / "soak.md"
MARK_BEGIN, MARK_END = "<!-- soak:figures -->", "<!-- /soak:figures -->"


def say(text: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {text}", flush=True)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class RssSampler(threading.Thread):
    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.samples: dict[int, list[tuple[float, int]]] = {i: [] for i in range(len(pids))}
        self.stopping = threading.Event()

    def run(self) -> None:
        while True:
            now = time.monotonic()
            for i, pid in enumerate(self.pids):
                with contextlib.suppress(OSError):
                    self.samples[i].append((now, rss_bytes(pid)))
            if self.stopping.wait(RSS_EVERY_S):
                return


def make_workspaces(base: Path, worker: int, lanes: bool) -> dict[str, Path]:
    from livesupport import git_workspace

    files = {
        "README.md": "# soak\n" + "".join(f"line {n}\n" for n in range(1, 60)),
        "src/app.py": "def needle():\n    return 'needle'\n",
        "src/util.py": "# no match here\n" * 20 + "needle = 1\n",
        "docs/notes.md": "nothing to see\n" * 40,
    }
    count = 3 if worker % 2 == 0 else 2
    spaces = {}
    for n in range(count):
        spaces[f"ws{n}"] = git_workspace(
            base / f"w{worker}" / f"ws{n}",
            files=files,
            lanes=("l1", "l2") if lanes and n == 0 else (),
        )
    return spaces


KILLS: dict[str, list[float]] = {}


def restart_worker(worker: Any, how: str, restarts: dict[str, list[tuple[float, float]]]) -> None:
    before = time.time()
    if how == "kill":
        KILLS.setdefault(worker.worker_id, []).append(time.time())
        worker.kill()
    else:
        worker.stop()
    worker.start()
    restarts.setdefault(worker.worker_id, []).append((before, time.time()))
    say(f"worker {worker.worker_id} restarted after {how} in {time.time() - before:.1f} s")


async def drive(
    agents: list[Any], workers: list[Any], restarts: dict[str, list[tuple[float, float]]]
) -> None:
    from agents import Agent

    stop = asyncio.Event()
    tasks = [asyncio.create_task(Agent.run(a, stop)) for a in agents]
    started = time.monotonic()
    plan = [(0.5, 0, "stop"), (0.65, 1 % len(workers), "kill")]
    for share, index, how in plan:
        await asyncio.sleep(max(0.0, started + SECONDS * share - time.monotonic()))
        await asyncio.to_thread(restart_worker, workers[index], how, restarts)
    while time.monotonic() - started < SECONDS:
        await asyncio.sleep(min(10.0, SECONDS - (time.monotonic() - started)))
        say(f"{int(time.monotonic() - started)} s: {len(agents[0].records)} calls")
    stop.set()
    await asyncio.gather(*tasks)


def completion_rows(request_ids: list[str]) -> dict[str, list[tuple[int | None, float, str]]]:
    """request id -> [(fencing ticket, created_at as epoch s, flow)] for every row of that id."""
    from admission.models import CompletionLog

    rows: dict[str, list[tuple[int | None, float, str]]] = {}
    for i in range(0, len(request_ids), 2000):
        batch = request_ids[i : i + 2000]
        for rid, ticket, created, flow in CompletionLog.objects.filter(
            request_id__in=batch
        ).values_list("request_id", "fencing_ticket", "created_at", "flow_hash"):
            rows.setdefault(rid, []).append((ticket, created.timestamp(), flow))
    return rows


def wait_for_rows(request_ids: list[str]) -> dict[str, list[tuple[int | None, float, str]]]:
    deadline = time.monotonic() + DRAIN_S
    while True:
        rows = completion_rows(request_ids)
        if len(rows) == len(request_ids) or time.monotonic() > deadline:
            return rows
        time.sleep(1.0)


def generation(created: float, windows: list[tuple[float, float]]) -> int:
    """Which incarnation a call entered: tickets restart with a new registration. -1 when the
    call arrived within a second of a restart, so its incarnation is not certain."""
    for before, after in windows:
        if before - 1.0 <= created <= after + 1.0:
            return -1
    return sum(1 for _, after in windows if after < created)


def percentile(values: list[float], p: float) -> float:
    return harness.percentile(values, p) if values else float("nan")


def figures(
    records: list[Any], rows: dict[str, Any], started: float, ended: float
) -> dict[str, Any]:
    from admission.models import CompletionLog

    by_answer = Counter(
        "disconnected" if r.disconnected else f"{r.status} {r.code}".strip() for r in records
    )
    ok = [r for r in records if r.status == 200]
    latency = {
        "commands": [r.took * 1000 for r in ok if r.operation == "execute_command"],
        "other": [r.took * 1000 for r in ok if r.operation != "execute_command"],
    }
    waits = list(
        CompletionLog.objects.filter(
            request_id__in=[r.request_id for r in records][:50_000], slot_index__isnull=False
        ).values_list("queue_wait_ms", flat=True)
    )
    return {
        "calls": len(records),
        "calls_per_s": round(len(records) / max(ended - started, 1e-9), 1),
        "operations": dict(Counter(r.operation for r in records)),
        "answers": dict(by_answer.most_common()),
        "latency_ms": {
            k: {"p50": round(percentile(v, 50), 1), "p99": round(percentile(v, 99), 1), "n": len(v)}
            for k, v in latency.items()
        },
        "queue_wait_ms": {
            "p50": round(percentile([float(w) for w in waits], 50), 1),
            "p99": round(percentile([float(w) for w in waits], 99), 1),
            "n": len(waits),
        },
    }


def write_docs(text: str) -> None:
    if not DOCS.exists():
        say(f"{DOCS} is missing; figures not written")
        return
    current = DOCS.read_text()
    pattern = re.compile(re.escape(MARK_BEGIN) + ".*?" + re.escape(MARK_END), re.S)
    replacement = f"{MARK_BEGIN}\n{text}\n{MARK_END}"
    if pattern.search(current):
        DOCS.write_text(pattern.sub(lambda _: replacement, current))
    else:
        DOCS.write_text(current.rstrip() + "\n\n" + replacement + "\n")
    say(f"figures written to {DOCS.relative_to(ROOT)}")


def main() -> int:
    env = harness.prepare("sluice_soak")
    import checks
    import redis
    from agents import Agent, Target
    from django.conf import settings
    from livesupport import Worker, start_api

    from admission.management.commands.bootstrap import bootstrap
    from admission.queue import SyncQueue

    prefix = settings.REDIS_KEY_PREFIX
    base = Path(tempfile.mkdtemp(prefix="sluice-soak-"))
    log_dir = base / "logs"
    log_dir.mkdir()
    say(f"{SECONDS} s, {AGENTS} agents, {WORKERS} workers, prefix {prefix}, files in {base}")

    # Accounts: one tenant per worker, one principal (own API key, own rate limit) per agent.
    rng = random.Random(int(os.environ.get("SOAK_SEED", "8")))
    targets, tokens, keys = [], [], []
    for w in range(WORKERS):
        worker_id = f"soak-w{w}"
        lanes = w % 2 == 0
        spaces = make_workspaces(base, w, lanes)
        targets.append((Target(worker_id, sorted(spaces), ["l1", "l2"] if lanes else []), spaces))
    for n in range(AGENTS):
        target, _ = targets[n % WORKERS]
        result = bootstrap(
            tenant=f"soak-t{n % WORKERS}", user=f"agent-{n}", worker_id=target.worker_id
        )
        keys.append(result["api_key"])
    for w in range(WORKERS):
        # The agents' bootstraps made the worker; its token is issued (again) here.
        tokens.append(
            bootstrap(
                tenant=f"soak-t{w}",
                user="operator",
                worker_id=f"soak-w{w}",
                rotate_worker_token=True,
            )["worker_token"]
        )

    apis = [start_api(env), start_api(env)]
    workers: list[Worker] = []
    sampler = RssSampler([api.process.proc.pid for api in apis])
    restarts: dict[str, list[tuple[float, float]]] = {}
    records: list[Any] = []
    code = 1
    try:
        for w, (target, spaces) in enumerate(targets):
            workers.append(
                Worker(
                    worker_id=target.worker_id,
                    token=tokens[w],
                    workspaces=spaces,
                    api_url=apis[w % 2].url,
                    env=env,
                    slots=3,
                    lanes=bool(target.lanes),
                    # The agents' commands log their start and end there (sandboxed).
                    shared_dirs=[log_dir],
                ).start()
            )
        say("API processes and workers are up")
        agents = [
            Agent(
                number=n,
                api_key=keys[n],
                target=targets[n % WORKERS][0],
                api_urls=[api.url for api in apis],
                log_dir=log_dir,
                records=records,
                rng=random.Random(rng.random()),
            )
            for n in range(AGENTS)
        ]
        sampler.start()
        started = time.time()
        asyncio.run(drive(agents, workers, restarts))
        ended = time.time()
        sampler.stopping.set()
        say(f"load stopped: {len(records)} calls; waiting up to {DRAIN_S:.0f} s for the drain")

        rows = wait_for_rows([r.request_id for r in records])
        counts = {rid: len(v) for rid, v in rows.items()}
        tickets: dict[str, tuple[int, int]] = {}
        flows: dict[str, str] = {}
        for record in records:
            found = rows.get(record.request_id)
            ticket, created, flow = found[0] if found and len(found) == 1 else (None, 0.0, "")
            if ticket is not None:
                gen = generation(created, restarts.get(record.worker_id, []))
                tickets[record.request_id] = (gen, ticket)
                flows[record.request_id] = flow
        per_key, starts = checks.read_logs(log_dir)
        client = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
        time.sleep(1.0)
        queue = SyncQueue(client, prefix)
        snapshots = {t.worker_id: queue.snapshot(t.worker_id)[1] for t, _ in targets}
        ttl_result, celery_keys = checks.redis_ttls(client, prefix)
        warmup = min(60.0, SECONDS * 0.2)
        memory_result, memory_rows = checks.memory_flat(sampler.samples, warmup)
        results = [
            checks.typed_answers(records),
            checks.completion_rows(records, counts),
            checks.ran_once(records, starts),
            checks.per_key_order(per_key, tickets, KILLS, flows),
            ttl_result,
            checks.queues_empty(snapshots),
            memory_result,
        ]
        numbers = figures(records, rows, started, ended)
        table = checks.summarize(results)
        print("\n" + table + "\n")
        print(json.dumps(numbers, indent=1))
        print("Celery keys (not Sluice's; listed apart):", celery_keys)
        passed = all(r.ok for r in results)
        if WRITE_DOCS:
            write_docs(report(numbers, table, memory_rows, celery_keys, restarts, started, passed))
        code = 0 if passed else 1
        say("PASS" if passed else "FAIL")
        client.close()
    finally:
        sampler.stopping.set()
        for worker in workers:
            worker.kill()
        for api in apis:
            api.process.stop()
        harness.cleanup_redis()
        shutil.rmtree(base, ignore_errors=True)
    return code


def report(
    numbers: dict[str, Any],
    table: str,
    memory_rows: list[dict[str, Any]],
    celery_keys: dict[str, tuple[str, int]],
    restarts: dict[str, list[tuple[float, float]]],
    started: float,
    passed: bool,
) -> str:
    when = dt.datetime.fromtimestamp(started, tz=dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    restart_text = ", ".join(
        f"{w} at +{before - started:.0f} s ({after - before:.1f} s to re-register)"
        for w, spans in sorted(restarts.items())
        for before, after in spans
    )
    lat = numbers["latency_ms"]
    lines = [
        f"Last run: {when}, `SOAK_SECONDS={SECONDS}`, {AGENTS} agents, {WORKERS} workers, "
        f"2 API processes, {os.cpu_count()} CPUs ({platform.machine()}), "
        f"result **{'PASS' if passed else 'FAIL'}**.",
        "",
        f"* calls: {numbers['calls']} ({numbers['calls_per_s']}/s); operations: "
        + ", ".join(f"{k} {v}" for k, v in sorted(numbers["operations"].items())),
        "* answers: " + ", ".join(f"{k or '200'}: {v}" for k, v in numbers["answers"].items()),
        f"* latency of 200s, p50/p99: commands {lat['commands']['p50']}/{lat['commands']['p99']} ms, "
        f"other operations {lat['other']['p50']}/{lat['other']['p99']} ms; queue wait of admitted "
        f"calls p50/p99 {numbers['queue_wait_ms']['p50']}/{numbers['queue_wait_ms']['p99']} ms",
        f"* worker restarts: {restart_text or 'none'}",
        "* API memory (RSS, mean of the first vs the last third of 10 s samples after warm-up): "
        + "; ".join(
            f"API {r['api']} {r['first_mib']} -> {r['last_mib']} MiB ({r['growth']}%)"
            for r in memory_rows
        ),
        "* Celery's own keys (outside the TTL check): "
        + (
            ", ".join(f"`{k}` ({t}, ttl {ttl})" for k, (t, ttl) in sorted(celery_keys.items()))
            or "none"
        ),
        "",
        table,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
