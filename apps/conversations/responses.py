"""Response shapes of the conversation endpoints (camelCase, as the interface says): each declaration renders its
body (``Shape.render``, ``Shape.from_object``) and documents it in the schema (apps.core.shapes). A list's page is
apps.core.shapes.page_of(<item>)."""

from __future__ import annotations

from rest_framework import serializers

from apps.conversations.models import Channel
from apps.core.shapes import Marker, Shape
from apps.encryption import crypto
from apps.sharing.access import LEVELS


# The fields every view of a conversation shows, from a selectors.ConversationRow. (No docstring: drf-spectacular
# would give it to every component below as its description.)
class _Conversation(Shape):
    id = serializers.UUIDField()
    title = serializers.CharField()
    ownerUserId = serializers.CharField(source="owner_user_id")
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")


class ConversationListItem(_Conversation):
    accessLevel = serializers.ChoiceField(choices=LEVELS, source="level", help_text="The caller's level")


class ConversationResponse(ConversationListItem):
    metadata = serializers.DictField()
    forkedAtConversationId = serializers.UUIDField(source="forked_at_conversation_id", allow_null=True)
    forkedAtEntryId = serializers.UUIDField(source="forked_at_entry_id", allow_null=True)


class EntryResponse(Shape):
    id = serializers.UUIDField()
    conversationId = serializers.UUIDField(source="conversation_id")
    userId = serializers.CharField(source="user_id")
    channel = serializers.ChoiceField(choices=Channel.values)
    contentType = serializers.CharField(source="content_type")
    content = serializers.ListField(
        child=serializers.DictField(),
        allow_null=True,
        help_text="null only when the stored content cannot be decrypted (then contentError says so)",
    )
    contentError = Marker(
        of="content",
        when=crypto.UNDECRYPTABLE,
        value=crypto.UNDECRYPTABLE_MARKER,
        help_text="Present only when content is null: the stored content does not decrypt with the service's keys "
        "(a key missing from MEMORY_ENCRYPTION_KEYS, or a damaged row). The other entries of the page are served.",
    )
    createdAt = serializers.DateTimeField(source="created_at")
    key = serializers.CharField(required=False, help_text="The entry's lookup key; present only when it has one")


class ForkItem(Shape):
    conversationId = serializers.UUIDField(source="conversation_id")
    title = serializers.CharField()
    forkedAtConversationId = serializers.UUIDField(source="forked_at_conversation_id", allow_null=True)
    forkedAtEntryId = serializers.UUIDField(source="forked_at_entry_id", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")


class AdminConversation(_Conversation):
    metadata = serializers.DictField()
    forkedAtConversationId = serializers.UUIDField(source="forked_at_conversation_id", allow_null=True)
    forkedAtEntryId = serializers.UUIDField(source="forked_at_entry_id", allow_null=True)
    deletedAt = serializers.DateTimeField(source="deleted_at", allow_null=True)


class IndexResponse(Shape):
    indexed = serializers.IntegerField(help_text="How many entries got the new index text")


class SearchResult(Shape):
    conversationId = serializers.UUIDField(source="conversation_id")
    conversationTitle = serializers.CharField(source="conversation_title")
    entryId = serializers.UUIDField(source="entry_id")
    score = serializers.FloatField(min_value=0, max_value=1, help_text="Higher is better, in [0, 1]")
    highlights = serializers.CharField(help_text="A snippet of the index text with matched terms wrapped in **")
    entry = EntryResponse()


class UnindexedItem(Shape):
    conversationId = serializers.UUIDField(source="conversation_id")
    entry = EntryResponse()
