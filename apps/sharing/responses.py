"""Response shapes of memberships and ownership transfers (camelCase), for the OpenAPI schema only: selectors
build the dicts. A list's page is apps.core.openapi.page_of(<item>)."""

from __future__ import annotations

from rest_framework import serializers

from apps.core.serializers import StrictChoiceField
from apps.sharing.access import LEVELS


class MembershipResponse(serializers.Serializer):
    conversationId = serializers.UUIDField()
    userId = serializers.CharField()
    accessLevel = StrictChoiceField(choices=LEVELS)
    createdAt = serializers.DateTimeField()


class TransferResponse(serializers.Serializer):
    id = serializers.UUIDField()
    conversationId = serializers.UUIDField()
    fromUserId = serializers.CharField()
    toUserId = serializers.CharField()
    createdAt = serializers.DateTimeField()
