"""Django admin for the admission policy, quarantines and the completion log.

The policy is one row edited on one page. Quarantines are released, never edited or deleted,
so the record of who released what stays. The completion log is evidence: nobody edits it
from the admin, and its list pages are built to stay fast on a table of millions of rows.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from sluice_protocol import OPERATIONS

from admission import workers_admin  # noqa: F401  (the tenants, keys and workers pages)
from admission.models import AdmissionPolicy, CompletionLog, OperatorAction, Quarantine
from admission.operator import Actor, action_record
from admission.policy import forget_cached_policy, policy_row
from workspaces.adminfilters import IsSetFilter, ReadOnlyAdmin

# ---------------------------------------------------------------------------------------
# Admission policy


admin.site.site_header = "Sluice administration"
admin.site.site_title = "Sluice admin"
admin.site.index_title = "Tenants, workers, policy and the completion log"
# "View site" goes to the dashboard; `/` itself sends staff there too.
admin.site.site_url = "/dashboard/"
# The app list in a sidebar on every page costs 280 px that the completion log needs.
admin.site.enable_nav_sidebar = False


class WeightsWidget(forms.MultiWidget):
    """One number box per operation, labelled with its name, instead of a JSON textarea."""

    template_name = "admin/admission/weights_widget.html"

    def __init__(self) -> None:
        super().__init__(
            widgets={
                op: forms.NumberInput(attrs={"min": 1, "max": 1000}) for op in sorted(OPERATIONS)
            }
        )

    def decompress(self, value: Any) -> list[Any]:
        weights = value if isinstance(value, dict) else {}
        return [weights.get(op, 1) for op in sorted(OPERATIONS)]

    def get_context(self, name: str, value: Any, attrs: Any) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        for op, sub in zip(sorted(OPERATIONS), context["widget"]["subwidgets"], strict=True):
            sub["label"] = op
        return context


class WeightsField(forms.MultiValueField):
    widget = WeightsWidget

    def __init__(self, **kwargs: Any) -> None:
        kwargs.pop("encoder", None)
        kwargs.pop("decoder", None)
        kwargs.pop("max_length", None)
        fields = [
            forms.IntegerField(min_value=1, max_value=1000, label=op) for op in sorted(OPERATIONS)
        ]
        super().__init__(fields=fields, require_all_fields=True, **kwargs)

    def compress(self, data_list: list[Any]) -> dict[str, int]:
        return dict(zip(sorted(OPERATIONS), data_list, strict=True)) if data_list else {}


class AdmissionPolicyForm(forms.ModelForm):
    """Range checks come from the model's validators; this adds the one cross-field rule."""

    operation_weights = WeightsField(
        label="Operation weights",
        help_text="Units each operation costs against the rate limit (1..1000; default 1).",
    )

    class Meta:
        model = AdmissionPolicy
        fields = [
            "job_timeout_ms",
            "queue_ceiling_ms",
            "worker_queue_limit",
            "flow_share_percent",
            "max_lease_slots",
            "rate_limit",
            "rate_limit_enabled",
            "operation_weights",
        ]


