"""The admission policy (one editable row, and overrides per tenant or worker), quarantined
isolation keys, and the completion log."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone
from sluice_protocol import OPERATIONS

from admission.ratelimit import RatePolicy


def default_weights() -> dict[str, int]:
    return dict.fromkeys(sorted(OPERATIONS), 1)


def validate_rate_limit(value: str) -> None:
    try:
        RatePolicy.parse(value)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


def validate_weights(value: Any) -> None:
    if not isinstance(value, dict):
        raise ValidationError("Operation weights must be an object of operation: weight.")
    unknown = sorted(set(value) - OPERATIONS)
    if unknown:
        raise ValidationError(f"Unknown operations in weights: {', '.join(unknown)}.")
    for op, weight in value.items():
        if type(weight) is not int or not 1 <= weight <= 1000:
            raise ValidationError(f"The weight of {op} must be a whole number within 1..1000.")


class AdmissionPolicy(models.Model):
    """The single policy row. It starts from the environment and operators edit it at run time."""

    job_timeout_ms = models.PositiveIntegerField(
        "Execution ceiling (ms)",
        validators=[MinValueValidator(1_000), MaxValueValidator(3_600_000)],
        help_text="The longest a call may run once it has a slot; 1000..3600000. "
        "Environment: JOB_TIMEOUT.",
    )
    queue_ceiling_ms = models.PositiveIntegerField(
        "Admission wait ceiling (ms)",
        validators=[MinValueValidator(1), MaxValueValidator(300_000)],
        help_text="The longest a call may wait for a slot, whatever it asks for; 1..300000. "
        "Environment: WORKSPACE_QUEUE_CEILING_MS.",
    )
    worker_queue_limit = models.PositiveIntegerField(
        "Queue limit per worker",
        validators=[MinValueValidator(1), MaxValueValidator(1024)],
        help_text="Calls admitted per worker at once, running ones included; one more gets "
        "WORKER_QUEUE_FULL. 1..1024. Environment: WORKER_QUEUE_LIMIT.",
    )
    flow_share_percent = models.PositiveSmallIntegerField(
        "Share of the queue per flow (%)",
        default=50,
        db_default=50,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="While more than one principal has calls on a worker, none holds more than "
        "this share of the queue limit (its excess waiting calls get WORKER_QUEUE_FULL); alone, "
        "a principal may fill it. 1..100. Environment: WORKER_FLOW_SHARE_PERCENT.",
    )
    max_lease_slots = models.PositiveSmallIntegerField(
        "Lease slots ceiling per worker",
        validators=[MinValueValidator(1), MaxValueValidator(64)],
        help_text="The most slots a worker gets, whatever it asks for; applies when a worker "
        "registers. 1..64. Environment: CODEAPI_BRIDGE_MAX_WORKSPACE_LEASE_SLOTS.",
    )
    rate_limit = models.CharField(
        "Rate limit per principal",
        max_length=32,
        validators=[validate_rate_limit],
        help_text="Units per window for each principal, e.g. 120/30s, 60/1m, 1000/1h. "
        "Environment: WORKSPACE_TOOLS_RATE_LIMIT.",
    )
    rate_limit_enabled = models.BooleanField(
        "Rate limit on",
        default=True,
        help_text="Off: no principal is limited. set_policy key: WORKSPACE_TOOLS_RATE_LIMIT_ENABLED.",
    )
    operation_weights = models.JSONField(
        "Operation weights",
        default=default_weights,
        validators=[validate_weights],
        help_text="Units each operation costs against the rate limit.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "admission policy"
        verbose_name_plural = "admission policy"

    def __str__(self) -> str:
        return "Admission policy"

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.pk = 1  # There is only ever one policy row.
        super().save(*args, **kwargs)

    def clean(self) -> None:
        """A weight above the limit could never be paid: that operation would always get 429."""
        try:
            rate = RatePolicy.parse(self.rate_limit)
        except (TypeError, ValueError):
            return  # The rate_limit field's own validator reports it.
        weights = self.operation_weights if isinstance(self.operation_weights, dict) else {}
        too_heavy = sorted(
            (op, w) for op, w in weights.items() if type(w) is int and w > rate.limit
        )
        if too_heavy:
            listed = ", ".join(f"{op} ({w})" for op, w in too_heavy)
            raise ValidationError(
                {
                    "operation_weights": f"Weights above the rate limit's {rate.limit} units per "
                    f"{rate.window_s}s can never be paid, so those calls would always get 429: {listed}. "
                    "Lower them or raise the limit."
                }
            )

    @classmethod
    def from_env(cls) -> AdmissionPolicy:
        env: dict[str, Any] = settings.SLUICE_POLICY_DEFAULTS
        return cls(
            pk=1,
            job_timeout_ms=env["JOB_TIMEOUT"],
            queue_ceiling_ms=env["WORKSPACE_QUEUE_CEILING_MS"],
            worker_queue_limit=env["WORKER_QUEUE_LIMIT"],
            flow_share_percent=env["WORKER_FLOW_SHARE_PERCENT"],
            max_lease_slots=env["CODEAPI_BRIDGE_MAX_WORKSPACE_LEASE_SLOTS"],
            rate_limit=env["WORKSPACE_TOOLS_RATE_LIMIT"],
        )


class PolicyOverride(models.Model):
    """Policy values for one tenant or one worker; a blank field inherits the next level.

    The most specific value wins: the worker's override, then its tenant's, then the global
    row. A worker's lease-slot ceiling and the operation weights stay global: the slot ceiling
    is negotiated when a worker registers and used by paths that do not know the caller, and
    one set of weights keeps a principal's costs the same on every worker.
    """

    tenant = models.OneToOneField(
        "workspaces.Tenant",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="policy_override",
    )
    worker = models.OneToOneField(
        "workspaces.Worker",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="policy_override",
    )
    job_timeout_ms = models.PositiveIntegerField(
        "Execution ceiling (ms)",
        null=True,
        blank=True,
        validators=[MinValueValidator(1_000), MaxValueValidator(3_600_000)],
        help_text="JOB_TIMEOUT: 1000..3600000. Blank: inherit.",
    )
    queue_ceiling_ms = models.PositiveIntegerField(
        "Admission wait ceiling (ms)",
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(300_000)],
        help_text="WORKSPACE_QUEUE_CEILING_MS: 1..300000. Blank: inherit.",
    )
    worker_queue_limit = models.PositiveIntegerField(
        "Queue limit per worker",
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(1024)],
        help_text="WORKER_QUEUE_LIMIT: calls admitted at once, running ones included; 1..1024. "
        "Blank: inherit.",
    )
    flow_share_percent = models.PositiveSmallIntegerField(
        "Share of the queue per flow (%)",
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="WORKER_FLOW_SHARE_PERCENT: 1..100. Blank: inherit.",
    )
    rate_limit = models.CharField(
        "Rate limit per principal",
        max_length=32,
        blank=True,
        validators=[validate_rate_limit],
        help_text="WORKSPACE_TOOLS_RATE_LIMIT, e.g. 120/30s. Blank: inherit.",
    )
    rate_limit_enabled = models.BooleanField(
        "Rate limit on",
        null=True,
        blank=True,
        help_text="WORKSPACE_TOOLS_RATE_LIMIT_ENABLED. Unknown: inherit.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "policy override"
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(tenant__isnull=False, worker__isnull=True)
                    | models.Q(tenant__isnull=True, worker__isnull=False)
                ),
                name="policy_override_one_target",
            )
        ]

    def __str__(self) -> str:
        if self.worker_id is not None:
            return f"Policy override for worker {self.worker}"
        return f"Policy override for tenant {self.tenant}"

    def clean(self) -> None:
        """The global row's rule: a weight above this limit could never be paid."""
        if not self.rate_limit:
            return
        try:
            rate = RatePolicy.parse(self.rate_limit)
        except ValueError:
            return  # The rate_limit field's own validator reports it.
        row = AdmissionPolicy.objects.filter(pk=1).first()
        weights = row.operation_weights if row is not None else {}
        heavy = sorted(op for op, w in (weights or {}).items() if type(w) is int and w > rate.limit)
        if heavy:
            raise ValidationError(
                {
                    "rate_limit": f"{rate.limit} units is below the weight of {', '.join(heavy)}, "
                    "so those calls would always get 429. Raise it or lower the weights."
                }
            )


