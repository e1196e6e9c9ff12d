"""The synchronous Client against the live service: every group of operations, typed answers, cursor iterators
and the exception hierarchy."""

from __future__ import annotations

import io
import uuid
from datetime import datetime

import pytest
import requests
from memory_service import (
    OPERATIONS,
    AsyncClient,
    AuthenticationError,
    Client,
    ConflictError,
    Conversation,
    Entry,
    Memory,
    NotFoundError,
    PermissionDeniedError,
    ValidationError,
)

from tests.conftest import TEST_API_CLIENT, TEST_API_KEY
from tests.live_service import LiveService

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_tables_after_module")]


def test_every_operation_of_the_live_schema_has_a_client_method(live_service: LiveService) -> None:
    """The live /openapi.json against memory_service.OPERATIONS: an operation the service gains without a client
    method (or a client method whose operation went) fails here."""
    schema = requests.get(f"{live_service.base_url}/openapi.json", timeout=30).json()
    served = {
        (method.upper(), path)
        for path, item in schema["paths"].items()
        for method in item
        if method in {"get", "put", "post", "patch", "delete", "head", "options", "trace"}
    }
    assert served - OPERATIONS.keys() == set(), "operations without a client method"
    assert OPERATIONS.keys() - served == set(), "client methods for operations the service does not serve"
    for name in OPERATIONS.values():
        assert callable(getattr(Client, name, None)), f"Client.{name}"
        assert callable(getattr(AsyncClient, name, None)), f"AsyncClient.{name}"


def test_memories(sdk) -> None:
    bob = sdk("bob")
    run = uuid.uuid4().hex  # this test's own subtree
    namespace = ("user", "bob", run, "prefs")
    written = bob.put_memory(namespace, "coffee", {"likes": "flat white"}, index={"text": "coffee"}, ttl_seconds=3600)
    assert (written.namespace, written.key, written.attributes) == (namespace, "coffee", {"namespace": "user", "sub": "bob"})
    assert isinstance(written.created_at, datetime) and written.created_at.tzinfo is not None
    assert written.expires_at is not None and written.expires_at > written.created_at

    memory = bob.get_memory(list(namespace), "coffee")
    assert isinstance(memory, Memory)
    assert (memory.id, memory.value) == (written.id, {"likes": "flat white"})

    for key in ("tea", "water", "juice"):
        bob.put_memory(("user", "bob", run, "drinks"), key, {"n": key})
    mine = ("user", "bob", run)
    found = bob.search_memories(mine, filter={"sub": "bob"}, limit=10)
    assert {item.key for item in found} == {"coffee", "tea", "water", "juice"}
    assert all(item.score is None for item in found)
    assert [item.key for item in bob.iter_search_memories(mine, page_size=1)] == [
        item.key for item in bob.search_memories(mine, limit=100)
    ]
    # No worker runs: the search itself embeds the version waiting for one (read your writes), and only it has an index.
    semantic = bob.search_memories(mine, query="coffee")
    assert [item.key for item in semantic] == ["coffee"] and 0 < semantic[0].score <= 1

    assert bob.list_namespaces(prefix=mine) == [(*mine, "drinks"), (*mine, "prefs")]
    assert bob.list_namespaces(prefix=mine, max_depth=3) == [mine]

    page = bob.list_memory_events(namespace=mine, kinds=["add"], limit=2)
    assert len(page.data) == 2 and page.after_cursor is not None
    events = list(bob.iter_memory_events(namespace=mine, kinds=["add", "delete"], limit=2))
    assert [(event.kind, event.key) for event in events] == [
        ("add", "coffee"), ("add", "tea"), ("add", "water"), ("add", "juice")
    ]
    # Caught up, the cursor stays valid for polling; resuming from it yields nothing new.
    last = bob.list_memory_events(namespace=mine, after_cursor=page.after_cursor)
    assert list(bob.iter_memory_events(namespace=mine, after_cursor=last.after_cursor)) == []

    bob.delete_memory(namespace, "coffee")
    bob.delete_memory(namespace, "coffee")  # idempotent
    with pytest.raises(NotFoundError) as caught:
        bob.get_memory(namespace, "coffee")
    assert caught.value.status == 404 and caught.value.code == "not_found" and caught.value.request_id
    assert [event.kind for event in bob.iter_memory_events(namespace=mine, kinds=["delete"])] == ["delete"]
    with pytest.raises(TypeError):
        bob.get_memory("user", "coffee")  # one string is not a namespace


