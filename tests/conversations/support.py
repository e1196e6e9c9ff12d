"""Helpers shared by the conversation and sharing tests (tests/conversations, tests/sharing).

Everything goes through the public HTTP API; the database is read with raw SQL on the table names fixed by the
conversation decisions (``conversations``, ``conversation_entries``, ``conversation_memberships``,
``conversation_ownership_transfers``, ``admin_audit_log``) so these tests never import the apps' models.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import pytest
import requests
from django.db import connection

CONVERSATIONS = "/v1/conversations"
TRANSFERS = "/v1/ownership-transfers"
ADMIN = "/v1/admin/conversations"
SEARCH = f"{CONVERSATIONS}/search"

ISO_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
LIST_FIELDS = {"id", "title", "ownerUserId", "createdAt", "updatedAt", "accessLevel"}
FULL_FIELDS = LIST_FIELDS | {"metadata", "forkedAtConversationId", "forkedAtEntryId"}
ENTRY_FIELDS = {"id", "conversationId", "userId", "channel", "contentType", "content", "createdAt"}
MEMBERSHIP_FIELDS = {"conversationId", "userId", "accessLevel", "createdAt"}
TRANSFER_FIELDS = {"id", "conversationId", "fromUserId", "toUserId", "createdAt"}
FORK_FIELDS = {"conversationId", "title", "forkedAtConversationId", "forkedAtEntryId", "createdAt"}
RESULT_FIELDS = {"conversationId", "conversationTitle", "entryId", "score", "highlights", "entry"}

# The actors of the access matrix: four members of one conversation, a stranger, the two privileged roles (members
# of nothing) and an anonymous caller. Names are distinct from the dev users so no test depends on dev-IdP data.
OWNER, MANAGER, WRITER, READER = "olivia", "mandy", "walt", "rita"
NON_MEMBER, ADMIN_USER, AUDITOR_USER = "nora", "adam", "aude"
ROLES: dict[str, tuple[str, ...]] = {ADMIN_USER: ("user", "admin"), AUDITOR_USER: ("user", "auditor")}


def url(path: str, **params: Any) -> str:
    params = {name: value for name, value in params.items() if value is not None}
    return f"{path}?{urlencode(params, doseq=True)}" if params else path


def conv_path(conversation_id: Any, *rest: str) -> str:
    return "/".join([CONVERSATIONS, str(conversation_id), *rest])


def history(text: str = "hello", role: str = "USER") -> list[dict[str, str]]:
    return [{"role": role, "text": text}]


# --- D1 error assertions --------------------------------------------------------------------------------------------


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert body["code"] == code, body
    assert isinstance(body["error"], str) and body["error"]
    assert body["requestId"] == response["X-Request-ID"]
    return body


def assert_validation_error(response, *fields: str) -> dict:
    """A D1 400 whose details.fields names ``fields`` (when given; ``content[0]``/``content.0`` count as content)."""
    body = assert_error(response, 400, "validation_error")
    reported = body["details"]["fields"]
    assert isinstance(reported, dict) and reported, body
    if fields:
        roots = {name if name in fields else re.split(r"[.\[]", name)[0] for name in reported}
        assert roots & set(fields), body["details"]
    return body


# --- HTTP shortcuts -------------------------------------------------------------------------------------------------


def create(client, **body: Any) -> dict:
    response = client.post(CONVERSATIONS, body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def append(client, conversation_id: Any, text: str = "hello", *, role: str = "USER", **extra: Any):
    body = {"content": history(text, role), **extra}
    return client.post(conv_path(conversation_id, "entries"), body, format="json")


def append_ok(client, conversation_id: Any, text: str = "hello", **extra: Any) -> dict:
    response = append(client, conversation_id, text, **extra)
    assert response.status_code == 201, response.content
    return response.json()


def add_member(client, conversation_id: Any, user_id: str, level: str) -> dict:
    response = client.post(
        conv_path(conversation_id, "memberships"), {"userId": user_id, "accessLevel": level}, format="json"
    )
    assert response.status_code == 201, response.content
    return response.json()


def start_transfer(client, conversation_id: Any, new_owner: str):
    return client.post(TRANSFERS, {"conversationId": str(conversation_id), "newOwnerUserId": new_owner}, format="json")


def page(client, path: str, **params: Any) -> dict:
    """One page of a list: the interface's envelope, plus ``beforeCursor`` on the entry lists (D11: paged both
    ways)."""
    response = client.get(url(path, **params))
    assert response.status_code == 200, response.content
    body = response.json()
    both_ways = path.rstrip("/").endswith("/entries")
    assert set(body) == ({"data", "afterCursor", "beforeCursor"} if both_ways else {"data", "afterCursor"}), body
    return body


def all_pages(client, path: str, *, key: Callable[[dict], Any] = lambda item: item["id"], limit: int | None = None,
              max_pages: int = 10_000, **params: Any) -> list[dict]:
    """Every item of a list, following afterCursor; fails on a repeated item or a page longer than ``limit``."""
    items: list[dict] = []
    seen: set[Any] = set()
    cursor = params.pop("afterCursor", None)
    for _ in range(max_pages):
        body = page(client, path, limit=limit, afterCursor=cursor, **params)
        if limit is not None:
            assert len(body["data"]) <= limit
        for item in body["data"]:
            assert key(item) not in seen, f"{key(item)} returned twice"
            seen.add(key(item))
            items.append(item)
        cursor = body["afterCursor"]
        if cursor is None:
            return items
        assert body["data"], "a non-final page must not be empty"
    raise AssertionError("pagination did not end")


def search(client, query: str, path: str = SEARCH, **extra: Any) -> dict:
    """A search (``path``: the member or the admin search) that answers 200 with results of the documented
    shape."""
    response = client.post(path, {"query": query, **extra}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"data", "afterCursor"}
    for item in body["data"]:
        assert set(item) == RESULT_FIELDS
        assert 0.0 <= item["score"] <= 1.0
    return body


def conversation_ids(body: dict) -> list[str]:
    """The conversation ids of a search page, in rank order."""
    return [item["conversationId"] for item in body["data"]]


def every_page(client, query: str, **extra: Any) -> list[dict]:
    """The pages of one search, followed by afterCursor to the end."""
    pages, cursor = [], None
    while True:
        body = search(client, query, afterCursor=cursor, **extra)
        pages.append(body)
        cursor = body["afterCursor"]
        if cursor is None:
            return pages


def ids(items: Sequence[dict], key: str = "id") -> list[str]:
    return [item[key] for item in items]


# --- The database, read directly ------------------------------------------------------------------------------------


def sql(statement: str, params: Sequence[Any] = ()) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(statement, list(params))
        return cursor.fetchall() if cursor.description else []


def count(table: str, where: str = "TRUE", params: Sequence[Any] = ()) -> int:
    return sql(f"SELECT count(*) FROM {table} WHERE {where}", params)[0][0]


def snapshot() -> dict[str, Any]:
    """Everything the conversation half stores, to show that a refused call wrote nothing."""
    return {
        "conversations": sql(
            "SELECT id, root_id, owner_user_id, title, metadata::text, updated_at, deleted_at FROM conversations "
            "ORDER BY id"
        ),
        "entries": [
            (row[0], row[1], hashlib.sha256(bytes(row[2])).hexdigest())
            for row in sql("SELECT id, conversation_id, content FROM conversation_entries ORDER BY id")
        ],
        "memberships": sql(
            "SELECT root_id, user_id, access_level FROM conversation_memberships ORDER BY root_id, user_id"
        ),
        "transfers": sql(
            "SELECT id, root_id, from_user_id, to_user_id FROM conversation_ownership_transfers ORDER BY id"
        ),
    }


def levels(conversation_id: Any) -> dict[str, str]:
    """user -> access level of the conversation's fork tree, from the table."""
    rows = sql(
        "SELECT m.user_id, m.access_level FROM conversations c "
        "JOIN conversation_memberships m ON m.root_id = c.root_id WHERE c.id = %s",
        [str(conversation_id)],
    )
    return dict(rows)


