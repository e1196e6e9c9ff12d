"""Operator pages. Metadata only: values are never decrypted here."""

from django.contrib import admin

from apps.core.admin import ReadOnlyModelAdmin
from apps.memories import config
from apps.memories.models import Memory, MemoryEvent, ServiceSettings


@admin.register(Memory)
class MemoryAdmin(ReadOnlyModelAdmin):
    # Deleting a version here would skip the memory_deleted event and the vectors: DELETE through the API.
    list_display = ("id", "namespace_path", "key", "state", "index_status", "created_at", "expires_at")
    list_filter = ("state", "index_status")
    search_fields = ("key",)
    ordering = ("-created_at",)
    # value_ciphertext is deliberately absent: the admin never decrypts or shows values.
    fields = ("id", "namespace", "key", "attributes", "indexed_content", "state", "created_at", "ended_at",
              "expires_at", "index_status", "index_attempts", "index_retry_at", "index_failures", "index_error",
              "index_quarantined_at")
    readonly_fields = fields

    @admin.display(description="namespace")
    def namespace_path(self, obj: Memory) -> str:
        return " / ".join(obj.namespace)


@admin.register(MemoryEvent)
class MemoryEventAdmin(ReadOnlyModelAdmin):
    # The timeline is append-only; retention prunes it.
    list_display = ("seq", "tx", "kind", "namespace_path", "key", "occurred_at")
    list_filter = ("kind",)
    search_fields = ("key",)
    ordering = ("-tx", "-seq")  # the timeline's order, newest first
    fields = ("seq", "tx", "id", "memory_id", "namespace", "key", "kind", "occurred_at", "attributes")
    readonly_fields = fields

    @admin.display(description="namespace")
    def namespace_path(self, obj: MemoryEvent) -> str:
        return " / ".join(obj.namespace)


@admin.register(ServiceSettings)
class ServiceSettingsAdmin(admin.ModelAdmin):
    list_display = ("__str__", "memory_episodic_namespace_max_depth", "updated_at")

    def has_add_permission(self, request) -> bool:
        return not ServiceSettings.objects.exists()

    def save_model(self, request, obj, form, change) -> None:
        super().save_model(request, obj, form, change)
        config.clear_cache()  # this process applies it at once; others within SERVICE_SETTINGS_CACHE_SECONDS
