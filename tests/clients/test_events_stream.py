"""Client.events() / AsyncClient.events() against the live event stream: delivery, resuming with Last-Event-ID
after a dropped connection, ``invalidate`` and ``evicted``."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest
from memory_service import Client, EventStream, StreamEvent

from tests.clients.conftest import user_token
from tests.live_service import LiveService

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_tables_after_module")]

WAIT = 15.0  # seconds an expected event may take (a condition, never a sleep)


class Reader:
    """Iterates a stream in a thread; ``next()`` waits for the next event, bounded."""

    def __init__(self, stream: EventStream) -> None:
        self.stream = stream
        self.events: queue.Queue[StreamEvent | BaseException | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for event in self.stream:
                self.events.put(event)
        except BaseException as exc:
            self.events.put(exc)
        self.events.put(None)  # the iteration ended

    def next(self) -> StreamEvent | None:
        item = self.events.get(timeout=WAIT)
        if isinstance(item, BaseException):
            raise item
        return item

    def entries(self, count: int) -> list[StreamEvent]:
        found: list[StreamEvent] = []
        while len(found) < count:
            event = self.next()
            assert event is not None, f"the stream ended after {found}"
            if event.kind == "entry":
                found.append(event)
        return found

    def close(self) -> None:
        self.stream.close()
        self.thread.join(timeout=WAIT)
        assert not self.thread.is_alive()


@pytest.fixture
def read() -> Iterator[Callable[[EventStream], Reader]]:
    """``read(stream)``: a :class:`Reader` of the stream, closed after the test."""
    opened: list[Reader] = []

    def start(stream: EventStream) -> Reader:
        opened.append(Reader(stream))
        return opened[-1]

    yield start
    for reader in opened:
        reader.close()


def test_events_are_delivered_and_resumable(sdk, read) -> None:
    bob = sdk("bob")
    conversation = bob.create_conversation(title="live")
    reader = read(bob.events(kinds=["entry"]))
    entry = bob.append_entry(conversation.id, [{"role": "USER", "text": "one"}])
    [event] = reader.entries(1)
    assert (event.event, event.kind, event.data["conversationId"], event.data["entryId"]) == (
        "created", "entry", conversation.id, entry.id
    )
    assert event.id and reader.stream.last_event_id == event.id
    reader.close()

    # Missed while disconnected: a new stream from the last id replays them first.
    missed = [bob.append_entry(conversation.id, [{"role": "USER", "text": f"m{i}"}]).id for i in range(2)]
    resumed = read(bob.events(kinds=["entry"], last_event_id=event.id))
    assert [e.data["entryId"] for e in resumed.entries(2)] == missed


def test_a_stream_past_retention_starts_with_invalidate(sdk, read) -> None:
    reader = read(sdk("bob").events(last_event_id="1-0"))
    first = reader.next()
    assert first is not None and first.is_invalidate and (first.kind, first.id) == ("stream", None)


class _DropAfterFirstEvent(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream) -> None:
        self.inner = inner

    def __iter__(self) -> Iterator[bytes]:
        seen = b""
        for chunk in self.inner:
            yield chunk
            seen += chunk
            data_at = seen.find(b"data:")
            if data_at != -1 and seen.find(b"\n\n", data_at) != -1:  # a whole event went through
                raise httpx.ReadError("connection dropped (injected)")

    def close(self) -> None:
        self.inner.close()


class DropFirstStream(httpx.BaseTransport):
    """The real transport, except that the first event stream breaks right after its first event."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.stream_requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.url.path == "/v1/events":
            self.stream_requests.append(request)
            if len(self.stream_requests) == 1:
                response.stream = _DropAfterFirstEvent(response.stream)
        return response

    def close(self) -> None:
        self.inner.close()


def test_a_dropped_stream_reconnects_with_last_event_id(live_service: LiveService, sdk, read) -> None:
    transport = DropFirstStream()
    watcher = Client(live_service.base_url, token=user_token(live_service, "bob"),
                     http_client=httpx.Client(transport=transport, timeout=30))
    bob = sdk("bob")
    conversation = bob.create_conversation(title="flaky")
    reader = read(watcher.events(kinds=["entry"]))
    first = bob.append_entry(conversation.id, [{"role": "USER", "text": "first"}])
    [event] = reader.entries(1)
    assert event.data["entryId"] == first.id
    later = [bob.append_entry(conversation.id, [{"role": "AI", "text": f"later {i}"}]).id for i in range(3)]
    # Each exactly once, in order, whether replayed after the reconnect or delivered live.
    assert [e.data["entryId"] for e in reader.entries(3)] == later
    assert len(transport.stream_requests) == 2
    assert transport.stream_requests[1].headers["last-event-id"] == event.id
    assert "last-event-id" not in transport.stream_requests[0].headers
    reader.close()
    watcher.close()


def test_a_stream_evicted_by_the_connection_limit_ends(sdk, read) -> None:
    """Opening streams beyond SSE_MAX_CONNECTIONS_PER_USER evicts the oldest: its iterator yields ``evicted``
    (reason ``connection_limit``) and ends instead of reconnecting (which would evict another)."""
    charlie = sdk("charlie")
    oldest = read(charlie.events())
    for _ in range(10):  # the limit (5), plus room for slots an earlier run left in Redis
        read(charlie.events())
        try:
            event = oldest.events.get(timeout=0.5)
        except queue.Empty:
            continue
        assert isinstance(event, StreamEvent) and event.is_evicted and event.reason == "connection_limit"
        assert oldest.next() is None  # the iteration ended
        break
    else:
        pytest.fail("the oldest stream was never evicted")


def test_async_events(live_service: LiveService, async_sdk) -> None:
    async def scenario() -> None:
        async with async_sdk("bob") as bob:
            conversation = await bob.create_conversation(title="async live")
            async with bob.events(kinds=["entry"]) as stream:
                entry = await bob.append_entry(conversation.id, [{"role": "USER", "text": "hi"}])
                event = await asyncio.wait_for(anext(stream), WAIT)
                assert (event.kind, event.data["entryId"]) == ("entry", entry.id)
                assert stream.last_event_id == event.id
            async with bob.events(last_event_id="1-0") as stream:
                assert (await asyncio.wait_for(anext(stream), WAIT)).is_invalidate

    asyncio.run(scenario())


def test_a_stream_with_a_bad_kind_fails_at_once(sdk) -> None:
    from memory_service import ValidationError

    with pytest.raises(ValidationError) as caught:
        sdk("bob").events(kinds=["nonsense"])
    assert "kinds" in caught.value.fields