def test_errors_carry_the_service_error_body(sdk, live_service: LiveService) -> None:
    bob = sdk("bob")
    with pytest.raises(ValidationError) as caught:
        bob.put_memory(("user", "bob"), "", {"x": 1})
    error = caught.value
    assert (error.status, error.code) == (400, "validation_error")
    assert "key" in error.fields and error.request_id

    with pytest.raises(PermissionDeniedError) as denied:
        bob.put_memory(("user", "alice"), "k", {"x": 1})
    assert denied.value.code == "forbidden" and denied.value.reason

    with pytest.raises(AuthenticationError) as unauthenticated:
        Client(live_service.base_url, token="not-a-jwt").me()
    assert unauthenticated.value.code == "unauthenticated"

    with pytest.raises(ValidationError) as bad_limit:
        bob.list_conversations(limit=0)
    assert "limit" in bad_limit.value.fields


def test_identity_api_key_and_health(sdk) -> None:
    me = sdk("alice").me()
    assert (me.user_id, me.client_id, me.is_admin, me.is_indexer) == ("alice", None, True, True)
    assert "admin" in me.roles
    assert sdk("bob", api_key=TEST_API_KEY).me().client_id == TEST_API_CLIENT
    assert sdk("bob", api_key="").me().client_id is None  # no key configured: no header at all
    with pytest.raises(AuthenticationError):
        sdk("bob", api_key="wrong").me()
    client = sdk("bob")
    assert client.healthz().ok
    ready = client.readyz()
    assert ready.http_status in (200, 503) and ready.status


def test_conversations_entries_and_forks(sdk) -> None:
    bob, alice = sdk("bob"), sdk("alice")
    run = uuid.uuid4().hex[:8]  # titles made from a first text keep its first 40 characters
    created = bob.create_conversation(title=f"Trip {run}", metadata={"topic": "travel"})
    assert isinstance(created, Conversation)
    assert (created.title, created.owner_user_id, created.access_level, created.metadata) == (
        f"Trip {run}", "bob", "owner", {"topic": "travel"}
    )
    with pytest.raises(ConflictError):
        bob.create_conversation(id=created.id)
    assert bob.update_conversation(created.id, title=f"Lisbon trip {run}").title == f"Lisbon trip {run}"
    assert bob.get_conversation(created.id).metadata == {"topic": "travel"}

    rich = {"role": "AI", "text": "Sunny", "events": [{"eventType": "PartialResponse", "chunk": "Sun"}]}
    entries = [
        bob.append_entry(created.id, [{"role": "USER", "text": f"message {index}"}]) for index in range(4)
    ]
    entries.append(bob.append_entry(created.id, [rich], content_type="history/vercelai"))
    assert isinstance(entries[0], Entry) and entries[0].content == [{"role": "USER", "text": "message 0"}]
    assert (entries[-1].content_type, entries[-1].content) == ("history/vercelai", [rich])
    assert [entry.id for entry in bob.iter_entries(created.id, limit=2)] == [entry.id for entry in entries]
    first_page = bob.list_entries(created.id, limit=2)
    assert len(first_page) == 2 and first_page.after_cursor and first_page.before_cursor is None

    # From the end (D11): the newest page, then the one before it; and entries found by their key.
    tail = bob.list_entries(created.id, limit=2, tail=True)
    assert [e.id for e in tail] == [e.id for e in entries[3:]] and tail.after_cursor is None
    before = bob.list_entries(created.id, limit=2, before_cursor=tail.before_cursor)
    assert [e.id for e in before] == [e.id for e in entries[1:3]] and before.after_cursor and before.before_cursor
    with pytest.raises(ValueError):
        bob.list_entries(created.id, tail=True, before_cursor=tail.before_cursor)
    keyed = bob.append_entry(created.id, [{"role": "USER", "text": "keyed"}], key=f"k-{run}")
    assert keyed.key == f"k-{run}" and entries[0].key is None
    assert [e.id for e in bob.list_entries(created.id, key=f"k-{run}")] == [keyed.id]
    assert [e.id for e in alice.admin_list_entries(created.id, tail=True, limit=1)] == [keyed.id]
    entries.append(keyed)

    # A fork: appending to a new id with a fork point.
    fork_id = str(uuid.uuid4())
    bob.append_entry(
        fork_id, [{"role": "USER", "text": f"what about Porto? {run}"}],
        forked_at_conversation_id=created.id, forked_at_entry_id=entries[2].id,
    )
    fork = bob.get_conversation(fork_id)
    assert (fork.forked_at_conversation_id, fork.forked_at_entry_id) == (created.id, entries[2].id)
    assert [item.conversation_id for item in bob.iter_forks(created.id, limit=1)] == [created.id, fork_id]
    assert [entry.content[0]["text"] for entry in bob.iter_entries(fork_id)] == [
        "message 0", "message 1", f"what about Porto? {run}"
    ]
    listed = [conversation.id for conversation in bob.iter_conversations(mode="all", query=run, limit=1)]
    assert sorted(listed) == sorted([created.id, fork_id])
    assert [c.id for c in bob.list_conversations(mode="latest-fork", query=run)] == [fork_id]

    with pytest.raises(PermissionDeniedError):
        alice.get_conversation(created.id)  # not a member (admin does not bypass membership)
    bob.delete_conversation(created.id)
    with pytest.raises(NotFoundError):
        bob.get_conversation(created.id)


