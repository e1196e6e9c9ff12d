"""Attachments on S3 (ATTACHMENT_STORAGE=s3 through django-storages) against moto started in server mode on
loopback: a real S3 HTTP endpoint, so multipart uploads, ranged streaming reads and presigned URLs go over HTTP."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import timedelta

import boto3
import pytest
import requests
from django.utils import timezone
from rest_framework.test import APIClient

from apps.attachments.models import Attachment
from apps.attachments.tasks import remove_expired_attachments
from apps.encryption import crypto
from tests.attachments.conftest import body_of, sha256, upload, upload_ok

pytestmark = pytest.mark.live  # a moto S3 server

REGION = "us-east-1"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per S3 request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def bucket(s3_endpoint, settings, monkeypatch):
    name = f"attachments-{uuid.uuid4().hex[:12]}"
    settings.ATTACHMENT_STORAGE = "s3"
    settings.ATTACHMENT_S3_BUCKET = name
    settings.ATTACHMENT_S3_ENDPOINT_URL = s3_endpoint
    settings.ATTACHMENT_S3_REGION = REGION
    settings.ATTACHMENT_S3_ACCESS_KEY_ID = "test-access-key"
    settings.ATTACHMENT_S3_SECRET_ACCESS_KEY = "test-secret-key"
    settings.ATTACHMENT_S3_ADDRESSING_STYLE = "path"
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name=REGION,
        aws_access_key_id="test-access-key",
        aws_secret_access_key="test-secret-key",
    )
    client.create_bucket(Bucket=name)
    client.bucket_name = name
    return client


def objects(bucket) -> dict[str, bytes]:
    listed = bucket.list_objects_v2(Bucket=bucket.bucket_name).get("Contents", [])
    return {item["Key"]: bucket.get_object(Bucket=bucket.bucket_name, Key=item["Key"])["Body"].read() for item in listed}


def pending_multipart_uploads(bucket) -> list:
    return bucket.list_multipart_uploads(Bucket=bucket.bucket_name).get("Uploads", [])


@pytest.mark.django_db
def test_round_trip_encrypted_on_s3(client_for, bucket, django_capture_on_commit_callbacks):
    bob = client_for("bob")
    data = b"S3-PLAINTEXT-MARKER " * 20000
    meta = upload_ok(bob, data)
    assert meta["sha256"] == sha256(data)
    stored = objects(bucket)
    assert list(stored) == [f"attachments/{meta['id'][:2]}/{meta['id']}"]
    [blob] = stored.values()
    assert b"S3-PLAINTEXT" not in blob and crypto.is_sealed_stream(blob)
    response = bob.get(meta["href"])
    assert response.status_code == 200
    assert body_of(response) == data
    assert response["ETag"] == f'"{meta["sha256"]}"'
    with django_capture_on_commit_callbacks(execute=True):
        assert bob.delete(meta["href"]).status_code == 204
    assert objects(bucket) == {}


@pytest.mark.django_db
def test_multipart_upload_of_a_large_file(client_for, bucket, settings):
    settings.ATTACHMENT_MAX_BYTES = 12 * 1024 * 1024
    bob = client_for("bob")
    data = os.urandom(11 * 1024 * 1024)  # more than two 5 MiB parts
    meta = upload_ok(bob, data)
    assert body_of(bob.get(meta["href"])) == data
    assert pending_multipart_uploads(bucket) == []


@pytest.mark.django_db
def test_over_the_limit_leaves_nothing_on_s3(client_for, bucket, settings):
    settings.ATTACHMENT_MAX_BYTES = 6 * 1024 * 1024
    bob = client_for("bob")
    response = upload(bob, os.urandom(6 * 1024 * 1024 + 1))  # one 5 MiB part is sent before the limit is hit
    assert response.status_code == 413, response.content
    assert objects(bucket) == {}
    assert pending_multipart_uploads(bucket) == []
    assert Attachment.objects.count() == 0


@pytest.mark.django_db
def test_empty_file_on_s3(client_for, bucket, settings):
    settings.ATTACHMENT_ENCRYPTION = False
    bob = client_for("bob")
    meta = upload_ok(bob, b"")
    assert meta["size"] == 0
    assert body_of(bob.get(meta["href"])) == b""


@pytest.mark.django_db
def test_direct_download_redirects_to_a_presigned_url(client_for, bucket, settings):
    settings.ATTACHMENT_ENCRYPTION = False  # the object store's own encryption; the service hands out URLs
    settings.ATTACHMENT_S3_DIRECT_DOWNLOAD = True
    bob = client_for("bob")
    data = b"<html>direct</html>"
    meta = upload_ok(bob, data, filename="page.html", content_type="text/html")
    [blob] = objects(bucket).values()
    assert blob == data
    response = bob.get(meta["href"])
    assert response.status_code == 302
    location = response["Location"]
    assert location.startswith(settings.ATTACHMENT_S3_ENDPOINT_URL) and "X-Amz-Signature=" in location
    fetched = requests.get(location, timeout=10)
    assert fetched.status_code == 200 and fetched.content == data
    assert fetched.headers["Content-Type"] == "text/html"
    assert fetched.headers["Content-Disposition"].startswith("attachment")
    # The signed, credential-free URL redirects the same way.
    url = bob.get(f"{meta['href']}/download-url").json()["url"]
    signed = APIClient().get(url)
    assert signed.status_code == 302
    assert requests.get(signed["Location"], timeout=10).content == data


@pytest.mark.django_db
def test_direct_download_never_redirects_service_encrypted_objects(client_for, bucket, settings):
    settings.ATTACHMENT_S3_DIRECT_DOWNLOAD = True
    bob = client_for("bob")
    meta = upload_ok(bob, b"sealed by the service")
    response = bob.get(meta["href"])
    assert response.status_code == 200
    assert body_of(response) == b"sealed by the service"


@pytest.mark.django_db
def test_expiry_sweep_removes_the_object(client_for, bucket, django_capture_on_commit_callbacks):
    bob = client_for("bob")
    meta = upload_ok(bob, b"short-lived")
    Attachment.objects.filter(id=meta["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert remove_expired_attachments() == 1
    assert objects(bucket) == {}


@pytest.mark.django_db
def test_an_object_missing_from_the_bucket_is_500_blob_missing_and_expiry_logs_it(
    client_for, bucket, caplog, django_capture_on_commit_callbacks
):
    import logging

    bob = client_for("bob")
    meta = upload_ok(bob, b"emptied by hand")
    [key] = objects(bucket)
    bucket.delete_object(Bucket=bucket.bucket_name, Key=key)
    with caplog.at_level(logging.INFO, logger="apps.attachments"):
        response = bob.get(meta["href"])
        assert response.status_code == 500 and response.json()["code"] == "blob_missing"
        Attachment.objects.filter(id=meta["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
        with django_capture_on_commit_callbacks(execute=True):
            assert remove_expired_attachments() == 1
    logged = [(r.levelno, r.getMessage(), r.attachment_id) for r in caplog.records if "missing" in r.getMessage()]
    assert logged == [
        (logging.ERROR, "attachment blob missing from storage", meta["id"]),
        (logging.ERROR, "attachment blob missing when its row expired", meta["id"]),
    ]
