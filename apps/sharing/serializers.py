"""Request validation and response shapes of memberships and ownership transfers (camelCase)."""

from __future__ import annotations

from rest_framework import serializers

from apps.core import errors
from apps.core.serializers import StrictCharField, StrictChoiceField, StrictSerializer, StrictUUIDField
from apps.sharing.access import AccessLevel

LEVELS = [level.value for level in AccessLevel]
MAX_USER_ID_CHARS = 256
TRANSFER_ROLES = ("recipient", "sender", "all")


class UserIdField(StrictCharField):
    def __init__(self, **kwargs) -> None:
        super().__init__(allow_blank=False, trim_whitespace=False, max_length=MAX_USER_ID_CHARS, **kwargs)


class MembershipCreateSerializer(StrictSerializer):
    """POST .../memberships body. Unknown fields are rejected."""

    userId = UserIdField()
    accessLevel = StrictChoiceField(choices=LEVELS)


class MembershipUpdateSerializer(StrictSerializer):
    """PATCH .../memberships/{userId} body. Unknown fields are rejected."""

    accessLevel = StrictChoiceField(choices=LEVELS)


class TransferCreateSerializer(StrictSerializer):
    """POST /v1/ownership-transfers body. Unknown fields are rejected."""

    conversationId = StrictUUIDField()
    newOwnerUserId = UserIdField()


def transfer_role(raw: str | None) -> str:
    if raw is None:
        return "all"
    if raw not in TRANSFER_ROLES:
        raise errors.validation_error({"role": "must be one of recipient, sender, all"})
    return raw


# --- Response shapes (documentation) ----------------------------------------------------------------------------


class MembershipResponse(serializers.Serializer):
    conversationId = serializers.UUIDField()
    userId = serializers.CharField()
    accessLevel = StrictChoiceField(choices=LEVELS)
    createdAt = serializers.DateTimeField()


class MembershipPage(serializers.Serializer):
    data = MembershipResponse(many=True)
    afterCursor = serializers.CharField(allow_null=True)


class TransferResponse(serializers.Serializer):
    id = serializers.UUIDField()
    conversationId = serializers.UUIDField()
    fromUserId = serializers.CharField()
    toUserId = serializers.CharField()
    createdAt = serializers.DateTimeField()


class TransferPage(serializers.Serializer):
    data = TransferResponse(many=True)
    afterCursor = serializers.CharField(allow_null=True)
