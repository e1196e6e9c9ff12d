"""Operator pages. Metadata only: entry content is never decrypted or shown here."""

from django.contrib import admin

from apps.conversations.models import Conversation, Entry


class _ReadOnly(admin.ModelAdmin):
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # deleting goes through the API, which also removes memberships and transfers


@admin.register(Conversation)
class ConversationAdmin(_ReadOnly):
    list_display = ("id", "title", "owner_user_id", "root_id", "created_at", "updated_at", "deleted_at")
    list_filter = (("deleted_at", admin.EmptyFieldListFilter),)
    search_fields = ("=id", "=root_id", "=owner_user_id", "title")
    ordering = ("-updated_at",)
    fields = ("id", "root_id", "title", "owner_user_id", "metadata", "forked_at_conversation_id",
              "forked_at_entry_id", "created_at", "updated_at", "deleted_at")
    readonly_fields = fields


@admin.register(Entry)
class EntryAdmin(_ReadOnly):
    list_display = ("id", "conversation_id", "user_id", "client_id", "channel", "content_type", "created_at")
    list_filter = ("channel",)
    search_fields = ("=id", "=conversation__id", "=user_id")
    ordering = ("-created_at",)
    # content (ciphertext) and indexed_content are deliberately absent: the admin shows metadata only.
    fields = ("id", "conversation_id", "user_id", "client_id", "channel", "content_type", "created_at")
    readonly_fields = fields
