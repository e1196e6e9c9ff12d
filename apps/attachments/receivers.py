"""Takes part in the conversations app's entry append (apps.core.signals.entry_appending) without importing it:
content items carrying ``attachmentId`` (or ``attachments: [{"attachmentId": ...}]``) link the attachment to the entry,
inside the append's transaction."""

from __future__ import annotations

import uuid
from typing import Any

from apps.attachments import services
from apps.core import errors


def attachment_ids(content: Any) -> list[uuid.UUID]:
    """The attachments an entry's content references: an item's ``attachmentId``, and the ``attachmentId`` of
    each object in an item's ``attachments`` array (the upstream project's shape, D10)."""
    ids: list[uuid.UUID] = []
    if not isinstance(content, list):
        return ids
    for position, item in enumerate(content):
        if not isinstance(item, dict):
            continue
        references = [(f"content[{position}].attachmentId", item)]
        if isinstance(item.get("attachments"), list):
            references += [
                (f"content[{position}].attachments[{index}].attachmentId", ref)
                for index, ref in enumerate(item["attachments"])
                if isinstance(ref, dict)
            ]
        for field, ref in references:
            if "attachmentId" not in ref:
                continue
            value = ref["attachmentId"]
            try:
                ids.append(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))
            except (ValueError, TypeError):
                raise errors.validation_error({field: "must be a UUID"}) from None
    return ids


def link_entry_attachments(
    sender: Any, *, principal, conversation_id: str, entry_id: str, channel: str, content: Any, **_: Any
) -> None:
    ids = attachment_ids(content)
    if ids:
        # A context entry is private to its API-key client (D5), and so is what it references.
        client_id = principal.client_id if channel == "context" else None
        services.link_to_entry(
            principal, conversation_id=conversation_id, entry_id=entry_id, attachment_ids=ids, client_id=client_id
        )


def unlink_deleted_conversations(sender: Any, *, conversation_ids: list[str], **_: Any) -> None:
    """Entries of deleted conversations no longer reference anything: their readers lose access through them, and
    an attachment left unreferenced expires again (removed by the sweep once its expiresAt has passed)."""
    services.unlink_conversations(conversation_ids)
