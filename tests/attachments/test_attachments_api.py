"""Attachments over HTTP (D7): upload, download, signed URLs, access, delete, admin list, expiry."""

from __future__ import annotations

import base64
import os
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.attachments import signing, storage
from apps.attachments.models import Attachment, AttachmentLink
from apps.attachments.tasks import remove_expired_attachments
from apps.core.models import AdminAuditRecord
from apps.encryption import crypto
from tests.attachments.conftest import ATTACHMENTS, blobs, body_of, sha256, upload, upload_ok

FIELDS = {"id", "href", "contentType", "filename", "size", "sha256", "expiresAt", "status"}


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["code"] == code and body["error"] and body["requestId"] == response["X-Request-ID"]
    return body


def _expires_at(meta: dict) -> datetime:
    return datetime.fromisoformat(meta["expiresAt"].replace("Z", "+00:00"))


# --- Upload and download ----------------------------------------------------------------------------------------


@pytest.mark.django_db
# 4 * chunk + 1 and 3 MiB + 5: several reads of whole chunks by the download, the last one short.
@pytest.mark.parametrize(
    "size",
    [0, 1, crypto.STREAM_CHUNK_BYTES, crypto.STREAM_CHUNK_BYTES + 1, 700_000, 4 * crypto.STREAM_CHUNK_BYTES + 1,
     3 * 1024 * 1024 + 5],
)
def test_round_trip(client_for, size):
    bob = client_for("bob")
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    meta = upload_ok(bob, data, filename="report.bin", content_type="application/octet-stream")
    assert set(meta) == FIELDS
    assert meta["href"] == f"{ATTACHMENTS}/{meta['id']}"
    assert (meta["size"], meta["sha256"], meta["status"]) == (size, sha256(data), "ready")
    assert (meta["filename"], meta["contentType"]) == ("report.bin", "application/octet-stream")
    response = bob.get(meta["href"])
    assert response.status_code == 200
    assert body_of(response) == data
    assert response["Content-Type"] == "application/octet-stream"
    assert response["Content-Length"] == str(size)
    assert response["ETag"] == f'"{sha256(data)}"'
    assert response["X-Content-Type-Options"] == "nosniff"


@pytest.mark.django_db
@pytest.mark.parametrize("encrypted", [True, False])
def test_head_answers_the_headers_without_reading_the_blob(client_for, settings, monkeypatch, encrypted):
    settings.ATTACHMENT_ENCRYPTION = encrypted
    bob = client_for("bob")
    data = os.urandom(3 * crypto.STREAM_CHUNK_BYTES + 10)
    meta = upload_ok(bob, data, filename="page.html", content_type="text/html")
    get = bob.get(meta["href"])
    assert body_of(get) == data
    opened: list[object] = []
    real_open = crypto.StreamOpener.__init__

    def counting_open(self, **kwargs):
        opened.append(kwargs)
        real_open(self, **kwargs)

    monkeypatch.setattr(crypto.StreamOpener, "__init__", counting_open)
    read: list[int] = []
    real_open_blob = storage.open_blob

    class Counting:
        def __init__(self, blob) -> None:
            self.blob = blob

        def read(self, size: int) -> bytes:
            piece = self.blob.read(size)
            read.append(len(piece))
            return piece

        def close(self) -> None:
            self.blob.close()

    def counting_open_blob(name):
        return Counting(real_open_blob(name))

    monkeypatch.setattr(storage, "open_blob", counting_open_blob)
    head = bob.head(meta["href"])
    assert head.status_code == 200
    assert not head.streaming and head.content == b""
    for name in ("Content-Type", "Content-Length", "ETag", "X-Content-Type-Options", "Content-Disposition"):
        assert head[name] == get[name], name
    assert head["Content-Length"] == str(len(data))
    # An encrypted blob's first piece is opened, as a GET opens it before its headers go out (so a HEAD answers
    # what the GET would: issue 28 item 9); nothing more is read or decrypted.
    assert len(opened) == (1 if encrypted else 0)
    # (the reader looks one sealed chunk ahead, to know whether the first is the last: 2 of the blob's 4 chunks)
    assert sum(read) <= (2 * crypto.STREAM_CHUNK_BYTES + 1024 if encrypted else 0) < len(data)
    assert body_of(bob.get(meta["href"])) == data
    assert len(opened) == (2 if encrypted else 0)
    assert bob.head(meta["href"], HTTP_IF_NONE_MATCH=get["ETag"]).status_code == 304


@pytest.mark.django_db
def test_head_of_a_missing_blob_is_500_blob_missing(client_for, attachment_dir):
    # The row is there and its blob is not (issue 32: tests/attachments/test_missing_blobs.py): not a 404.
    bob = client_for("bob")
    meta = upload_ok(bob, b"soon gone")
    [blob] = blobs(attachment_dir)
    blob.unlink()
    assert bob.head(meta["href"]).status_code == 500  # a HEAD answer has no body to check
    assert_error(bob.get(meta["href"]), 500, "blob_missing")