def test_context_entries_need_the_api_key(sdk) -> None:
    app = sdk("bob", api_key=TEST_API_KEY)
    conversation = app.create_conversation(title="agent")
    state = {"messages": [{"type": "human", "content": "hi"}], "step": 3}
    entry = app.append_entry(conversation.id, [state], channel="context", content_type="application/json")
    assert (entry.channel, entry.content) == ("context", [state])
    assert [e.content for e in app.iter_entries(conversation.id, channel="context")] == [[state]]
    with pytest.raises(PermissionDeniedError):
        sdk("bob").list_entries(conversation.id, channel="context")


def test_memberships_and_ownership_transfers(sdk) -> None:
    bob, charlie, alice = sdk("bob"), sdk("charlie"), sdk("alice")
    conversation = bob.create_conversation(title="shared")
    membership = bob.add_membership(conversation.id, "charlie", "reader")
    assert (membership.user_id, membership.access_level) == ("charlie", "reader")
    with pytest.raises(ConflictError):
        bob.add_membership(conversation.id, "charlie", "writer")
    assert bob.update_membership(conversation.id, "charlie", "writer").access_level == "writer"
    bob.add_membership(conversation.id, "alice", "reader")
    levels = {m.user_id: m.access_level for m in bob.iter_memberships(conversation.id, limit=1)}
    assert levels == {"bob": "owner", "charlie": "writer", "alice": "reader"}
    charlie.append_entry(conversation.id, [{"role": "USER", "text": "hi from charlie"}])

    transfer = bob.create_transfer(conversation.id, "charlie")
    assert (transfer.from_user_id, transfer.to_user_id) == ("bob", "charlie")
    assert charlie.get_transfer(transfer.id) == transfer
    assert transfer.id in [t.id for t in charlie.iter_transfers(role="recipient", limit=1)]
    assert transfer.id not in [t.id for t in bob.iter_transfers(role="recipient")]
    charlie.accept_transfer(transfer.id)
    assert bob.get_conversation(conversation.id).owner_user_id == "charlie"
    with pytest.raises(NotFoundError):
        bob.get_transfer(transfer.id)

    cancelled = charlie.create_transfer(conversation.id, "bob")
    charlie.delete_transfer(cancelled.id)
    assert cancelled.id not in [t.id for t in charlie.iter_transfers()]

    charlie.remove_membership(conversation.id, "alice")
    with pytest.raises(PermissionDeniedError):
        alice.get_conversation(conversation.id)


