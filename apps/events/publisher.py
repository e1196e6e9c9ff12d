"""The one publishing hook of the live event stream (D8).

Every service that creates, updates or deletes a conversation, an entry or a membership calls ``publish`` inside
its write transaction. ``publish`` resolves the recipients there (so call it before deleting the rows they are
resolved from, e.g. before deleting a conversation or a membership) and sends after commit; a failed publish never
fails the write, and nothing is sent for a transaction that rolls back.
"""

from __future__ import annotations

from typing import Any


def publish(event: str, kind: str, data: dict[str, Any]) -> None:
    """``event``: created | updated | deleted; ``kind``: conversation | entry | membership; ``data``: ids only
    (``conversationId`` always; ``entryId``, ``userId``, ``accessLevel`` where they apply), never entry content.

    Until the stream exists this does nothing; the call sites are the contract.
    """
    return None
