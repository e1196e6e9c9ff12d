"""Django admin pages of the conversation half: they load, search, and never show entry content."""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.django_db

PAGES = [
    "/admin/conversations/conversation/",
    "/admin/conversations/entry/",
    "/admin/sharing/membership/",
    "/admin/sharing/ownershiptransfer/",
]



def test_admin_pages_show_metadata_only(operator, client_for):
    bob = client_for("bob")
    cid = str(uuid.uuid4())
    # The first text becomes the (plaintext) title; the secret is in a later entry.
    assert bob.post(f"/v1/conversations/{cid}/entries", {"content": [{"role": "USER", "text": "hello"}]},
                    format="json").status_code == 201
    created = bob.post(f"/v1/conversations/{cid}/entries",
                       {"content": [{"role": "AI", "text": "hush-hush-content"}]}, format="json")
    assert created.status_code == 201
    bob.post(f"/v1/conversations/{cid}/memberships", {"userId": "charlie", "accessLevel": "reader"}, format="json")
    bob.post("/v1/ownership-transfers", {"conversationId": cid, "newOwnerUserId": "charlie"}, format="json")
    for page in PAGES:
        for query in ("", "?q=bob", "?q=not-a-uuid", f"?q={cid}"):
            response = operator.get(page + query)
            assert response.status_code == 200, (page, query)
            assert b"hush-hush-content" not in response.content
    detail = operator.get(f"/admin/conversations/entry/{created.json()['id']}/change/")
    assert detail.status_code == 200
    assert b"hush-hush-content" not in detail.content
