"""The admission policy as API processes see it: the policy row and its overrides, cached
in each process under a version that lives in Django's cache (django-redis).

Operators change the row (and the overrides per tenant or worker) in Django admin or with
`manage.py set_policy`. Every save or delete of either bumps the version (a fresh random
token, once the write is committed: `policy_changed`); each API process reads the version
on every call (one GET, no thread hop on the async path) and reloads from Postgres when it
differs, so a change is live on every process from its next call. If the cache's Redis
cannot be read, a process falls back to re-reading Postgres every POLICY_FALLBACK_S.
`policy_for()` resolves one call's policy: the worker's override, then its tenant's, then
the global row, field by field.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any

import redis.asyncio as aioredis
from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from admission.dbthread import in_db_thread
from admission.models import AdmissionPolicy, PolicyOverride
from admission.ratelimit import RatePolicy
from workspaces import outages
from workspaces.models import Tenant, Worker

# set_policy KEY -> policy row field. The keys are the contract's environment names.
POLICY_FIELDS = {
    "JOB_TIMEOUT": "job_timeout_ms",
    "WORKSPACE_QUEUE_CEILING_MS": "queue_ceiling_ms",
    "WORKER_QUEUE_LIMIT": "worker_queue_limit",
    "WORKER_FLOW_SHARE_PERCENT": "flow_share_percent",
    "CODEAPI_BRIDGE_MAX_WORKSPACE_LEASE_SLOTS": "max_lease_slots",
    "WORKSPACE_TOOLS_RATE_LIMIT": "rate_limit",
    "WORKSPACE_TOOLS_RATE_LIMIT_ENABLED": "rate_limit_enabled",
}
# What an override per tenant or worker may change (PolicyOverride says why the rest may not).
OVERRIDE_KEYS = [
    "JOB_TIMEOUT",
    "WORKSPACE_QUEUE_CEILING_MS",
    "WORKER_QUEUE_LIMIT",
    "WORKER_FLOW_SHARE_PERCENT",
    "WORKSPACE_TOOLS_RATE_LIMIT",
    "WORKSPACE_TOOLS_RATE_LIMIT_ENABLED",
]


@dataclass(frozen=True)
class Policy:
    job_timeout_ms: int
    queue_ceiling_ms: int
    worker_queue_limit: int
    max_lease_slots: int
    rate: RatePolicy
    rate_limit_enabled: bool
    weights: dict[str, int]
    # While another flow (principal) is in a worker's queue, one flow holds at most this
    # percentage of worker_queue_limit (admission/lua/_common.lua, share_room).
    flow_share_percent: int

    def weight(self, operation: str) -> int:
        return self.weights.get(operation, 1)


def policy_row() -> AdmissionPolicy:
    """The policy row, created from the environment on first use.

    Several processes may meet the table empty at once: the one whose insert loses the race reads
    the row the winner wrote.
    """
    row = AdmissionPolicy.objects.filter(pk=1).first()
    if row is not None:
        return row
    row = AdmissionPolicy.from_env()
    try:
        with transaction.atomic():
            row.save(force_insert=True)
    except IntegrityError:
        return AdmissionPolicy.objects.get(pk=1)
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
        flow_share_percent=row.flow_share_percent,
    )


log = logging.getLogger("sluice.admission")

# The version's name in Django's cache, and how long it lives unchanged (lost or expired, it
# reads as 0, which differs from every token a bump writes: every process reloads once).
VERSION_KEY = "admission:policy-version"
VERSION_TTL_S = 30 * 24 * 3600
# With the cache's Redis unreadable, a process re-reads the policy from Postgres this often.
POLICY_FALLBACK_S = 1.0


@dataclass(frozen=True)
class _Stamp:
    """What a process's cached policy was loaded under."""

    version: int | None  # None: the version could not be read
    loaded_at: float

    def fresh(self, version: int | None) -> bool:
        if version is None or self.version is None:
            return time.monotonic() - self.loaded_at < POLICY_FALLBACK_S
        return version == self.version


_UNREAD = object()


def _decoded(raw: Any) -> int:
    return 0 if raw is None else int(raw)  # never bumped (or lost with its Redis): 0


def policy_version() -> int | None:
    """The current version (Django's cache); None when it cannot be read."""
    try:
        return _decoded(cache.get(VERSION_KEY))
    except (RedisError, OSError, ValueError) as exc:
        outages.warn(log, "policy version unreadable; re-reading the policy from Postgres", exc)
        return None


