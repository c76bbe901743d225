"""`GET /metrics`: Prometheus text, the same totals from whichever API process answers.

Gauges come from the live queues in Redis (dashboard.live); counters and histograms from the
Redis hash that every API process bumps in the same round trip as a call's completion row
(admission.completion.metrics_record). Nothing is kept in process memory, so several API
processes behind one scrape address never disagree. Labels: `worker` and `reason`/`code`
only; never an isolation key, tenant or principal.

Access: `Authorization: Bearer <METRICS_TOKEN>`, or an active staff member's session (a
person looking from the browser). The client address counts for nothing: a command on a
worker that shares the API's host connects from loopback too, and the metrics name every
tenant's workers.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from admission.completion import METRIC_BUCKETS_S, metrics_key, stream_key
from admission.connections import sync_queue
from admission.queue import worker_keys
from dashboard.live import WorkerCard, live_cards
from workspaces.auth import bearer_token

log = logging.getLogger("sluice.metrics")


def _counters(raw: dict[str, str]) -> dict[str, dict[tuple[str, ...], int]]:
    """Split `kind|worker|...` fields into {kind: {(worker, ...): value}}."""
    out: dict[str, dict[tuple[str, ...], int]] = defaultdict(dict)
    for name, value in raw.items():
        kind, _, rest = name.partition("|")
        out[kind][tuple(rest.split("|"))] = int(value)
    return out


def _histogram(name: str, doc: str, series: dict[tuple[str, ...], int]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=["worker"])
    by_worker: dict[str, dict[str, int]] = defaultdict(dict)
    for key, value in series.items():
        if len(key) == 2:
            by_worker[key[0]][key[1]] = value
    for worker, parts in sorted(by_worker.items()):
        cumulative, buckets = 0, []
        for i, le in enumerate((*METRIC_BUCKETS_S, float("inf"))):
            cumulative += parts.get(str(i), 0)
            buckets.append(("+Inf" if le == float("inf") else repr(le), cumulative))
        family.add_metric([worker], buckets, sum_value=parts.get("sum_ms", 0) / 1000)
    return family


class SluiceCollector:
    """Reads everything fresh on each scrape: two Redis round trips and one small query."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def collect(self) -> Iterator[Metric]:
        cards = live_cards(client=self.client)
        yield from self._gauges(cards)
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(metrics_key())
        pipe.xlen(stream_key())
        for card in cards:
            pipe.hgetall(worker_keys(settings.REDIS_KEY_PREFIX, card.worker_id).stats)
        raw, backlog, *stats = pipe.execute()
        counters = _counters(raw)
        admissions = CounterMetricFamily(
            "sluice_admissions", "Calls admitted to a lease slot.", labels=["worker"]
        )
        for (worker, *_), value in sorted(counters["a"].items()):
            admissions.add_metric([worker], value)
        yield admissions
        rejections = CounterMetricFamily(
            "sluice_rejections",
            "Calls refused without running, by reason (queue_full, queue_timeout, rate_limited, cancelled, "
            'worker_offline, ...). worker="" when refused before the worker was confirmed.',
            labels=["worker", "reason"],
        )
        for key, value in sorted(counters["r"].items()):
            if len(key) == 2:
                rejections.add_metric(list(key), value)
        yield rejections
        requests = CounterMetricFamily(
            "sluice_requests",
            'Every POST to the execute endpoint, by answer code ("OK" for 200).',
            labels=["worker", "code"],
        )
        for key, value in sorted(counters["c"].items()):
            if len(key) == 2:
                requests.add_metric(list(key), value)
        yield requests
        yield _histogram(
            "sluice_queue_wait_seconds",
            "Time from arrival to admission (or to giving up) of calls that queued.",
            counters["qw"],
        )
        yield _histogram(
            "sluice_execution_seconds",
            "Time from admission to the answer of dispatched calls.",
            counters["ex"],
        )
        discarded = CounterMetricFamily(
            "sluice_settlements_discarded",
            "Worker settlements for assignments that were no longer live (late or stale).",
            labels=["worker"],
        )
        for card, worker_stats in zip(cards, stats, strict=True):
            discarded.add_metric([card.worker_id], int(worker_stats.get("settle_discarded", 0)))
        yield discarded
        yield GaugeMetricFamily(
            "sluice_completion_backlog",
            "Completion rows buffered in Redis and not yet in Postgres (grows while Postgres is down).",
            value=int(backlog),
        )

    def _gauges(self, cards: list[WorkerCard]) -> Iterator[Metric]:
        specs: list[tuple[str, str, Any]] = [
            (
                "sluice_worker_online",
                "1 when the worker is registered and heartbeating.",
                lambda c: int(c.online),
            ),
            ("sluice_queue_waiting", "Calls waiting in the worker's queue.", lambda c: c.waiting),
            (
                "sluice_queue_running",
                "Calls holding one of the worker's lease slots.",
                lambda c: c.running,
            ),
            (
                "sluice_slot_capacity",
                "Lease slots of the worker (its --slots, capped by the policy).",
                lambda c: c.capacity,
            ),
            (
                "sluice_queue_limit",
                "WORKER_QUEUE_LIMIT in effect on the worker: its override, its tenant's, or the "
                "global policy.",
                lambda c: c.queue_limit,
            ),
            (
                "sluice_worker_draining",
                "1 while an operator drains the worker: it grants nothing new until resumed.",
                lambda c: int(c.draining),
            ),
            (
                "sluice_queue_oldest_wait_seconds",
                "How long the oldest waiting call has waited.",
                lambda c: c.oldest_wait_ms / 1000,
            ),
        ]
        for name, doc, value in specs:
            family = GaugeMetricFamily(name, doc, labels=["worker"])
            for card in cards:
                family.add_metric([card.worker_id], value(card))
            yield family


def metrics_refusal(request: HttpRequest) -> tuple[int, str] | None:
    """None when the request may read the metrics, else (status, text). The token is read from
    the environment on each request, so a test can set it for itself."""
    token = os.environ.get("METRICS_TOKEN", "")
    supplied = bearer_token(request.headers.get("Authorization"))
    if token and supplied and hmac.compare_digest(supplied.encode(), token.encode()):
        return None
    user = request.user
    if user.is_authenticated:
        if user.is_active and user.is_staff:
            return None
        return 403, "/metrics is for active staff or a scraper holding METRICS_TOKEN.\n"
    if not token:
        return 401, "METRICS_TOKEN is not set here: only a staff session can read /metrics.\n"
    return 401, "A bearer token is required: Authorization: Bearer <METRICS_TOKEN>.\n"


def metrics_view(request: HttpRequest) -> HttpResponse:
    refusal = metrics_refusal(request)
    if refusal is not None:
        status, text = refusal
        response = HttpResponse(text, status=status, content_type="text/plain")
        if status == 401:
            # What a scraper expects to see when its credentials are missing or wrong.
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SluiceCollector(sync_queue().client))
    try:
        body = generate_latest(registry)
    except Exception:
        log.warning("metrics unavailable", exc_info=True)
        return HttpResponse(
            "metrics unavailable: Redis or Postgres is down\n",
            status=503,
            content_type="text/plain",
        )
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
