"""The MCP write tools under 32+ concurrent clients: each a real HTTP client on its own connection, sending its
``tools/call`` to the live service at once with the others (stateless Streamable HTTP: one self-contained POST per
call, as any MCP client sends it after its handshake). The services serialise in the database as they do for REST."""

from __future__ import annotations

import itertools
import uuid
from collections import Counter
from functools import partial
from urllib.parse import urlencode

import pytest
import requests

from apps.conversations.models import Conversation, Entry
from apps.memories.models import Memory
from tests.concurrency import run_concurrently
from tests.live_service import LiveService
from tests.mcp.conftest import credentials

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_tables_after_module")]

CLIENTS = 32


def call_tool(live_service: LiveService, user: str, name: str, arguments: dict, call_id: int = 1) -> dict:
    """One tools/call on a connection of its own; the CallToolResult."""
    headers = {
        **credentials(live_service, user),
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25",
    }
    body = {"jsonrpc": "2.0", "id": call_id, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    with requests.Session() as session:
        response = session.post(f"{live_service.base_url}/mcp", json=body, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["id"] == call_id and "result" in answer, answer
    return answer["result"]


def test_concurrent_put_memory_of_one_address_leaves_one_version(live_service: LiveService) -> None:
    namespace = ["user", "bob", "mcp-race"]
    credentials(live_service, "bob")  # the token, fetched before the race

    def put(index: int) -> dict:
        return call_tool(live_service, "bob", "put_memory", {"namespace": namespace, "key": "k", "value": {"n": index}}, index)

    results = run_concurrently([partial(put, index) for index in range(CLIENTS)])

    assert [result["isError"] for result in results] == [False] * CLIENTS
    ids = {result["structuredContent"]["id"] for result in results}
    assert len(ids) == CLIENTS  # every write a version of its own
    active = list(Memory.objects.filter(namespace=namespace, key="k", state="active"))
    assert len(active) == 1 and str(active[0].id) in ids
    status, events = live_service.request(
        "GET", "/v1/memories/events?" + urlencode({"ns": namespace, "limit": 200}, doseq=True),
        headers=credentials(live_service, "bob"),
    )  # fmt: skip
    assert status == 200
    assert Counter(event["kind"] for event in events["events"]) == {"add": 1, "update": CLIENTS - 1}
    # The last event is the surviving version's write.
    assert events["events"][-1]["value"] == live_service.request(
        "GET", "/v1/memories?" + urlencode({"ns": namespace, "key": "k"}, doseq=True),
        headers=credentials(live_service, "bob"),
    )[1]["value"]  # fmt: skip


def test_concurrent_append_entry_to_a_new_conversation_creates_it_once(live_service: LiveService) -> None:
    conversation_id = str(uuid.uuid4())
    credentials(live_service, "charlie")

    def append(index: int) -> dict:
        arguments = {"conversation_id": conversation_id, "text": f"message {index}"}
        return call_tool(live_service, "charlie", "append_entry", arguments, index)

    results = run_concurrently([partial(append, index) for index in range(CLIENTS)])

    assert [result["isError"] for result in results] == [False] * CLIENTS
    assert Conversation.objects.filter(id=conversation_id).count() == 1
    entries = list(Entry.objects.filter(conversation_id=conversation_id).order_by("created_at"))
    assert len(entries) == CLIENTS
    assert {str(entry.id) for entry in entries} == {result["structuredContent"]["id"] for result in results}
    # Entry order is commit order: strictly increasing times.
    assert all(a.created_at < b.created_at for a, b in itertools.pairwise(entries))


def test_concurrent_create_conversation_with_one_id_creates_it_once(live_service: LiveService) -> None:
    conversation_id = str(uuid.uuid4())
    credentials(live_service, "alice")

    def create(index: int) -> dict:
        return call_tool(live_service, "alice", "create_conversation", {"conversation_id": conversation_id}, index)

    results = run_concurrently([partial(create, index) for index in range(CLIENTS)])

    codes = Counter(result["structuredContent"].get("code", "created") for result in results)
    assert codes == {"created": 1, "conflict": CLIENTS - 1}
    assert Conversation.objects.filter(id=conversation_id).count() == 1


def test_concurrent_delete_memory_of_one_address_deletes_it_once(live_service: LiveService) -> None:
    namespace = ["user", "bob", "mcp-delete-race"]
    call_tool(live_service, "bob", "put_memory", {"namespace": namespace, "key": "k", "value": {"n": 0}})

    def delete(index: int) -> dict:
        return call_tool(live_service, "bob", "delete_memory", {"namespace": namespace, "key": "k"}, index)

    results = run_concurrently([partial(delete, index) for index in range(CLIENTS)])

    assert [result["structuredContent"] for result in results] == [{"namespace": namespace, "key": "k", "deleted": True}] * CLIENTS
    assert not Memory.objects.filter(namespace=namespace, key="k", state="active").exists()
    status, events = live_service.request(
        "GET", "/v1/memories/events?" + urlencode({"ns": namespace}, doseq=True), headers=credentials(live_service, "bob")
    )
    assert status == 200 and [event["kind"] for event in events["events"]] == ["add", "delete"]
