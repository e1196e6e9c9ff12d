"""Writes of the attachments app: streamed uploads, deletes, links from conversation entries, the expiry sweep.

Blob and row are kept consistent in one direction: a row always exists while its blob may exist. The row is
inserted (``uploading``) before the first byte is stored and removed only after the blob is; the blob of a deleted
row is removed after the deleting transaction commits (a reader that already opened it finishes its download).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.attachments import storage
from apps.attachments.models import Attachment, AttachmentLink, AttachmentStatus
from apps.core import audit, errors
from apps.encryption import crypto
from apps.identity.principal import Principal
from apps.limits import services as limits

logger = logging.getLogger(__name__)

BLOB_PURPOSE = "attachment.blob"


class Upload:
    """One file being received: counted against ATTACHMENT_MAX_BYTES, hashed (sha256 of the plaintext) and sealed
    chunk by chunk into storage as it arrives. Fed by apps.attachments.upload.AttachmentUploadHandler."""

    def __init__(self, principal: Principal, *, filename: str, content_type: str) -> None:
        self.id = uuid.uuid4()
        self.max_bytes = settings.ATTACHMENT_MAX_BYTES
        self.size = 0
        self.digest = hashlib.sha256()
        self.name = storage.blob_name(self.id)
        self.encrypted = bool(settings.ATTACHMENT_ENCRYPTION)
        self._committed = False
        self._closed = False
        self.user_id = principal.user_id
        now = timezone.now()
        # The row first: from now on the expiry sweep knows a blob of this name may exist. It counts against the
        # uploader's attachments quota from now on; its bytes once complete (complete()), but an upload stops as
        # soon as it would not fit in what was left of the bytes quota when it began.
        with transaction.atomic():
            Attachment.objects.create(
                id=self.id,
                user_id=principal.user_id,
                filename=filename,
                content_type=content_type,
                storage_name=self.name,
                encrypted=self.encrypted,
                status=AttachmentStatus.UPLOADING,
                created_at=now,
                expires_at=now + timedelta(seconds=settings.ATTACHMENT_UPLOAD_TIMEOUT_SECONDS),
            )
            limits.charge(principal.user_id, attachments=1)
        self.bytes_used = limits.usage(principal.user_id)["attachment_bytes"]
        self.bytes_limit = limits.limits_for(principal.user_id, ["attachment_bytes"])[0]
        try:
            self._writer = storage.open_writer(self.name)
            self._sealer = crypto.StreamSealer(purpose=BLOB_PURPOSE, row_id=str(self.id)) if self.encrypted else None
        except BaseException:
            self._remove_row()
            raise

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.max_bytes:
            raise errors.payload_too_large(f"The file exceeds the upload limit of {self.max_bytes} bytes.")
        if self.bytes_used + self.size > self.bytes_limit:
            raise limits.refusal("attachment_bytes", self.bytes_limit, self.bytes_used)
        self.digest.update(data)
        if self._sealer is None:
            self._writer.write(data)
        else:
            for piece in self._sealer.update(data):
                self._writer.write(piece)

    def finish(self) -> None:
        if self._sealer is not None:
            for piece in self._sealer.finish():
                self._writer.write(piece)
        self._closed = True
        self._writer.commit()
        self._committed = True

    def abort(self) -> None:
        """Leave nothing behind: the partial (or complete) blob and the row."""
        try:
            if not self._closed:
                self._closed = True
                self._writer.abort()
            if self._committed:
                storage.delete(self.name)
        finally:
            self._remove_row()

    def _remove_row(self) -> None:
        with transaction.atomic():
            deleted, _ = Attachment.objects.filter(id=self.id, status=AttachmentStatus.UPLOADING).delete()
            limits.credit([(self.user_id, "attachments", deleted)])

    def complete(self, expires_in: int) -> Attachment:
        """Mark the stored file ready; it expires ``expires_in`` seconds from now unless an entry references it."""
        now = timezone.now()
        with transaction.atomic():
            updated = Attachment.objects.filter(id=self.id, status=AttachmentStatus.UPLOADING).update(
                status=AttachmentStatus.READY,
                size=self.size,
                sha256=self.digest.hexdigest(),
                expires_at=now + timedelta(seconds=expires_in),
            )
            if updated:
                # The bytes quota, exact: concurrent uploads that each fit in what was left when they began are
                # serialised here, and the one that no longer fits is refused (the caller aborts it).
                limits.charge(self.user_id, attachment_bytes=self.size)
        if not updated:
            # The sweep removed the row of an upload that outlived ATTACHMENT_UPLOAD_TIMEOUT_SECONDS.
            storage.delete(self.name)
            raise errors.ApiError(408, "The upload took too long.", code="upload_timeout")
        return Attachment.objects.get(id=self.id)


def _remove_blob_after_commit(name: str, *, attachment_id: uuid.UUID | None = None, expect_blob: bool = False) -> None:
    """``expect_blob``: the row was ready, so its blob should be there; one that is not was lost (or lives on the disk
    of another host: storage that is not shared between the processes, README "Several hosts") and is reported."""

    def remove() -> None:
        try:
            found = storage.delete(name)
        except Exception:
            # The row is gone; a blob left behind costs space, never access. Logged for the operator.
            logger.exception("attachment blob could not be removed", extra={"attachment_id": str(attachment_id), "blob": name})
            return
        if expect_blob and not found:
            logger.error(
                "attachment blob missing when its row expired",
                extra={"attachment_id": str(attachment_id), "blob": name, "storage": settings.ATTACHMENT_STORAGE},
            )

    transaction.on_commit(remove)


def delete_attachment(principal: Principal, attachment_id: uuid.UUID) -> None:
    """Uploader or admin (D7). Serialised with links and other deletes by the row lock."""
    with transaction.atomic():
        attachment = (
            Attachment.objects.select_for_update()
            .filter(id=attachment_id, status=AttachmentStatus.READY)
            .first()
        )
        if attachment is None:
            raise errors.not_found("Attachment not found.")
        if attachment.user_id != principal.user_id:
            if not principal.is_admin:
                raise errors.forbidden("Only the uploader or an admin may delete this attachment.")
            # The admin role used on someone else's file: an admin call (D5), recorded in this transaction.
            audit.record(principal, "admin.attachments.delete", target_id=str(attachment.id))
        attachment.delete()  # links cascade
        limits.credit([(attachment.user_id, "attachments", 1), (attachment.user_id, "attachment_bytes", attachment.size)])
        _remove_blob_after_commit(attachment.storage_name, attachment_id=attachment.id)


def link_to_entry(
    principal: Principal,
    *,
    conversation_id: str,
    entry_id: str,
    attachment_ids: list[uuid.UUID],
    client_id: str | None = None,
) -> None:
    """Record that an entry being appended references these attachments (called inside the append transaction);
    ``client_id``: the API-key client of a context entry (its link grants reading through that client only), None
    for a history entry.

    Only the uploader may reference an attachment; an unknown, unfinished or expired one is a 400. The rows are
    locked FOR SHARE so a concurrent delete or expiry sweep (FOR UPDATE) cannot remove them under the new link.
    """
    unique = sorted(set(attachment_ids))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.id, a.user_id, (a.expires_at > clock_timestamp() "
            "OR EXISTS (SELECT 1 FROM attachment_links l WHERE l.attachment_id = a.id)) AS live "
            "FROM attachments a WHERE a.id = ANY(%s::uuid[]) AND a.status = %s ORDER BY a.id FOR SHARE OF a",
            [[str(value) for value in unique], AttachmentStatus.READY.value],
        )
        found = {row[0]: (row[1], row[2]) for row in cursor.fetchall()}
    for attachment_id in unique:
        owner, live = found.get(attachment_id, (None, False))
        if owner is None or not live:
            raise errors.validation_error(
                {"content.attachmentId": f"unknown attachment {attachment_id}"}, "Unknown attachment."
            )
        if owner != principal.user_id:
            raise errors.forbidden("Only the uploader of an attachment may reference it in an entry.")
    now = timezone.now()
    AttachmentLink.objects.bulk_create(
        [
            AttachmentLink(
                attachment_id=value,
                conversation_id=conversation_id,
                entry_id=entry_id,
                client_id=client_id,
                created_at=now,
            )
            for value in unique
        ],
        ignore_conflicts=True,
    )


def remove_expired(batch_size: int | None = None) -> int:
    """Remove expired attachments that no entry references, and uploads abandoned past their deadline, with their
    blobs. Rows are claimed with SKIP LOCKED (a row being linked or deleted right now is left for the next run)."""
    batch_size = batch_size or settings.ATTACHMENT_EXPIRY_BATCH_SIZE
    removed = 0
    while True:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    "DELETE FROM attachments WHERE id IN ("
                    " SELECT a.id FROM attachments a WHERE a.expires_at <= clock_timestamp()"
                    " AND NOT EXISTS (SELECT 1 FROM attachment_links l WHERE l.attachment_id = a.id)"
                    " ORDER BY a.expires_at LIMIT %s FOR UPDATE SKIP LOCKED"
                    ") RETURNING id, storage_name, status, user_id, size",
                    [batch_size],
                )
                rows = cursor.fetchall()
            limits.credit(
                [(user, quota, amount) for _id, _name, _status, user, size in rows
                 for quota, amount in (("attachments", 1), ("attachment_bytes", size))]
            )
            for attachment_id, name, status, _user, _size in rows:
                # An abandoned upload may never have stored a byte; a ready row always had its blob.
                _remove_blob_after_commit(name, attachment_id=attachment_id, expect_blob=status == AttachmentStatus.READY)
        removed += len(rows)
        if len(rows) < batch_size:
            return removed


def unlink_conversations(conversation_ids: list[str]) -> int:
    """Drop the links of conversations being deleted (inside the deleting transaction)."""
    deleted, _ = AttachmentLink.objects.filter(conversation_id__in=conversation_ids).delete()
    return deleted


# --- Key rotation (rotate_encryption_key) ----------------------------------------------------------------------


def count_encrypted_blobs() -> int:
    return Attachment.objects.filter(encrypted=True, status=AttachmentStatus.READY).count()


def rotate_blob_keys(primary: str, progress: Callable[[int], object], dry_run: bool = False) -> crypto.BlobRotation:
    """Re-seal every stored attachment blob whose stream is not under ``primary`` (D4: rotation covers everything
    encrypted). The key id is read from each blob's clear header, so a re-run continues where one stopped.

    One attachment at a time, its row held FOR SHARE while its blob is rewritten: a delete (FOR UPDATE) waits rather
    than lose its blob to a rewrite that would then resurrect it, links (FOR SHARE) go on, and a row already locked
    by a delete or the expiry sweep is skipped and reported. The new stream replaces the old one atomically (rename
    on the filesystem, a completed multipart upload on S3); a download already reading the old one finishes it.
    Plaintext, size and sha256 (the ETag) do not change."""
    tally = crypto.BlobRotation()
    ids = list(
        Attachment.objects.filter(encrypted=True, status=AttachmentStatus.READY).order_by("id").values_list("id", flat=True)
    )
    for attachment_id in ids:
        try:
            _rotate_one(attachment_id, primary, tally, dry_run)
        finally:
            progress(1)
    return tally


def _rotate_one(attachment_id: uuid.UUID, primary: str, tally: crypto.BlobRotation, dry_run: bool) -> None:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT storage_name FROM attachments WHERE id = %s AND status = %s FOR SHARE SKIP LOCKED",
                [attachment_id, AttachmentStatus.READY.value],
            )
            row = cursor.fetchone()
        if row is None:
            # Gone meanwhile (deleted, expired: nothing to rotate), or locked by a delete or the sweep right now.
            if Attachment.objects.filter(id=attachment_id).exists():
                tally.skipped += 1
            return
        name = row[0]
        try:
            blob = storage.open_blob(name)
        except storage.BlobMissing:
            return  # removed after its row's delete committed
        try:
            kid = crypto.stream_key_id(blob.read(crypto.MAX_STREAM_HEADER))
        except crypto.DecryptionError:
            kid = None
        finally:
            blob.close()
        if kid == primary:
            tally.already_primary += 1
            return
        if dry_run:
            tally.rotated += 1  # would be
            return
        blob = storage.open_blob(name)
        writer = storage.open_writer(name, replace=True)
        try:
            for piece in crypto.reseal_reader(blob.read, purpose=BLOB_PURPOSE, row_id=str(attachment_id)):
                writer.write(piece)
        except crypto.DecryptionError:
            writer.abort()
            tally.failed += 1
            if len(tally.failed_examples) < 10:
                tally.failed_examples.append(str(attachment_id))
            return
        except BaseException:
            writer.abort()
            raise
        finally:
            blob.close()
        writer.commit()
        tally.rotated += 1


blob_rotator = crypto.BlobRotator(
    label="attachments.blob", count=count_encrypted_blobs, rotate=rotate_blob_keys
)
