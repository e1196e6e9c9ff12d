"""A blob missing where its row says it is (issue 32, item 1: attachment storage not shared between hosts, a lost
volume): the download says so with 500 ``blob_missing`` and logs it at ERROR with the attachment id, instead of a
404 "Attachment not found" for an attachment that exists; the expiry sweep logs a ready blob it could not find."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.attachments import storage
from apps.attachments.models import Attachment
from apps.attachments.tasks import remove_expired_attachments
from tests.attachments.conftest import blobs, body_of, upload_ok

pytestmark = pytest.mark.django_db


def _lose_blob(attachment_dir, attachment_id: str) -> None:
    [path] = [path for path in blobs(attachment_dir) if path.name == attachment_id]
    path.unlink()


def _missing_logs(caplog, message: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.getMessage() == message]


def test_a_download_whose_blob_is_missing_is_500_blob_missing_and_logged(client_for, attachment_dir, caplog):
    bob, alice = client_for("bob"), client_for("alice")
    meta = upload_ok(bob, b"on another host's disk")
    link = bob.get(f"{meta['href']}/download-url").json()["url"]
    _lose_blob(attachment_dir, meta["id"])
    with caplog.at_level(logging.ERROR, logger="apps.attachments.views"):
        for response in (
            bob.get(meta["href"]),  # the uploader
            client_for("charlie").get(link),  # a signed link, no token needed
            alice.get(f"/v1/admin/attachments/{meta['id']}"),  # an admin
        ):
            assert response.status_code == 500, response.content
            body = response.json()
            assert body["code"] == "blob_missing"
            assert "missing" in body["error"] and "Attachment not found" not in body["error"]
            assert body["requestId"] == response["X-Request-ID"]
    logged = _missing_logs(caplog, "attachment blob missing from storage")
    assert len(logged) == 3
    assert all(record.levelno == logging.ERROR and record.attachment_id == meta["id"] for record in logged)
    assert Attachment.objects.filter(id=meta["id"]).exists()  # nothing was removed on the way


def test_a_blob_deleted_with_its_row_during_the_download_is_still_404(client_for, attachment_dir, monkeypatch, caplog):
    """Blobs go only after their row's delete commits: no row any more means a delete won the race, not a lost file."""
    bob = client_for("bob")
    meta = upload_ok(bob, b"deleted meanwhile")
    opened = storage.open_blob

    def deleted_meanwhile(name: str):
        Attachment.objects.filter(id=meta["id"]).delete()
        _lose_blob(attachment_dir, meta["id"])
        return opened(name)

    monkeypatch.setattr(storage, "open_blob", deleted_meanwhile)
    with caplog.at_level(logging.ERROR, logger="apps.attachments.views"):
        response = bob.get(meta["href"])
    assert response.status_code == 404 and response.json()["code"] == "not_found"
    assert not _missing_logs(caplog, "attachment blob missing from storage")


def test_the_expiry_sweep_logs_a_ready_blob_it_could_not_find(
    client_for, attachment_dir, caplog, django_capture_on_commit_callbacks
):
    bob = client_for("bob")
    lost, kept = upload_ok(bob, b"lost"), upload_ok(bob, b"kept")
    Attachment.objects.filter(id__in=[lost["id"], kept["id"]]).update(expires_at=timezone.now() - timedelta(seconds=1))
    _lose_blob(attachment_dir, lost["id"])
    with caplog.at_level(logging.INFO, logger="apps.attachments"), django_capture_on_commit_callbacks(execute=True):
        assert remove_expired_attachments() == 2
    logged = _missing_logs(caplog, "attachment blob missing when its row expired")
    assert [(record.levelno, record.attachment_id) for record in logged] == [(logging.ERROR, lost["id"])]
    assert blobs(attachment_dir) == []  # the other blob was there and is gone


def test_the_expiry_sweep_does_not_report_an_abandoned_upload_without_a_blob(
    client_for, attachment_dir, caplog, django_capture_on_commit_callbacks
):
    import uuid

    from apps.attachments.models import AttachmentStatus

    attachment_id = uuid.uuid4()
    Attachment.objects.create(
        id=attachment_id, user_id="bob", filename="f", content_type="text/plain",
        storage_name=storage.blob_name(attachment_id), encrypted=True, status=AttachmentStatus.UPLOADING,
        created_at=timezone.now(), expires_at=timezone.now() - timedelta(seconds=1),
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="apps.attachments"), django_capture_on_commit_callbacks(execute=True):
        assert remove_expired_attachments() == 1
    assert not _missing_logs(caplog, "attachment blob missing when its row expired")


def test_a_present_blob_still_downloads(client_for):
    bob = client_for("bob")
    meta = upload_ok(bob, b"here")
    assert body_of(bob.get(meta["href"])) == b"here"