class Quarantine(models.Model):
    """An isolation key whose last mutation has an unknown outcome; calls on it are refused."""

    worker_id = models.CharField(max_length=128)
    workspace_id = models.CharField(max_length=128)
    worktree = models.CharField(max_length=128, blank=True)
    isolation_key_hash = models.CharField(max_length=64)
    operation = models.CharField(max_length=32)
    reason = models.CharField(max_length=512)
    request_id = models.CharField(max_length=128, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)
    released_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["worker_id", "isolation_key_hash"], name="quarantine_gate")]

    def __str__(self) -> str:
        lane = f"@{self.worktree}" if self.worktree else ""
        return f"{self.worker_id}:{self.workspace_id}{lane}"


class CompletionLog(models.Model):
    """One row per POST to the execute endpoint, admitted or not (contract §5)."""

    uid = models.CharField(
        max_length=32, unique=True, help_text="Names the row; a row is written once."
    )
    request_id = models.CharField(max_length=128, db_index=True)
    created_at = models.DateTimeField(default=timezone.now)
    tenant_hash = models.CharField(max_length=64)
    principal_hash = models.CharField(max_length=64)
    worker_id = models.CharField(max_length=128, blank=True)
    workspace_id = models.CharField(max_length=128, blank=True)
    worktree = models.CharField(max_length=128, blank=True)
    isolation_key_hash = models.CharField(max_length=64, blank=True)
    operation = models.CharField(max_length=32, blank=True)
    http_status = models.PositiveSmallIntegerField()
    code = models.CharField(max_length=64, blank=True)
    outcome = models.CharField(max_length=16)
    admission_outcome = models.CharField(max_length=32)
    queue_wait_ms = models.PositiveIntegerField(default=0)
    slot_index = models.PositiveSmallIntegerField(null=True, blank=True)
    exec_ms = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    deadline_budget_ms = models.PositiveIntegerField(default=0)
    fencing_ticket = models.BigIntegerField(null=True, blank=True)
    # Database defaults too: an API process of the previous release, still writing rows during
    # an upgrade, names neither column.
    flow_hash = models.CharField(
        max_length=64,
        blank=True,
        default="",
        db_default="",
        help_text="The flow whose turn the call took in its worker's queue (its principal).",
    )
    granted_out_of_order = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Granted while a call that entered the same queue before it still waited.",
    )
    # A default in the database too: an API process of the previous release (a rolling
    # upgrade) and the COPY of the benchmarks insert rows without this column.
    operator_cancelled = models.BooleanField(
        default=False,
        db_default=False,
        help_text="An operator cancelled the call while it waited (not its client).",
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["created_at"], name="completion_by_time"),
            models.Index(fields=["worker_id", "created_at"], name="completion_by_worker"),
            models.Index(fields=["isolation_key_hash", "created_at"], name="completion_by_key"),
        ]

    def __str__(self) -> str:
        return f"{self.request_id} {self.operation} {self.http_status}"


class OperatorAction(models.Model):
    """One thing a staff user did to live traffic or its rules: the audit trail (issue 38)."""

    CANCEL = "cancel"
    DRAIN = "drain"
    RESUME = "resume"
    REVOKE = "revoke"
    POLICY = "policy"
    ACTIONS = [
        (CANCEL, "cancel a waiting call"),
        (DRAIN, "drain a worker"),
        (RESUME, "resume a worker"),
        (REVOKE, "revoke keys"),
        (POLICY, "change the policy"),
    ]

    at = models.DateTimeField(default=timezone.now, db_index=True)
    # A name, not a key to the user table: the trail outlives the account, and a worker's
    # install (config/worker_settings.py) has no auth app for a key to point at.
    actor = models.CharField(
        max_length=150, help_text="The staff user, or 'shell:<os user>' for a manage.py command."
    )
    via = models.CharField(max_length=16, help_text="dashboard, admin or command.")
    action = models.CharField(max_length=16, choices=ACTIONS)
    target = models.CharField(max_length=256, help_text="The worker, call or keys acted on.")
    result = models.CharField(max_length=256, blank=True)

    class Meta:
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target}"
