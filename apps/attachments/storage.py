"""Where attachment blobs live, through Django's storage API: a FileSystemStorage under ATTACHMENT_DIR (the
embedded default, in the data directory) or django-storages' S3Storage (ATTACHMENT_STORAGE=s3).

The storage API reads and writes whole files; uploads and downloads here are streams of unknown length that must
never be held in memory, so this module adds the three streaming operations on top of each backend:
``open_writer`` (incremental write that becomes visible only on ``commit`` and leaves nothing on ``abort``),
``open_blob`` / ``open_reader`` and ``presigned_url``.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.files.storage import FileSystemStorage, Storage

from apps.core.settings_cache import BuiltFromSettings

logger = logging.getLogger(__name__)

READ_CHUNK_BYTES = 1024 * 1024  # unencrypted blobs; encrypted ones are read in whole chunks (crypto.open_reader)


class BlobMissing(Exception):
    """The blob is not in storage (deleted concurrently, or lost)."""


class BlobWriter(Protocol):
    def write(self, data: bytes) -> None: ...
    def commit(self) -> None: ...
    def abort(self) -> None: ...


def _config() -> tuple[Any, ...]:
    return (
        settings.ATTACHMENT_STORAGE,
        settings.ATTACHMENT_DIR,
        settings.ATTACHMENT_S3_BUCKET,
        settings.ATTACHMENT_S3_PREFIX,
        settings.ATTACHMENT_S3_ENDPOINT_URL,
        settings.ATTACHMENT_S3_REGION,
        settings.ATTACHMENT_S3_ACCESS_KEY_ID,
        settings.ATTACHMENT_S3_SECRET_ACCESS_KEY,
        settings.ATTACHMENT_S3_ADDRESSING_STYLE,
    )


def _build(config: tuple[Any, ...]) -> Storage:
    kind = config[0]
    if kind == "filesystem":
        return FileSystemStorage(
            location=settings.ATTACHMENT_DIR, directory_permissions_mode=0o700, file_permissions_mode=0o600
        )
    if kind == "s3":
        return _s3_storage()
    raise ImproperlyConfigured(f"ATTACHMENT_STORAGE must be 'filesystem' or 's3', not {kind!r}")


_storage: BuiltFromSettings[Storage] = BuiltFromSettings(_config, _build)


def get_storage() -> Storage:
    """The configured backend, rebuilt when its settings change (tests switch between filesystem and S3)."""
    return _storage.get()


def _s3_storage() -> Storage:
    from storages.backends.s3 import S3Storage

    if not settings.ATTACHMENT_S3_BUCKET:
        raise ImproperlyConfigured("ATTACHMENT_STORAGE=s3 needs ATTACHMENT_S3_BUCKET")
    options: dict[str, Any] = {
        "bucket_name": settings.ATTACHMENT_S3_BUCKET,
        "location": settings.ATTACHMENT_S3_PREFIX.strip("/"),
        "file_overwrite": True,  # names are fresh uuids; skip the exists() probe
        "querystring_auth": True,
        "signature_version": "s3v4",
        "default_acl": None,
    }
    if settings.ATTACHMENT_S3_ENDPOINT_URL:
        options["endpoint_url"] = settings.ATTACHMENT_S3_ENDPOINT_URL
    if settings.ATTACHMENT_S3_REGION:
        options["region_name"] = settings.ATTACHMENT_S3_REGION
    if settings.ATTACHMENT_S3_ACCESS_KEY_ID:
        options["access_key"] = settings.ATTACHMENT_S3_ACCESS_KEY_ID
        options["secret_key"] = settings.ATTACHMENT_S3_SECRET_ACCESS_KEY
    if settings.ATTACHMENT_S3_ADDRESSING_STYLE:
        options["addressing_style"] = settings.ATTACHMENT_S3_ADDRESSING_STYLE
    return S3Storage(**options)


def is_s3(storage: Storage | None = None) -> bool:
    storage = storage or get_storage()
    return type(storage).__name__ == "S3Storage"


def blob_name(attachment_id: uuid.UUID | str) -> str:
    """Fan out by the id's first two hex digits so no directory grows without bound."""
    text = str(attachment_id)
    return f"{text[:2]}/{text}"


# --- Writers ----------------------------------------------------------------------------------------------------


