"""Admin pieces shared by the apps' admin modules: list filters and a read-only page."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest


class IsSetFilter(admin.SimpleListFilter):
    """Filters on whether a nullable timestamp (revoked_at, released_at ...) is set."""

    field = ""
    set_label = ""
    unset_label = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", self.set_label), ("no", self.unset_label)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() in ("yes", "no"):
            return queryset.filter(**{f"{self.field}__isnull": self.value() == "no"})
        return queryset


class ReadOnlyAdmin(admin.ModelAdmin):
    """An admin page that is a record: nothing is added, changed or deleted from it."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