# --- A shared conversation with one member per level ----------------------------------------------------------------


@dataclass
class Shared:
    """A conversation owned by OWNER with MANAGER, WRITER and READER members (plus ``extra`` members)."""

    id: str
    clients: dict[str, Any]
    entries: list[dict] = field(default_factory=list)

    def __getitem__(self, actor: str):
        return self.clients[actor]


def make_client_factory(client_for) -> Callable[[str], Any]:
    from rest_framework.test import APIClient

    def client(actor: str):
        if actor == "anonymous":
            return APIClient()
        return client_for(actor, roles=ROLES.get(actor))

    return client


@pytest.fixture
def actor_client(client_for) -> Callable[[str], Any]:
    """``actor_client(name)``: an authenticated client for a matrix actor (``"anonymous"``: no credentials)."""
    return make_client_factory(client_for)


@pytest.fixture
def shared(actor_client) -> Shared:
    owner = actor_client(OWNER)
    conversation = create(owner, title="Shared plans")
    for user, level in ((MANAGER, "manager"), (WRITER, "writer"), (READER, "reader")):
        add_member(owner, conversation["id"], user, level)
    result = Shared(conversation["id"], {})
    result.entries.append(append_ok(owner, conversation["id"], "first words"))
    result.entries.append(append_ok(actor_client(WRITER), conversation["id"], "second words", role="AI"))
    for actor in (OWNER, MANAGER, WRITER, READER, NON_MEMBER, ADMIN_USER, AUDITOR_USER, "anonymous"):
        result.clients[actor] = actor_client(actor)
    return result


