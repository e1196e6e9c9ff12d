"""The streaming upload handler: Django's multipart parser hands each piece of the ``file`` part to it as it
arrives; the piece is counted, hashed, sealed and stored at once (apps.attachments.services.Upload), so memory
stays flat and the size limit stops the upload at the first byte over it."""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler, StopFutureHandlers

from apps.attachments.services import Upload
from apps.core import errors
from apps.identity.principal import Principal

FILE_FIELD = "file"
MAX_FILENAME_CHARS = 255
_MEDIA_TYPE = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]{0,126}/[a-z0-9][a-z0-9!#$&^_.+-]{0,126}$")
DEFAULT_CONTENT_TYPE = "application/octet-stream"


def clean_filename(name: str | None) -> str:
    """A display name that is safe in headers and paths: no control or separator characters, bounded length."""
    name = unicodedata.normalize("NFC", name or "")
    name = "".join(ch for ch in name if unicodedata.category(ch)[0] != "C" and ch not in '/\\"')
    name = name.strip().lstrip(".") or "file"
    return name[:MAX_FILENAME_CHARS]


def clean_content_type(value: str | None) -> str:
    value = (value or "").split(";")[0].strip().lower()
    return value if _MEDIA_TYPE.match(value) else DEFAULT_CONTENT_TYPE


class StoredFile(UploadedFile):
    """What ends up in request.FILES: the finished Upload, no bytes."""

    def __init__(self, upload: Upload, name: str, content_type: str) -> None:
        super().__init__(file=None, name=name, content_type=content_type, size=upload.size)
        self.upload = upload

    def close(self) -> None:  # nothing open
        return None


class AttachmentUploadHandler(FileUploadHandler):
    chunk_size = 256 * 1024  # the pieces the parser hands over (one sealed chunk each, apps.encryption.crypto)

    def __init__(self, principal: Principal, request: Any = None) -> None:
        super().__init__(request)
        self.principal = principal
        self.upload: Upload | None = None
        self.finished: StoredFile | None = None

    def new_file(self, field_name, file_name, content_type, content_length, charset=None, content_type_extra=None):
        if field_name != FILE_FIELD:
            raise errors.validation_error({field_name: f"unexpected file part; send the file as '{FILE_FIELD}'"})
        if self.upload is not None:
            raise errors.validation_error({FILE_FIELD: "send exactly one file"})
        super().new_file(field_name, file_name, content_type, content_length, charset, content_type_extra)
        self.upload = Upload(
            self.principal, filename=clean_filename(file_name), content_type=clean_content_type(content_type)
        )
        raise StopFutureHandlers()

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        assert self.upload is not None
        self.upload.write(raw_data)
        return None

    def file_complete(self, file_size: int) -> StoredFile:
        assert self.upload is not None
        self.upload.finish()
        self.finished = StoredFile(self.upload, self.file_name, self.content_type)
        return self.finished

    def abort(self) -> None:
        """Called by the view whenever the request fails after the upload began."""
        if self.upload is not None:
            self.upload.abort()
