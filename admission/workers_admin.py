"""Django admin for tenants, principals, API keys, workers and the workspaces they offer.

Secrets are shown exactly once, in the message that follows the action creating them, and
only their hashes are stored. `key_hash` and `token_hash` never appear on any admin page.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Count, Q, QuerySet
from django.forms import ModelChoiceField, ModelForm, NullBooleanField, Select
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from admission.credentials import (
    RedisAclUnavailable,
    WorkerRedisCredentials,
    worker_credentials_issue,
)
from admission.models import OperatorAction, PolicyOverride
from admission.operator import Actor, action_record
from admission.policy import forget_cached_policy, load_overrides, policy_sources, resolve
from admission.revocation import api_keys_revoke, principal_active_set
from workspaces.adminfilters import IsSetFilter, ReadOnlyAdmin
from workspaces.models import ApiKey, Principal, Tenant, Worker, WorkerWorkspace
from workspaces.secrets import API_KEY_PREFIX, WORKER_TOKEN_PREFIX, new_secret

SHOWN_ONCE = "Copy it now: it is shown only this once and stored only as a hash."


def api_key_create(*, principal: Principal, label: str) -> str:
    """A fresh API key for `principal`; returns the raw key, which is not stored anywhere."""
    raw, prefix, key_hash = new_secret(API_KEY_PREFIX)
    ApiKey.objects.create(principal=principal, prefix=prefix, key_hash=key_hash, label=label)
    return raw


def worker_token_rotate(*, worker: Worker) -> tuple[str, WorkerRedisCredentials | None]:
    """A fresh token for `worker`, and a fresh password for its Redis user: the old ones stop
    working at once. Raises RedisAclUnavailable, leaving the old token in place."""
    raw, _, token_hash = new_secret(WORKER_TOKEN_PREFIX)
    with transaction.atomic():
        Worker.objects.filter(pk=worker.pk).update(token_hash=token_hash)
        creds = worker_credentials_issue(worker=worker)
    return raw, creds


def _redis_note(creds: WorkerRedisCredentials | None) -> str:
    if creds is None:
        return (
            " Redis ACLs are off (SLUICE_WORKER_REDIS_ACL): the worker uses the shared REDIS_URL."
        )
    note = f" Its own Redis URL: {creds.redis_url}"
    if creds.admission_redis_url != creds.redis_url:
        note += f" (admission: {creds.admission_redis_url})"
    return note + "."


# ---------------------------------------------------------------------------------------
# Policy overrides (edited on the tenant's and the worker's page)


# The override's fields as the model form takes them (rate_limit_enabled has a field of its
# own there), in the order the admin shows them.
_OVERRIDE_MODEL_FIELDS = [
    "worker_queue_limit",
    "flow_share_percent",
    "queue_ceiling_ms",
    "job_timeout_ms",
    "rate_limit",
]


class PolicyOverrideForm(ModelForm):
    # "Unknown" (Django's word for a blank yes/no) means inherit here; say so.
    rate_limit_enabled = NullBooleanField(
        required=False,
        label="Rate limit on",
        widget=Select(choices=[("unknown", "inherit"), ("true", "on"), ("false", "off")]),
        help_text="WORKSPACE_TOOLS_RATE_LIMIT_ENABLED.",
    )

    class Meta:
        model = PolicyOverride
        fields = _OVERRIDE_MODEL_FIELDS


class PolicyOverrideInline(admin.StackedInline):
    model = PolicyOverride
    form = PolicyOverrideForm
    fields = [*_OVERRIDE_MODEL_FIELDS, "rate_limit_enabled"]
    extra = 0
    max_num = 1
    verbose_name = "policy override"
    verbose_name_plural = (
        "Policy override (blank fields inherit: the worker's value, then the tenant's, "
        "then the global admission policy)"
    )


class TenantPolicyOverrideInline(PolicyOverrideInline):
    fk_name = "tenant"


class WorkerPolicyOverrideInline(PolicyOverrideInline):
    fk_name = "worker"


class ForgetsPolicyOnSave(admin.ModelAdmin):
    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        # The save bumps the policy version: every process has the change from its next call.
        forget_cached_policy()
        for formset in formsets:
            touched = [*formset.new_objects, *formset.changed_objects, *formset.deleted_objects]
            if formset.model is PolicyOverride and touched:
                action_record(
                    actor=Actor.of(request, via="admin"),
                    action=OperatorAction.POLICY,
                    target=f"override of {form.instance}",
                    result="removed" if formset.deleted_objects else "saved",
                )


def effective_policy_table(worker: Worker) -> SafeString:
    """The policy calls on `worker` run under, and where each value comes from."""
    overrides = load_overrides()
    policy = resolve(overrides, worker_id=worker.worker_id, tenant_id=worker.tenant_id)
    sources = policy_sources(overrides, worker_id=worker.worker_id, tenant_id=worker.tenant_id)
    rows = [
        ("Queue limit per worker", policy.worker_queue_limit, sources["worker_queue_limit"]),
        (
            "Share of the queue per flow",
            f"{policy.flow_share_percent} %",
            sources["flow_share_percent"],
        ),
        ("Admission wait ceiling", f"{policy.queue_ceiling_ms} ms", sources["queue_ceiling_ms"]),
        ("Execution ceiling", f"{policy.job_timeout_ms} ms", sources["job_timeout_ms"]),
        ("Rate limit per principal", str(policy.rate), sources["rate"]),
        (
            "Rate limit on",
            "yes" if policy.rate_limit_enabled else "no",
            sources["rate_limit_enabled"],
        ),
        ("Lease slots ceiling", policy.max_lease_slots, "global"),
    ]
    body = format_html_join(
        "", "<tr><th>{}</th><td>{}</td><td>{}</td></tr>", ((n, v, f"from {s}") for n, v, s in rows)
    )
    return format_html('<table class="effective-policy">{}</table>', body)


# ---------------------------------------------------------------------------------------
# Tenants and principals


class PrincipalInline(admin.TabularInline):
    model = Principal
    fields = ["name", "is_active", "created_at"]
    readonly_fields = ["created_at"]
    extra = 0
    show_change_link = True


class TenantAdmin(ForgetsPolicyOnSave):
    list_display = ["name", "default_worker", "principal_count", "worker_count", "created_at"]
    search_fields = ["name"]
    readonly_fields = ["created_at"]
    inlines = [PrincipalInline, TenantPolicyOverrideInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Tenant]:
        return (
            super()
            .get_queryset(request)
            .select_related("default_worker")
            .annotate(
                principal_total=Count("principals", distinct=True),
                worker_total=Count("workers", distinct=True),
            )
        )

    @admin.display(description="principals", ordering="principal_total")
    def principal_count(self, obj: Tenant) -> int:
        return int(getattr(obj, "principal_total", 0))

    @admin.display(description="workers", ordering="worker_total")
    def worker_count(self, obj: Tenant) -> int:
        return int(getattr(obj, "worker_total", 0))

    def get_form(
        self, request: HttpRequest, obj: Tenant | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        field = form.base_fields.get("default_worker")
        if isinstance(field, ModelChoiceField):
            # Only the tenant's own workers: the choice field then also refuses a posted id of
            # another tenant's worker, so a default can never point across tenants. A new
            # tenant has no workers yet, so its default is set after a worker is bound to it.
            field.queryset = (
                Worker.objects.filter(tenant=obj) if obj is not None else Worker.objects.none()
            )
        return form


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    fields = ("prefix", "label", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "label", "created_at", "last_used_at", "revoked_at")
    extra = 0
    show_change_link = True
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Keys are made by the "Create API key" action, which can show the raw key once.
        return False


class PrincipalAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "is_active", "active_key_count", "created_at"]
    list_filter = ["tenant", "is_active"]
    search_fields = ["name", "tenant__name"]
    list_select_related = ["tenant"]
    readonly_fields = ["created_at"]
    inlines = [ApiKeyInline]
    actions = ["create_api_key"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Principal]:
        return (
            super()
            .get_queryset(request)
            .annotate(active_keys=Count("api_keys", filter=Q(api_keys__revoked_at__isnull=True)))
        )

    @admin.display(description="active keys", ordering="active_keys")
    def active_key_count(self, obj: Principal) -> int:
        return int(getattr(obj, "active_keys", 0))

    def get_readonly_fields(self, request: HttpRequest, obj: Principal | None = None) -> Any:
        # Moving a principal to another tenant would hand its keys and history to that tenant.
        if obj is not None:
            return [*self.readonly_fields, "tenant"]
        return self.readonly_fields

    def save_model(self, request: HttpRequest, obj: Principal, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if change and "is_active" in form.changed_data:
            # Disabled: its calls waiting for a slot are refused, not dispatched.
            principal_active_set(principal=obj, active=obj.is_active)
            action_record(
                actor=Actor.of(request, via="admin"),
                action=OperatorAction.REVOKE,
                target=f"principal {obj} (all its keys)",
                result="enabled again" if obj.is_active else "disabled",
            )

    @admin.action(description="Create API key", permissions=["change"])
    def create_api_key(self, request: HttpRequest, queryset: QuerySet[Principal]) -> None:
        # The raw key travels in the message storage (a signed cookie, or the session) until
        # the next page renders it; after that it exists only with whoever copied it.
        for principal in queryset.select_related("tenant"):
            raw = api_key_create(principal=principal, label=f"admin:{request.user.get_username()}")
            self.message_user(
                request, f"New API key for {principal}: {raw} — {SHOWN_ONCE}", messages.SUCCESS
            )


# ---------------------------------------------------------------------------------------
# API keys


class RevokedFilter(IsSetFilter):
    title = "revoked"
    parameter_name = "revoked"
    field = "revoked_at"
    set_label = "Revoked"
    unset_label = "Active"


class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["prefix", "principal", "label", "created_at", "last_used_at", "state"]
    list_filter = [("principal__tenant", admin.RelatedOnlyFieldListFilter), RevokedFilter]
    search_fields = ["prefix", "principal__name"]
    list_select_related = ["principal__tenant"]
    # key_hash is editable=False, so no form carries it; it is listed nowhere on purpose.
    fields = ["principal", "prefix", "label", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["principal", "prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke_keys"]

    def get_fieldsets(self, request: HttpRequest, obj: ApiKey | None = None) -> Any:
        if obj is not None:
            return super().get_fieldsets(request, obj)
        # Adding names the principal and a label; the key itself is made on save.
        note = f"The key is made when you save, and shown in the message that follows. {SHOWN_ONCE}"
        return [(None, {"fields": ["principal", "label"], "description": note})]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> Any:
        return [] if obj is None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        # The raw key travels in the message storage until the next page renders it, as with
        # the principal's "Create API key" action; only its hash is stored.
        raw, obj.prefix, obj.key_hash = new_secret(API_KEY_PREFIX)
        obj.label = obj.label or f"admin:{request.user.get_username()}"
        super().save_model(request, obj, form, change)
        self.message_user(
            request, f"New API key for {obj.principal}: {raw} — {SHOWN_ONCE}", messages.SUCCESS
        )

    @admin.display(description="state", ordering="revoked_at")
    def state(self, obj: ApiKey) -> str:
        # Words, not the admin's boolean icons: a red cross under "revoked" read as "broken".
        if obj.revoked_at is None:
            return "active"
        return f"revoked {obj.revoked_at.strftime('%Y-%m-%d %H:%M:%S')}"

    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        # Already revoked keys keep their original revocation time. Their calls waiting for
        # a slot are refused too, not dispatched (admission/revocation.py).
        count = api_keys_revoke(keys=queryset)
        if count:
            action_record(
                actor=Actor.of(request, via="admin"),
                action=OperatorAction.REVOKE,
                target="keys " + ", ".join(sorted(k.prefix for k in queryset))[:240],
                result=f"{count} key(s) revoked",
            )
        self.message_user(
            request, f"Revoked {count} key(s); they are refused from the next request on."
        )


# ---------------------------------------------------------------------------------------
# Workers


def online_cutoff() -> Any:
    return timezone.now() - timedelta(seconds=settings.WORKER_OFFLINE_AFTER_S)


class OnlineFilter(admin.SimpleListFilter):
    """The same rule as Worker.is_online, as a query: registered and heard from recently."""

    title = "online"
    parameter_name = "online"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Online"), ("no", "Offline")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        online = Q(last_heartbeat_at__gt=online_cutoff()) & ~Q(incarnation_id="")
        if self.value() == "yes":
            return queryset.filter(online)
        if self.value() == "no":
            # NULL heartbeats fall outside both sides of a comparison, so name them explicitly.
            return queryset.filter(~online | Q(last_heartbeat_at__isnull=True))
        return queryset


class WorkerWorkspaceInline(admin.TabularInline):
    model = WorkerWorkspace
    fields = ("workspace_id", "operations", "linked_worktree_lanes")
    readonly_fields = ("workspace_id", "operations", "linked_worktree_lanes")
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Workspaces come only from the worker's own registration.
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class WorkerAdmin(ForgetsPolicyOnSave):
    list_display = [
        "worker_id",
        "tenant",
        "online",
        "slots",
        "requested_slots",
        "last_heartbeat_at",
    ]
    list_filter = ["tenant", OnlineFilter]
    search_fields = ["worker_id", "tenant__name"]
    list_select_related = ["tenant"]
    readonly_fields = [
        "online",
        "incarnation_id",
        "requested_slots",
        "slots",
        "registered_at",
        "last_heartbeat_at",
        "created_at",
        "effective_policy",
    ]
    inlines = [WorkerWorkspaceInline, WorkerPolicyOverrideInline]
    actions = ["rotate_token"]

    @admin.display(description="effective policy")
    def effective_policy(self, obj: Worker) -> SafeString:
        if obj.pk is None:
            return format_html("{}", "(once the worker is saved)")
        return effective_policy_table(obj)

    def get_inlines(self, request: HttpRequest, obj: Worker | None) -> Any:
        # A worker being added has registered nothing yet.
        return self.inlines if obj is not None else []

    @admin.display(description="online", boolean=True)
    def online(self, obj: Worker) -> bool:
        return obj.is_online

    def get_readonly_fields(self, request: HttpRequest, obj: Worker | None = None) -> Any:
        # Rebinding a worker would let another tenant reach workspaces it was never given.
        if obj is not None:
            return [*self.readonly_fields, "worker_id", "tenant"]
        return self.readonly_fields

    def save_model(
        self, request: HttpRequest, obj: Worker, form: ModelForm[Worker], change: bool
    ) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        # A worker added here gets its first token now; without one it could never register.
        # The admin's add view runs in a transaction: a Redis that refuses the ACL user
        # leaves no worker behind.
        raw, _, obj.token_hash = new_secret(WORKER_TOKEN_PREFIX)
        super().save_model(request, obj, form, change)
        creds = worker_credentials_issue(worker=obj)
        self.message_user(
            request,
            f"Token for worker {obj.worker_id}: {raw} — {SHOWN_ONCE}{_redis_note(creds)}",
            messages.SUCCESS,
        )

    @admin.action(description="Rotate token (and Redis password)", permissions=["change"])
    def rotate_token(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        for worker in queryset:
            try:
                raw, creds = worker_token_rotate(worker=worker)
            except RedisAclUnavailable as exc:
                self.message_user(request, str(exc), messages.ERROR)
                return
            self.message_user(
                request,
                f"New token for worker {worker.worker_id}: {raw} — {SHOWN_ONCE}{_redis_note(creds)} "
                "A worker still running with the old token can no longer heartbeat; restart it with this one.",
                messages.SUCCESS,
            )


class WorkerWorkspaceAdmin(ReadOnlyAdmin):
    """What each worker offers, exactly as its last registration said. Read-only."""

    list_display = ["workspace_id", "worker", "operation_list", "linked_worktree_lanes"]
    list_filter = [("worker__tenant", admin.RelatedOnlyFieldListFilter), "linked_worktree_lanes"]
    search_fields = ["workspace_id", "worker__worker_id"]
    list_select_related = ["worker"]
    actions = None

    @admin.display(description="operations")
    def operation_list(self, obj: WorkerWorkspace) -> str:
        return ", ".join(obj.operations or [])


admin.site.register(Tenant, TenantAdmin)
admin.site.register(Principal, PrincipalAdmin)
admin.site.register(ApiKey, ApiKeyAdmin)
admin.site.register(Worker, WorkerAdmin)
admin.site.register(WorkerWorkspace, WorkerWorkspaceAdmin)