# One asyncio client per event loop for the version read (the cache's own Redis, the key
# django-redis wrote: it keeps an int as its decimal digits). Django's `cache.aget` would hop
# to the shared sync thread on every call instead.
_version_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
    weakref.WeakKeyDictionary()
)


def _version_client() -> Any:
    loop = asyncio.get_running_loop()
    client = _version_clients.get(loop)
    if client is None:
        config: dict[str, Any] = dict(settings.CACHES["default"])
        options: dict[str, Any] = dict(config.get("OPTIONS") or {})
        client = aioredis.Redis.from_url(
            str(config["LOCATION"]),
            socket_connect_timeout=options.get("SOCKET_CONNECT_TIMEOUT", 2),
            socket_timeout=options.get("SOCKET_TIMEOUT", 2),
            retry=Retry(NoBackoff(), 1),
        )
        _version_clients[loop] = client
    return client


async def apolicy_version() -> int | None:
    """policy_version() for the async path: one GET on this loop's client."""
    try:
        version = _decoded(await _version_client().get(cache.make_and_validate_key(VERSION_KEY)))
    except (RedisError, OSError, ValueError) as exc:
        outages.warn(log, "policy version unreadable; re-reading the policy from Postgres", exc)
        return None
    return version


def policy_changed() -> None:
    """Every API process reloads the policy on its next call (this one at once)."""
    try:
        cache.set(VERSION_KEY, secrets.randbits(62), timeout=VERSION_TTL_S)
    except (RedisError, OSError) as exc:
        # Then the others see the change within POLICY_FALLBACK_S of finding the cache again.
        outages.warn(log, "could not bump the policy version", exc)
    forget_cached_policy()


def _saved_or_deleted(sender: Any, **_: Any) -> None:
    # After the commit: a process reloading before it would cache the old row under the new
    # version. (Outside a transaction this runs at once.)
    transaction.on_commit(policy_changed)


def connect_policy_signals() -> None:
    """Every save and delete of the policy row or an override bumps the version (admin,
    set_policy, a cascade from a deleted tenant or worker, a test writing rows directly)."""
    from django.db.models.signals import post_delete, post_save

    for model in (AdmissionPolicy, PolicyOverride):
        for signal in (post_save, post_delete):
            signal.connect(
                _saved_or_deleted, sender=model, dispatch_uid=f"policy-version-{model.__name__}"
            )


_lock = threading.Lock()
_cached: tuple[_Stamp, Policy] | None = None


def current_policy(version: Any = _UNREAD) -> Policy:
    global _cached
    if version is _UNREAD:
        version = policy_version()
    cached = _cached
    if cached is not None and cached[0].fresh(version):
        return cached[1]
    with _lock:
        fresh = snapshot(policy_row())
        _cached = (_Stamp(version, time.monotonic()), fresh)
        return fresh


_loading: dict[int, asyncio.Future[Policy]] = {}


async def acurrent_policy() -> Policy:
    version = await apolicy_version()
    cached = _cached
    if cached is not None and cached[0].fresh(version):
        return cached[1]
    # A burst arriving as the cached row expires shares one read (one per event loop).
    loop = id(asyncio.get_running_loop())
    pending = _loading.get(loop)
    if pending is None or pending.done():
        pending = _loading[loop] = asyncio.ensure_future(
            in_db_thread(current_policy, version=version)
        )
    return await asyncio.shield(pending)


def forget_cached_policy() -> None:
    global _cached, _overrides_cached
    _cached = None
    _overrides_cached = None


# ---------------------------------------------------------------------------------------
# Overrides per tenant and per worker


@dataclass(frozen=True)
class Overrides:
    """Every override row, as one process caches it, and the global policy they refine."""

    base: Policy
    by_worker: dict[str, dict[str, Any]]
    by_tenant: dict[int, dict[str, Any]]


def override_values(row: PolicyOverride) -> dict[str, Any]:
    """The fields this row sets, as Policy field names (blank ones inherit)."""
    values: dict[str, Any] = {}
    for field in ("job_timeout_ms", "queue_ceiling_ms", "worker_queue_limit", "flow_share_percent"):
        if getattr(row, field) is not None:
            values[field] = getattr(row, field)
    if row.rate_limit:
        values["rate"] = RatePolicy.parse(row.rate_limit)
    if row.rate_limit_enabled is not None:
        values["rate_limit_enabled"] = row.rate_limit_enabled
    return values


