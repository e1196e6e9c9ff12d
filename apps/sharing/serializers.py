"""Request validation of memberships and ownership transfers (camelCase): bodies (unknown fields are rejected, D1)
and query parameters. Response shapes: apps.sharing.responses."""

from __future__ import annotations

from apps.core import errors
from apps.core.pagination import LimitBounds
from apps.core.serializers import (
    MAX_USER_ID_CHARS,
    StrictCharField,
    StrictChoiceField,
    StrictSerializer,
    StrictUUIDField,
)
from apps.sharing.access import LEVELS

TRANSFER_ROLES = ("recipient", "sender", "all")
# Each list's limit bounds (the interface's limits table), named by its view.
MEMBERSHIPS_LIMIT = LimitBounds(default=50, maximum=200)
TRANSFERS_LIMIT = LimitBounds(default=50, maximum=200)
ADMIN_MEMBERSHIPS_LIMIT = LimitBounds(default=50, maximum=1000)


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
