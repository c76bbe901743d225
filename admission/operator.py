"""What an operator does to live traffic: cancel a waiting call, drain and resume a worker,
each recorded in the audit trail (`OperatorAction`).

A cancel is the client's own DELETE (contract §2.6) made by someone else: the same leave
script takes the call out of its queue, its request answers 409 REQUEST_CANCELLED (not
started), and only the words of that answer and its completion row's `operator_cancelled`
say an operator did it. A running call is never touched.

A drain is a flag in Redis beside the worker's registration, read by every grant
(`_common.lua` drained()): nothing new starts, running calls finish, waiting and new calls
keep their places and their own deadlines, so one that outlasts its allowance gets the usual
503 WORKSPACE_QUEUE_TIMEOUT. Every API process sees the flag at its next grant, because the
grant itself reads it. The flag has no TTL; the audit trail in Postgres says who set it, and
a worker that registers again while its last recorded action is a drain gets the flag back
(a Redis that lost its data would otherwise forget it).
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass

from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from admission.connections import sync_queue
from admission.models import OperatorAction
from admission.policy import policy_for
from workspaces.access import principal_hash
from workspaces.models import Principal, Worker


@dataclass(frozen=True)
class Actor:
    """Who acts: a staff user's name (dashboard, admin) or the shell user (a command)."""

    name: str
    via: str

    @classmethod
    def of(cls, request: HttpRequest, *, via: str) -> Actor:
        return cls(request.user.get_username(), via)

    @classmethod
    def shell(cls) -> Actor:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "unknown"
        return cls(f"shell:{user}", "command")


def action_record(*, actor: Actor, action: str, target: str, result: str = "") -> OperatorAction:
    return OperatorAction.objects.create(
        actor=actor.name[:150], via=actor.via, action=action, target=target[:256], result=result
    )


class UnknownWorker(Exception):
    pass


def _slot_ceiling(worker: Worker) -> int:
    return policy_for(worker_id=worker.worker_id, tenant_id=worker.tenant_id).max_lease_slots


def _worker(worker_id: str) -> Worker:
    worker = Worker.objects.filter(worker_id=worker_id).first()
    if worker is None:
        raise UnknownWorker(worker_id)
    return worker


def call_cancel(*, worker_id: str, entry_id: str, actor: Actor, named: str = "") -> str:
    """Cancel one waiting call by its place in a worker's queue (the dashboard's button):
    "cancelled", "running" (untouched) or "gone" (no longer in the queue). Only a cancel is
    recorded: the others changed nothing."""
    worker = _worker(worker_id)
    state = sync_queue().cancel_waiting(
        worker_id=worker_id, entry_id=entry_id, slot_ceiling=_slot_ceiling(worker)
    )
    if state == "cancelled":
        action_record(
            actor=actor,
            action=OperatorAction.CANCEL,
            target=f"call {named or entry_id} on {worker_id}",
            result="cancelled while it waited",
        )
    return state


def request_cancel(*, request_id: str, actor: Actor) -> str:
    """Cancel the waiting call a client named with this request id, whoever its principal:
    "cancelled", "running", "finished", or "unknown"."""
    principals = Principal.objects.values_list("tenant_id", "pk")
    scopes = [principal_hash(tenant_id=t, principal_id=p) for t, p in principals]
    found = sync_queue().find_request(scopes=scopes, request_id=request_id)
    if found is None:
        return "unknown"
    if isinstance(found, str):
        return found
    worker_id, entry_id = found
    try:
        state = call_cancel(
            worker_id=worker_id, entry_id=entry_id, actor=actor, named=f"request {request_id}"
        )
    except UnknownWorker:
        return "finished"
    return {"gone": "finished"}.get(state, state)


def worker_drain(*, worker_id: str, actor: Actor) -> bool:
    """Stop granting the worker's queue. False when it was drained already."""
    _worker(worker_id)
    note = {"by": actor.name, "at": timezone.now().isoformat()}
    with transaction.atomic():
        changed = sync_queue().drain(worker_id=worker_id, note=note)
        if changed:
            action_record(
                actor=actor,
                action=OperatorAction.DRAIN,
                target=f"worker {worker_id}",
                result="grants nothing new; running calls finish",
            )
    return changed


def worker_resume(*, worker_id: str, actor: Actor) -> tuple[bool, int]:
    """Grant the worker's queue again, in order: (it was drained, calls granted at once)."""
    worker = _worker(worker_id)
    with transaction.atomic():
        was, granted = sync_queue().resume(worker_id=worker_id, slot_ceiling=_slot_ceiling(worker))
        if was:
            action_record(
                actor=actor,
                action=OperatorAction.RESUME,
                target=f"worker {worker_id}",
                result=f"{granted} waiting call(s) granted",
            )
    return was, granted


def drain_restore(*, worker_id: str) -> None:
    """Set the flag again when the audit trail's last drain or resume of this worker is a
    drain (called as a worker registers: a Redis restarted empty must not undo a drain)."""
    last = (
        OperatorAction.objects.filter(
            action__in=[OperatorAction.DRAIN, OperatorAction.RESUME],
            target=f"worker {worker_id}",
        )
        .order_by("-at", "-pk")
        .first()
    )
    if last is not None and last.action == OperatorAction.DRAIN:
        sync_queue().drain(worker_id=worker_id, note={"by": last.actor, "at": last.at.isoformat()})