# --- Real concurrent clients against the live server (run_concurrently: tests/concurrency.py) -------------------------


class Http:
    """A requests session for one user against the live server (its own connection, like a real client)."""

    def __init__(self, base_url: str, token: str | None, api_key: str | None = None) -> None:
        self.base_url = base_url
        self.session = requests.Session()
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        if api_key:
            self.session.headers["X-API-Key"] = api_key

    def request(self, method: str, path: str, json: Any = None) -> requests.Response:
        return self.session.request(method, self.base_url + path, json=json, timeout=60)

    def get(self, path: str) -> requests.Response:
        return self.request("GET", path)

    def post(self, path: str, json: Any = None) -> requests.Response:
        return self.request("POST", path, json)

    def patch(self, path: str, json: Any = None) -> requests.Response:
        return self.request("PATCH", path, json)

    def delete(self, path: str) -> requests.Response:
        return self.request("DELETE", path)


@pytest.fixture
def http(live_service, transactional_db, mint_token) -> Iterator[Callable[..., Http]]:
    """``http(user, roles=None, api_key=None)``: a real HTTP client of the live service (tests/live_service.py) for
    ``user``. What it writes is committed, so the test is transactional (its tables are emptied afterwards)."""

    made: list[Http] = []

    def make(user: str | None, roles: Sequence[str] | None = None, api_key: str | None = None) -> Http:
        token = mint_token(user, roles=roles or ROLES.get(user)) if user else None
        made.append(Http(live_service.base_url, token, api_key))
        return made[-1]

    yield make
    for client in made:
        client.session.close()


def statuses(responses: Sequence[requests.Response]) -> list[int]:
    return sorted(response.status_code for response in responses)


def assert_no_5xx(responses: Sequence[requests.Response]) -> None:
    bad = [(r.status_code, r.text[:300]) for r in responses if r.status_code >= 500]
    assert not bad, bad


def new_id() -> str:
    return str(uuid.uuid4())
