"""Worker lifecycle on the server: registration, heartbeats, deregistration.

Postgres keeps what a worker offers; Redis (admission/queue.py) keeps its live incarnation.
While Redis is unreachable each of them refuses ADMISSION_UNAVAILABLE (the worker retries).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone
from redis.exceptions import RedisError

from admission import refusals
from admission.connections import sync_queue
from admission.credentials import RedisAclUnavailable, worker_credentials_restore
from admission.operator import drain_restore
from admission.policy import current_policy
from admission.services import workspace_offer_tokens
from workspaces.dispatch import worker_queue_name
from workspaces.models import Worker, WorkerWorkspace

log = logging.getLogger("sluice.registration")

# What a worker may report as its command sandbox (§4.4).
SANDBOX_PROFILES = frozenset({"bwrap", "none"})

# Sent whenever a worker's registration changes, with keyword arguments kind ("registered",
# "restarted", "deregistered", "expired", "revoked"), worker_id, incarnation and detail. The
# dashboard records it as the worker's online/offline history (dashboard/events.py); a lower
# layer announces, the higher one listens. A receiver that fails never fails the registration.
worker_event = Signal()


def worker_event_announce(*, kind: str, worker_id: str, incarnation: str, detail: str = "") -> None:
    for receiver, result in worker_event.send_robust(
        sender=None, kind=kind, worker_id=worker_id, incarnation=incarnation, detail=detail
    ):
        if isinstance(result, Exception):
            log.warning(
                "worker event not recorded",
                exc_info=result,
                extra={"kind": kind, "worker_id": worker_id, "receiver": str(receiver)},
            )


@dataclass(frozen=True)
class OfferedWorkspace:
    workspace_id: str
    operations: list[str]
    linked_worktree_lanes: bool
    # §2.2.1; None: the worker sent no editFeatures (an older worker, see workspaces.features).
    edit_features: list[str] | None = None
    instruction_files: list[dict[str, object]] = field(default_factory=list)


def _ttl_ms() -> int:
    return settings.WORKER_OFFLINE_AFTER_S * 1000


@contextmanager
def _redis_answers() -> Iterator[None]:
    """Redis away (or refusing the worker's user) is a typed refusal the worker retries."""
    try:
        yield
    except (RedisError, RedisAclUnavailable) as exc:
        log.warning("worker route: Redis unavailable", extra={"error": str(exc)})
        raise refusals.admission_unavailable() from None


def worker_register(
    *,
    worker: Worker,
    workspaces: list[OfferedWorkspace],
    slots: int,
    sandbox_profile: str = "",
) -> dict[str, object]:
    """A new incarnation: calls waiting for the old one are told WORKER_OFFLINE, none moves over."""
    incarnation = uuid.uuid4().hex
    previous = worker.incarnation_id
    # The worker's ACL user and the scripts it may call are set up before it is told to
    # connect: after a Redis restart both are gone, and this is the first thing it asks for.
    with _redis_answers():
        worker_credentials_restore(worker=worker)
        # A drain outlives a Redis that restarted empty: the audit trail has the last word.
        drain_restore(worker_id=worker.worker_id)
    negotiated = min(slots, current_policy().max_lease_slots)
    now = timezone.now()
    with transaction.atomic():
        Worker.objects.filter(pk=worker.pk).update(
            incarnation_id=incarnation,
            requested_slots=slots,
            slots=negotiated,
            registered_at=now,
            last_heartbeat_at=now,
            sandbox_profile=sandbox_profile,
        )
        WorkerWorkspace.objects.filter(worker=worker).delete()
        WorkerWorkspace.objects.bulk_create(
            WorkerWorkspace(
                worker=worker,
                workspace_id=w.workspace_id,
                operations=sorted(w.operations),
                linked_worktree_lanes=w.linked_worktree_lanes,
                edit_features=None if w.edit_features is None else sorted(w.edit_features),
                instruction_files=w.instruction_files,
            )
            for w in workspaces
        )
    # Postgres first: a call admitted against the old incarnation in between is dropped
    # by the Redis step below and answered WORKER_OFFLINE.
    # Redis gets the offer too: the scripts that grant check every call against it, so a
    # withdrawn offer refuses a waiting call (WORKER_MISMATCH) with no API process involved.
    offer = {
        w.workspace_id: workspace_offer_tokens(
            operations=w.operations,
            linked_worktree_lanes=w.linked_worktree_lanes,
            edit_features=w.edit_features,
            instruction_files=w.instruction_files,
        )
        for w in workspaces
    }
    with _redis_answers():
        waiting, running = sync_queue().register_incarnation(
            worker_id=worker.worker_id,
            incarnation=incarnation,
            slots=slots,
            ttl_ms=_ttl_ms(),
            offer=offer,
        )
    worker_event_announce(
        kind="restarted" if previous else "registered",
        worker_id=worker.worker_id,
        incarnation=incarnation,
        detail=(
            f"replaced {previous[:8]}; told {waiting} waiting and {running} running calls"
            if previous
            else f"{negotiated} slots"
        ),
    )
    return {
        "incarnationId": incarnation,
        "slots": negotiated,
        "queue": worker_queue_name(worker.worker_id),
    }


def worker_heartbeat(*, worker: Worker, incarnation: str) -> str:
    """'alive'; 'replaced' (another incarnation registered: stop); or 'lost' (the registration
    expired or Redis restarted empty, and nobody replaced it: register again).

    A lost registration also gets the worker's Redis user set up again: after a Redis restart
    without its data the user is gone, and the worker registers again only once its Celery
    consumer, which logs in as that user, reads its queue (workspaces/runtime/consuming.py).
    """
    with _redis_answers():
        renewed = sync_queue().heartbeat(
            worker_id=worker.worker_id, incarnation=incarnation, ttl_ms=_ttl_ms()
        )
    if renewed == 0:
        return "replaced"
    if renewed < 0:
        current = (
            Worker.objects.filter(pk=worker.pk).values_list("incarnation_id", flat=True).first()
        )
        if current != incarnation:
            return "replaced"
        with _redis_answers():
            worker_credentials_restore(worker=worker)
        # Its registration expired (or Redis restarted empty): the sampler may not have seen it.
        worker_event_announce(
            kind="expired",
            worker_id=worker.worker_id,
            incarnation=incarnation,
            detail="noticed by its heartbeat",
        )
        return "lost"
    Worker.objects.filter(pk=worker.pk, incarnation_id=incarnation).update(
        last_heartbeat_at=timezone.now()
    )
    return "alive"


def worker_deregister(*, worker: Worker, incarnation: str) -> int:
    with _redis_answers():
        told = sync_queue().deregister(worker_id=worker.worker_id, incarnation=incarnation)
    if Worker.objects.filter(pk=worker.pk, incarnation_id=incarnation).update(incarnation_id=""):
        worker_event_announce(
            kind="deregistered",
            worker_id=worker.worker_id,
            incarnation=incarnation,
            detail=f"told {max(told, 0)} calls",
        )
    return told
