"""AsyncClient against the live service: the same operations awaited, async iterators over cursors, streamed
attachments, and the errors of the sync client. Each test runs its scenario in a fresh event loop."""

from __future__ import annotations

import asyncio
import inspect
import io
import uuid

import pytest
from memory_service import AsyncClient, Client, ConflictError, NotFoundError, ValidationError

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_tables_after_module")]


def test_the_async_client_has_every_method_of_the_sync_one() -> None:
    """With the same parameters: both inherit each operation from one declaration (memory_service._methods)."""

    def methods(cls: type) -> dict[str, inspect.Signature]:
        return {name: inspect.signature(getattr(cls, name)) for name in dir(cls)
                if not name.startswith("_") and callable(getattr(cls, name))}

    sync, awaited = methods(Client), methods(AsyncClient)
    assert sync.keys() - {"close"} == awaited.keys() - {"aclose"}
    assert len(sync) > 50
    assert all(sync[name] == awaited[name] for name in sync.keys() - {"close"})


def test_async_memories_and_conversations(async_sdk) -> None:
    async def scenario() -> None:
        async with async_sdk("bob") as bob:
            run = uuid.uuid4().hex[:8]
            namespace = ("user", "bob", run)
            written = await asyncio.gather(*(bob.put_memory(namespace, f"k{i}", {"i": i}) for i in range(5)))
            assert sorted(result.key for result in written) == [f"k{i}" for i in range(5)]
            assert (await bob.get_memory(namespace, "k3")).value == {"i": 3}
            assert len([item async for item in bob.iter_search_memories(namespace, page_size=2)]) == 5
            events = [event async for event in bob.iter_memory_events(namespace=namespace, limit=2)]
            assert sorted(event.key for event in events) == [f"k{i}" for i in range(5)]  # written concurrently
            assert await bob.list_namespaces(prefix=namespace) == [namespace]
            await bob.delete_memory(namespace, "k3")
            with pytest.raises(NotFoundError):
                await bob.get_memory(namespace, "k3")
            with pytest.raises(ValidationError) as caught:
                await bob.put_memory(namespace, "", {})
            assert "key" in caught.value.fields

            conversation = await bob.create_conversation(title=f"async {run}")
            with pytest.raises(ConflictError):
                await bob.create_conversation(id=conversation.id)
            for index in range(3):
                await bob.append_entry(conversation.id, [{"role": "USER", "text": f"t{index}"}])
            texts = [entry.content[0]["text"] async for entry in bob.iter_entries(conversation.id, limit=1)]
            assert texts == ["t0", "t1", "t2"]
            assert [c.id async for c in bob.iter_conversations(query=run, limit=1)] == [conversation.id]
            await bob.add_membership(conversation.id, "charlie", "reader")
            assert {m.user_id async for m in bob.iter_memberships(conversation.id)} == {"bob", "charlie"}
            await bob.delete_conversation(conversation.id)
            assert (await bob.me()).user_id == "bob"

    asyncio.run(scenario())


def test_async_attachments(async_sdk, tmp_path) -> None:
    data = b"0123456789" * 200_000  # 2 MB

    async def scenario() -> None:
        async with async_sdk("bob") as bob:
            path = tmp_path / "big.bin"
            path.write_bytes(data)
            uploaded = await bob.upload_attachment(path)
            small = await bob.upload_attachment(io.BytesIO(b"tiny"), filename="tiny.txt", content_type="text/plain")
            async with await bob.download_attachment(uploaded.id) as download:
                assert download.size == len(data)
                received = [chunk async for chunk in download.iter_bytes(500_000)]
            assert b"".join(received) == data and len(received) > 1
            async with await bob.download_attachment(uploaded.id, if_none_match=f'"{uploaded.sha256}"') as cached:
                assert cached.not_modified
            link = await bob.attachment_download_url(small.id)
            async with AsyncClient(bob.base_url) as anonymous:
                async with await anonymous.download_signed(link.url) as download:
                    assert await download.read() == b"tiny"
        async with async_sdk("alice") as alice:  # admin: through the audit-logged admin endpoint
            async with await alice.admin_download_attachment(small.id) as download:
                assert await download.read() == b"tiny"
        async with async_sdk("bob") as bob:
            await bob.delete_attachment(small.id)
            with pytest.raises(NotFoundError):
                await bob.download_attachment(small.id)

    asyncio.run(scenario())
