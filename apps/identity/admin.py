"""Django admin for API keys: list, create (the key is shown once), revoke. The key and its hash never appear."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from apps.identity import api_keys
from apps.identity.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("client", "prefix", "created_at", "last_used_at", "revoked_at", "active")
    list_filter = ("client",)
    search_fields = ("client", "prefix")
    ordering = ("client", "-created_at")
    actions = ("revoke_keys",)
    # key_hash is deliberately absent everywhere: a hash of a key is still a fact about the key.
    readonly_fields = ("prefix", "created_at", "last_used_at", "revoked_at")

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        return ["client"] if obj is None else ["client", *self.readonly_fields]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> tuple[str, ...]:
        # A key's client is its identity in every policy decision; changing it would rewrite history.
        return self.readonly_fields if obj is None else ("client", *self.readonly_fields)

    @admin.display(boolean=True, description="Active")
    def active(self, obj: ApiKey) -> bool:
        return obj.is_active

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        key = api_keys.generate_key()
        obj.prefix = api_keys.key_prefix(key)
        obj.key_hash = api_keys.hash_key(key)
        obj.client = obj.client.strip()
        super().save_model(request, obj, form, change)
        messages.warning(request, f"API key for {obj.client}: {key} (copy it now; it is not shown again)")

    def has_delete_permission(self, request: HttpRequest, obj: ApiKey | None = None) -> bool:
        return False  # revoke instead, so the prefix of a key that leaked can still be traced

    @admin.action(description="Revoke selected API keys")
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} API key(s).", messages.SUCCESS)
