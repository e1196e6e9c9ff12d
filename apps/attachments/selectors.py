"""Reads of the attachments app: who may read an attachment (D7), response shapes, the admin list."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import Count, Exists, OuterRef, Q, Sum
from django.utils import timezone

from apps.attachments.models import Attachment, AttachmentLink, AttachmentStatus
from apps.attachments.responses import AdminAttachmentResponse, AttachmentResponse
from apps.core import errors, pagination
from apps.identity.principal import Principal
from apps.sharing import access


def attachment_response(attachment: Attachment) -> dict[str, Any]:
    return AttachmentResponse.from_object(attachment, href=f"/v1/attachments/{attachment.id}")


def admin_attachment_response(attachment: Attachment) -> dict[str, Any]:
    return AdminAttachmentResponse.from_object(attachment, href=f"/v1/attachments/{attachment.id}")


def _visible() -> Q:
    """Ready, and either not yet expired or referenced by an entry (a referenced attachment no longer expires).
    An expired one is gone for everyone at once, before the sweep removes it (like memories, D4)."""
    linked = Exists(AttachmentLink.objects.filter(attachment_id=OuterRef("pk")))
    return Q(status=AttachmentStatus.READY) & (Q(expires_at__gt=timezone.now()) | Q(linked))


def get_visible(attachment_id: uuid.UUID) -> Attachment:
    attachment = Attachment.objects.filter(_visible(), id=attachment_id).first()
    if attachment is None:
        raise errors.not_found("Attachment not found.")
    return attachment


def readable_attachment(principal: Principal, attachment_id: uuid.UUID) -> Attachment:
    """The attachment if ``principal`` may read it: its uploader, or whoever may read an entry referencing it (D7): a
    reader of that conversation, and for a context entry (private to its API-key client, D5) only through that
    client. 404 when it does not exist (or expired), 403 when it exists for someone else.

    Admins and auditors get no bypass here (D7 names no one else); they read through the audit-logged admin
    endpoint (``admin_get``)."""
    attachment = get_visible(attachment_id)
    if attachment.user_id == principal.user_id:
        return attachment
    through = Q(client_id__isnull=True)
    if principal.client_id is not None:
        through |= Q(client_id=principal.client_id)
    conversation_ids = list(
        AttachmentLink.objects.filter(through, attachment_id=attachment.id)
        .values_list("conversation_id", flat=True)
        .distinct()
    )
    if access.reads_any(principal.user_id, [str(value) for value in conversation_ids]):
        return attachment
    raise errors.forbidden("You do not have access to this attachment.")


def readable_by_signer(signer: tuple[str, str | None], attachment_id: uuid.UUID) -> Attachment:
    """The attachment of a signed download link, if whoever signed the link may still read it (as
    ``readable_attachment``, now: access withdrawn since the link was made ends the link too). 404 when it is gone."""
    user_id, client_id = signer
    try:
        return readable_attachment(Principal(user_id=user_id, client_id=client_id, roles=()), attachment_id)
    except errors.ApiError as exc:
        if exc.status != 403:
            raise
        raise errors.forbidden("The download link is no longer valid: whoever made it can no longer read the file.") from None


def admin_get(attachment_id: uuid.UUID) -> Attachment:
    """Any ready attachment, as the admin list shows them (expired ones awaiting the sweep included)."""
    attachment = Attachment.objects.filter(id=attachment_id, status=AttachmentStatus.READY).first()
    if attachment is None:
        raise errors.not_found("Attachment not found.")
    return attachment


def still_stored(attachment_id: uuid.UUID) -> bool:
    """Whether the attachment's row is still there (ready): a download whose blob vanished tells a concurrent delete
    (the row went first) from a blob lost from storage (the row remains)."""
    return Attachment.objects.filter(id=attachment_id, status=AttachmentStatus.READY).exists()


ADMIN_CURSOR = "attachments.admin"


def admin_list(*, user_id: str | None, cursor: str | None, limit: int) -> dict[str, Any]:
    """Every ready attachment (expired ones awaiting the sweep included), newest first."""
    queryset = Attachment.objects.filter(status=AttachmentStatus.READY)
    if user_id is not None:
        queryset = queryset.filter(user_id=user_id)
    page = pagination.keyset_page(
        pagination.ModelKeyset(queryset, "created_at", descending=True), tag=ADMIN_CURSOR, cursor=cursor, limit=limit
    )
    return pagination.envelope([admin_attachment_response(item) for item in page.items], page.next_cursor)


# --- Quota totals (apps.limits recounts them: `manage.py limits recount`) -----------------------------------------


def quota_usage(user_id: str) -> dict[str, int]:
    """What counts against ``user_id``'s attachment quotas: their uploads (finished or under way) and the size of
    the finished ones."""
    totals = Attachment.objects.filter(user_id=user_id).aggregate(count=Count("id"), size=Sum("size"))
    return {"attachments": totals["count"], "attachment_bytes": totals["size"] or 0}


def quota_users() -> list[str]:
    return list(Attachment.objects.values_list("user_id", flat=True).distinct())
