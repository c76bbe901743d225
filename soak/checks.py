"""What the soak checks once the load has stopped. Each check returns (ok, one-line detail).

* every answer is typed JSON with an expected code (never a 500, never HTML);
* every call has exactly one completion row (matched by its request id);
* no command ran twice, and none that was answered "not started" ran at all;
* on each isolation key, commands never overlapped and started in ticket order;
* no Sluice key of the run's prefix is left without a TTL (Celery's keys listed apart);
* no worker queue holds anything;
* the API processes' memory stayed flat (last third of the samples vs the first third).
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents import CallRecord

# Answers a soak call may get. Anything else (a 500, a 502, an unknown code) fails the run.
EXPECTED = {
    (200, ""),
    (409, "EDIT_CONFLICT"),  # an edit based on a write whose client gave up
    (422, "NOT_FOUND"),  # an edit of a file whose first write was abandoned
    (429, "RATE_LIMITED"),
    (429, "WORKER_QUEUE_FULL"),
    (503, "WORKER_OFFLINE"),  # around the worker restarts
    (503, "WORKSPACE_QUEUE_TIMEOUT"),
    (504, "ASSIGNMENT_EXPIRED"),  # calls running on the worker that is killed
}
# Answers that promise the operation never reached the worker.
NOT_STARTED = {"WORKER_OFFLINE", "WORKSPACE_QUEUE_TIMEOUT", "RATE_LIMITED", "WORKER_QUEUE_FULL"}
# Keys without a TTL by design: the completion stream (drained and trimmed; its consumer group
# must outlive any row) and the cumulative /metrics counters.
NO_TTL_BY_DESIGN = ("log:completions", "metrics:calls")
MEMORY_GROWTH_LIMIT = 0.20


@dataclass
class Result:
    name: str
    ok: bool
    detail: str


def typed_answers(records: list[CallRecord]) -> Result:
    answered = [r for r in records if r.status]
    failures = [r for r in records if not r.status and not r.disconnected]
    wrong = [
        r
        for r in answered
        if r.content_type != "application/json" or (r.status, r.code) not in EXPECTED
    ]
    codes = Counter((r.status, r.code) for r in wrong)
    detail = f"{len(answered)} answered, {len(wrong)} unexpected {dict(codes)}"
    if failures:
        detail += f"; {len(failures)} transport errors, e.g. {failures[0].transport_error}"
    return Result("typed answers only", not wrong and not failures, detail)


def completion_rows(records: list[CallRecord], rows: dict[str, int]) -> Result:
    missing = [r for r in records if rows.get(r.request_id, 0) == 0]
    doubled = [r for r in records if rows.get(r.request_id, 0) > 1]
    missing_disconnected = sum(r.disconnected for r in missing)
    detail = (
        f"{len(records)} calls, {len(missing)} without a row "
        f"({missing_disconnected} of them disconnected), {len(doubled)} with more than one"
    )
    if missing:
        detail += "; e.g. " + ", ".join(
            f"{r.request_id} ({r.operation}, gave up after {r.took:.2f} s)"
            if r.disconnected
            else f"{r.request_id} ({r.operation}, {r.status} {r.code})"
            for r in missing[:3]
        )
    return Result("one completion row per call", not missing and not doubled, detail)


@dataclass
class Run:
    request_id: str
    start_ns: int
    end_ns: int | None


def read_logs(log_dir: Path) -> tuple[dict[str, list[Run]], Counter[str]]:
    """Per log file (isolation key), the commands that started there; and starts per request id."""
    per_key: dict[str, list[Run]] = {}
    starts: Counter[str] = Counter()
    for path in sorted(log_dir.glob("*.log")):
        marks: dict[str, dict[str, int]] = defaultdict(dict)
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 3:
                continue
            request_id, what, ns = parts
            if what == "start":
                starts[request_id] += 1
            marks[request_id][what] = int(ns)
        per_key[str(path)] = [
            Run(rid, m["start"], m.get("end")) for rid, m in marks.items() if "start" in m
        ]
    return per_key, starts


def ran_once(records: list[CallRecord], starts: Counter[str]) -> Result:
    commands = [r for r in records if r.log_file]
    twice = [rid for rid, n in starts.items() if n > 1]
    ok_but_not_run = [r for r in commands if r.status == 200 and starts[r.request_id] != 1]
    not_started_but_ran = [
        r for r in commands if r.code in NOT_STARTED and starts[r.request_id] > 0
    ]
    detail = (
        f"{len(commands)} commands, {sum(starts.values())} runs; {len(twice)} ran twice, "
        f"{len(ok_but_not_run)} answered 200 without exactly one run, "
        f"{len(not_started_but_ran)} answered 'not started' yet ran"
    )
    return Result("no call ran twice", not (twice or ok_but_not_run or not_started_but_ran), detail)


def _conflicts(a: str, b: str) -> bool:
    """Log files are `<worker>.<workspace>.<lane or _>.log`: the checkout conflicts with its
    lanes, a lane with itself."""
    wa, sa, la = Path(a).name.rsplit(".", 1)[0].rsplit(".", 2)
    wb, sb, lb = Path(b).name.rsplit(".", 1)[0].rsplit(".", 2)
    return (wa, sa) == (wb, sb) and (la == "_" or lb == "_" or la == lb)


def per_key_order(
    per_key: dict[str, list[Run]],
    tickets: dict[str, tuple[int, int]],
    kills: dict[str, list[float]] | None = None,
    flows: dict[str, str] | None = None,
) -> Result:
    """No two conflicting commands overlapped; within one incarnation and one flow (`flows`:
    request id -> its row's flow; the grant takes flows in turn, so only a flow's own calls
    keep their arrival order) they started in ticket order. `tickets` maps a request id to
    (generation, ticket); generation -1 = unknown.

    `kills` (worker id -> epoch seconds of its SIGKILLs): a command running when its worker
    was killed is killed in turn when the worker starts again, before it registers
    (tests/faults/test_fault_worker_kill_orphans.py), so its run records no end and seems to
    last for ever. Such runs are counted apart, not as overlaps."""
    kills = kills or {}
    orphaned = 0
    overlaps = 0
    examples: list[str] = []
    out_of_order = 0
    compared = 0
    files = sorted(per_key)
    for i, a in enumerate(files):
        for b in files[i:]:
            if not _conflicts(a, b):
                continue
            runs = sorted(per_key[a] + (per_key[b] if b != a else []), key=lambda r: r.start_ns)
            for x, y in itertools.pairwise(runs):
                if x.end_ns is None or x.end_ns > y.start_ns:
                    worker = Path(a).name.split(".", 1)[0]
                    if any(
                        x.start_ns < k * 1e9 < (x.end_ns or float("inf"))
                        for k in kills.get(worker, [])
                    ):
                        orphaned += 1
                        continue
                    overlaps += 1
                    examples.append(
                        f"{Path(a).name}+{Path(b).name}: {x.request_id} "
                        f"[{x.start_ns / 1e9:.3f}, {(x.end_ns or 0) / 1e9:.3f}] vs {y.request_id} "
                        f"[{y.start_ns / 1e9:.3f}, {(y.end_ns or 0) / 1e9:.3f}]"
                    )
            ordered = [
                (tickets[r.request_id], (flows or {}).get(r.request_id, ""), r.start_ns)
                for r in runs
                if tickets.get(r.request_id, (-1, 0))[0] >= 0
            ]
            by_generation: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
            for (generation, ticket), flow, start in ordered:
                by_generation[generation, flow].append((ticket, start))
            for group in by_generation.values():
                group.sort()
                compared += max(len(group) - 1, 0)
                out_of_order += sum(1 for p, q in itertools.pairwise(group) if p[1] > q[1])
    runs_total = sum(len(v) for v in per_key.values())
    detail = (
        f"{len(per_key)} keys, {runs_total} runs: {overlaps} overlaps "
        f"(+{orphaned} with a command cut short by its worker's SIGKILL, never ended); "
        f"{compared} ticket-ordered pairs checked, {out_of_order} out of order"
    )
    if examples:
        detail += "; " + "; ".join(examples[:3])
    return Result("per-key order held", overlaps == 0 and out_of_order == 0, detail)


def redis_ttls(client: Any, prefix: str) -> tuple[Result, dict[str, tuple[str, int]]]:
    celery_prefix = f"{prefix}celery:"
    without: list[str] = []
    by_design: list[str] = []
    celery: dict[str, tuple[str, int]] = {}
    total = 0
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        total += 1
        ttl = int(client.pttl(key))
        if key.startswith(celery_prefix):
            celery[key[len(prefix) :]] = (str(client.type(key)), ttl)
        elif ttl == -1:
            if key[len(prefix) :] in NO_TTL_BY_DESIGN:
                by_design.append(key[len(prefix) :])
            else:
                without.append(key[len(prefix) :])
    detail = (
        f"{total} keys; without TTL: {without or 'none'}; by design: {sorted(by_design)}; "
        f"Celery keys (apart): {len(celery)}"
    )
    return Result("every key has a TTL", not without, detail), celery


def queues_empty(snapshots: dict[str, list[dict[str, Any]]]) -> Result:
    held = {w: len(e) for w, e in snapshots.items() if e}
    return Result("no stuck queue entries", not held, f"entries left: {held or 'none'}")


def memory_flat(
    samples: dict[int, list[tuple[float, int]]], warmup_s: float
) -> tuple[Result, list[dict[str, Any]]]:
    """RSS per API process: mean of the last third of the samples after warm-up vs the first."""
    rows: list[dict[str, Any]] = []
    ok = True
    for api, points in sorted(samples.items()):
        t0 = points[0][0] if points else 0.0
        kept = [rss for t, rss in points if t - t0 >= warmup_s]
        if len(kept) < 3:
            rows.append(
                {
                    "api": api,
                    "samples": len(kept),
                    "first_mib": None,
                    "last_mib": None,
                    "growth": None,
                }
            )
            continue
        third = len(kept) // 3
        first = statistics.fmean(kept[:third])
        last = statistics.fmean(kept[-third:])
        growth = (last - first) / first
        ok = ok and growth <= MEMORY_GROWTH_LIMIT
        rows.append(
            {
                "api": api,
                "samples": len(kept),
                "first_mib": round(first / 2**20, 1),
                "last_mib": round(last / 2**20, 1),
                "growth": round(growth * 100, 1),
            }
        )
    detail = "; ".join(
        f"API {r['api']}: {r['first_mib']} -> {r['last_mib']} MiB ({r['growth']}%, {r['samples']} samples)"
        for r in rows
    )
    enough = all(r["samples"] >= 3 for r in rows)
    return Result(
        f"API memory flat (growth <= {int(MEMORY_GROWTH_LIMIT * 100)}%)",
        ok and enough,
        detail if enough else detail + " (too few samples)",
    ), rows


def summarize(results: Iterable[Result]) -> str:
    lines = ["| check | result | detail |", "| --- | --- | --- |"]
    for r in results:
        lines.append(f"| {r.name} | {'PASS' if r.ok else 'FAIL'} | {r.detail} |")
    return "\n".join(lines)
