"""Hostile cursors on every list endpoint (D3, issue 21 item 5): whatever a client hands back as a cursor, every
list answers a D1 ``validation_error`` naming the cursor field, never a 500. The cursor codec itself (tags, bounds,
positions) is unit-tested in tests/core/test_pagination.py."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from tests.conversations.support import (
    ADMIN,
    ADMIN_USER,
    CONVERSATIONS,
    OWNER,
    TRANSFERS,
    Shared,
    actor_client,  # noqa: F401 - a fixture (shared needs it)
    assert_validation_error,
    conv_path,
    shared,  # noqa: F401 - a fixture
    url,
)

pytestmark = pytest.mark.django_db


@dataclass(frozen=True)
class Endpoint:
    name: str
    actor: str
    path: Callable[[str], str]  # of the shared conversation's id
    field: str = "afterCursor"
    body: dict | None = None  # a POST list (search) takes its cursor in the body

    def call(self, client, conversation_id: str, cursor: str):
        path = self.path(conversation_id)
        if self.body is not None:
            return client.post(path, {**self.body, self.field: cursor}, format="json")
        return client.get(url(path, **{self.field: cursor}))


INDEXER = "ivan"
EVERY_LIST = [
    Endpoint("conversations", OWNER, lambda c: CONVERSATIONS),
    Endpoint("entries", OWNER, lambda c: conv_path(c, "entries")),
    Endpoint("forks", OWNER, lambda c: conv_path(c, "forks")),
    Endpoint("memberships", OWNER, lambda c: conv_path(c, "memberships")),
    Endpoint("ownership transfers", OWNER, lambda c: TRANSFERS),
    Endpoint("unindexed", INDEXER, lambda c: f"{CONVERSATIONS}/unindexed"),
    Endpoint("search", OWNER, lambda c: f"{CONVERSATIONS}/search", body={"query": "plans"}),
    Endpoint("admin conversations", ADMIN_USER, lambda c: ADMIN),
    Endpoint("admin entries", ADMIN_USER, lambda c: f"{ADMIN}/{c}/entries"),
    Endpoint("admin forks", ADMIN_USER, lambda c: f"{ADMIN}/{c}/forks"),
    Endpoint("admin memberships", ADMIN_USER, lambda c: f"{ADMIN}/{c}/memberships"),
    Endpoint("admin search", ADMIN_USER, lambda c: f"{ADMIN}/search", body={"query": "plans"}),
    Endpoint("admin attachments", ADMIN_USER, lambda c: "/v1/admin/attachments"),
    Endpoint("memory events", OWNER, lambda c: "/v1/memories/events", field="after_cursor"),
]


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def nested(depth: int) -> bytes:
    return b"[" * depth + b'"2026-01-01T00:00:00+00:00"' + b"]" * depth


UUID = "00000000-0000-0000-0000-000000000001"
HOSTILE = {
    # Deep enough to exhaust a recursive JSON decoder (a RecursionError was a 500 on every raw-SQL list).
    "deeply nested": b64(nested(5000)),
    # Nested, and short enough to pass the length bound: the depth bound refuses it on its own.
    "nested within the length bound": b64(nested(60)),
    "nested object": b64(b'[{"a": {"b": [1]}}, "' + UUID.encode() + b'", "x"]'),
    # Well-formed JSON, but far longer than any cursor the service hands out.
    "over-long": b64(json.dumps(["2026-01-01T00:00:00+00:00", UUID, "x" * 6000]).encode()),
    "wrong tag": b64(json.dumps(["2026-01-01T00:00:00+00:00", UUID, "another.list"]).encode()),
    "untagged": b64(json.dumps(["2026-01-01T00:00:00+00:00", UUID]).encode()),
    "not UTF-8": b64(b'["\xff\xfe", "\xc3\x28", "x"]'),
    "not base64url": "abc+/def==",
    "not ASCII": "Wy\u00e9Il0",
    "NUL": "Wy\x00Il0",
    "impossible length": "AAAAA",
}


@pytest.mark.parametrize("endpoint", EVERY_LIST, ids=[endpoint.name for endpoint in EVERY_LIST])
def test_hostile_cursor_is_a_400_on_every_list(shared: Shared, client_for, endpoint: Endpoint) -> None:  # noqa: F811
    client = client_for(INDEXER, roles=("user", "indexer")) if endpoint.actor == INDEXER else shared[endpoint.actor]
    for name, cursor in HOSTILE.items():
        response = endpoint.call(client, shared.id, cursor)
        assert response.status_code == 400, (endpoint.name, name, response.status_code, response.content[:300])
        body = assert_validation_error(response, endpoint.field)
        assert body["details"]["fields"][endpoint.field] == "malformed cursor", (endpoint.name, name, body)
