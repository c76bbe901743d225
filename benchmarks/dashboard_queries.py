"""Dashboard queries on a million completion rows (issue 6).

    .venv/bin/python benchmarks/dashboard_queries.py [--rows 1000000] [--days 1] [--repeat 5] [--keep] [--reuse]

Recreates the throwaway database `sluice_bench_dashboard` (harness.prepare: create, migrate),
loads ROWS synthetic completion rows with COPY, spread over the last DAYS days (the default,
1, is the worst case: every row falls inside the dashboard's 24 h window), ANALYZEs, then times
each history query the dashboard and `contention_report` run, for a 1 h and a 24 h window,
with and without a worker filter: the median of REPEAT runs, in ms. It then EXPLAINs each
query for the 1 h and the worker-filtered 24 h window and reports which index it used.
Before timing, it builds the 10-minute rollup (dashboard/rollup.py) as a drainer starting up
would, and reports how long that took; `--raw` times the queries on the log alone instead
(the "before" of issue 16). Prints a table, then one JSON line for the docs. Drops the
database unless --keep; --reuse times a database kept before without loading it again.

It also loads what the queue-depth sampler and the worker-event hooks write over the same days
(one sample per worker every 5 s, a restart or an expiry per worker every few hours) and times
the queue-depth chart and the worker-history table with the rest.

The synthetic log: 8 workers of 4 slots, 200 workspaces with a skewed share of the traffic
(a few are hot), 2,000 isolation keys, ~2 % queue timeouts, ~1 % other refusals, mostly short
calls with a tail of long commands.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

DB_NAME = "sluice_bench_dashboard"
WORKERS = [f"bench-w{i}" for i in range(8)]
WORKSPACES = [f"repo-{i:03d}" for i in range(200)]
COLUMNS = (
    "uid",
    "request_id",
    "created_at",
    "tenant_hash",
    "principal_hash",
    "worker_id",
    "workspace_id",
    "worktree",
    "isolation_key_hash",
    "operation",
    "http_status",
    "code",
    "outcome",
    "admission_outcome",
    "queue_wait_ms",
    "slot_index",
    "exec_ms",
    "duration_ms",
    "deadline_budget_ms",
    "fencing_ticket",
)
OPERATIONS = [
    "read_file",
    "list_files",
    "search_text",
    "write_file",
    "edit_file",
    "execute_command",
]


def synthetic_rows(count: int, *, until: datetime, days: float, seed: int = 6) -> Any:
    rng = random.Random(seed)
    span_s = days * 86400
    # Zipf-like: workspace i gets weight 1/(i+1), so the first few are hot.
    weights = [1 / (i + 1) for i in range(len(WORKSPACES))]
    cumulative = list(_accumulate(weights))
    keys = {ws: [uuid.uuid4().hex for _ in range(10)] for ws in WORKSPACES}
    for n in range(count):
        ws = WORKSPACES[_pick(rng, cumulative)]
        worker = WORKERS[hash(ws) % len(WORKERS)]
        # Arrival order, as the drainer appends them (a little jitter within a batch): rows of
        # one time window sit together on disk, as in a real log.
        created = until - timedelta(seconds=span_s * (1 - n / count) + rng.random() * 2)
        op = rng.choice(OPERATIONS)
        roll = rng.random()
        wait = int(rng.expovariate(1 / 60))
        exec_ms: int | None = (
            int(rng.lognormvariate(4.5, 1.2))
            if op != "execute_command"
            else int(rng.lognormvariate(7, 1.5))
        )
        slot: int | None = rng.randrange(4)
        ticket: int | None = n + 1
        status, code, admission = 200, "", "admitted"
        if roll < 0.02:
            wait, exec_ms, slot = rng.choice([5_000, 10_000, 30_000]), None, None
            status, code, admission = 503, "WORKSPACE_QUEUE_TIMEOUT", "queue_timeout"
        elif roll < 0.025:
            wait, exec_ms, slot, ticket = 0, None, None, None
            status, code, admission = 429, "WORKER_QUEUE_FULL", "queue_full"
        elif roll < 0.03:
            wait, exec_ms, slot, ticket = 0, None, None, None
            status, code, admission = 400, "INVALID_WORKSPACE_TOOL_REQUEST", "rejected_before_queue"
        elif roll < 0.05:
            status, code = 409, "EDIT_CONFLICT"
        exec_ms = min(exec_ms, 300_000) if exec_ms is not None else None
        yield (
            uuid.uuid4().hex,
            f"bench-{n:012d}",
            created,
            "t" * 32,
            "p" * 32,
            worker,
            ws,
            "",
            rng.choice(keys[ws]),
            op,
            status,
            code,
            "completed",
            admission,
            wait,
            slot,
            exec_ms,
            wait + (exec_ms or 0),
            65_000,
            ticket,
        )


def _accumulate(values: list[float]) -> Any:
    total = 0.0
    for v in values:
        total += v
        yield total


def _pick(rng: random.Random, cumulative: list[float]) -> int:
    x = rng.random() * cumulative[-1]
    lo, hi = 0, len(cumulative) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if cumulative[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def load(count: int, days: float) -> tuple[datetime, float]:
    from django.db import connection

    from admission.models import CompletionLog

    until = datetime.now(tz=UTC)
    started = time.perf_counter()
    table = CompletionLog._meta.db_table
    with connection.cursor() as cursor:
        raw = cursor.cursor  # the psycopg cursor: COPY is not part of Django's cursor API
        with raw.copy(f"COPY {table} ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            for row in synthetic_rows(count, until=until, days=days):
                copy.write_row(row)
        cursor.execute(f"VACUUM ANALYZE {table}")
    return until, time.perf_counter() - started


def load_samples(until: datetime, days: float, seed: int = 16) -> int:
    """Queue-depth samples every SAMPLE_PERIOD_S per worker, and a few worker events a day."""
    from django.db import connection

    from dashboard.models import QueueDepthSample, WorkerEvent
    from dashboard.sampler import SAMPLE_PERIOD_S

    rng = random.Random(seed)
    ticks = int(days * 86400 / SAMPLE_PERIOD_S)
    with connection.cursor() as cursor:
        raw = cursor.cursor
        table = QueueDepthSample._meta.db_table
        with raw.copy(f"COPY {table} (at, worker_id, waiting, running) FROM STDIN") as copy:
            for n in range(ticks):
                at = until - timedelta(seconds=(ticks - n) * SAMPLE_PERIOD_S)
                for worker in WORKERS:
                    copy.write_row((at, worker, int(rng.expovariate(1 / 2)), rng.randrange(5)))
        table = WorkerEvent._meta.db_table
        with raw.copy(
            f"COPY {table} (at, worker_id, kind, incarnation_id, detail) FROM STDIN"
        ) as copy:
            for worker in WORKERS:
                at = until - timedelta(days=days)
                while at < until:
                    for kind in ("registered", rng.choice(["expired", "deregistered"])):
                        copy.write_row((at, worker, kind, uuid.uuid4().hex, ""))
                        at += timedelta(hours=rng.uniform(1, 6))
        cursor.execute(f"VACUUM ANALYZE {QueueDepthSample._meta.db_table}")
        cursor.execute(f"VACUUM ANALYZE {table}")
    return ticks * len(WORKERS)


def queries() -> dict[str, Callable[[Any], Any]]:
    from dashboard import history
    from dashboard.attribution import recent_timeouts
    from dashboard.events import worker_events

    return {
        "wait percentiles": history.wait_percentiles,
        "outcomes (throughput, error rate)": history.outcomes,
        "slot utilisation": history.slot_usage,
        "top workspaces": lambda w: history.top_contended(w, by_key=False),
        "top isolation keys": lambda w: history.top_contended(w, by_key=True),
        "timeouts + holders (200)": lambda w: recent_timeouts(w, limit=200),
        "exec percentiles": history.exec_percentiles,
        "failures by code / operation": history.failures,
        "tenants and principals": history.callers,
        "queue depth (samples)": history.queue_depth,
        "worker history (events)": worker_events,
    }


def load_operators(*, keys: int = 20_000, actions: int = 100_000) -> list[int]:
    """What the live cards' who-waits lookup and the audit list read: `keys` API keys of
    principals spread over 200 tenants, and `actions` rows of the audit trail over 90 days.
    Returns the key ids, for a lookup of a full card's worth of them."""
    from django.utils import timezone

    from admission.models import OperatorAction
    from workspaces.models import ApiKey, Principal, Tenant

    tenants = Tenant.objects.bulk_create(Tenant(name=f"bench-{i}") for i in range(200))
    principals = Principal.objects.bulk_create(
        Principal(tenant=tenants[i % len(tenants)], name=f"user-{i}") for i in range(keys // 4)
    )
    made = ApiKey.objects.bulk_create(
        (
            ApiKey(principal=principals[i % len(principals)], prefix=f"b{i}", key_hash=f"{i:064x}")
            for i in range(keys)
        ),
        batch_size=5_000,
    )
    now = timezone.now()
    rng = random.Random(38)
    OperatorAction.objects.bulk_create(
        (
            OperatorAction(
                at=now - timedelta(seconds=rng.uniform(0, 90 * 86400)),
                actor=f"staff-{rng.randrange(20)}",
                via=rng.choice(["dashboard", "admin", "command"]),
                action=rng.choice([a for a, _ in OperatorAction.ACTIONS]),
                target=f"worker {rng.choice(WORKERS)}",
            )
            for _ in range(actions)
        ),
        batch_size=10_000,
    )
    with connection_cursor() as cursor:
        for model in (ApiKey, OperatorAction):
            cursor.execute(f"ANALYZE {model._meta.db_table}")
    return [k.pk for k in made]


def connection_cursor() -> Any:
    from django.db import connection

    return connection.cursor()


def operator_queries(key_ids: list[int]) -> dict[str, Callable[[], Any]]:
    """The live cards' who-waits lookup (the key ids of 8 workers' full queues of 32, one
    query) and the admin's audit list (its first page, and filtered by action)."""
    from admission.models import OperatorAction
    from dashboard.live import _callers

    wanted = {str(k) for k in random.Random(7).sample(key_ids, 8 * 32)}
    return {
        "who waits: 256 callers by key id": lambda: _callers(wanted),
        "audit list, first page": lambda: list(OperatorAction.objects.all()[:100]),
        "audit list, one action": lambda: list(OperatorAction.objects.filter(action="drain")[:100]),
    }


def attach(name: str) -> None:
    """Django on an existing benchmark database (harness.prepare, without recreating it)."""
    import os

    os.environ["DATABASE_URL"] = harness._database_url(name)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("SLUICE_LOCAL_SECRET", "1")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def reused_until() -> datetime:
    from django.db.models import Max

    from admission.models import CompletionLog

    newest = CompletionLog.objects.aggregate(t=Max("created_at"))["t"]
    assert newest is not None, "the database holds no rows: run without --reuse"
    return newest + timedelta(seconds=1)


def timed(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm the cache: a dashboard that is looked at is a warm dashboard
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - started) * 1000)
    return statistics.median(runs)