@pytest.mark.django_db
def test_upload_outliving_its_deadline_is_408(client_for, settings, attachment_dir, monkeypatch,
                                              django_capture_on_commit_callbacks):  # fmt: skip
    from apps.attachments import services

    settings.ATTACHMENT_UPLOAD_TIMEOUT_SECONDS = 0  # the row is past its deadline from the start
    real_finish = services.Upload.finish

    def finish_then_sweep(self):
        real_finish(self)
        services.remove_expired()  # the expiry sweep runs between the last byte and completion

    monkeypatch.setattr(services.Upload, "finish", finish_then_sweep)
    bob = client_for("bob")
    with django_capture_on_commit_callbacks(execute=True):
        assert_error(upload(bob, b"slow upload"), 408, "upload_timeout")
    assert blobs(attachment_dir) == []
    assert not Attachment.objects.exists()


@pytest.mark.django_db
def test_limit_exactly_and_over(client_for, settings, attachment_dir):
    settings.ATTACHMENT_MAX_BYTES = 200_000
    bob = client_for("bob")
    exact = b"a" * 200_000
    meta = upload_ok(bob, exact)
    assert meta["size"] == 200_000
    assert body_of(bob.get(meta["href"])) == exact
    before_rows, before_blobs = Attachment.objects.count(), len(blobs(attachment_dir))
    assert_error(upload(bob, exact + b"!"), 413, "payload_too_large")
    assert_error(upload(bob, b"a" * 2_000_000), 413, "payload_too_large")  # refused from Content-Length at once
    assert Attachment.objects.count() == before_rows
    assert len(blobs(attachment_dir)) == before_blobs, "a refused upload left a blob or a .part file behind"


@pytest.mark.django_db
def test_stored_blob_is_encrypted(client_for, attachment_dir):
    secret = b"TOP-SECRET-PLAINTEXT-MARKER " * 5000
    meta = upload_ok(client_for("bob"), secret)
    [blob] = blobs(attachment_dir)
    stored = blob.read_bytes()
    assert b"TOP-SECRET" not in stored
    assert crypto.is_sealed_stream(stored)
    assert len(stored) == len(secret) + crypto.stream_overhead(len(secret))
    assert Attachment.objects.get(id=meta["id"]).encrypted


@pytest.mark.django_db
def test_unencrypted_mode_stores_plaintext(client_for, settings, attachment_dir):
    settings.ATTACHMENT_ENCRYPTION = False
    data = b"plain bytes " * 100
    bob = client_for("bob")
    meta = upload_ok(bob, data)
    [blob] = blobs(attachment_dir)
    assert blob.read_bytes() == data
    assert body_of(bob.get(meta["href"])) == data


def _chunks_of(blob: bytes) -> tuple[bytes, list[bytes]]:
    kid_len = blob[3]
    header_len = 4 + kid_len + 4
    sealed = crypto.NONCE_BYTES + crypto.STREAM_CHUNK_BYTES + crypto.TAG_BYTES
    body = blob[header_len:]
    return blob[:header_len], [body[i : i + sealed] for i in range(0, len(body), sealed)]


@pytest.mark.django_db
@pytest.mark.parametrize("damage", ["swap", "truncate", "drop_first", "flip"])
def test_tampered_blob_fails_to_download(client_for, attachment_dir, damage):
    bob = client_for("bob")
    data = os.urandom(4 * crypto.STREAM_CHUNK_BYTES)  # 4 full chunks, the last sealed as final
    meta = upload_ok(bob, data)
    [blob] = blobs(attachment_dir)
    header, chunks = _chunks_of(blob.read_bytes())
    assert len(chunks) == 4
    if damage == "swap":
        chunks[0], chunks[1] = chunks[1], chunks[0]
    elif damage == "truncate":
        chunks = chunks[:-1]
    elif damage == "drop_first":
        chunks = chunks[1:]
    else:
        chunks[2] = chunks[2][:40] + bytes([chunks[2][40] ^ 1]) + chunks[2][41:]
    blob.write_bytes(header + b"".join(chunks))
    response = bob.get(meta["href"])
    if damage in ("swap", "drop_first"):
        # The first piece is opened before any header goes out: a clear error instead of a cut body.
        assert_error(response, 500, "undecryptable")
        return
    assert response.status_code == 200  # headers go out before the later chunks are read
    with pytest.raises(crypto.DecryptionError):
        body_of(response)


@pytest.mark.django_db
@pytest.mark.parametrize("damage", ["key_gone", "first_chunk_swapped"])
def test_head_answers_as_get_for_an_attachment_that_cannot_be_decrypted(client_for, attachment_dir, settings, damage):
    """Issue 28 item 9: HEAD answered 200 where GET answered 500 ``undecryptable``."""
    bob = client_for("bob")
    meta = upload_ok(bob, os.urandom(2 * crypto.STREAM_CHUNK_BYTES))
    signed = bob.get(f"{meta['href']}/download-url").json()["url"]
    if damage == "key_gone":  # a botched rotation: the blob's key id is no longer in the ring
        settings.MEMORY_ENCRYPTION_KEYS = "other-key:" + base64.b64encode(os.urandom(32)).decode()
    else:
        [blob] = blobs(attachment_dir)
        header, chunks = _chunks_of(blob.read_bytes())
        blob.write_bytes(header + b"".join([chunks[1], chunks[0], *chunks[2:]]))
    for url in (meta["href"], signed):
        get = bob.get(url)
        assert_error(get, 500, "undecryptable")
        head = bob.head(url)
        assert head.status_code == get.status_code and not head.content


