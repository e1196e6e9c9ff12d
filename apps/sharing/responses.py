"""Response shapes of memberships and ownership transfers (camelCase): each declaration renders its body
(``Shape.from_object``) and documents it in the schema (apps.core.shapes). A list's page is
apps.core.shapes.page_of(<item>)."""

from __future__ import annotations

from rest_framework import serializers

from apps.core.serializers import StrictChoiceField
from apps.core.shapes import Shape
from apps.sharing.access import LEVELS


class MembershipResponse(Shape):
    conversationId = serializers.UUIDField(source="conversation_id")
    userId = serializers.CharField(source="user_id")
    accessLevel = StrictChoiceField(choices=LEVELS, source="access_level")
    createdAt = serializers.DateTimeField(source="created_at")


class TransferResponse(Shape):
    id = serializers.UUIDField()
    conversationId = serializers.UUIDField(source="conversation_id")
    fromUserId = serializers.CharField(source="from_user_id")
    toUserId = serializers.CharField(source="to_user_id")
    createdAt = serializers.DateTimeField(source="created_at")
