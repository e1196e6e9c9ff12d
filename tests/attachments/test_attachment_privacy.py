"""Who reads an attachment (issue 21 items 2 and 3): whoever may read an entry referencing it, and its uploader.

- A link from a ``context`` entry (private to its API-key client, D5) lets the conversation's readers read the
  attachment only through that client; without a client, or through another one, it stays the uploader's (403).
- Admins and auditors get no bypass on the user endpoints (D7 names only the uploader and the conversation's
  readers); they read through ``GET /v1/admin/attachments/{id}``, which is audit-logged, as is an admin's delete of
  someone else's attachment.
"""

from __future__ import annotations

import logging
import uuid

import pytest
from rest_framework.test import APIClient

from apps.attachments.models import AttachmentLink
from apps.core.models import AdminAuditRecord
from apps.identity.api_keys import create_key
from tests.attachments.conftest import body_of, upload_ok
from tests.conftest import TEST_API_KEY

pytestmark = pytest.mark.django_db

ADMIN_ATTACHMENTS = "/v1/admin/attachments"


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:300])
    body = response.json()
    assert body["code"] == code and body["error"] and body["requestId"] == response["X-Request-ID"]
    return body


def _append(client, conversation_id: str, body: dict):
    response = client.post(f"/v1/conversations/{conversation_id}/entries", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def _share(client, conversation_id: str, user_id: str, level: str = "reader") -> None:
    body = {"userId": user_id, "accessLevel": level}
    response = client.post(f"/v1/conversations/{conversation_id}/memberships", body, format="json")
    assert response.status_code == 201, response.content


def _readable(client, meta: dict) -> bool:
    """Download and signed download-url agree: both 200 (and the URL works) or both 403."""
    download = client.get(meta["href"])
    url = client.get(f"{meta['href']}/download-url")
    if download.status_code == 200:
        assert body_of(download) == b"private notes"
        assert url.status_code == 200, url.content
        assert body_of(APIClient().get(url.json()["url"])) == b"private notes"
        return True
    assert_error(download, 403, "forbidden")
    assert_error(url, 403, "forbidden")
    return False


@pytest.fixture
def context_linked(client_for):
    """bob's attachment referenced only from a context entry bob wrote through the test client, in a conversation
    charlie reads."""
    bob = client_for("bob", api_key=TEST_API_KEY)
    meta = upload_ok(bob, b"private notes")
    conversation_id = str(uuid.uuid4())
    _append(bob, conversation_id, {"content": [{"role": "USER", "text": "history"}]})
    _append(bob, conversation_id, {"channel": "context", "content": [{"attachmentId": meta["id"], "k": "v"}]})
    _share(bob, conversation_id, "charlie")
    return meta, conversation_id


def test_a_context_entrys_attachment_is_not_readable_by_other_members_without_its_client(client_for, context_linked):
    meta, _ = context_linked
    assert AttachmentLink.objects.get(attachment_id=meta["id"]).client_id == "test-client"
    assert not _readable(client_for("charlie"), meta)
    other = create_key("other-app")
    assert not _readable(client_for("charlie", api_key=other.key), meta)
    assert not _readable(client_for("dave", api_key=TEST_API_KEY), meta)  # the client, but no member


def test_a_context_entrys_attachment_is_readable_by_members_through_its_client_and_by_the_uploader(
    client_for, context_linked
):
    meta, _ = context_linked
    assert _readable(client_for("charlie", api_key=TEST_API_KEY), meta)  # they read the entry: they read the file
    assert _readable(client_for("bob"), meta)  # the uploader, with or without a client
    assert _readable(client_for("bob", api_key=TEST_API_KEY), meta)


def test_a_history_link_next_to_a_context_link_makes_it_readable_by_every_reader(client_for, context_linked):
    meta, conversation_id = context_linked
    _append(client_for("bob"), conversation_id, {"content": [{"role": "USER", "attachmentId": meta["id"]}]})
    assert _readable(client_for("charlie"), meta)


def test_removing_the_member_ends_their_access_through_the_client(client_for, context_linked):
    meta, conversation_id = context_linked
    charlie = client_for("charlie", api_key=TEST_API_KEY)
    assert _readable(charlie, meta)
    assert client_for("bob").delete(f"/v1/conversations/{conversation_id}/memberships/charlie").status_code == 204
    assert not _readable(charlie, meta)


# --- Admins and auditors (item 3) -------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["alice", "auditor"])
def test_admins_and_auditors_get_no_bypass_on_the_user_endpoints(client_for, who):
    staff = client_for("alice") if who == "alice" else client_for("aude", roles=("user", "auditor"))
    meta = upload_ok(client_for("bob"), b"private notes")
    before = AdminAuditRecord.objects.count()
    assert not _readable(staff, meta)
    assert AdminAuditRecord.objects.count() == before  # nothing was read, nothing to record


@pytest.mark.parametrize("who", ["alice", "auditor"])
def test_admins_and_auditors_read_through_the_admin_endpoint_audited(client_for, caplog, who):
    staff = client_for("alice") if who == "alice" else client_for("aude", roles=("user", "auditor"))
    user_id = "alice" if who == "alice" else "aude"
    meta = upload_ok(client_for("bob"), b"private notes", content_type="text/html")
    with caplog.at_level(logging.INFO, logger="apps.audit"):
        response = staff.get(f"{ADMIN_ATTACHMENTS}/{meta['id']}")
    assert response.status_code == 200
    assert body_of(response) == b"private notes"
    assert response["ETag"] == f'"{meta["sha256"]}"'
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Content-Disposition"].startswith("attachment")  # an active type: never rendered inline
    record = AdminAuditRecord.objects.filter(action="admin.attachments.get").latest("id")
    assert (record.user_id, record.target_id, record.request_id) == (user_id, meta["id"], response["X-Request-ID"])
    assert "private notes" not in str(record.params)
    logged = [r for r in caplog.records if r.name == "apps.audit"]
    assert logged and getattr(logged[-1], "action", None) == "admin.attachments.get"


def test_admin_read_endpoint_refuses_users_and_answers_404_and_400(client_for):
    bob = client_for("bob")
    meta = upload_ok(bob, b"private notes")
    assert_error(bob.get(f"{ADMIN_ATTACHMENTS}/{meta['id']}"), 403, "forbidden")  # even the uploader: not staff
    assert not AdminAuditRecord.objects.filter(action="admin.attachments.get").exists()
    assert_error(APIClient().get(f"{ADMIN_ATTACHMENTS}/{meta['id']}"), 401, "unauthenticated")
    alice = client_for("alice")
    assert_error(alice.get(f"{ADMIN_ATTACHMENTS}/{uuid.uuid4()}"), 404, "not_found")
    assert_error(alice.get(f"{ADMIN_ATTACHMENTS}/nope"), 400, "validation_error")
    assert_error(alice.delete(f"{ADMIN_ATTACHMENTS}/{meta['id']}"), 405, "method_not_allowed")
    assert body_of(bob.get(meta["href"])) == b"private notes"  # untouched


def test_an_admins_delete_of_someone_elses_attachment_is_audited(client_for):
    bob, alice = client_for("bob"), client_for("alice")
    own = upload_ok(alice, b"alice's")
    assert alice.delete(own["href"]).status_code == 204  # her own: a user's call, not an admin one
    assert not AdminAuditRecord.objects.filter(action="admin.attachments.delete").exists()
    meta = upload_ok(bob, b"bob's")
    response = alice.delete(meta["href"])
    assert response.status_code == 204
    record = AdminAuditRecord.objects.get(action="admin.attachments.delete")
    assert (record.user_id, record.target_id, record.request_id) == ("alice", meta["id"], response["X-Request-ID"])
    assert_error(bob.get(meta["href"]), 404, "not_found")


def test_admin_read_is_in_the_openapi_schema(api):
    schema = api.get("/openapi.json").json()
    operation = schema["paths"][f"{ADMIN_ATTACHMENTS}/{{id}}"]["get"]
    assert "audit" in operation["description"].lower()
    assert set(schema["paths"][f"{ADMIN_ATTACHMENTS}/{{id}}"]) == {"get"}

