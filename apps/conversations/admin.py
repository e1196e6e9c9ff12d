"""Operator pages. Metadata only: entry content is never decrypted or shown here."""

from django.contrib import admin

from apps.conversations.models import Conversation, Entry
from apps.core.admin import ReadOnlyModelAdmin


@admin.register(Conversation)
class ConversationAdmin(ReadOnlyModelAdmin):
    list_display = ("id", "title", "owner_user_id", "root_id", "created_at", "updated_at", "deleted_at")
    list_filter = (("deleted_at", admin.EmptyFieldListFilter),)
    search_fields = ("=id", "=root_id", "=owner_user_id", "title")
    ordering = ("-updated_at",)
    fields = ("id", "root_id", "title", "owner_user_id", "metadata", "forked_at_conversation_id",
              "forked_at_entry_id", "created_at", "updated_at", "deleted_at")
    readonly_fields = fields


@admin.register(Entry)
class EntryAdmin(ReadOnlyModelAdmin):
    list_display = ("id", "conversation_id", "user_id", "client_id", "channel", "content_type", "created_at")
    list_filter = ("channel",)
    search_fields = ("=id", "=conversation__id", "=user_id")
    ordering = ("-created_at",)
    # content (ciphertext) and indexed_content are deliberately absent: the admin shows metadata only.
    # The indexer's state is shown (apps.retrieval.indexing): a failure's reason never holds content.
    fields = ("id", "conversation_id", "user_id", "client_id", "channel", "content_type", "created_at",
              "embedding_pending", "index_failures", "index_error", "index_retry_at", "index_quarantined_at")
    readonly_fields = fields
