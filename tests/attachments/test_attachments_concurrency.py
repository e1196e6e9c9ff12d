"""Attachments under real concurrency: threads with their own database connections against the service (D7)."""

from __future__ import annotations

import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable

import pytest
from django.db import connections

from apps.attachments.models import Attachment, AttachmentLink
from tests.attachments.conftest import blobs, body_of, sha256, upload, upload_ok


def run_concurrently(count: int, work: Callable[[int], object]) -> list[object]:
    """``work(i)`` in ``count`` threads released together; results in order, exceptions re-raised."""
    barrier = threading.Barrier(count)
    results: list[object] = [None] * count

    def run(index: int) -> None:
        try:
            barrier.wait()
            results[index] = work(index)
        except BaseException as exc:  # reported below, in the test's thread
            results[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


@pytest.mark.django_db(transaction=True)
def test_sixteen_concurrent_uploads_all_land_intact(client_for, attachment_dir):
    payloads = [os.urandom(150_000 + index * 1000) for index in range(16)]

    def work(index: int) -> tuple[int, dict]:
        response = upload(client_for(f"user{index % 4}"), payloads[index], filename=f"f{index}.bin")
        return response.status_code, response.json()

    results = run_concurrently(16, work)
    assert [status for status, _ in results] == [201] * 16
    for index, (_, meta) in enumerate(results):
        assert meta["sha256"] == sha256(payloads[index]) and meta["size"] == len(payloads[index])
        assert body_of(client_for(f"user{index % 4}").get(meta["href"])) == payloads[index]
    assert Attachment.objects.count() == 16
    assert len(blobs(attachment_dir)) == 16


@pytest.mark.django_db(transaction=True)
def test_concurrent_deletes_and_downloads_of_one_attachment(client_for, attachment_dir):
    data = os.urandom(300_000)
    meta = upload_ok(client_for("bob"), data)

    def work(index: int) -> tuple[str, int, bool]:
        client = client_for("bob")
        if index % 2 == 0:
            return "delete", client.delete(meta["href"]).status_code, True
        response = client.get(meta["href"] if index % 4 == 1 else f"{meta['href']}/download-url")
        intact = True
        if response.status_code == 200 and index % 4 == 1:
            intact = body_of(response) == data  # a download that started finishes whole
        return "read", response.status_code, intact

    results = run_concurrently(32, work)
    deletes = Counter(status for kind, status, _ in results if kind == "delete")
    reads = Counter(status for kind, status, _ in results if kind == "read")
    assert deletes == Counter({204: 1, 404: 15}), deletes
    assert set(reads) <= {200, 404}, reads
    assert all(intact for _, _, intact in results)
    assert not Attachment.objects.filter(id=meta["id"]).exists()
    assert blobs(attachment_dir) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("shape", ["attachmentId", "attachments"])
def test_concurrent_links_and_delete(client_for, attachment_dir, shape):
    """32 clients: most reference the attachment in new entries (by an item's ``attachmentId`` or its
    ``attachments`` array, D10) while others delete it. Every append either links a live attachment (201) or finds
    it gone (400); no link survives to a deleted attachment."""
    meta = upload_ok(client_for("bob"), b"contended")
    reference = {"attachmentId": meta["id"]} if shape == "attachmentId" else {"attachments": [{"attachmentId": meta["id"]}]}

    def work(index: int) -> int:
        client = client_for("bob")
        if index % 8 == 7:
            return client.delete(meta["href"]).status_code
        body = {"content": [{"role": "USER", "text": f"m{index}", **reference}]}
        return client.post(f"/v1/conversations/{uuid.uuid4()}/entries", body, format="json").status_code

    statuses = run_concurrently(32, work)
    assert all(status < 500 for status in statuses), statuses
    delete_statuses = Counter(statuses[index] for index in range(32) if index % 8 == 7)
    assert delete_statuses == Counter({204: 1, 404: 3}), delete_statuses
    assert set(statuses[index] for index in range(32) if index % 8 != 7) <= {201, 400}
    assert not AttachmentLink.objects.exists()  # the delete cascaded every link made before it
    assert blobs(attachment_dir) == []
