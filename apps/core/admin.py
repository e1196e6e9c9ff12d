"""The read-only operator page every app's admin builds on, and the admin audit trail's page."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from apps.core.models import AdminAuditRecord


class ReadOnlyModelAdmin(admin.ModelAdmin):
    """An operator page that only looks. Every change goes through the API, which checks the rules, keeps the
    related rows consistent (memberships, blobs, vectors) and publishes the events; a row deleted here would do
    none of that."""

    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(AdminAuditRecord)
class AdminAuditRecordAdmin(ReadOnlyModelAdmin):
    """The trail is written by the service, never edited by hand."""

    list_display = ("occurred_at", "user_id", "client_id", "action", "target_id", "request_id")
    list_filter = ("action",)
    search_fields = ("user_id", "target_id", "request_id")
