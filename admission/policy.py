"""The admission policy as API processes see it: the policy row, cached for a second.

Operators change the row in Django admin or with `manage.py set_policy`; every API process
re-reads it at most POLICY_CACHE_S later, so a change reaches all of them within 2 s
without a restart.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError

from admission.dbthread import in_db_thread
from admission.models import AdmissionPolicy
from admission.ratelimit import RatePolicy

# set_policy KEY -> policy row field. The keys are the contract's environment names.
POLICY_FIELDS = {
    "JOB_TIMEOUT": "job_timeout_ms",
    "WORKSPACE_QUEUE_CEILING_MS": "queue_ceiling_ms",
    "WORKER_QUEUE_LIMIT": "worker_queue_limit",
    "CODEAPI_BRIDGE_MAX_WORKSPACE_LEASE_SLOTS": "max_lease_slots",
    "WORKSPACE_TOOLS_RATE_LIMIT": "rate_limit",
    "WORKSPACE_TOOLS_RATE_LIMIT_ENABLED": "rate_limit_enabled",
}


@dataclass(frozen=True)
class Policy:
    job_timeout_ms: int
    queue_ceiling_ms: int
    worker_queue_limit: int
    max_lease_slots: int
    rate: RatePolicy
    rate_limit_enabled: bool
    weights: dict[str, int]

    def weight(self, operation: str) -> int:
        return self.weights.get(operation, 1)


def policy_row() -> AdmissionPolicy:
    """The policy row, created from the environment on first use."""
    row = AdmissionPolicy.objects.filter(pk=1).first()
    if row is None:
        row = AdmissionPolicy.from_env()
        row.save()
    return row


def snapshot(row: AdmissionPolicy) -> Policy:
    return Policy(
        job_timeout_ms=row.job_timeout_ms,
        queue_ceiling_ms=row.queue_ceiling_ms,
        worker_queue_limit=row.worker_queue_limit,
        max_lease_slots=row.max_lease_slots,
        rate=RatePolicy.parse(row.rate_limit),
        rate_limit_enabled=row.rate_limit_enabled,
        weights=dict(row.operation_weights or {}),
    )


_lock = threading.Lock()
_cached: tuple[float, Policy] | None = None


def current_policy() -> Policy:
    global _cached
    now = time.monotonic()
    cached = _cached
    if cached is not None and cached[0] > now:
        return cached[1]
    with _lock:
        fresh = snapshot(policy_row())
        _cached = (now + settings.POLICY_CACHE_S, fresh)
        return fresh


_loading: dict[int, asyncio.Future[Policy]] = {}


async def acurrent_policy() -> Policy:
    cached = _cached
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    # A burst arriving as the cached row expires shares one read (one per event loop).
    loop = id(asyncio.get_running_loop())
    pending = _loading.get(loop)
    if pending is None or pending.done():
        pending = _loading[loop] = asyncio.ensure_future(in_db_thread(current_policy))
    return await asyncio.shield(pending)


def forget_cached_policy() -> None:
    global _cached
    _cached = None


def parse_assignment(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    if key not in POLICY_FIELDS:
        raise ValueError(f"unknown policy key {key!r}; known keys: {', '.join(POLICY_FIELDS)}")
    return key, value


def policy_update(assignments: dict[str, str]) -> AdmissionPolicy:
    """Validate and store KEY=VALUE changes; raise ValueError with one clear line on any bad value."""
    row = policy_row()
    for key, raw in assignments.items():
        field = POLICY_FIELDS[key]
        value: Any
        if field == "rate_limit":
            value = raw
        elif field == "rate_limit_enabled":
            if raw.lower() not in {"1", "0", "true", "false", "on", "off"}:
                raise ValueError(f"{key} must be on or off, not {raw!r}")
            value = raw.lower() in {"1", "true", "on"}
        else:
            if not raw.isascii() or not raw.isdigit():
                raise ValueError(f"{key} must be a whole number, not {raw!r}")
            value = int(raw)
        setattr(row, field, value)
    try:
        row.full_clean()
    except ValidationError as exc:
        problems = []
        for field, messages in exc.message_dict.items():
            key = next((k for k, f in POLICY_FIELDS.items() if f == field), field)
            problems.append(f"{key}: {' '.join(messages)}")
        raise ValueError("; ".join(problems)) from None
    row.save()
    forget_cached_policy()
    return row