def load_overrides() -> Overrides:
    by_worker: dict[str, dict[str, Any]] = {}
    by_tenant: dict[int, dict[str, Any]] = {}
    for row in PolicyOverride.objects.select_related("worker"):
        values = override_values(row)
        if row.worker is not None:
            by_worker[row.worker.worker_id] = values
        elif row.tenant_id is not None:
            by_tenant[row.tenant_id] = values
    return Overrides(base=snapshot(policy_row()), by_worker=by_worker, by_tenant=by_tenant)


def resolve(overrides: Overrides, *, worker_id: str, tenant_id: int | None) -> Policy:
    values = dict(overrides.by_tenant.get(tenant_id, {})) if tenant_id is not None else {}
    values.update(overrides.by_worker.get(worker_id, {}))
    return replace(overrides.base, **values) if values else overrides.base


def policy_sources(
    overrides: Overrides, *, worker_id: str, tenant_id: int | None
) -> dict[str, str]:
    """Policy field -> "worker", "tenant" or "global": where each effective value comes from."""
    fields = [
        "job_timeout_ms",
        "queue_ceiling_ms",
        "worker_queue_limit",
        "flow_share_percent",
        "rate",
        "rate_limit_enabled",
    ]
    worker = overrides.by_worker.get(worker_id, {})
    tenant = overrides.by_tenant.get(tenant_id, {}) if tenant_id is not None else {}
    return {f: "worker" if f in worker else "tenant" if f in tenant else "global" for f in fields}


# (stamp, overrides, resolved policies by (worker, tenant)). The resolved map only grows
# with the workers and tenants this process serves, and is dropped at every refresh.
_overrides_cached: tuple[_Stamp, Overrides, dict[tuple[str, int | None], Policy]] | None = None


def current_overrides(
    version: Any = _UNREAD,
) -> tuple[Overrides, dict[tuple[str, int | None], Policy]]:
    global _overrides_cached
    if version is _UNREAD:
        version = policy_version()
    cached = _overrides_cached
    if cached is not None and cached[0].fresh(version):
        return cached[1], cached[2]
    with _lock:
        fresh = load_overrides()
        _overrides_cached = (_Stamp(version, time.monotonic()), fresh, {})
        return fresh, _overrides_cached[2]


def policy_for(*, worker_id: str, tenant_id: int | None, version: Any = _UNREAD) -> Policy:
    """The policy one call on `worker_id` by a principal of `tenant_id` runs under."""
    overrides, resolved = current_overrides(version)
    key = (worker_id, tenant_id)
    policy = resolved.get(key)
    if policy is None:
        policy = resolved[key] = resolve(overrides, worker_id=worker_id, tenant_id=tenant_id)
    return policy


async def apolicy_for(*, worker_id: str, tenant_id: int | None) -> Policy:
    """policy_for() for the async path: the version read, then a dict lookup while the
    cached overrides are of that version."""
    version = await apolicy_version()
    cached = _overrides_cached
    if cached is not None and cached[0].fresh(version):
        policy = cached[2].get((worker_id, tenant_id))
        if policy is not None:
            return policy
        policy = cached[2][(worker_id, tenant_id)] = resolve(
            cached[1], worker_id=worker_id, tenant_id=tenant_id
        )
        return policy
    return await in_db_thread(
        lambda: policy_for(worker_id=worker_id, tenant_id=tenant_id, version=version)
    )