def plans(window: Any) -> dict[str, str]:
    """Which access path each query takes: the indexes named in its plan, or the scans."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    found = {}
    for name, fn in queries().items():
        with CaptureQueriesContext(connection) as captured:
            fn(window)
        sql = max((q["sql"] for q in captured.captured_queries), key=len)  # not SET/COMMIT
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + sql)
            plan = "\n".join(r[0] for r in cursor.fetchall())
        indexes = sorted(
            set(
                re.findall(
                    r"Index (?:Only )?Scan (?:using|on) ((?:completion|depth|worker_event)_\w+)",
                    plan,
                )
            )
        )
        found[name] = ", ".join(indexes) or ("seq scan" if "Seq Scan" in plan else "?")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--days", type=float, default=1.0, help="spread the rows over this many days [1]"
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--keep", action="store_true", help="keep the database (e.g. to look at the dashboard)"
    )
    parser.add_argument(
        "--reuse", action="store_true", help="time the database a --keep run left, no load"
    )
    parser.add_argument(
        "--raw", action="store_true", help="the log alone: no rollup (the old queries' cost)"
    )
    args = parser.parse_args()

    if args.reuse:
        attach(DB_NAME)
        until = reused_until()
    else:
        harness.prepare(DB_NAME, shared=True)
        until, load_s = load(args.rows, args.days)
        print(
            f"loaded {args.rows:,} rows over {args.days:g} d in {load_s:.1f} s "
            "(COPY + VACUUM ANALYZE)"
        )
        print(f"loaded {load_samples(until, args.days):,} queue-depth samples")
    from dashboard.models import RollupMark
    from dashboard.rollup import Rollup
    from dashboard.window import Window

    RollupMark.objects.all().delete()
    if not args.raw:
        started = time.perf_counter()
        pairs = Rollup().tick(now=until)
        print(
            f"rollup built (as a drainer starting up does): {pairs:,} worker buckets "
            f"in {time.perf_counter() - started:.1f} s"
        )

    windows = {
        "15m": Window(since=until - timedelta(minutes=15), until=until),
        "1h": Window(since=until - timedelta(hours=1), until=until),
        "24h": Window(since=until - timedelta(hours=24), until=until),
        "24h, one worker": Window(
            since=until - timedelta(hours=24), until=until, worker=WORKERS[0]
        ),
    }
    results: dict[str, dict[str, float]] = {}

    def measure(fn: Callable[[Any], Any], window: Any) -> float:
        return round(timed(lambda: fn(window), args.repeat), 1)

    for name, fn in queries().items():
        results[name] = {label: measure(fn, w) for label, w in windows.items()}
    page = {label: round(sum(r[label] for r in results.values()), 1) for label in windows}
    access = {label: plans(windows[label]) for label in ("1h", "24h, one worker")}

    width = max(map(len, results)) + 2
    print(
        f"\n{'query':<{width}}"
        + "".join(f"{label:>18}" for label in windows)
        + "   access path (1h | 24h, one worker)"
    )
    for name, row in results.items():
        cells = "".join(f"{row[label]:>15.1f} ms" for label in windows)
        print(f"{name:<{width}}{cells}   {access['1h'][name]} | {access['24h, one worker'][name]}")
    print(
        f"{'whole history page':<{width}}"
        + "".join(f"{page[label]:>15.1f} ms" for label in windows)
    )
    if not args.reuse:
        started = time.perf_counter()
        key_ids = load_operators()
        print(
            f"\nloaded 20,000 API keys and 100,000 audit rows in {time.perf_counter() - started:.1f} s"
        )
        for name, fn in operator_queries(key_ids).items():
            took = round(timed(fn, args.repeat), 1)
            results[name] = {label: took for label in windows}
            print(f"{name:<{width}}{took:>15.1f} ms")
    worst = max(v for row in results.values() for v in row.values())
    print(f"\nslowest single query: {worst:.1f} ms (target <= 300 ms)")
    print(
        json.dumps(
            {
                "rows": args.rows,
                "days": args.days,
                "median_ms": results,
                "page_ms": page,
                "access": access,
            }
        )
    )

    if not args.keep:
        from django.db import connection

        connection.close()
        import psycopg

        with psycopg.connect(
            harness._database_url("postgres").replace("postgres://", "postgresql://"),
            autocommit=True,
        ) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


if __name__ == "__main__":
    main()