class _FileSystemWriter:
    """Writes ``<name>.part`` and renames it into place on commit: a reader never sees a half-written blob."""

    def __init__(self, storage: FileSystemStorage, name: str, replace: bool = False) -> None:
        self.path = storage.path(name)
        self.part = f"{self.path}.part"
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        if replace:
            # Rewriting a stored blob (key rotation, serialised per row): a .part left by a crashed rewrite is stale.
            try:
                os.unlink(self.part)
            except FileNotFoundError:
                pass
        fd = os.open(self.part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self.file = os.fdopen(fd, "wb", buffering=0)

    def write(self, data: bytes) -> None:
        self.file.write(data)

    def commit(self) -> None:
        self.file.close()
        os.replace(self.part, self.path)

    def abort(self) -> None:
        self.file.close()
        try:
            os.unlink(self.part)
        except FileNotFoundError:
            pass


class _S3Writer:
    """A multipart upload through django-storages' S3File (parts of AWS_S3_FILE_BUFFER_SIZE, 5 MiB by default);
    the object exists only once the upload completes on commit, and abort cancels the parts already sent."""

    def __init__(self, storage: Storage, name: str) -> None:
        self.storage = storage
        self.name = name
        self.file = storage.open(name, "wb")

    def write(self, data: bytes) -> None:
        self.file.write(data)

    def commit(self) -> None:
        self.file.close()

    def abort(self) -> None:
        multipart = getattr(self.file, "_multipart", None)
        try:
            if multipart is not None:
                multipart.abort()
        finally:
            self.file._multipart = None
            self.file._is_dirty = False
            self.file._raw_bytes_written = 1  # do not let close() create an empty object
            self.file.close()


class _SpooledWriter:
    """Any other storage backend: spool to a temporary file, then one ``save``."""

    def __init__(self, storage: Storage, name: str, replace: bool = False) -> None:
        import tempfile

        self.storage = storage
        self.name = name
        self.replace = replace
        self.file = tempfile.TemporaryFile(dir=settings.FILE_UPLOAD_TEMP_DIR)

    def write(self, data: bytes) -> None:
        self.file.write(data)

    def commit(self) -> None:
        from django.core.files import File

        self.file.seek(0)
        if self.replace:
            self.storage.delete(self.name)  # save() would pick another name; not atomic on such backends
        self.storage.save(self.name, File(self.file))
        self.file.close()

    def abort(self) -> None:
        self.file.close()


def open_writer(name: str, *, replace: bool = False) -> BlobWriter:
    """A writer whose blob appears (or, with ``replace``, replaces the stored one) only on ``commit``."""
    storage = get_storage()
    if isinstance(storage, FileSystemStorage):
        return _FileSystemWriter(storage, name, replace)
    if is_s3(storage):
        return _S3Writer(storage, name)
    return _SpooledWriter(storage, name, replace)


# --- Readers ----------------------------------------------------------------------------------------------------


def _s3_object(storage: Any, name: str) -> Any:
    from storages.utils import clean_name

    return storage.bucket.Object(storage._normalize_name(clean_name(name)))


class BlobReader(Protocol):
    def read(self, size: int) -> bytes: ...
    def close(self) -> None: ...


def open_blob(name: str) -> BlobReader:
    """The blob opened for reading (``read(n)`` returns n bytes unless at the end). Opening happens now
    (BlobMissing when it is gone), so the caller can still answer 404 before it starts a response."""
    storage = get_storage()
    if is_s3(storage):
        from botocore.exceptions import ClientError

        try:
            return _s3_object(storage, name).get()["Body"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                raise BlobMissing(name) from None
            raise
    try:
        return storage.open(name, "rb")
    except FileNotFoundError:
        raise BlobMissing(name) from None


def open_reader(name: str) -> Iterator[bytes]:
    """The blob's bytes in pieces of READ_CHUNK_BYTES (opened now: BlobMissing when it is gone)."""
    return iter_blob(open_blob(name))


def iter_blob(blob: BlobReader) -> Iterator[bytes]:
    try:
        while True:
            piece = blob.read(READ_CHUNK_BYTES)
            if not piece:
                return
            yield piece
    finally:
        blob.close()


def delete(name: str) -> bool:
    """Remove the blob; a blob already gone is not an error (deletes race, sweeps repeat). Returns whether there was
    one to remove, so the expiry sweep can report a blob that was missing (another host's disk, a lost volume)."""
    storage = get_storage()
    if isinstance(storage, FileSystemStorage):
        path = storage.path(name)
        try:
            os.unlink(path)
            found = True
        except FileNotFoundError:
            found = False
        try:
            os.unlink(path + ".part")
        except FileNotFoundError:
            pass
        return found
    # S3 deletes answer alike whether or not the object was there: ask first (a HEAD, once per expired blob).
    found = storage.exists(name)
    try:
        storage.delete(name)
    except FileNotFoundError:
        pass
    return found


def exists(name: str) -> bool:
    return get_storage().exists(name)


def presigned_url(name: str, *, content_type: str, disposition: str, expires_in: int) -> str | None:
    """A presigned GET URL for S3 (None for other backends), answering with our content type and disposition."""
    storage = get_storage()
    if not is_s3(storage):
        return None
    return storage.url(
        name,
        parameters={"ResponseContentType": content_type, "ResponseContentDisposition": disposition},
        expire=expires_in,
    )