@pytest.mark.django_db
def test_blob_of_another_attachment_does_not_open(client_for, attachment_dir):
    bob = client_for("bob")
    first, second = upload_ok(bob, b"first" * 100), upload_ok(bob, b"second" * 100)
    first_blob = next(path for path in blobs(attachment_dir) if path.name == first["id"])
    second_blob = next(path for path in blobs(attachment_dir) if path.name == second["id"])
    second_blob.write_bytes(first_blob.read_bytes())
    assert_error(bob.get(second["href"]), 500, "undecryptable")


@pytest.mark.django_db
def test_etag_and_if_none_match(client_for):
    bob = client_for("bob")
    meta = upload_ok(bob, b"cache me")
    etag = f'"{meta["sha256"]}"'
    for header in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        response = bob.get(meta["href"], HTTP_IF_NONE_MATCH=header)
        assert response.status_code == 304, header
        assert response["ETag"] == etag
        assert body_of(response) == b""
    response = bob.get(meta["href"], HTTP_IF_NONE_MATCH='"something-else"')
    assert response.status_code == 200 and body_of(response) == b"cache me"


@pytest.mark.django_db
def test_a_304_repeats_the_200s_cache_control_and_etag(client_for):
    """RFC 9110 15.4.5 (D10): a 304 carries the Cache-Control and ETag the 200 would have, for the download and
    for the signed link alike."""
    bob = client_for("bob")
    meta = upload_ok(bob, b"cache me")
    signed = bob.get(f"{meta['href']}/download-url").json()["url"]
    for url, client in ((meta["href"], bob), (signed, APIClient())):
        full = client.get(url)
        assert full.status_code == 200
        not_modified = client.get(url, HTTP_IF_NONE_MATCH=full["ETag"])
        assert not_modified.status_code == 304
        assert not_modified["Cache-Control"] == full["Cache-Control"] == "private, no-cache"
        assert not_modified["ETag"] == full["ETag"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("content_type", "disposition"),
    [
        ("text/html", "attachment"),
        ("image/svg+xml", "attachment"),
        ("application/xhtml+xml", "attachment"),
        ("text/plain", "inline"),
        ("image/png", "inline"),
    ],
)
def test_active_types_are_downloads(client_for, content_type, disposition):
    bob = client_for("bob")
    meta = upload_ok(bob, b"<script>alert(1)</script>", filename="x.html", content_type=content_type)
    response = bob.get(meta["href"])
    assert response["Content-Type"] == content_type
    assert response["Content-Disposition"].startswith(disposition)
    assert response["X-Content-Type-Options"] == "nosniff"
    assert "sandbox" in response["Content-Security-Policy"]
    body_of(response)


@pytest.mark.django_db
def test_filename_and_content_type_are_sanitised(client_for):
    bob = client_for("bob")
    meta = upload_ok(bob, b"x", filename='../../etc/pa"ss\x07wd', content_type="not a type")
    assert meta["filename"] == "passwd"  # no directories, quotes or control characters
    assert meta["contentType"] == "application/octet-stream"
    unicode_name = upload_ok(bob, b"x", filename="résumé 2024.pdf", content_type="application/pdf")
    response = bob.get(unicode_name["href"])
    assert "filename*=utf-8''r%C3%A9sum%C3%A9%202024.pdf" in response["Content-Disposition"]
    body_of(response)


@pytest.mark.django_db
def test_upload_validation(client_for, attachment_dir):
    bob = client_for("bob")
    from django.core.files.uploadedfile import SimpleUploadedFile

    assert_error(bob.post(ATTACHMENTS, {"other": "x"}, format="multipart"), 400, "validation_error")
    assert_error(
        bob.post(ATTACHMENTS, {"upload": SimpleUploadedFile("a.txt", b"x")}, format="multipart"), 400, "validation_error"
    )
    two = bob.post(
        ATTACHMENTS, {"file": [SimpleUploadedFile("a.txt", b"x"), SimpleUploadedFile("b.txt", b"y")]}, format="multipart"
    )
    assert_error(two, 400, "validation_error")
    assert_error(bob.post(ATTACHMENTS, {"file": "x"}, format="json"), 415, "unsupported_media_type")
    assert_error(bob.post(ATTACHMENTS, b"", content_type="multipart/form-data; boundary=xyz"), 400, "validation_error")
    assert_error(
        bob.post(ATTACHMENTS, b"--xyz\r\nnot a part", content_type="multipart/form-data; boundary=xyz"),
        400,
        "validation_error",
    )
    assert_error(upload(APIClient()), 401, "unauthenticated")
    assert Attachment.objects.count() == 0
    assert blobs(attachment_dir) == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("expires_in", "seconds"),
    [("PT90S", 90), ("PT30M", 1800), ("PT1H", 3600), ("P1D", 86400), ("120", 120), ("pt2m", 120), ("PT1H30M", 5400)],
)
def test_expires_in(client_for, expires_in, seconds):
    bob = client_for("bob")
    before = timezone.now()
    for meta in (upload_ok(bob, query=f"?expiresIn={expires_in}"), upload_ok(bob, expiresIn=expires_in)):
        expires_at = _expires_at(meta)
        assert before + timedelta(seconds=seconds - 5) <= expires_at <= timezone.now() + timedelta(seconds=seconds + 5)


