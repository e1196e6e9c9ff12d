"""The access matrix of D6 (and D1's status order), cell by cell: every conversation, membership, transfer and admin
endpoint called by the owner, a manager, a writer, a reader, a non-member, an admin and an auditor (neither of them
members) and an anonymous caller.

Each cell gets a fresh conversation owned by OWNER with MANAGER, WRITER, READER and a second reader (``rhea``) as
members, two entries and, for the transfer endpoints, a pending transfer OWNER -> MANAGER. A refused write (any
non-2xx) must leave every conversation table exactly as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conversations.support import (
    ADMIN,
    ADMIN_USER,
    AUDITOR_USER,
    CONVERSATIONS,
    MANAGER,
    NON_MEMBER,
    OWNER,
    READER,
    TRANSFERS,
    WRITER,
    Shared,
    add_member,
    assert_error,
    conv_path,
    history,
    new_id,
    snapshot,
    start_transfer,
)

pytestmark = pytest.mark.django_db

ACTORS = (OWNER, MANAGER, WRITER, READER, NON_MEMBER, ADMIN_USER, AUDITOR_USER, "anonymous")
ACTOR_LABELS = dict(zip(ACTORS, ("owner", "manager", "writer", "reader", "non-member", "admin", "auditor", "no-token"),
                        strict=True))
SECOND_READER = "rhea"
NEWCOMER = "nico"


def row(owner: int, manager: int, writer: int, reader: int, non_member: int, admin: int, auditor: int,
        anonymous: int = 401) -> dict[str, int]:
    return dict(zip(ACTORS, (owner, manager, writer, reader, non_member, admin, auditor, anonymous), strict=True))


READ = row(200, 200, 200, 200, 403, 403, 403)
ADMIN_ONLY = row(403, 403, 403, 403, 403, 200, 200)


@dataclass
class Context:
    shared: Shared
    actor: str
    transfer_id: str | None = None

    @property
    def id(self) -> str:
        return self.shared.id

    @property
    def entry_id(self) -> str:
        return self.shared.entries[-1]["id"]


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[Any, Context], Any]
    expected: dict[str, int]
    writes: bool = True
    needs_transfer: bool = False


def _patch_member(target: str, level: str) -> Callable[[Any, Context], Any]:
    return lambda c, ctx: c.patch(conv_path(ctx.id, "memberships", target), {"accessLevel": level}, format="json")


def _add_member(level: str) -> Callable[[Any, Context], Any]:
    return lambda c, ctx: c.post(conv_path(ctx.id, "memberships"), {"userId": NEWCOMER, "accessLevel": level},
                                 format="json")


def _own_user(ctx: Context) -> str:
    return "nobody" if ctx.actor == "anonymous" else ctx.actor


CASES = [
    Case("GET conversation", lambda c, ctx: c.get(conv_path(ctx.id)), READ, writes=False),
    Case("PATCH conversation", lambda c, ctx: c.patch(conv_path(ctx.id), {"title": "renamed"}, format="json"),
         row(200, 200, 200, 403, 403, 403, 403)),
    Case("DELETE conversation", lambda c, ctx: c.delete(conv_path(ctx.id)), row(204, 403, 403, 403, 403, 403, 403)),
    Case("GET entries", lambda c, ctx: c.get(conv_path(ctx.id, "entries")), READ, writes=False),
    Case("GET entries channel=history", lambda c, ctx: c.get(conv_path(ctx.id, "entries") + "?channel=history"),
         READ, writes=False),
    Case("POST entry", lambda c, ctx: c.post(conv_path(ctx.id, "entries"), {"content": history("hi")}, format="json"),
         row(201, 201, 201, 403, 403, 403, 403)),
    Case("POST entry creating a fork",
         lambda c, ctx: c.post(conv_path(new_id(), "entries"),
                               {"content": history("forked"), "forkedAtConversationId": ctx.id,
                                "forkedAtEntryId": ctx.entry_id}, format="json"),
         row(201, 201, 201, 403, 403, 403, 403)),
    Case("GET forks", lambda c, ctx: c.get(conv_path(ctx.id, "forks")), READ, writes=False),
    Case("GET memberships", lambda c, ctx: c.get(conv_path(ctx.id, "memberships")), READ, writes=False),
    Case("POST membership reader", _add_member("reader"), row(201, 201, 403, 403, 403, 403, 403)),
    Case("POST membership writer", _add_member("writer"), row(201, 201, 403, 403, 403, 403, 403)),
    Case("POST membership manager", _add_member("manager"), row(201, 403, 403, 403, 403, 403, 403)),
    Case("POST membership owner", _add_member("owner"), row(201, 403, 403, 403, 403, 403, 403)),
    Case("PATCH reader to writer", _patch_member(SECOND_READER, "writer"), row(200, 200, 403, 403, 403, 403, 403)),
    Case("PATCH writer to reader", _patch_member(WRITER, "reader"), row(200, 200, 403, 403, 403, 403, 403)),
    Case("PATCH reader to manager", _patch_member(SECOND_READER, "manager"), row(200, 403, 403, 403, 403, 403, 403)),
    Case("PATCH reader to owner", _patch_member(SECOND_READER, "owner"), row(200, 403, 403, 403, 403, 403, 403)),
    Case("PATCH manager to reader", _patch_member(MANAGER, "reader"), row(200, 403, 403, 403, 403, 403, 403)),
    Case("PATCH primary owner to manager", _patch_member(OWNER, "manager"), row(400, 403, 403, 403, 403, 403, 403)),
    Case("DELETE another reader's membership",
         lambda c, ctx: c.delete(conv_path(ctx.id, "memberships", SECOND_READER)),
         row(204, 204, 403, 403, 403, 403, 403)),
    # A manager may remove writers and readers only (D6): removing another manager ("max") is refused.
    Case("DELETE another manager's membership", lambda c, ctx: c.delete(conv_path(ctx.id, "memberships", "max")),
         row(204, 403, 403, 403, 403, 403, 403)),
    Case("DELETE own membership (leave)",
         lambda c, ctx: c.delete(conv_path(ctx.id, "memberships", _own_user(ctx))),
         row(400, 204, 204, 204, 403, 403, 403)),
    Case("DELETE the primary owner's membership", lambda c, ctx: c.delete(conv_path(ctx.id, "memberships", OWNER)),
         row(400, 403, 403, 403, 403, 403, 403)),
    Case("POST ownership transfer", lambda c, ctx: start_transfer(c, ctx.id, MANAGER),
         row(201, 403, 403, 403, 403, 403, 403)),
    Case("GET ownership transfer", lambda c, ctx: c.get(f"{TRANSFERS}/{ctx.transfer_id}"),
         row(200, 200, 404, 404, 404, 404, 404), writes=False, needs_transfer=True),
    Case("POST ownership transfer accept", lambda c, ctx: c.post(f"{TRANSFERS}/{ctx.transfer_id}/accept"),
         row(403, 204, 403, 403, 403, 403, 403), needs_transfer=True),
    Case("DELETE ownership transfer", lambda c, ctx: c.delete(f"{TRANSFERS}/{ctx.transfer_id}"),
         row(204, 204, 403, 403, 403, 403, 403), needs_transfer=True),
    Case("GET ownership transfers", lambda c, ctx: c.get(TRANSFERS), row(200, 200, 200, 200, 200, 200, 200),
         writes=False, needs_transfer=True),
    Case("GET conversations", lambda c, ctx: c.get(CONVERSATIONS), row(200, 200, 200, 200, 200, 200, 200),
         writes=False),
    Case("GET admin conversations", lambda c, ctx: c.get(ADMIN), ADMIN_ONLY, writes=False),
    Case("GET admin conversation", lambda c, ctx: c.get(f"{ADMIN}/{ctx.id}"), ADMIN_ONLY, writes=False),
    Case("GET admin entries", lambda c, ctx: c.get(f"{ADMIN}/{ctx.id}/entries"), ADMIN_ONLY, writes=False),
    Case("GET admin memberships", lambda c, ctx: c.get(f"{ADMIN}/{ctx.id}/memberships"), ADMIN_ONLY, writes=False),
    Case("GET admin forks", lambda c, ctx: c.get(f"{ADMIN}/{ctx.id}/forks"), ADMIN_ONLY, writes=False),
]
ERROR_CODES = {401: "unauthenticated", 403: "forbidden", 404: "not_found"}


def _cells():
    for case in CASES:
        for actor in ACTORS:
            yield pytest.param(case, actor, id=f"{case.name} | {ACTOR_LABELS[actor]}")


@pytest.fixture
def matrix_shared(shared: Shared) -> Shared:
    owner = shared[OWNER]
    add_member(owner, shared.id, SECOND_READER, "reader")
    add_member(owner, shared.id, "max", "manager")
    return shared


@pytest.mark.parametrize(("case", "actor"), list(_cells()))
def test_access_matrix(matrix_shared: Shared, case: Case, actor: str) -> None:
    context = Context(matrix_shared, actor)
    if case.needs_transfer:
        response = start_transfer(matrix_shared[OWNER], matrix_shared.id, MANAGER)
        assert response.status_code == 201, response.content
        context.transfer_id = response.json()["id"]
    before = snapshot()

    response = case.call(matrix_shared[actor], context)

    expected = case.expected[actor]
    assert response.status_code == expected, (case.name, ACTOR_LABELS[actor], response.status_code,
                                              response.content[:300])
    if expected in ERROR_CODES:
        assert_error(response, expected, ERROR_CODES[expected])
    elif expected >= 400:
        assert response.json()["code"]
    if expected == 401:
        assert response["WWW-Authenticate"].startswith("Bearer")
    if expected >= 400 or not case.writes:
        assert snapshot() == before, "a refused call (or a read) changed the stored conversations"
    if expected == 204:
        assert response.content == b""


@pytest.mark.parametrize("actor", ACTORS)
def test_conversation_list_shows_the_conversation_only_to_its_members(matrix_shared: Shared, actor: str) -> None:
    if actor == "anonymous":
        assert_error(matrix_shared[actor].get(CONVERSATIONS), 401, "unauthenticated")
        return
    data = matrix_shared[actor].get(CONVERSATIONS + "?mode=all").json()["data"]
    expected_level = {OWNER: "owner", MANAGER: "manager", WRITER: "writer", READER: "reader"}.get(actor)
    listed = {item["id"]: item["accessLevel"] for item in data}
    if expected_level is None:
        assert matrix_shared.id not in listed
    else:
        assert listed[matrix_shared.id] == expected_level


@pytest.mark.parametrize("actor", ACTORS)
def test_transfer_list_shows_the_transfer_to_sender_and_recipient_only(matrix_shared: Shared, actor: str) -> None:
    response = start_transfer(matrix_shared[OWNER], matrix_shared.id, MANAGER)
    assert response.status_code == 201, response.content
    transfer_id = response.json()["id"]
    if actor == "anonymous":
        assert_error(matrix_shared[actor].get(TRANSFERS), 401, "unauthenticated")
        return
    listed = [item["id"] for item in matrix_shared[actor].get(TRANSFERS).json()["data"]]
    assert listed == ([transfer_id] if actor in (OWNER, MANAGER) else [])


@pytest.mark.parametrize("path", ["", "/entries", "/forks", "/memberships"])
def test_unknown_conversation_is_404_for_a_member_of_others(matrix_shared: Shared, path: str) -> None:
    assert_error(matrix_shared[OWNER].get(conv_path(new_id()) + path), 404, "not_found")


@pytest.mark.parametrize("path", ["", "/entries", "/forks", "/memberships"])
def test_unknown_conversation_is_404_for_admin_endpoints(matrix_shared: Shared, path: str) -> None:
    assert_error(matrix_shared[ADMIN_USER].get(f"{ADMIN}/{new_id()}{path}"), 404, "not_found")
