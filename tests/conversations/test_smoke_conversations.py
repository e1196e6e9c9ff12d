"""Smoke tests of the conversation endpoints (the implementer's; the full matrix lives in the other test files)."""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.django_db

CONVERSATIONS = "/v1/conversations"


def test_create_get_list(client_for):
    bob = client_for("bob")
    response = bob.post(CONVERSATIONS, {"title": "Trip", "metadata": {"k": 1}}, format="json")
    assert response.status_code == 201, response.content
    created = response.json()
    assert set(created) == {"id", "title", "ownerUserId", "createdAt", "updatedAt", "accessLevel", "metadata",
                            "forkedAtConversationId", "forkedAtEntryId"}
    assert created["ownerUserId"] == "bob" and created["accessLevel"] == "owner" and created["metadata"] == {"k": 1}

    got = bob.get(f"{CONVERSATIONS}/{created['id']}")
    assert got.status_code == 200 and got.json() == created

    listed = bob.get(CONVERSATIONS)
    assert listed.status_code == 200
    assert listed.json() == {"data": [{key: created[key] for key in
                                       ("id", "title", "ownerUserId", "createdAt", "updatedAt", "accessLevel")}],
                             "afterCursor": None}
    assert client_for("charlie").get(CONVERSATIONS).json()["data"] == []
    assert client_for("charlie").get(f"{CONVERSATIONS}/{created['id']}").status_code == 403


def test_client_chosen_id_conflict_and_bad_input(client_for):
    bob = client_for("bob")
    chosen = str(uuid.uuid4())
    assert bob.post(CONVERSATIONS, {"id": chosen}, format="json").status_code == 201
    conflict = bob.post(CONVERSATIONS, {"id": chosen}, format="json")
    assert conflict.status_code == 409 and conflict.json()["code"] == "conflict"
    for body in ({"nope": 1}, {"id": 5}, {"id": "x"}, {"title": 5}, {"title": "x" * 501}, {"metadata": []},
                 {"metadata": {"a": "\x00"}}, [1]):
        response = bob.post(CONVERSATIONS, body, format="json")
        assert response.status_code == 400, (body, response.content)
        assert response.json()["code"] == "validation_error"
    assert bob.get(f"{CONVERSATIONS}/not-a-uuid").status_code == 400
    assert bob.get(f"{CONVERSATIONS}/{uuid.uuid4()}").status_code == 404
    assert bob.get(f"{CONVERSATIONS}?limit=0").status_code == 400
    assert bob.get(f"{CONVERSATIONS}?mode=nope").status_code == 400
    assert bob.get(f"{CONVERSATIONS}?afterCursor=garbage").status_code == 400


def test_list_pages_newest_first(client_for):
    bob = client_for("bob")
    ids = [bob.post(CONVERSATIONS, {"title": f"c{i}"}, format="json").json()["id"] for i in range(7)]
    seen, cursor = [], None
    while True:
        params = {"limit": 3, **({"afterCursor": cursor} if cursor else {})}
        body = bob.get(CONVERSATIONS, params).json()
        seen += [item["id"] for item in body["data"]]
        cursor = body["afterCursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    assert [c["title"] for c in bob.get(CONVERSATIONS, {"query": "C3"}).json()["data"]] == ["c3"]


def test_unauthenticated(api):
    response = api.get(CONVERSATIONS)
    assert response.status_code == 401 and response.json()["code"] == "unauthenticated"


def test_lone_surrogates_and_nul_are_400_not_500(client_for):
    bob = client_for("bob")
    raw = '{"title": "\\ud800"}'
    response = bob.generic("POST", CONVERSATIONS, raw, content_type="application/json")
    assert response.status_code == 400, response.content
    cid = str(uuid.uuid4())
    for raw in ('{"content": [{"role": "USER", "text": "\\udfff"}]}',
                '{"content": [{"role": "USER", "text": "ok"}], "indexedContent": "\\ud800"}',
                '{"content": [{"role": "USER", "text": "ok"}], "indexedContent": "a\\u0000b"}',
                '{"content": [{"role": "USER", "text": "x"}], "contentType": "\\ud800"}'):
        response = bob.generic("POST", f"{CONVERSATIONS}/{cid}/entries", raw, content_type="application/json")
        assert response.status_code == 400, (raw, response.content)
    # NUL inside encrypted content is fine; the title derived from it drops the NUL.
    ok = bob.generic("POST", f"{CONVERSATIONS}/{cid}/entries", '{"content": [{"role": "USER", "text": "a\\u0000b"}]}',
                     content_type="application/json")
    assert ok.status_code == 201, ok.content
    assert bob.get(f"{CONVERSATIONS}/{cid}").json()["title"] == "ab"
    members = f"{CONVERSATIONS}/{cid}/memberships"
    response = bob.generic("POST", members, '{"userId": "\\ud800", "accessLevel": "reader"}',
                           content_type="application/json")
    assert response.status_code == 400


def test_metrics_name_routes_like_the_openapi_paths(client_for, api):
    bob = client_for("bob")
    cid = bob.post(CONVERSATIONS, {}, format="json").json()["id"]
    assert bob.get(f"{CONVERSATIONS}/{cid}/memberships").status_code == 200
    text = api.get("/metrics").content.decode()
    assert 'route="/v1/conversations/{conversationId}/memberships"' in text
    assert cid not in text
