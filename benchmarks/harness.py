"""Shared set-up for benchmarks: a throwaway database, its own Redis namespace, real processes.

Import this before anything from Django: it points DATABASE_URL at the throwaway database
and gives the run its own SLUICE_REDIS_PREFIX, then sets Django up in this process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def _drop(name: str) -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    admin_url = _database_url("postgres").replace("postgres://", "postgresql://")
    with contextlib.suppress(psycopg.Error), psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _database_url(name: str) -> str:
    base = os.environ.get("DATABASE_URL", "postgres://root@127.0.0.1:5432/test")
    return base.rsplit("/", 1)[0] + "/" + name


def prepare(name: str = "sluice_bench", *, shared: bool = False, **env: str) -> dict[str, str]:
    """Recreate database `name`, migrate it, set Django up here; returns the children's env.
    Unless `shared` (a database kept between runs on purpose), the name gets this run's pid and
    the database is dropped at exit: benchmarks run side by side in several checkouts never
    drop each other's database."""
    import psycopg

    if not shared:
        name = f"{name}_{os.getpid()}"
        atexit.register(_drop, name)
    admin_url = _database_url("postgres")
    with psycopg.connect(
        admin_url.replace("postgres://", "postgresql://"), autocommit=True
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    os.environ.update(env)
    os.environ["DATABASE_URL"] = _database_url(name)
    os.environ["SLUICE_REDIS_PREFIX"] = f"bench-{uuid.uuid4().hex[:8]}:"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("SLUICE_LOCAL_SECRET", "1")  # a benchmark is a local run
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from livesupport import base_env

    return base_env({k: os.environ[k] for k in ("DATABASE_URL", "SLUICE_REDIS_PREFIX", *env)})


def account(worker_id: str, tenant: str = "bench") -> dict[str, str]:
    from admission.management.commands.bootstrap import bootstrap

    # A benchmark starts this worker itself: a token issued now is the one it runs with.
    return bootstrap(tenant=tenant, user="bench", worker_id=worker_id, rotate_worker_token=True)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(values_ms: list[float]) -> dict[str, Any]:
    return {
        "n": len(values_ms),
        "p50_ms": round(percentile(values_ms, 50), 3),
        "p90_ms": round(percentile(values_ms, 90), 3),
        "p99_ms": round(percentile(values_ms, 99), 3),
        "mean_ms": round(statistics.fmean(values_ms), 3) if values_ms else None,
    }


def cleanup_redis() -> None:
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.scan_iter(match=f"{settings.REDIS_KEY_PREFIX}*", count=1000):
        client.delete(key)