@pytest.mark.django_db
def test_expires_in_defaults_to_an_hour(client_for):
    meta = upload_ok(client_for("bob"))
    remaining = _expires_at(meta) - datetime.now(UTC)
    assert timedelta(minutes=59) < remaining <= timedelta(hours=1)


@pytest.mark.django_db
@pytest.mark.parametrize("expires_in", ["abc", "PT0S", "0", "-5", "P2D", "90000", "P", "PT", "1.5", "PT1.5S", "9" * 50])
def test_bad_expires_in(client_for, attachment_dir, expires_in):
    bob = client_for("bob")
    body = assert_error(upload(bob, query=f"?expiresIn={expires_in}"), 400, "validation_error")
    assert "expiresIn" in body["details"]["fields"]
    assert_error(upload(bob, expiresIn=expires_in), 400, "validation_error")
    assert Attachment.objects.count() == 0
    assert blobs(attachment_dir) == []


# --- Access -----------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_only_the_uploader_reads_and_the_uploader_or_an_admin_deletes(client_for, mint_token):
    bob, charlie, alice = client_for("bob"), client_for("charlie"), client_for("alice")
    meta = upload_ok(bob, b"bob's")
    auditor = client_for("audrey", roles=("user", "auditor"))
    for client in (charlie, alice, auditor):  # admins read through /v1/admin/attachments/{id} (audit-logged)
        assert_error(client.get(meta["href"]), 403, "forbidden")
        assert_error(client.get(f"{meta['href']}/download-url"), 403, "forbidden")
    for client in (charlie, auditor):  # auditors only read
        assert_error(client.delete(meta["href"]), 403, "forbidden")
    assert_error(APIClient().get(meta["href"]), 401, "unauthenticated")
    assert body_of(bob.get(meta["href"])) == b"bob's"
    assert alice.delete(meta["href"]).status_code == 204
    assert_error(bob.get(meta["href"]), 404, "not_found")


@pytest.mark.django_db
def test_not_found_and_malformed_ids(client_for):
    bob = client_for("bob")
    missing = f"{ATTACHMENTS}/{uuid.uuid4()}"
    assert_error(bob.get(missing), 404, "not_found")
    assert_error(bob.get(f"{missing}/download-url"), 404, "not_found")
    assert_error(bob.delete(missing), 404, "not_found")
    for path in (f"{ATTACHMENTS}/nope", f"{ATTACHMENTS}/nope/download-url"):
        assert_error(bob.get(path), 400, "validation_error")
    assert_error(bob.delete(f"{ATTACHMENTS}/123"), 400, "validation_error")


@pytest.mark.django_db
def test_delete_removes_row_and_blob(client_for, attachment_dir, django_capture_on_commit_callbacks):
    bob = client_for("bob")
    meta = upload_ok(bob, b"gone soon")
    assert len(blobs(attachment_dir)) == 1
    with django_capture_on_commit_callbacks(execute=True):  # the blob goes after the delete commits
        assert bob.delete(meta["href"]).status_code == 204
    assert_error(bob.get(meta["href"]), 404, "not_found")
    assert_error(bob.delete(meta["href"]), 404, "not_found")
    assert blobs(attachment_dir) == []
    assert not Attachment.objects.filter(id=meta["id"]).exists()


# --- Signed downloads -------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_signed_download_without_credentials(client_for, settings):
    settings.ATTACHMENT_DOWNLOAD_URL_EXPIRES_IN = 120
    bob = client_for("bob")
    data = b"shared via link " * 1000
    meta = upload_ok(bob, data, filename="notes & plans.txt")
    response = bob.get(f"{meta['href']}/download-url")
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"url", "expiresIn"} and body["expiresIn"] == 120
    assert body["url"].startswith("/v1/attachments/download/")
    assert body["url"].endswith("/notes%20%26%20plans.txt")
    anonymous = APIClient()
    download = anonymous.get(body["url"])
    assert download.status_code == 200
    assert body_of(download) == data
    assert download["ETag"] == f'"{sha256(data)}"'
    assert download["X-Content-Type-Options"] == "nosniff"
    # A garbage Authorization header does not matter: the token alone authorizes.
    assert anonymous.get(body["url"], HTTP_AUTHORIZATION="Bearer junk").status_code == 200


