"""Membership and ownership-transfer writes. Each is one transaction that first takes the fork tree's lock
(apps.sharing.access.lock_tree, apps.conversations.trees.lock_root), so changes to one tree serialise and take locks
in the order apps.conversations.trees documents; the invariants themselves (one membership per user and tree, one
pending transfer per tree) are unique indexes.

Rules (D6): owner grants anything (owner included: a co-owner; ownerUserId stays); a manager adds, changes and
removes only writers and readers, and only to writer or reader; the primary owner's membership cannot be lowered
or removed (400), only a transfer moves it; any member may leave, except the primary owner.

A pending transfer carries its sender's authority, so it lives only as long as that authority: removing a member
(or their leaving) ends the transfers to and from them, lowering an owner below owner ends the transfers from them,
and accepting re-checks under the tree lock that the sender still holds owner level.
"""

from __future__ import annotations

import uuid
from uuid import UUID

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from apps.conversations import trees
from apps.core import errors
from apps.events.publisher import publish, publish_all
from apps.identity.principal import Principal
from apps.limits import services as limits
from apps.sharing import access, selectors
from apps.sharing.access import AccessLevel, at_least
from apps.sharing.models import Membership, OwnershipTransfer

_MANAGEABLE = {AccessLevel.WRITER.value, AccessLevel.READER.value}


def _lock_tree(principal: Principal, conversation_id: UUID) -> tuple[str, str | None, str]:
    locked = access.lock_tree(principal.user_id, str(conversation_id))
    if locked is None:
        raise errors.not_found("Conversation not found.")
    return locked


def _require_manager(level: str | None) -> None:
    if not at_least(level, AccessLevel.MANAGER):
        raise errors.forbidden("Only an owner or a manager may change memberships.")


def _membership(event: str, conversation_id: UUID, user_id: str, level: str) -> tuple[str, str, dict]:
    """A membership event (apps.events.publisher), recorded by the write and sent after it commits."""
    return event, "membership", {"conversationId": str(conversation_id), "userId": user_id, "accessLevel": level}


# --- Memberships ------------------------------------------------------------------------------------------------


def add_membership(principal: Principal, conversation_id: UUID, *, user_id: str, access_level: str) -> dict:
    with transaction.atomic():
        root_id, level, owner = _lock_tree(principal, conversation_id)
        _require_manager(level)
        if level != AccessLevel.OWNER and access_level not in _MANAGEABLE:
            raise errors.forbidden("A manager may grant only writer or reader.")
        now = timezone.now()
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO conversation_memberships (id, root_id, user_id, access_level, created_at) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (root_id, user_id) DO NOTHING",
                [uuid.uuid4(), root_id, user_id, access_level, now],
            )
            inserted = cursor.rowcount == 1
        if not inserted:
            raise errors.conflict("The user is already a member; use PATCH to change the level.")
        # Counted under the tree lock, which every membership write takes: concurrent adds cannot overshoot. The
        # tree owner's limit applies.
        limits.check_count(owner, "members_per_conversation", access.count_members(root_id) - 1)
        publish(*_membership("created", conversation_id, user_id, access_level))
        membership = Membership(root_id=root_id, user_id=user_id, access_level=access_level, created_at=now)
    return selectors.membership_response(membership, conversation_id)


def _target(root_id: str, user_id: str) -> Membership:
    membership = Membership.objects.select_for_update().filter(root_id=root_id, user_id=user_id).first()
    if membership is None:
        raise errors.not_found("No such member.")
    return membership


