"""Worker events where registration changes, queue-depth samples, their charts and retention.

Real Redis and Postgres, services called directly; time is a parameter of the sampler.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis
from django.conf import settings
from django.test import Client
from django.utils import timezone

from admission.bridge import worker_revoke
from admission.connections import sync_queue
from admission.management.commands.bootstrap import bootstrap
from admission.queue import AsyncQueue, worker_keys
from admission.registration import (
    OfferedWorkspace,
    worker_deregister,
    worker_heartbeat,
    worker_register,
)
from dashboard import history
from dashboard.models import QueueDepthSample, WorkerEvent
from dashboard.sampler import QueueDepthSampler, dashboard_prune, queue_depth_sample
from dashboard.window import Window
from workspaces.access import caller_for_api_key
from workspaces.models import Worker

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2030, 1, 7, 12, 0, tzinfo=UTC)


def account(name: str = "owner") -> dict[str, Any]:
    return bootstrap(
        tenant=f"{name}-{uuid.uuid4().hex[:6]}",
        user=name,
        worker_id=f"{name}_{uuid.uuid4().hex[:12]}",
    )


def register(worker_id: str, *, slots: int = 1) -> str:
    worker = Worker.objects.get(worker_id=worker_id)
    offered = [OfferedWorkspace("repo", ["read_file"], False)]
    return str(worker_register(worker=worker, workspaces=offered, slots=slots)["incarnationId"])


def kinds(worker_id: str) -> list[tuple[str, str]]:
    return list(
        WorkerEvent.objects.filter(worker_id=worker_id)
        .order_by("at", "pk")
        .values_list("kind", "incarnation_id")
    )


def enter(worker_id: str, entry_ids: list[str]) -> list[str]:
    async def go() -> list[str]:
        client = aioredis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
        try:
            queue = AsyncQueue(client, settings.REDIS_KEY_PREFIX)
            states = []
            for entry_id in entry_ids:
                entered = await queue.enter(
                    worker_id=worker_id,
                    entry_id=entry_id,
                    key=("repo", ""),
                    queue_budget_ms=30_000,
                    exec_budget_ms=30_000,
                    queue_limit=32,
                    slot_ceiling=8,
                    operation="read_file",
                )
                states.append(entered.status)
            return states
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_register_restart_deregister_and_revoke_are_recorded_once_each_in_order() -> None:
    owner = account()
    w = owner["worker_id"]
    first = register(w)
    second = register(w)  # the worker process restarted: a new incarnation replaces the first
    worker_deregister(worker=Worker.objects.get(worker_id=w), incarnation=second)
    # A stale incarnation deregistering again changes nothing and records nothing.
    worker_deregister(worker=Worker.objects.get(worker_id=w), incarnation=second)
    third = register(w)
    caller = caller_for_api_key(owner["api_key"])
    assert caller is not None
    worker_revoke(caller=caller, worker_id=w)
    worker_revoke(caller=caller, worker_id=w)  # LibreChat retrying: not a second revoke
    assert kinds(w) == [
        ("registered", first),
        ("restarted", second),
        ("deregistered", second),
        ("registered", third),
        ("revoked", third),  # the incarnation the revoke ended
    ]
    restarted = WorkerEvent.objects.get(worker_id=w, kind="restarted")
    assert restarted.detail.startswith(f"replaced {first[:8]}")


def test_an_expired_registration_is_recorded_once_whoever_notices_it() -> None:
    w = account()["worker_id"]
    incarnation = register(w)
    # The registration's TTL ran out: Redis deletes the key, Postgres still names it.
    sync_queue().client.delete(worker_keys(settings.REDIS_KEY_PREFIX, w).reg)
    now = timezone.now()
    # Within the registration's lifetime of the last heartbeat, the sampler does not guess.
    queue_depth_sample(now=now)
    assert kinds(w) == [("registered", incarnation)]
    later = now + timedelta(seconds=settings.WORKER_OFFLINE_AFTER_S + 1)
    queue_depth_sample(now=later)
    queue_depth_sample(now=later + timedelta(seconds=5))
    # The worker's own heartbeat finds it lost too: still one expiry.
    assert worker_heartbeat(worker=Worker.objects.get(worker_id=w), incarnation=incarnation) == (
        "lost"
    )
    assert kinds(w) == [("registered", incarnation), ("expired", incarnation)]
    assert not QueueDepthSample.objects.filter(worker_id=w, at__gte=later).exists()


def test_the_heartbeat_records_an_expiry_the_sampler_never_saw() -> None:
    w = account()["worker_id"]
    incarnation = register(w)
    sync_queue().client.delete(worker_keys(settings.REDIS_KEY_PREFIX, w).reg)
    assert worker_heartbeat(worker=Worker.objects.get(worker_id=w), incarnation=incarnation) == (
        "lost"
    )
    assert kinds(w)[-1] == ("expired", incarnation)


def test_a_sample_holds_each_registered_workers_waiting_and_running_calls() -> None:
    busy = account("busy")["worker_id"]
    idle = account("idle")["worker_id"]
    away = account("away")["worker_id"]  # never registered: no row, its line breaks
    register(busy, slots=1)
    register(idle, slots=2)
    assert enter(busy, ["e1", "e2", "e3"]) == ["granted", "waiting", "waiting"]
    assert queue_depth_sample(now=T0) == 2
    rows = {
        r.worker_id: (r.waiting, r.running)
        for r in QueueDepthSample.objects.filter(at=T0, worker_id__in=[busy, idle, away])
    }
    assert rows == {busy: (2, 1), idle: (0, 0)}


def sample(worker_id: str, at_s: float, waiting: int, running: int = 0) -> QueueDepthSample:
    return QueueDepthSample(
        at=T0 + timedelta(seconds=at_s), worker_id=worker_id, waiting=waiting, running=running
    )


def test_depth_buckets_follow_the_window_and_keep_each_buckets_peak() -> None:
    QueueDepthSample.objects.bulk_create(
        [
            sample("w1", 0, 1, 1),
            sample("w1", 5, 4, 2),  # same 10 s bucket: its peak is 4 waiting, 2 running
            sample("w1", 10, 0, 1),
            sample("w2", 5, 3),
            sample("w1", 900, 9),  # outside the 15 min window
        ]
    )
    short = Window(since=T0, until=T0 + timedelta(minutes=15))
    depth = history.queue_depth(short)
    assert [(p.t, p.waiting, p.running) for p in depth["w1"]] == [
        (T0, 4, 2),
        (T0 + timedelta(seconds=10), 0, 1),
    ]
    assert [(p.t, p.waiting) for p in depth["w2"]] == [(T0, 3)]
    assert list(history.queue_depth(Window(short.since, short.until, worker="w2"))) == ["w2"]
    day = Window(since=T0 - timedelta(hours=23), until=T0 + timedelta(hours=1))
    # A 24 h window has 10 min buckets: the first four samples share one.
    assert [(p.t, p.waiting) for p in history.queue_depth(day)["w1"]] == [
        (T0, 4),
        (T0 + timedelta(minutes=10), 9),
    ]


def test_the_page_charts_queue_depth_and_lists_worker_events(django_user_model: Any) -> None:
    now = timezone.now()
    w = account()["worker_id"]
    incarnation = register(w)
    QueueDepthSample.objects.bulk_create(
        [
            QueueDepthSample(at=now - timedelta(seconds=s), worker_id=w, waiting=s % 4, running=1)
            for s in range(0, 120, 5)
        ]
    )
    staff = django_user_model.objects.create_user(f"staff-{uuid.uuid4().hex[:6]}", is_staff=True)
    client = Client()
    client.force_login(staff)
    page = client.get("/dashboard/", {"range": "15m", "worker": w}).content.decode()
    depth = page.split('id="chart-queue-depth"', 1)[1].split("</figure>", 1)[0]
    assert "<polyline" in depth and "No queue samples" not in depth
    assert f"Peak: <strong>3 waiting</strong> on {w}" in depth
    events = page.split('id="worker-events"', 1)[1].split("</figure>", 1)[0]
    assert "registered" in events and incarnation[:8] in events
    empty = client.get("/dashboard/", {"range": "15m", "worker": "nobody"}).content.decode()
    assert "No queue samples in this window" in empty


def test_retention_prunes_old_samples_and_events_and_keeps_the_rest() -> None:
    QueueDepthSample.objects.bulk_create(
        [sample("w1", -40 * 86400, 1), sample("w1", -29 * 86400, 2)]
    )
    WorkerEvent.objects.create(at=T0 - timedelta(days=31), worker_id="w1", kind="registered")
    WorkerEvent.objects.create(at=T0 - timedelta(days=1), worker_id="w1", kind="expired")
    assert dashboard_prune(older_than_days=30, now=T0, batch_size=1) == 2
    assert list(QueueDepthSample.objects.values_list("waiting", flat=True)) == [2]
    assert list(WorkerEvent.objects.values_list("kind", flat=True)) == ["expired"]


def test_the_sampler_thread_keeps_sampling_until_stopped() -> None:
    w = account()["worker_id"]
    register(w)
    sampler = QueueDepthSampler(period_s=0.05)
    sampler.start()
    try:
        deadline = timezone.now() + timedelta(seconds=30)
        while QueueDepthSample.objects.filter(worker_id=w).count() < 3:
            assert timezone.now() < deadline, "the sampler wrote fewer than 3 samples in 30 s"
            sampler.stopping.wait(0.05)
    finally:
        sampler.stop()
        sampler.join(timeout=10)
    assert not sampler.is_alive()