class AdmissionPolicyAdmin(admin.ModelAdmin):
    form = AdmissionPolicyForm
    readonly_fields = ["updated_at"]
    fieldsets = [
        (
            "Admission",
            {
                "fields": [
                    "worker_queue_limit",
                    "flow_share_percent",
                    "queue_ceiling_ms",
                    "job_timeout_ms",
                    "max_lease_slots",
                ]
            },
        ),
        ("Rate limit", {"fields": ["rate_limit", "rate_limit_enabled", "operation_weights"]}),
        (None, {"fields": ["updated_at"]}),
    ]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # There is exactly one policy; a list of one row is just an extra click.
        row = policy_row()
        return HttpResponseRedirect(
            reverse("admin:admission_admissionpolicy_change", args=[row.pk])
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(
        self, request: HttpRequest, obj: AdmissionPolicy, form: Any, change: bool
    ) -> None:
        super().save_model(request, obj, form, change)
        # The save bumps the policy version: every process has the change from its next call.
        forget_cached_policy()
        action_record(
            actor=Actor.of(request, via="admin"),
            action=OperatorAction.POLICY,
            target="global policy",
            result=", ".join(form.changed_data)[:256],
        )


# ---------------------------------------------------------------------------------------
# Quarantines


class ReleasedFilter(IsSetFilter):
    title = "state"
    parameter_name = "released"
    field = "released_at"
    set_label = "Released"
    unset_label = "Quarantined (unreleased)"


class QuarantineAdmin(ReadOnlyAdmin):
    # Only a worker's report of an unknown mutation outcome quarantines a key; the detail page
    # is a record, and releasing (the one change) is an action.
    list_display = [
        "created_at",
        "worker_id",
        "workspace_id",
        "worktree",
        "operation",
        "reason",
        "released",
        "released_at",
        "released_by",
    ]
    list_filter = [ReleasedFilter, "operation"]
    search_fields = ["worker_id", "workspace_id", "isolation_key_hash", "request_id"]
    date_hierarchy = "created_at"
    actions = ["release_quarantines"]

    @admin.display(description="released", boolean=True, ordering="released_at")
    def released(self, obj: Quarantine) -> bool:
        return obj.released_at is not None

    def has_release_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("admission.change_quarantine")

    @admin.action(description="Release selected quarantines", permissions=["release"])
    def release_quarantines(self, request: HttpRequest, queryset: QuerySet[Quarantine]) -> None:
        # Only unreleased rows: a second release must not overwrite who released it first.
        count = queryset.filter(released_at__isnull=True).update(
            released_at=timezone.now(), released_by=request.user.get_username()
        )
        self.message_user(
            request,
            f"Released {count} quarantine(s); calls on those workspaces are admitted again.",
        )


# ---------------------------------------------------------------------------------------
# Completion log


class FixedValuesFilter(admin.SimpleListFilter):
    """Offers a known set of values instead of SELECT DISTINCT over the whole log."""

    values: tuple[str, ...] = ()

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(v, v) for v in self.values]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None or self.parameter_name is None:
            return queryset
        return queryset.filter(**{str(self.parameter_name): value})


class AdmissionOutcomeFilter(FixedValuesFilter):
    title = "admission outcome"
    parameter_name = "admission_outcome"
    values = (
        "admitted",
        "queue_full",
        "queue_timeout",
        "rate_limited",
        "rejected_before_queue",
        "cancelled",
    )


class OutcomeFilter(FixedValuesFilter):
    title = "outcome"
    parameter_name = "outcome"
    values = ("completed", "disconnected", "cancelled")


class OperationFilter(FixedValuesFilter):
    title = "operation"
    parameter_name = "operation"
    values = tuple(sorted(OPERATIONS))


class HttpStatusFilter(FixedValuesFilter):
    title = "HTTP status"
    parameter_name = "http_status"
    # Every status the endpoint answers with (contract §2.5), plus 499 for a client that left.
    values = (
        "200",
        "400",
        "401",
        "403",
        "404",
        "405",
        "409",
        "413",
        "415",
        "422",
        "429",
        "499",
        "502",
        "503",
        "504",
    )


# How a row reads to a person. The stored `outcome` is the contract's (§5): whether the
# answer reached the client. For a call refused before it ran that is still "completed",
# which reads as if the call had run; the summary says what happened instead.
REFUSED = {
    "queue_full": "refused: queue full",
    "queue_timeout": "timed out waiting for a slot",
    "rate_limited": "refused: rate limited",
    "rejected_before_queue": "refused before queueing",
    "cancelled": "cancelled while waiting",
}


def result_summary(row: CompletionLog) -> str:
    if row.admission_outcome in REFUSED:
        return REFUSED[row.admission_outcome]
    if row.outcome == "disconnected":
        return "client went away"
    if row.outcome == "cancelled":
        return "cancelled"
    return "ok" if row.http_status == 200 else "error answer"


class ExactFilter(admin.SimpleListFilter):
    """A filter the dashboard's links set (?code=..., ?principal_hash=...). It lists only the
    value in use: offering every value would be a SELECT DISTINCT over the whole log."""

    field = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, value if len(value) <= 24 else f"{value[:20]}…")] if value else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset


def exact_filter(name: str, title: str, lookup: str | None = None) -> type[ExactFilter]:
    return type(
        f"{name.title().replace('_', '')}Filter",
        (ExactFilter,),
        {"title": title, "parameter_name": name, "field": lookup or name},
    )


class TimeBoundFilter(ExactFilter):
    """?since= / ?until= (ISO 8601): the dashboard's window, so a number links to its rows."""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return queryset.none()
        return queryset.filter(**{self.field: moment})


class SinceFilter(TimeBoundFilter):
    title = "since"
    parameter_name = "since"
    field = "created_at__gte"


class UntilFilter(TimeBoundFilter):
    title = "until"
    parameter_name = "until"
    field = "created_at__lt"


class FailedFilter(admin.SimpleListFilter):
    title = "answer"
    parameter_name = "failed"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("1", "anything but 200")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.exclude(http_status=200) if self.value() == "1" else queryset