@pytest.mark.django_db
def test_bad_signed_tokens_are_403(client_for):
    bob = client_for("bob")
    meta = upload_ok(bob, b"x")
    url = bob.get(f"{meta['href']}/download-url").json()["url"]
    token = url.split("/")[4]
    payload, mac = token.split(".")
    flipped_mac = mac[:-2] + ("A" if mac[-2] != "A" else "B") + mac[-1]
    other = upload_ok(bob, b"y")
    other_payload = bob.get(f"{other['href']}/download-url").json()["url"].split("/")[4].split(".")[0]
    bad = [
        f"{payload}.{flipped_mac}",  # tampered signature
        f"{other_payload}.{mac}",  # another attachment's payload under this signature
        token[:-5],  # truncated
        payload,  # no signature
        "garbage",
        "a.b",
        "%%%.%%%",
        signing.make_token(uuid.UUID(meta["id"]), -1, signer=("bob", None)),  # expired
    ]
    anonymous = APIClient()
    for candidate in bad:
        assert_error(anonymous.get(f"/v1/attachments/download/{candidate}/x.txt"), 403, "forbidden")


@pytest.mark.django_db
def test_signed_download_of_a_deleted_attachment_is_404(client_for):
    bob = client_for("bob")
    meta = upload_ok(bob, b"x")
    url = bob.get(f"{meta['href']}/download-url").json()["url"]
    assert bob.delete(meta["href"]).status_code == 204
    assert_error(APIClient().get(url), 404, "not_found")


@pytest.mark.django_db
def test_tokens_are_signed_with_the_configured_key(client_for, settings):
    bob = client_for("bob")
    meta = upload_ok(bob, b"x")
    url = bob.get(f"{meta['href']}/download-url").json()["url"]
    settings.ATTACHMENT_SIGNING_KEY = "another-key"
    assert_error(APIClient().get(url), 403, "forbidden")


