"""Signals that let one app take part in another's write without importing it."""

from django.dispatch import Signal

# Sent by the conversations app inside the transaction that appends an entry, before it commits, with
# ``principal`` (apps.identity.principal.Principal), ``conversation_id`` (str), ``entry_id`` (str), ``channel``
# (``history`` or ``context``: a context entry is private to ``principal.client_id``) and ``content`` (the validated
# list of content items). A receiver may raise apps.core.errors.ApiError to refuse the append; the
# transaction then rolls back and the caller gets that error (attachments use it to link ``{"attachmentId": ...}``
# items to the entry). Sent with ``send``, never ``send_robust``: a failing receiver must fail the write.
entry_appending = Signal()

# Sent by the conversations app inside the transaction that soft-deletes conversations, before it commits, with
# ``conversation_ids`` (list[str]: every conversation being deleted), ``root_id`` (str) and ``whole_tree`` (bool:
# the root is among them, so the tree's memberships and pending transfers must go). apps.sharing removes them here,
# so the conversations app never touches sharing's tables. Sent with ``send``: a failing receiver fails the delete.
conversation_deleting = Signal()