def parse_assignment(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    if key not in POLICY_FIELDS:
        raise ValueError(f"unknown policy key {key!r}; known keys: {', '.join(POLICY_FIELDS)}")
    return key, value


def parse_value(key: str, raw: str) -> Any:
    field = POLICY_FIELDS[key]
    if field == "rate_limit":
        return raw
    if field == "rate_limit_enabled":
        if raw.lower() not in {"1", "0", "true", "false", "on", "off"}:
            raise ValueError(f"{key} must be on or off, not {raw!r}")
        return raw.lower() in {"1", "true", "on"}
    if not raw.isascii() or not raw.isdigit():
        raise ValueError(f"{key} must be a whole number, not {raw!r}")
    return int(raw)


def _clean(row: AdmissionPolicy | PolicyOverride) -> None:
    try:
        row.full_clean()
    except ValidationError as exc:
        problems = []
        for field, messages in exc.message_dict.items():
            key = next((k for k, f in POLICY_FIELDS.items() if f == field), field)
            problems.append(f"{key}: {' '.join(messages)}")
        raise ValueError("; ".join(problems)) from None


def policy_update(assignments: dict[str, str]) -> AdmissionPolicy:
    """Validate and store KEY=VALUE changes; raise ValueError with one clear line on any bad value."""
    row = policy_row()
    for key, raw in assignments.items():
        setattr(row, POLICY_FIELDS[key], parse_value(key, raw))
    _clean(row)
    row.save()
    forget_cached_policy()
    return row


def override_target(*, tenant: str | None, worker: str | None) -> dict[str, Any]:
    """The override's owner, looked up by tenant name or worker id; ValueError when unknown."""
    if (tenant is None) == (worker is None):
        raise ValueError("name exactly one of a tenant or a worker")
    if tenant is not None:
        tenant_row = Tenant.objects.filter(name=tenant).first()
        if tenant_row is None:
            raise ValueError(f"no tenant named {tenant!r}")
        return {"tenant": tenant_row}
    worker_row = Worker.objects.filter(worker_id=worker).first()
    if worker_row is None:
        raise ValueError(f"no worker {worker!r}")
    return {"worker": worker_row}


def policy_override_update(
    *, tenant: str | None = None, worker: str | None = None, assignments: dict[str, str]
) -> PolicyOverride:
    """Set values of one tenant's or worker's override; KEY= (empty) inherits again.

    All or nothing, like policy_update: one bad value leaves the override as it was.
    """
    target = override_target(tenant=tenant, worker=worker)
    row = PolicyOverride.objects.filter(**target).first() or PolicyOverride(**target)
    for key, raw in assignments.items():
        if key not in OVERRIDE_KEYS:
            raise ValueError(
                f"{key} is global only; an override may set {', '.join(OVERRIDE_KEYS)}"
            )
        field = POLICY_FIELDS[key]
        if raw == "":
            setattr(row, field, "" if field == "rate_limit" else None)
        else:
            setattr(row, field, parse_value(key, raw))
    _clean(row)
    row.save()
    forget_cached_policy()
    return row


def policy_override_clear(*, tenant: str | None = None, worker: str | None = None) -> bool:
    """Remove one override (everything inherits again); False when there was none."""
    deleted, _ = PolicyOverride.objects.filter(
        **override_target(tenant=tenant, worker=worker)
    ).delete()
    forget_cached_policy()
    return deleted > 0


def policy_shown(value: Any) -> str:
    """A policy value as set_policy takes it back."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def effective_policy(
    *, tenant: str | None = None, worker: str | None = None
) -> list[tuple[str, str, str]]:
    """(KEY, value, where it comes from) for every policy key: for one worker (its override,
    then its tenant's, then the global row), one tenant, or the global row alone. The same
    field-by-field rule as resolve(); ValueError for an unknown tenant or worker."""
    layers: list[tuple[str, PolicyOverride]] = []
    if worker is not None or tenant is not None:
        target = override_target(tenant=tenant, worker=worker)
        tenant_row: Tenant = target["tenant"] if "tenant" in target else target["worker"].tenant
        if "worker" in target:
            row = PolicyOverride.objects.filter(worker=target["worker"]).first()
            if row is not None:
                layers.append((f"worker {worker} override", row))
        row = PolicyOverride.objects.filter(tenant=tenant_row).first()
        if row is not None:
            layers.append((f"tenant {tenant_row.name} override", row))
    base = policy_row()
    out = []
    for key, field in POLICY_FIELDS.items():
        value, source = getattr(base, field), "global policy"
        if key not in OVERRIDE_KEYS:
            source = "global policy (global only)"
        else:
            for name, override in layers:
                if getattr(override, field) not in (None, ""):
                    value, source = getattr(override, field), name
                    break
        out.append((key, policy_shown(value), source))
    return out


def env_differences() -> list[str]:
    """Policy variables set in this environment that the stored row does not follow.

    The row starts from the environment once; after that operators own it, so a changed
    variable is ignored until someone applies it. Saying so beats a silent mismatch.
    """
    row = policy_row()
    lines = []
    for key, value in settings.SLUICE_POLICY_DEFAULTS.items():
        if not os.environ.get(key):
            continue
        stored = getattr(row, POLICY_FIELDS[key])
        if str(stored) != str(value):
            lines.append(
                f"{key}={value} in the environment, but the stored policy says {stored} "
                f"(the stored policy wins; apply it with: manage.py set_policy {key}={value})"
            )
    return lines