# --- Expiry -----------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_expired_attachment_disappears_and_the_sweep_removes_the_blob(
    client_for, attachment_dir, django_capture_on_commit_callbacks
):
    bob = client_for("bob")
    keep, expire = upload_ok(bob, b"keep"), upload_ok(bob, b"expire")
    Attachment.objects.filter(id=expire["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert_error(bob.get(expire["href"]), 404, "not_found")  # invisible at once, before the sweep
    assert len(blobs(attachment_dir)) == 2
    with django_capture_on_commit_callbacks(execute=True):
        assert remove_expired_attachments() == 1
    assert not Attachment.objects.filter(id=expire["id"]).exists()
    assert [path.name for path in blobs(attachment_dir)] == [keep["id"]]
    assert body_of(bob.get(keep["href"])) == b"keep"
    assert remove_expired_attachments() == 0


@pytest.mark.django_db
def test_sweep_removes_abandoned_uploads(client_for, attachment_dir, django_capture_on_commit_callbacks):
    from apps.attachments.models import AttachmentStatus
    from apps.attachments.storage import blob_name, open_writer

    attachment_id = uuid.uuid4()
    writer = open_writer(blob_name(attachment_id))
    writer.write(b"partial")  # a crashed upload: .part file, row still uploading
    Attachment.objects.create(
        id=attachment_id, user_id="bob", filename="f", content_type="text/plain", storage_name=blob_name(attachment_id),
        encrypted=True, status=AttachmentStatus.UPLOADING, created_at=timezone.now(),
        expires_at=timezone.now() - timedelta(seconds=1),
    )
    assert len(blobs(attachment_dir)) == 1
    with django_capture_on_commit_callbacks(execute=True):
        assert remove_expired_attachments() == 1
    assert blobs(attachment_dir) == []


# --- Admin list -------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_admin_list(client_for):
    bob, charlie, alice = client_for("bob"), client_for("charlie"), client_for("alice")
    ids = [upload_ok(bob, b"b%d" % i)["id"] for i in range(3)] + [upload_ok(charlie, b"c")["id"]]
    assert_error(bob.get("/v1/admin/attachments"), 403, "forbidden")
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 3, **({"afterCursor": cursor} if cursor else {})}
        page = alice.get("/v1/admin/attachments", params)
        assert page.status_code == 200, page.content
        body = page.json()
        assert set(body) == {"data", "afterCursor"}
        seen += [item["id"] for item in body["data"]]
        cursor = body["afterCursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))  # newest first, each once
    only_charlie = alice.get("/v1/admin/attachments", {"userId": "charlie"}).json()["data"]
    assert [(item["id"], item["userId"]) for item in only_charlie] == [(ids[3], "charlie")]
    assert set(only_charlie[0]) == FIELDS | {"userId", "createdAt"}
    auditor = client_for("audrey", roles=("user", "auditor"))
    assert auditor.get("/v1/admin/attachments").status_code == 200
    for params in ({"limit": 0}, {"limit": 1001}, {"limit": "x"}, {"afterCursor": "%%%"}):
        assert_error(alice.get("/v1/admin/attachments", params), 400, "validation_error")
    assert alice.get("/v1/admin/attachments", {"limit": 1000}).status_code == 200
    records = AdminAuditRecord.objects.filter(action="admin.attachments.list")
    assert records.filter(user_id="alice").count() >= 3 and records.filter(user_id="audrey").count() == 1
    assert not records.filter(user_id="bob").exists()


# --- Links from conversation entries ----------------------------------------------------------------------------


def _append(client, conversation_id: str, *items: dict):
    return client.post(f"/v1/conversations/{conversation_id}/entries", {"content": list(items)}, format="json")


@pytest.mark.django_db
def test_conversation_readers_can_read_a_linked_attachment(client_for):
    bob, charlie, dave = client_for("bob"), client_for("charlie"), client_for("dave")
    meta = upload_ok(bob, b"for the conversation")
    conversation_id = str(uuid.uuid4())
    response = _append(bob, conversation_id, {"role": "USER", "text": "see file", "attachmentId": meta["id"]})
    assert response.status_code == 201, response.content
    assert AttachmentLink.objects.filter(attachment_id=meta["id"], conversation_id=conversation_id).count() == 1
    assert_error(charlie.get(meta["href"]), 403, "forbidden")  # not a member yet
    grant = bob.post(
        f"/v1/conversations/{conversation_id}/memberships", {"userId": "charlie", "accessLevel": "reader"}, format="json"
    )
    assert grant.status_code == 201, grant.content
    assert body_of(charlie.get(meta["href"])) == b"for the conversation"
    url = charlie.get(f"{meta['href']}/download-url").json()["url"]
    assert body_of(APIClient().get(url)) == b"for the conversation"
    assert_error(charlie.delete(meta["href"]), 403, "forbidden")  # readers read; only uploader/admin delete
    assert_error(dave.get(meta["href"]), 403, "forbidden")  # a non-member
    assert bob.delete(f"/v1/conversations/{conversation_id}/memberships/charlie").status_code == 204
    assert_error(charlie.get(meta["href"]), 403, "forbidden")  # membership gone, access gone


@pytest.mark.django_db
def test_a_signed_link_stops_working_when_its_signer_loses_access(client_for):
    """Issue 28 item 8: a removed member's signed link went on working until it expired (up to 300 s). The link is
    checked at download time against whoever signed it."""
    bob, charlie = client_for("bob"), client_for("charlie")
    meta = upload_ok(bob, b"members only")
    conversation_id = str(uuid.uuid4())
    assert _append(bob, conversation_id, {"role": "USER", "attachmentId": meta["id"]}).status_code == 201
    grant = {"userId": "charlie", "accessLevel": "reader"}
    assert bob.post(f"/v1/conversations/{conversation_id}/memberships", grant, format="json").status_code == 201
    charlies = charlie.get(f"{meta['href']}/download-url").json()["url"]
    bobs = bob.get(f"{meta['href']}/download-url").json()["url"]
    assert body_of(APIClient().get(charlies)) == b"members only"
    assert APIClient().head(charlies).status_code == 200

    assert bob.delete(f"/v1/conversations/{conversation_id}/memberships/charlie").status_code == 204
    error = assert_error(APIClient().get(charlies), 403, "forbidden")
    assert "no longer" in error["error"]
    assert APIClient().head(charlies).status_code == 403
    assert body_of(APIClient().get(bobs)) == b"members only"  # the uploader's own link still works


@pytest.mark.django_db
def test_a_signed_link_made_through_an_api_key_client_reads_as_that_client(client_for):
    """A context entry's attachment is readable by its conversation's readers only through the entry's client
    (D5, D7): so is a link one of them signed through that client, and not one signed without it."""
    from tests.conftest import TEST_API_KEY

    bob = client_for("bob")
    charlie_direct, charlie_agent = client_for("charlie"), client_for("charlie", api_key=TEST_API_KEY)
    bob_agent = client_for("bob", api_key=TEST_API_KEY)
    meta = upload_ok(bob, b"agent context")
    conversation_id = str(uuid.uuid4())
    item = {"role": "USER", "attachmentId": meta["id"]}
    response = bob_agent.post(f"/v1/conversations/{conversation_id}/entries",
                              {"channel": "context", "content": [item]}, format="json")  # fmt: skip
    assert response.status_code == 201, response.content
    grant = {"userId": "charlie", "accessLevel": "reader"}
    assert bob.post(f"/v1/conversations/{conversation_id}/memberships", grant, format="json").status_code == 201
    assert_error(charlie_direct.get(f"{meta['href']}/download-url"), 403, "forbidden")
    url = charlie_agent.get(f"{meta['href']}/download-url").json()["url"]
    assert body_of(APIClient().get(url)) == b"agent context"


@pytest.mark.django_db
def test_linked_attachment_no_longer_expires(client_for, attachment_dir):
    bob = client_for("bob")
    meta = upload_ok(bob, b"kept")
    conversation_id = str(uuid.uuid4())
    assert _append(bob, conversation_id, {"role": "USER", "attachmentId": meta["id"]}).status_code == 201
    Attachment.objects.filter(id=meta["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert remove_expired_attachments() == 0
    assert body_of(bob.get(meta["href"])) == b"kept"
    assert len(blobs(attachment_dir)) == 1


@pytest.mark.django_db
def test_deleting_the_conversation_drops_its_links(client_for, attachment_dir, django_capture_on_commit_callbacks):
    bob, charlie = client_for("bob"), client_for("charlie")
    meta = upload_ok(bob, b"shared once")
    conversation_id = str(uuid.uuid4())
    assert _append(bob, conversation_id, {"role": "USER", "attachmentId": meta["id"]}).status_code == 201
    grant = {"userId": "charlie", "accessLevel": "reader"}
    assert bob.post(f"/v1/conversations/{conversation_id}/memberships", grant, format="json").status_code == 201
    assert body_of(charlie.get(meta["href"])) == b"shared once"
    assert bob.delete(f"/v1/conversations/{conversation_id}").status_code == 204
    assert not AttachmentLink.objects.exists()
    assert_error(charlie.get(meta["href"]), 403, "forbidden")
    assert body_of(bob.get(meta["href"])) == b"shared once"  # still the uploader's until it expires
    Attachment.objects.filter(id=meta["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert remove_expired_attachments() == 1
    assert blobs(attachment_dir) == []


@pytest.mark.django_db
def test_only_the_uploader_may_link(client_for):
    bob, charlie = client_for("bob"), client_for("charlie")
    meta = upload_ok(bob, b"bob's")
    conversation_id = str(uuid.uuid4())
    response = _append(charlie, conversation_id, {"role": "USER", "text": "steal", "attachmentId": meta["id"]})
    assert_error(response, 403, "forbidden")
    assert not AttachmentLink.objects.exists()
    assert charlie.get(f"/v1/conversations/{conversation_id}").status_code == 404  # the append rolled back whole
    assert_error(charlie.get(meta["href"]), 403, "forbidden")


@pytest.mark.django_db
def test_unknown_or_expired_attachment_is_400(client_for):
    bob = client_for("bob")
    conversation_id = str(uuid.uuid4())
    body = assert_error(
        _append(bob, conversation_id, {"role": "USER", "attachmentId": str(uuid.uuid4())}), 400, "validation_error"
    )
    assert body["details"]["fields"]
    expired = upload_ok(bob, b"old")
    Attachment.objects.filter(id=expired["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert_error(_append(bob, conversation_id, {"role": "USER", "attachmentId": expired["id"]}), 400, "validation_error")
    deleted = upload_ok(bob, b"del")
    assert bob.delete(deleted["href"]).status_code == 204
    assert_error(_append(bob, conversation_id, {"role": "USER", "attachmentId": deleted["id"]}), 400, "validation_error")
    assert not AttachmentLink.objects.exists()


@pytest.mark.django_db
def test_one_entry_may_reference_several_and_twice(client_for):
    bob = client_for("bob")
    first, second = upload_ok(bob, b"1"), upload_ok(bob, b"2")
    conversation_id = str(uuid.uuid4())
    response = _append(
        bob,
        conversation_id,
        {"role": "USER", "attachmentId": first["id"]},
        {"role": "USER", "attachmentId": second["id"]},
        {"role": "AI", "text": "again", "attachmentId": first["id"]},
    )
    assert response.status_code == 201, response.content
    assert AttachmentLink.objects.count() == 2


@pytest.mark.django_db
def test_an_items_attachments_array_links_like_attachment_id(client_for, attachment_dir):
    """D10: ``attachments: [{"attachmentId": ...}]`` (the upstream clients' shape) links each referenced file exactly
    as an item's ``attachmentId`` does: readable by the conversation's readers, never expiring; an external
    reference without an id (``href``) is kept as sent and links nothing."""
    bob, charlie = client_for("bob"), client_for("charlie")
    first, second = upload_ok(bob, b"first file"), upload_ok(bob, b"second file")
    conversation_id = str(uuid.uuid4())
    item = {
        "role": "AI",
        "text": "two files",
        "attachments": [
            {"attachmentId": first["id"], "name": "first.txt", "contentType": "text/plain"},
            {"href": "https://example.com/cat.png", "contentType": "image/png"},
            {"attachmentId": second["id"]},
        ],
    }
    response = _append(bob, conversation_id, item)
    assert response.status_code == 201, response.content
    assert response.json()["content"] == [item]
    linked = set(AttachmentLink.objects.filter(conversation_id=conversation_id).values_list("attachment_id", flat=True))
    assert {str(value) for value in linked} == {first["id"], second["id"]}
    grant = {"userId": "charlie", "accessLevel": "reader"}
    assert bob.post(f"/v1/conversations/{conversation_id}/memberships", grant, format="json").status_code == 201
    assert body_of(charlie.get(first["href"])) == b"first file"
    assert body_of(charlie.get(second["href"])) == b"second file"
    Attachment.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert remove_expired_attachments() == 0
    assert len(blobs(attachment_dir)) == 2


@pytest.mark.django_db
def test_an_attachments_array_obeys_the_linking_rules(client_for):
    bob, charlie = client_for("bob"), client_for("charlie")
    meta = upload_ok(bob, b"bob's")
    conversation_id = str(uuid.uuid4())
    stolen = {"role": "USER", "attachments": [{"attachmentId": meta["id"]}]}
    assert_error(_append(charlie, conversation_id, stolen), 403, "forbidden")
    unknown = {"role": "USER", "attachments": [{"attachmentId": str(uuid.uuid4())}]}
    assert_error(_append(bob, conversation_id, unknown), 400, "validation_error")
    assert not AttachmentLink.objects.exists()


# --- OpenAPI ----------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_openapi_documents_the_attachment_endpoints(api):
    schema = api.get("/openapi.json").json()
    paths = schema["paths"]
    upload_op = paths["/v1/attachments"]["post"]
    multipart = upload_op["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert multipart["properties"]["file"]["format"] == "binary" and multipart["required"] == ["file"]
    assert {"201", "400", "401", "408", "413"} <= set(upload_op["responses"])
    assert {"get", "delete"} <= set(paths["/v1/attachments/{id}"])
    assert "304" in paths["/v1/attachments/{id}"]["get"]["responses"]
    assert "get" in paths["/v1/attachments/{id}/download-url"]
    signed = paths["/v1/attachments/download/{token}/{filename}"]["get"]
    assert {} in signed["security"]  # the empty requirement: no credentials needed
    assert "get" in paths["/v1/admin/attachments"]


# --- Key rotation -----------------------------------------------------------------------------------------------


def _rotate(**options) -> str:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    options.setdefault("no_progress", True)
    call_command("rotate_encryption_key", stdout=out, **options)
    return out.getvalue()


def _kid_of(path) -> str:
    with open(path, "rb") as handle:
        return crypto.stream_key_id(handle.read(crypto.MAX_STREAM_HEADER))


@pytest.mark.django_db
@pytest.mark.usefixtures("own_key_rings")
def test_rotate_encryption_key_reseals_blobs(client_for, settings, attachment_dir, capsys):
    import base64

    old, new = base64.b64encode(os.urandom(32)).decode(), base64.b64encode(os.urandom(32)).decode()
    settings.MEMORY_ENCRYPTION_KEYS = f"old:{old}"
    bob = client_for("bob")
    payloads = [os.urandom(size) for size in (0, 10, 3 * crypto.STREAM_CHUNK_BYTES + 5)]
    metas = [upload_ok(bob, data) for data in payloads]
    settings.ATTACHMENT_ENCRYPTION = False
    plain = upload_ok(bob, b"not encrypted")  # left alone
    settings.ATTACHMENT_ENCRYPTION = True
    paths = {meta["id"]: next(p for p in blobs(attachment_dir) if p.name == meta["id"]) for meta in metas}
    assert {_kid_of(path) for path in paths.values()} == {"old"}

    settings.MEMORY_ENCRYPTION_KEYS = f"new:{new},old:{old}"
    current = upload_ok(bob, b"already under the new key")
    assert "attachments.blob: 3 file(s) to re-encrypt" in _rotate(dry_run=True)
    assert {_kid_of(path) for path in paths.values()} == {"old"}  # a dry run writes nothing

    output = _rotate(no_progress=False)
    assert "attachments.blob: rotated 3, already current 1, failed 0, remaining 0" in output
    assert "attachments.blob" in capsys.readouterr().err  # the progress bar
    assert {_kid_of(path) for path in paths.values()} == {"new"}
    assert not [p for p in blobs(attachment_dir) if p.name.endswith(".part")]

    settings.MEMORY_ENCRYPTION_KEYS = f"new:{new}"  # the old key retired: everything still downloads, same ETag
    for meta, data in zip(metas, payloads, strict=True):
        response = bob.get(meta["href"])
        assert body_of(response) == data and response["ETag"] == f'"{sha256(data)}"'
    assert body_of(bob.get(plain["href"])) == b"not encrypted"
    assert body_of(bob.get(current["href"])) == b"already under the new key"
    assert "attachments.blob: rotated 0, already current 4, failed 0, remaining 0" in _rotate()


@pytest.mark.django_db
@pytest.mark.usefixtures("own_key_rings")  # without it, a live server's ring reported minutes before failed it
def test_rotation_reports_a_blob_that_does_not_open(client_for, settings, attachment_dir):
    import base64

    from django.core.management.base import CommandError

    old, new = base64.b64encode(os.urandom(32)).decode(), base64.b64encode(os.urandom(32)).decode()
    settings.MEMORY_ENCRYPTION_KEYS = f"old:{old}"
    bob = client_for("bob")
    good, bad = upload_ok(bob, b"good" * 1000), upload_ok(bob, b"bad" * 1000)
    bad_path = next(p for p in blobs(attachment_dir) if p.name == bad["id"])
    damaged = bytearray(bad_path.read_bytes())
    damaged[-1] ^= 1
    bad_path.write_bytes(bytes(damaged))
    settings.MEMORY_ENCRYPTION_KEYS = f"new:{new},old:{old}"
    with pytest.raises(CommandError, match="could not be decrypted"):
        _rotate()
    assert bad_path.read_bytes() == bytes(damaged)  # left as it was, nothing half-written
    assert not [p for p in blobs(attachment_dir) if p.name.endswith(".part")]
    assert body_of(bob.get(good["href"])) == b"good" * 1000
