"""Helpers shared by the attachment tests: uploads over HTTP, and a storage directory per test."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

ATTACHMENTS = "/v1/attachments"


@pytest.fixture(autouse=True)
def attachment_dir(settings, tmp_path: Path) -> Path:
    """Every test stores blobs in its own directory (filesystem storage), so blob assertions see only its files."""
    directory = tmp_path / "attachments"
    settings.ATTACHMENT_DIR = str(directory)
    settings.ATTACHMENT_STORAGE = "filesystem"
    return directory


def upload(client, data: bytes = b"hello", *, filename: str = "hello.txt", content_type: str = "text/plain", query: str = "", **form):
    body = {"file": SimpleUploadedFile(filename, data, content_type=content_type), **form}
    return client.post(f"{ATTACHMENTS}{query}", body, format="multipart")


def upload_ok(client, data: bytes = b"hello", **kwargs) -> dict:
    response = upload(client, data, **kwargs)
    assert response.status_code == 201, response.content
    return response.json()


def body_of(response) -> bytes:
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content)
    return response.content


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def blobs(directory: Path) -> list[Path]:
    return [path for path in directory.rglob("*") if path.is_file()] if directory.exists() else []