def update_membership(principal: Principal, conversation_id: UUID, *, user_id: str, access_level: str) -> dict:
    with transaction.atomic():
        root_id, level, owner_user_id = _lock_tree(principal, conversation_id)
        _require_manager(level)
        target = _target(root_id, user_id)
        if level != AccessLevel.OWNER and (target.access_level not in _MANAGEABLE or access_level not in _MANAGEABLE):
            raise errors.forbidden("A manager may change only writers and readers, and only to writer or reader.")
        if user_id == owner_user_id and access_level != AccessLevel.OWNER:
            raise errors.validation_error(
                {"accessLevel": "the primary owner's membership cannot be lowered; transfer ownership instead"}
            )
        if target.access_level != access_level:
            Membership.objects.filter(pk=target.pk).update(access_level=access_level)
            if target.access_level == AccessLevel.OWNER:
                # No longer an owner: a transfer they started no longer has an owner behind it.
                OwnershipTransfer.objects.filter(root_id=root_id, from_user_id=user_id).delete()
            target.access_level = access_level
            publish(*_membership("updated", conversation_id, user_id, access_level))
    return selectors.membership_response(target, conversation_id)


def remove_membership(principal: Principal, conversation_id: UUID, *, user_id: str) -> None:
    with transaction.atomic():
        root_id, level, owner_user_id = _lock_tree(principal, conversation_id)
        leaving = user_id == principal.user_id and level is not None
        if not leaving:
            _require_manager(level)
        target = _target(root_id, user_id)
        if not leaving and level != AccessLevel.OWNER and target.access_level not in _MANAGEABLE:
            raise errors.forbidden("A manager may remove only writers and readers.")
        if user_id == owner_user_id:
            raise errors.validation_error(
                {"userId": "the primary owner's membership cannot be removed; transfer ownership first"}
            )
        publish(*_membership("deleted", conversation_id, user_id, target.access_level))
        OwnershipTransfer.objects.filter(Q(to_user_id=user_id) | Q(from_user_id=user_id), root_id=root_id).delete()
        Membership.objects.filter(pk=target.pk).delete()


# --- Ownership transfers ----------------------------------------------------------------------------------------


def create_transfer(principal: Principal, *, conversation_id: UUID, new_owner_user_id: str) -> dict:
    with transaction.atomic():
        root_id, level, _owner = _lock_tree(principal, conversation_id)
        if level != AccessLevel.OWNER:
            raise errors.forbidden("Only an owner may transfer ownership.")
        if new_owner_user_id == principal.user_id:
            raise errors.validation_error({"newOwnerUserId": "must be another user than the caller"})
        if not Membership.objects.filter(root_id=root_id, user_id=new_owner_user_id).exists():
            raise errors.validation_error({"newOwnerUserId": "must already be a member of the conversation"})
        transfer = OwnershipTransfer(
            id=uuid.uuid4(),
            root_id=root_id,
            conversation_id=conversation_id,
            from_user_id=principal.user_id,
            to_user_id=new_owner_user_id,
            created_at=timezone.now(),
        )
        # The unique index on root_id decides "one pending transfer per tree", whatever the callers race.
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO conversation_ownership_transfers (id, root_id, conversation_id, from_user_id, "
                "to_user_id, created_at) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (root_id) DO NOTHING",
                [transfer.id, root_id, conversation_id, transfer.from_user_id, transfer.to_user_id,
                 transfer.created_at],
            )
            inserted = cursor.rowcount == 1
        if not inserted:
            existing = OwnershipTransfer.objects.filter(root_id=root_id).values_list("id", flat=True).first()
            raise errors.conflict(
                "A transfer of this conversation is already pending.",
                details={"existingTransferId": str(existing) if existing else None},
            )
    return selectors.transfer_response(transfer)


