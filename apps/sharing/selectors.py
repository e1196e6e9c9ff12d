"""Reads of memberships and pending transfers. Every list is scoped in SQL: memberships by the tree the caller
belongs to, transfers by the caller being their sender or recipient."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db.models import Q

from apps.conversations import trees
from apps.core import errors, pagination
from apps.identity.principal import Principal
from apps.sharing import access
from apps.sharing.access import AccessLevel
from apps.sharing.models import ArchivedMembership, Membership, OwnershipTransfer
from apps.sharing.responses import MembershipResponse, TransferResponse

MEMBERSHIPS_CURSOR = "sharing.memberships"
TRANSFERS_CURSOR = "sharing.transfers"


def membership_response(membership: Membership, conversation_id: Any) -> dict:
    return MembershipResponse.from_object(membership, conversation_id=conversation_id)


def transfer_response(transfer: OwnershipTransfer) -> dict:
    return TransferResponse.from_object(transfer)


def _oldest_first(queryset, tag: str, cursor: str | None, limit: int) -> pagination.Page:
    return pagination.keyset_page(pagination.ModelKeyset(queryset, "created_at"), tag=tag, cursor=cursor, limit=limit)


def membership_page(
    root_id: Any, conversation_id: Any, *, cursor: str | None, limit: int, archived: bool = False
) -> dict:
    model = ArchivedMembership if archived else Membership
    page = _oldest_first(model.objects.filter(root_id=root_id), MEMBERSHIPS_CURSOR, cursor, limit)
    return pagination.envelope([membership_response(row, conversation_id) for row in page.items], page.next_cursor)


def list_memberships(principal: Principal, conversation_id: UUID, *, cursor: str | None, limit: int) -> dict:
    found = access.tree_level(principal.user_id, str(conversation_id))
    if found is None:
        raise errors.not_found("Conversation not found.")
    root_id, level = found
    if not access.at_least(level, AccessLevel.READER):
        raise errors.forbidden("You do not have access to this conversation.")
    return membership_page(root_id, conversation_id, cursor=cursor, limit=limit)


def admin_list_memberships(conversation_id: UUID, *, cursor: str | None, limit: int) -> dict:
    """The tree's members; for a deleted tree, the members it had when it was deleted (the archive: a deleted tree
    has no live memberships, a live one no archived ones)."""
    root_id = trees.root_of(conversation_id)
    if root_id is None:
        raise errors.not_found("Conversation not found.")
    archived = ArchivedMembership.objects.filter(root_id=root_id).exists()
    return membership_page(root_id, conversation_id, cursor=cursor, limit=limit, archived=archived)


def list_transfers(principal: Principal, *, role: str, cursor: str | None, limit: int) -> dict:
    """Pending transfers (every stored transfer is pending) the caller sends or receives, oldest first."""
    if role == "recipient":
        scope = Q(to_user_id=principal.user_id)
    elif role == "sender":
        scope = Q(from_user_id=principal.user_id)
    else:
        scope = Q(to_user_id=principal.user_id) | Q(from_user_id=principal.user_id)
    page = _oldest_first(OwnershipTransfer.objects.filter(scope), TRANSFERS_CURSOR, cursor, limit)
    return pagination.envelope([transfer_response(row) for row in page.items], page.next_cursor)


def get_transfer(principal: Principal, transfer_id: UUID) -> dict:
    transfer = (
        OwnershipTransfer.objects.filter(id=transfer_id)
        .filter(Q(to_user_id=principal.user_id) | Q(from_user_id=principal.user_id))
        .first()
    )
    if transfer is None:
        raise errors.not_found("Transfer not found.")
    return transfer_response(transfer)
