"""Response shapes of the conversation endpoints (camelCase, as the interface says), for the OpenAPI schema only:
selectors build the dicts. A list's page is apps.core.openapi.page_of(<item>)."""

from __future__ import annotations

from rest_framework import serializers

from apps.conversations.models import Channel
from apps.sharing.access import LEVELS


# The fields every view of a conversation shows. (No docstring: drf-spectacular would give it to every component
# below as its description.)
class _Conversation(serializers.Serializer):
    id = serializers.UUIDField()
    title = serializers.CharField()
    ownerUserId = serializers.CharField()
    createdAt = serializers.DateTimeField()
    updatedAt = serializers.DateTimeField()


class ConversationListItem(_Conversation):
    accessLevel = serializers.ChoiceField(choices=LEVELS, help_text="The caller's level")


class ConversationResponse(ConversationListItem):
    metadata = serializers.DictField()
    forkedAtConversationId = serializers.UUIDField(allow_null=True)
    forkedAtEntryId = serializers.UUIDField(allow_null=True)


class EntryResponse(serializers.Serializer):
    id = serializers.UUIDField()
    conversationId = serializers.UUIDField()
    userId = serializers.CharField()
    channel = serializers.ChoiceField(choices=Channel.values)
    contentType = serializers.CharField()
    content = serializers.ListField(
        child=serializers.DictField(),
        allow_null=True,
        help_text="null only when the stored content cannot be decrypted (then contentError says so)",
    )
    contentError = serializers.ChoiceField(
        choices=["undecryptable"],
        required=False,
        help_text="Present only when content is null: the stored content does not decrypt with the service's keys "
        "(a key missing from MEMORY_ENCRYPTION_KEYS, or a damaged row). The other entries of the page are served.",
    )
    createdAt = serializers.DateTimeField()
    key = serializers.CharField(required=False, help_text="The entry's lookup key; present only when it has one")


class ForkItem(serializers.Serializer):
    conversationId = serializers.UUIDField()
    title = serializers.CharField()
    forkedAtConversationId = serializers.UUIDField(allow_null=True)
    forkedAtEntryId = serializers.UUIDField(allow_null=True)
    createdAt = serializers.DateTimeField()


class AdminConversation(_Conversation):
    metadata = serializers.DictField()
    forkedAtConversationId = serializers.UUIDField(allow_null=True)
    forkedAtEntryId = serializers.UUIDField(allow_null=True)
    deletedAt = serializers.DateTimeField(allow_null=True)


class IndexResponse(serializers.Serializer):
    indexed = serializers.IntegerField(help_text="How many entries got the new index text")


class SearchResult(serializers.Serializer):
    conversationId = serializers.UUIDField()
    conversationTitle = serializers.CharField()
    entryId = serializers.UUIDField()
    score = serializers.FloatField(min_value=0, max_value=1, help_text="Higher is better, in [0, 1]")
    highlights = serializers.CharField(help_text="A snippet of the index text with matched terms wrapped in **")
    entry = EntryResponse()


class UnindexedItem(serializers.Serializer):
    conversationId = serializers.UUIDField()
    entry = EntryResponse()
