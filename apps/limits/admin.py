"""Django admin: per-user overrides of the rates and quotas. An empty field is the default (the setting, shown
beside it); what the user stores now is shown read-only, and an action rebuilds it from the data."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html_join

from apps.limits import services
from apps.limits.definitions import QUOTAS, RATES
from apps.limits.models import UserLimits


@admin.register(UserLimits)
class UserLimitsAdmin(admin.ModelAdmin):
    list_display = ("user_id", "overrides", "note", "updated_at")
    search_fields = ("user_id", "note")
    ordering = ("user_id",)
    actions = ("recount_totals",)
    readonly_fields = ("defaults", "stored_now", "updated_at")
    fieldsets = (
        (None, {"fields": ("user_id", "note", "updated_at")}),
        (
            "Rates (per user, all processes; empty = default)",
            {"fields": [field for rate in RATES.values() for field in (rate.per_minute_field, rate.burst_field)]},
        ),
        ("Quotas on stored totals (empty = default)", {"fields": list(QUOTAS)}),
        ("For reference", {"fields": ("defaults", "stored_now")}),
    )

    def get_readonly_fields(self, request: HttpRequest, obj: UserLimits | None = None) -> tuple[str, ...]:
        # The row is the user's: renaming it would hand one user's limits to another.
        return self.readonly_fields if obj is None else ("user_id", *self.readonly_fields)

    @admin.display(description="Overridden")
    def overrides(self, obj: UserLimits) -> str:
        return ", ".join(f"{f}={getattr(obj, f)}" for f in services.OVERRIDE_FIELDS if getattr(obj, f) is not None)

    @admin.display(description="Defaults")
    def defaults(self, obj: UserLimits) -> str:
        limits = services.limits_of(obj.user_id) if obj.user_id else services.limits_of("")
        return format_html_join(", ", "{}={}", ((field, item["default"]) for field, item in limits.items()))

    @admin.display(description="Stored now (kept totals)")
    def stored_now(self, obj: UserLimits) -> str:
        if not obj.user_id:
            return "-"
        return format_html_join(", ", "{}={}", services.usage(obj.user_id).items())

    @admin.action(description="Recount the stored totals of the selected users")
    def recount_totals(self, request: HttpRequest, queryset: QuerySet[UserLimits]) -> None:
        for row in queryset:
            services.recount(row.user_id)
        self.message_user(request, f"Recounted {queryset.count()} user(s).", messages.SUCCESS)
