"""Pagination of every conversation-half list (D3 and the interface's limits table): pages follow afterCursor with
no duplicate and no gap, afterCursor is null exactly at the end, limits are bounded, and a cursor that is not one
of this list's (malformed, forged, or from another list) is a 400."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.utils import timezone

from apps.attachments.selectors import ADMIN_CURSOR as ATTACHMENTS_CURSOR
from apps.core.pagination import encode_cursor
from apps.memories.selectors import EVENTS_CURSOR
from tests.conversations.support import (
    ADMIN,
    ADMIN_USER,
    AUDITOR_USER,
    CONVERSATIONS,
    MANAGER,
    OWNER,
    TRANSFERS,
    Shared,
    add_member,
    all_pages,
    append_ok,
    assert_validation_error,
    conv_path,
    create,
    new_id,
    page,
    start_transfer,
    url,
)

pytestmark = pytest.mark.django_db

ITEMS = 12  # per list: more than two pages of PAGE
PAGE = 5


@dataclass(frozen=True)
class ListCase:
    name: str
    actor: str
    path: Callable[[dict], str]
    key: str
    maximum: int
    default: int
    params: tuple[tuple[str, str], ...] = ()


LISTS = [
    ListCase("conversations all", OWNER, lambda d: CONVERSATIONS, "id", 200, 20, (("mode", "all"),)),
    ListCase("conversations roots", OWNER, lambda d: CONVERSATIONS, "id", 200, 20, (("mode", "roots"),)),
    ListCase("conversations latest-fork", OWNER, lambda d: CONVERSATIONS, "id", 200, 20, (("mode", "latest-fork"),)),
    ListCase("conversations by title", OWNER, lambda d: CONVERSATIONS, "id", 200, 20,
             (("mode", "all"), ("query", "numbered"))),
    ListCase("entries", OWNER, lambda d: conv_path(d["big"], "entries"), "id", 200, 50),
    ListCase("entries of a fork", OWNER, lambda d: conv_path(d["fork"], "entries"), "id", 200, 50),
    ListCase("memberships", OWNER, lambda d: conv_path(d["big"], "memberships"), "userId", 200, 50),
    ListCase("forks", OWNER, lambda d: conv_path(d["big"], "forks"), "conversationId", 200, 50),
    ListCase("transfers all", OWNER, lambda d: TRANSFERS, "id", 200, 50),
    ListCase("transfers sender", OWNER, lambda d: TRANSFERS, "id", 200, 50, (("role", "sender"),)),
    ListCase("transfers recipient", MANAGER, lambda d: TRANSFERS, "id", 200, 50, (("role", "recipient"),)),
    ListCase("admin conversations", ADMIN_USER, lambda d: ADMIN, "id", 1000, 100),
    ListCase("admin conversations of a user", AUDITOR_USER, lambda d: ADMIN, "id", 1000, 100,
             (("userId", OWNER),)),
    ListCase("admin entries", AUDITOR_USER, lambda d: f"{ADMIN}/{d['big']}/entries", "id", 1000, 50),
    ListCase("admin memberships", ADMIN_USER, lambda d: f"{ADMIN}/{d['big']}/memberships", "userId", 1000, 50),
    ListCase("admin forks", ADMIN_USER, lambda d: f"{ADMIN}/{d['big']}/forks", "conversationId", 1000, 50),
]
LIST_IDS = [case.name for case in LISTS]


@pytest.fixture
def data(shared: Shared) -> dict:
    """OWNER's lists all hold more than two pages: ITEMS numbered conversations (each with a transfer to MANAGER),
    one of them ``big`` with ITEMS entries, members and forks; ``fork`` is a fork that sees half of big's entries."""
    owner = shared[OWNER]
    big = create(owner, title="numbered big")["id"]
    add_member(owner, big, MANAGER, "reader")
    entries = [append_ok(owner, big, f"e{i}")["id"] for i in range(ITEMS)]
    for index in range(ITEMS):
        add_member(owner, big, f"member{index:02d}", "reader")
    forks = [append_ok(owner, new_id(), f"fork {i}", forkedAtConversationId=big,
                       forkedAtEntryId=entries[ITEMS // 2])["conversationId"] for i in range(ITEMS)]
    for index in range(ITEMS):
        conversation = create(owner, title=f"numbered {index}")["id"]
        add_member(owner, conversation, MANAGER, "reader")
        assert start_transfer(owner, conversation, MANAGER).status_code == 201
    fork = forks[0]
    for index in range(ITEMS):
        append_ok(owner, fork, f"f{index}")
    return {"big": big, "fork": fork, "shared": shared}


@pytest.mark.parametrize("case", LISTS, ids=LIST_IDS)
def test_pages_have_no_duplicate_and_no_gap(data: dict, actor_client, case: ListCase) -> None:
    client = actor_client(case.actor)
    path, params = case.path(data), dict(case.params)
    whole = page(client, path, limit=case.maximum, **params)
    assert whole["afterCursor"] is None
    expected = [item[case.key] for item in whole["data"]]
    assert len(expected) > 2 * PAGE, f"{case.name}: the fixture must fill more than two pages"
    assert len(set(expected)) == len(expected)

    paged = all_pages(client, path, key=lambda item: item[case.key], limit=PAGE, **params)
    assert [item[case.key] for item in paged] == expected
    assert paged == whole["data"]

    # A page of exactly the remaining size ends the list: no cursor to an empty page.
    body = page(client, path, limit=len(expected), **params)
    assert body["afterCursor"] is None and len(body["data"]) == len(expected)
    body = page(client, path, limit=len(expected) - 1, **params)
    assert body["afterCursor"] is not None
    assert page(client, path, limit=1, afterCursor=body["afterCursor"], **params)["afterCursor"] is None


@pytest.fixture
def light(shared: Shared) -> dict:
    """Two items or more in every list (the shared conversation, a fork, a second conversation, two pending
    transfers), for the limit and cursor checks."""
    fork = append_ok(shared[OWNER], new_id(), "fork", forkedAtConversationId=shared.id,
                     forkedAtEntryId=shared.entries[1]["id"])["conversationId"]
    assert start_transfer(shared[OWNER], shared.id, MANAGER).status_code == 201
    other = create(shared[OWNER], title="second")["id"]
    add_member(shared[OWNER], other, MANAGER, "writer")
    assert start_transfer(shared[OWNER], other, MANAGER).status_code == 201
    return {"big": shared.id, "fork": fork, "shared": shared}


@pytest.mark.parametrize("case", LISTS, ids=LIST_IDS)
def test_limit_out_of_range_or_not_an_integer_is_400(light: dict, actor_client, case: ListCase) -> None:
    client = actor_client(case.actor)
    base = url(case.path(light), **dict(case.params)) + ("&" if case.params else "?")
    for limit in ("0", "-1", str(case.maximum + 1), "1001", "100000", "abc", "1.5", "10e1", "%20", "true"):
        assert_validation_error(client.get(f"{base}limit={limit}"), "limit")


@pytest.mark.parametrize("case", LISTS, ids=LIST_IDS)
def test_limit_bounds_themselves_are_accepted(light: dict, actor_client, case: ListCase) -> None:
    client = actor_client(case.actor)
    for limit in (1, case.maximum):
        page(client, case.path(light), limit=limit, **dict(case.params))


@pytest.mark.parametrize("case", [c for c in LISTS if c.maximum == 1000], ids=lambda c: c.name)
def test_admin_lists_accept_limits_above_the_user_maximum(light: dict, actor_client, case: ListCase) -> None:
    page(actor_client(case.actor), case.path(light), limit=201, **dict(case.params))
    page(actor_client(case.actor), case.path(light), limit=999, **dict(case.params))


def _b64(value) -> str:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


BAD_CURSORS = {
    "garbage": "not a cursor",
    "bad-base64": "%%%",
    "base64-not-json": _b64(b"\xff\xfe\x00"),
    "json-object": _b64({"after": "x"}),
    "json-list-too-short": _b64(["2026-01-01T00:00:00+00:00"]),
    "bad-timestamp": _b64(["yesterday", "00000000-0000-0000-0000-000000000000"]),
    "bad-id": _b64(["2026-01-01T00:00:00+00:00", "not-a-uuid"]),
    "number-sort": _b64([12, "00000000-0000-0000-0000-000000000000"]),
    "huge": "A" * 5000,
}


@pytest.mark.parametrize("case", LISTS, ids=LIST_IDS)
def test_malformed_cursor_is_400(light: dict, actor_client, case: ListCase) -> None:
    client = actor_client(case.actor)
    for name, cursor in BAD_CURSORS.items():
        response = client.get(url(case.path(light), afterCursor=cursor, **dict(case.params)))
        assert response.status_code == 400, (case.name, name, response.content[:200])
        assert_validation_error(response, "afterCursor")


def _cursor_of(client, path: str, key_count: int, **params) -> str:
    body = page(client, path, limit=1, **params)
    assert body["afterCursor"] is not None, f"{path} needs {key_count}+ items for a cursor"
    return body["afterCursor"]


@pytest.fixture
def cursors(light: dict, actor_client) -> dict[str, str]:
    """One real cursor of each list family, to hand to the others."""
    owner, admin = actor_client(OWNER), actor_client(ADMIN_USER)
    return {
        "conversations": _cursor_of(owner, CONVERSATIONS, 2, mode="all"),
        "entries": _cursor_of(owner, conv_path(light["big"], "entries"), 2),
        "memberships": _cursor_of(owner, conv_path(light["big"], "memberships"), 2),
        "forks": _cursor_of(owner, conv_path(light["big"], "forks"), 2),
        "transfers": _cursor_of(owner, TRANSFERS, 2),
        "admin conversations": _cursor_of(admin, ADMIN, 2),
        # What the memory events and admin attachment lists hand out.
        "memory events": encode_cursor(EVENTS_CURSOR, 1, uuid.uuid4()),
        "admin attachments": encode_cursor(ATTACHMENTS_CURSOR, timezone.now(), uuid.uuid4()),
    }


FAMILY = {
    "conversations all": "conversations", "conversations roots": "conversations",
    "conversations latest-fork": "conversations", "conversations by title": "conversations",
    "entries": "entries", "entries of a fork": "entries", "memberships": "memberships", "forks": "forks",
    "transfers all": "transfers", "transfers sender": "transfers", "transfers recipient": "transfers",
    "admin conversations": "admin conversations", "admin conversations of a user": "admin conversations",
    "admin entries": "entries", "admin memberships": "memberships", "admin forks": "forks",
}


@pytest.mark.parametrize("case", LISTS, ids=LIST_IDS)
def test_cursor_of_another_list_is_400(light: dict, cursors: dict[str, str], actor_client, case: ListCase) -> None:
    client = actor_client(case.actor)
    own_family = FAMILY[case.name]
    for family, cursor in cursors.items():
        if family == own_family:
            continue
        response = client.get(url(case.path(light), afterCursor=cursor, **dict(case.params)))
        assert response.status_code == 400, (case.name, "given a cursor of", family, response.content[:200])
        assert_validation_error(response, "afterCursor")


def test_cursor_survives_the_deletion_of_its_item(actor_client) -> None:
    owner = actor_client(OWNER)
    created = [create(owner, title=f"c{i}")["id"] for i in range(7)]
    first = page(owner, CONVERSATIONS, mode="all", limit=3)
    assert [c["id"] for c in first["data"]] == created[::-1][:3]
    assert owner.delete(conv_path(first["data"][-1]["id"])).status_code == 204
    rest = all_pages(owner, CONVERSATIONS, mode="all", limit=3, afterCursor=first["afterCursor"])
    assert [c["id"] for c in rest] == created[::-1][3:]


def test_membership_cursor_survives_the_removal_of_its_member(shared: Shared) -> None:
    owner = shared[OWNER]
    first = page(owner, conv_path(shared.id, "memberships"), limit=2)
    assert owner.delete(conv_path(shared.id, "memberships", first["data"][-1]["userId"])).status_code == 204
    rest = all_pages(owner, conv_path(shared.id, "memberships"), key=lambda m: m["userId"],
                     afterCursor=first["afterCursor"])
    assert [m["userId"] for m in first["data"] + rest] == ["olivia", "mandy", "walt", "rita"]


@pytest.mark.parametrize(
    ("path", "default"),
    [("entries", 50), ("memberships", 50), ("forks", 50)],
)
def test_default_page_sizes_of_conversation_lists(actor_client, path: str, default: int) -> None:
    owner = actor_client(OWNER)
    conversation = create(owner)["id"]
    first_entry = append_ok(owner, conversation, "e")["id"]
    for index in range(default):  # default + 1 items in total
        if path == "entries":
            append_ok(owner, conversation, f"e{index}")
        elif path == "memberships":
            add_member(owner, conversation, f"m{index:03d}", "reader")
        else:
            append_ok(owner, new_id(), "f", forkedAtConversationId=conversation, forkedAtEntryId=first_entry)
    body = page(owner, conv_path(conversation, path))
    assert len(body["data"]) == default
    assert body["afterCursor"] is not None


def test_default_page_size_of_conversations_is_20(actor_client) -> None:
    owner = actor_client(OWNER)
    for _ in range(21):
        create(owner)
    body = page(owner, CONVERSATIONS)
    assert len(body["data"]) == 20 and body["afterCursor"] is not None


def test_default_page_size_of_transfers_is_50(actor_client) -> None:
    owner = actor_client(OWNER)
    for _ in range(51):
        conversation = create(owner)["id"]
        add_member(owner, conversation, MANAGER, "reader")
        assert start_transfer(owner, conversation, MANAGER).status_code == 201
    body = page(actor_client(MANAGER), TRANSFERS)
    assert len(body["data"]) == 50 and body["afterCursor"] is not None


def test_default_page_size_of_admin_conversations_is_100(actor_client) -> None:
    owner = actor_client(OWNER)
    for _ in range(101):
        create(owner)
    body = page(actor_client(AUDITOR_USER), ADMIN)
    assert len(body["data"]) == 100 and body["afterCursor"] is not None