def accept_transfer(principal: Principal, transfer_id: UUID) -> None:
    """The recipient becomes owner and the primary owner (``ownerUserId``) of the tree; whoever was the primary owner
    becomes manager (D6), whichever owner sent the transfer (a co-owner who sent it keeps their owner level). The
    sender must still hold owner level now, under the tree lock: a transfer whose sender lost it is void, deleted
    and answered 404 like any transfer that no longer exists. (Removing or lowering a member already ends their
    transfers in the same transaction; this check holds the rule on its own, for rows older than that rule too.)"""
    void = False
    with transaction.atomic():
        found = OwnershipTransfer.objects.filter(id=transfer_id).values_list("root_id", "to_user_id").first()
        if found is None:
            raise errors.not_found("Transfer not found.")
        root_id, to_user_id = found
        if to_user_id != principal.user_id:
            raise errors.forbidden("Only the recipient may accept a transfer.")
        previous_owner = trees.lock_root(root_id)
        # Re-read under the tree lock: of concurrent accepts (or an accept racing a cancel, a removal or a lowering
        # of the sender) exactly one finds it, and it sees the memberships as that lock left them.
        transfer = OwnershipTransfer.objects.select_for_update().filter(id=transfer_id).first()
        if transfer is None or previous_owner is None:
            raise errors.not_found("Transfer not found.")
        sender_level = (
            Membership.objects.filter(root_id=root_id, user_id=transfer.from_user_id)
            .values_list("access_level", flat=True)
            .first()
        )
        if sender_level != AccessLevel.OWNER:
            transfer.delete()
            void = True
        else:
            _complete_transfer(transfer, previous_owner)
    if void:
        raise errors.not_found("Transfer not found: its sender no longer holds owner level.")


def _complete_transfer(transfer: OwnershipTransfer, previous_owner: str) -> None:
    root_id, to_user_id, conversation_id = transfer.root_id, transfer.to_user_id, transfer.conversation_id
    updated = Membership.objects.filter(root_id=root_id, user_id=to_user_id).update(access_level=AccessLevel.OWNER)
    if not updated:  # removing a member deletes transfers to them, so this is belt and braces
        Membership.objects.create(
            root_id=root_id, user_id=to_user_id, access_level=AccessLevel.OWNER, created_at=timezone.now()
        )
    events = [_membership("updated", conversation_id, to_user_id, AccessLevel.OWNER)]
    if previous_owner != to_user_id:
        Membership.objects.filter(root_id=root_id, user_id=previous_owner).update(access_level=AccessLevel.MANAGER)
        events.append(_membership("updated", conversation_id, previous_owner, AccessLevel.MANAGER))
    publish_all(events)
    live = trees.set_owner(root_id, to_user_id)
    # The tree's conversations now count against the new owner (403 quota_exceeded when that passes their limit).
    limits.move("conversations", live, previous_owner, to_user_id)
    transfer.delete()


def delete_transfer(principal: Principal, transfer_id: UUID) -> None:
    """Cancel (by the sender) or decline (by the recipient)."""
    with transaction.atomic():
        transfer = OwnershipTransfer.objects.select_for_update().filter(id=transfer_id).first()
        if transfer is None:
            raise errors.not_found("Transfer not found.")
        if principal.user_id not in (transfer.from_user_id, transfer.to_user_id):
            raise errors.forbidden("Only the sender or the recipient may cancel or decline a transfer.")
        transfer.delete()


# --- Conversation deletion (core signal) ------------------------------------------------------------------------


def on_conversation_deleting(*, conversation_ids: list[str], root_id: str, whole_tree: bool, **_: object) -> None:
    """Same transaction as the delete (which holds the tree's root lock): a deleted tree keeps no members and no
    pending transfer; its memberships move to the archive the admin view reads, where they grant nothing. A
    deleted fork takes the transfers that name it."""
    if whole_tree:
        publish_all(
            _membership("deleted", UUID(root_id), user_id, level)
            for user_id, level in Membership.objects.filter(root_id=root_id).values_list("user_id", "access_level")
        )
        OwnershipTransfer.objects.filter(root_id=root_id).delete()
        with connection.cursor() as cursor:
            cursor.execute(
                "WITH gone AS (DELETE FROM conversation_memberships WHERE root_id = %s "
                "RETURNING id, root_id, user_id, access_level, created_at) "
                "INSERT INTO conversation_memberships_archive (id, root_id, user_id, access_level, created_at, "
                "archived_at) SELECT id, root_id, user_id, access_level, created_at, clock_timestamp() FROM gone",
                [root_id],
            )
    else:
        OwnershipTransfer.objects.filter(conversation_id__in=conversation_ids).delete()