class CompletionLogAdmin(ReadOnlyAdmin):
    # Old rows go with `manage.py prune_completions`, never one by one from here.
    # Ten narrow columns: the whole row fits a 1400 px screen; the rest is on the row's page.
    list_display = [
        "time",
        "request",
        "where",
        "operation",
        "status",
        "result",
        "wait_ms",
        "run_ms",
        "total_ms",
    ]
    list_display_links = ["time", "request"]
    readonly_fields = ["result"]
    fields = [
        "result",
        "created_at",
        "request_id",
        "uid",
        "tenant_hash",
        "principal_hash",
        "worker_id",
        "workspace_id",
        "worktree",
        "isolation_key_hash",
        "operation",
        "http_status",
        "code",
        "outcome",
        "admission_outcome",
        "queue_wait_ms",
        "slot_index",
        "exec_ms",
        "duration_ms",
        "deadline_budget_ms",
        "fencing_ticket",
    ]

    @admin.display(description="time (UTC)", ordering="created_at")
    def time(self, obj: CompletionLog) -> str:
        return obj.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]

    @admin.display(description="request id", ordering="request_id")
    def request(self, obj: CompletionLog) -> str:
        return obj.request_id

    @admin.display(description="worker: workspace", ordering="worker_id")
    def where(self, obj: CompletionLog) -> str:
        lane = f"@{obj.worktree}" if obj.worktree else ""
        return f"{obj.worker_id}: {obj.workspace_id}{lane}" if obj.workspace_id else obj.worker_id

    @admin.display(description="status", ordering="http_status")
    def status(self, obj: CompletionLog) -> SafeString:
        # Long codes may break after an underscore instead of widening the whole table.
        parts = obj.code.split("_")
        code = format_html_join(mark_safe("_<wbr>"), "{}", ((p,) for p in parts))
        return (
            format_html("{} {}", obj.http_status, code)
            if obj.code
            else format_html("{}", obj.http_status)
        )

    @admin.display(description="result")
    def result(self, obj: CompletionLog) -> str:
        return result_summary(obj)

    @admin.display(description="wait ms", ordering="queue_wait_ms")
    def wait_ms(self, obj: CompletionLog) -> int:
        return obj.queue_wait_ms

    @admin.display(description="exec ms", ordering="exec_ms")
    def run_ms(self, obj: CompletionLog) -> int | None:
        return obj.exec_ms

    @admin.display(description="total ms", ordering="duration_ms")
    def total_ms(self, obj: CompletionLog) -> int:
        return obj.duration_ms

    list_filter = [
        FailedFilter,
        AdmissionOutcomeFilter,
        OutcomeFilter,
        OperationFilter,
        HttpStatusFilter,
        exact_filter("code", "code"),
        exact_filter("worker", "worker", "worker_id"),
        exact_filter("workspace", "workspace", "workspace_id"),
        exact_filter("tenant_hash", "tenant (hash)"),
        exact_filter("principal_hash", "principal (hash)"),
        exact_filter("key", "isolation key (hash)", "isolation_key_hash"),
        SinceFilter,
        UntilFilter,
    ]
    search_fields = ["request_id", "worker_id", "workspace_id", "isolation_key_hash"]
    search_help_text = "Exact request id, worker id, workspace id or isolation-key hash."
    date_hierarchy = "created_at"
    # COUNT(*) over millions of rows on every page view is the slowest thing on the page.
    show_full_result_count = False
    list_per_page = 100
    actions = None

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[CompletionLog], search_term: str
    ) -> tuple[QuerySet[CompletionLog], bool]:
        # Exact matches only. The admin's default (icontains on every column) can use no index
        # and scans the whole log on every search; exact request ids, worker ids and key hashes
        # can use their indexes. (workspace_id has none of its own, so a search is still a scan
        # when the planner cannot narrow it by time first.)
        term = search_term.strip()
        if not term:
            return queryset, False
        match = Q()
        for field in self.search_fields:
            match |= Q(**{field: term})
        return queryset.filter(match), False


# ---------------------------------------------------------------------------------------
# The audit trail


class OperatorActionAdmin(ReadOnlyAdmin):
    """Who cancelled, drained, resumed, revoked or changed the policy, and when (a record)."""

    list_display = ["at", "actor", "action", "target", "result", "via"]
    list_filter = ["action", "via"]
    search_fields = ["actor", "target"]
    date_hierarchy = "at"
    actions = None


admin.site.register(AdmissionPolicy, AdmissionPolicyAdmin)
admin.site.register(OperatorAction, OperatorActionAdmin)
admin.site.register(Quarantine, QuarantineAdmin)
admin.site.register(CompletionLog, CompletionLogAdmin)