def test_search_indexing_and_admin(sdk) -> None:
    bob, alice, charlie = sdk("bob"), sdk("alice"), sdk("charlie")
    conversation = bob.create_conversation(title="Pastry")
    bob.append_entry(conversation.id, [{"role": "USER", "text": "pastel de nata"}], indexed_content="pastel de nata")
    unindexed = bob.append_entry(conversation.id, [{"role": "AI", "text": "custard tarts from Belem"}])

    hits = bob.search_conversations("nata", search_type="fulltext")
    assert [(hit.conversation_id, hit.conversation_title) for hit in hits] == [(conversation.id, "Pastry")]
    assert "**" in hits.data[0].highlights and 0 <= hits.data[0].score <= 1
    assert isinstance(hits.data[0].entry, Entry)
    assert charlie.search_conversations("nata", search_type="fulltext").data == []

    pending = [item for item in alice.iter_unindexed(limit=1) if item.conversation_id == conversation.id]
    assert [item.entry.id for item in pending] == [unindexed.id]
    assert alice.index_entries([
        {"conversationId": conversation.id, "entryId": unindexed.id, "indexedContent": "custard tarts belem"}
    ]) == 1
    assert [hit.entry_id for hit in bob.iter_search_conversations("belem", search_type="fulltext")] == [unindexed.id]
    with pytest.raises(PermissionDeniedError):
        bob.list_unindexed()

    assert [hit.conversation_id for hit in alice.admin_search_conversations("belem", search_type="fulltext")] == [
        conversation.id
    ]
    assert conversation.id in {c.id for c in alice.admin_iter_conversations(user_id="bob", limit=1)}
    admin_view = alice.admin_get_conversation(conversation.id)
    assert (admin_view.owner_user_id, admin_view.deleted_at) == ("bob", None)
    assert len(list(alice.admin_iter_entries(conversation.id, limit=1))) == 2
    assert len(alice.admin_list_entries(conversation.id, channel="history").data) == 2
    assert [m.user_id for m in alice.admin_list_memberships(conversation.id)] == ["bob"]
    assert [f.conversation_id for f in alice.admin_list_forks(conversation.id)] == [conversation.id]
    bob.delete_conversation(conversation.id)
    deleted = [c for c in alice.admin_list_conversations(include_deleted=True).data if c.id == conversation.id]
    assert deleted and deleted[0].deleted_at is not None
    with pytest.raises(PermissionDeniedError):
        bob.admin_list_conversations()


def test_attachments_streamed_both_ways(sdk, tmp_path) -> None:
    bob, charlie, alice = sdk("bob"), sdk("charlie"), sdk("alice")
    data = bytes(range(256)) * 5000  # 1.28 MB: several chunks each way
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    from_path = bob.upload_attachment(path, content_type="application/octet-stream", expires_in=600)
    assert (from_path.filename, from_path.size, from_path.status) == ("data.bin", len(data), "ready")
    from_bytes = bob.upload_attachment(b"hello", filename="hello.txt", content_type="text/plain")
    from_stream = bob.upload_attachment(io.BytesIO(b"streamed"), filename="s.txt")
    assert (from_bytes.size, from_stream.size, from_stream.filename) == (5, 8, "s.txt")

    with bob.download_attachment(from_path.id) as download:
        assert (download.size, download.etag) == (len(data), f'"{from_path.sha256}"')
        chunks = list(download.iter_bytes(100_000))
    assert b"".join(chunks) == data and len(chunks) > 1
    with bob.download_attachment(from_path.id) as download:
        assert download.save(tmp_path / "copy.bin") == len(data)
    assert (tmp_path / "copy.bin").read_bytes() == data
    with bob.download_attachment(from_path.id, if_none_match=f'"{from_path.sha256}"') as cached:
        assert cached.not_modified and cached.headers["cache-control"] == "private, no-cache"

    link = bob.attachment_download_url(from_bytes.id)
    assert link.url.startswith("/v1/attachments/download/") and link.expires_in > 0
    with Client(bob.base_url) as anonymous, anonymous.download_signed(link.url) as download:
        assert download.read() == b"hello"
    with charlie.download_signed(f"{bob.base_url}{link.url}") as download:
        assert download.content_type.startswith("text/plain") and download.read() == b"hello"

    with pytest.raises(PermissionDeniedError):
        charlie.download_attachment(from_bytes.id)
    # Linked from an entry through an item's attachments array, the file is readable by the conversation's readers.
    conversation = bob.create_conversation(title="files")
    bob.append_entry(conversation.id, [{"role": "USER", "attachments": [{"attachmentId": from_bytes.id}]}])
    bob.add_membership(conversation.id, "charlie", "reader")
    with charlie.download_attachment(from_bytes.id) as download:
        assert download.read() == b"hello"

    assert {a.id for a in alice.admin_iter_attachments(user_id="bob", limit=1)} >= {
        from_path.id, from_bytes.id, from_stream.id
    }
    # Admins read other users' files through the audit-logged admin endpoint only.
    with pytest.raises(PermissionDeniedError):
        alice.download_attachment(from_stream.id)
    with alice.admin_download_attachment(from_stream.id) as download:
        assert download.read() == b"streamed"
    bob.delete_attachment(from_stream.id)
    with pytest.raises(NotFoundError):
        bob.download_attachment(from_stream.id)
