"""Tenants, principals and their API keys, workers and the workspaces they offer.

Secrets (API keys, worker tokens) are stored only as SHA-256 hashes: they are long random
strings, so a plain hash is enough and a lookup by hash is a single indexed query.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone


class Tenant(models.Model):
    name = models.CharField(max_length=128, unique=True)
    default_worker = models.ForeignKey(
        "Worker",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Runs calls that name no worker (no X-LibreChat-Code-Worker-ID header).",
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Principal(models.Model):
    """A user inside a tenant; rate limits and request ids belong to a principal."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="principals")
    name = models.CharField(max_length=128)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["tenant__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="principal_unique_in_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.tenant.name}/{self.name}"


class ApiKey(models.Model):
    principal = models.ForeignKey(Principal, on_delete=models.CASCADE, related_name="api_keys")
    prefix = models.CharField(
        max_length=24, help_text="The visible start of the key, to tell keys apart."
    )
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    label = models.CharField(max_length=128, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.principal})"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None


class Worker(models.Model):
    worker_id = models.CharField(max_length=128, unique=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="workers")
    token_hash = models.CharField(max_length=64, editable=False)
    # SHA-256 of the worker's own Redis ACL password (admission/credentials.py): Redis takes
    # the hash as it is (`ACL SETUSER ... #<hash>`), so the server can set the user up again
    # after a Redis restart without ever keeping the password. Empty: no ACL user issued.
    redis_password_hash = models.CharField(max_length=64, blank=True, editable=False)
    incarnation_id = models.CharField(
        max_length=32,
        blank=True,
        editable=False,
        help_text="Empty when the worker is not registered.",
    )
    requested_slots = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    slots = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        editable=False,
        help_text="Negotiated: min(the worker's --slots, the policy ceiling).",
    )
    registered_at = models.DateTimeField(null=True, blank=True, editable=False)
    sandbox_profile = models.CharField(
        max_length=16,
        blank=True,
        editable=False,
        help_text="How its commands are confined, as the worker registered it: bwrap or none. "
        "Empty: not reported.",
    )
    last_heartbeat_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Set by the bridge's revoke (contract §4.5): its token and Redis user are gone. Cleared
    # when a pairing code for it is redeemed again.
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["worker_id"]

    def __str__(self) -> str:
        return self.worker_id

    @property
    def is_online(self) -> bool:
        if not self.incarnation_id or self.last_heartbeat_at is None:
            return False
        silent = timezone.now() - self.last_heartbeat_at
        return silent < timedelta(seconds=settings.WORKER_OFFLINE_AFTER_S)


class WorkerWorkspace(models.Model):
    """A workspace a worker offers. The server never learns its path on the worker."""

    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="workspaces")
    workspace_id = models.CharField(max_length=128)
    operations = models.JSONField(default=list)
    linked_worktree_lanes = models.BooleanField(default=False)
    # §2.2.1 as advertised at registration. edit_features NULL: an old worker that sent none
    # (see workspaces.features). instruction_files: [{"path", "bytes", "sha256"}, ...].
    edit_features = models.JSONField(null=True, blank=True, default=None)
    instruction_files = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["worker__worker_id", "workspace_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["worker", "workspace_id"], name="workspace_unique_on_worker"
            )
        ]

    def __str__(self) -> str:
        return f"{self.worker.worker_id}:{self.workspace_id}"


class WorkerPairing(models.Model):
    """A single-use pairing code for a worker id (contract §4.5), kept only as its SHA-256.

    A pairing names a worker id, not a worker row: the worker is created (or its token rotated)
    only when the code is redeemed. Until then the id is visible to the pairing's own tenant
    alone, so a tenant cannot tell from the answers it gets whether another tenant holds an id
    (admission/bridge.py). `redeemed_at` is set once, by the one redeemer that wins.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="pairings")
    worker_id = models.CharField(max_length=128, db_index=True)
    code_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_by = models.ForeignKey(
        Principal, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # LibreChat's {"tenantId", "principal": {"type", "id"}}: whom the worker serves there.
    binding = models.JSONField(null=True, blank=True, default=None)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    redeemed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.tenant.name}:{self.worker_id} ({self.created_at:%Y-%m-%d %H:%M})"
