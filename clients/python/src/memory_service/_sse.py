"""The live event stream: a server-sent events parser (the WHATWG event-stream format), fed one line at a time,
:class:`BaseEventStream`, what a stream knows across its connections, and the two streams the clients hand out,
:class:`EventStream` (blocking) and :class:`AsyncEventStream` (awaited), which add reading lines and waiting. A
stream sends its connections through whatever client made it (:class:`BlockingSender`, :class:`AwaitedSender`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import httpx

from memory_service._base import Call, RetryPolicy
from memory_service._operations import EventsOptions, event_stream
from memory_service.errors import APIConnectionError, UnavailableError
from memory_service.models import StreamEvent

C = TypeVar("C")  # the client


class BlockingSender(Protocol):
    """What :class:`EventStream` needs of its client: sending a call, blocking, its body left unread."""

    def _send(self, call: Call[Any], *, stream: bool = ..., timeout: httpx.Timeout | None = ...) -> httpx.Response: ...


class AwaitedSender(Protocol):
    async def _send(
        self, call: Call[Any], *, stream: bool = ..., timeout: httpx.Timeout | None = ...,
    ) -> httpx.Response: ...


@dataclass(frozen=True, slots=True)
class RawEvent:
    data: str
    id: str | None  # the block's own id: line, if it had one


class SSEParser:
    def __init__(self) -> None:
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, line: str) -> RawEvent | None:
        """The event a blank line completes, else None. Comments (``: keepalive``) and unknown fields are skipped;
        ``event:`` and ``retry:`` carry nothing this service uses."""
        if line == "":
            if not self._data:
                self._id = None
                return None
            event = RawEvent("\n".join(self._data), self._id)
            self._data, self._id = [], None
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "id" and "\x00" not in value:
            self._id = value
        return None


def decode(raw: RawEvent) -> StreamEvent | None:
    """The service's event, or None for a data block that is not its JSON object (skipped, as browsers do with
    events they cannot use)."""
    try:
        payload = json.loads(raw.data)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    return StreamEvent.from_json(payload, raw.id or None)


class BaseEventStream(Generic[C]):
    """What an event stream knows across its connections: where it resumes (``last_event_id``), how many
    connections in a row delivered nothing, and whether to connect again. ``EventStream`` and ``AsyncEventStream``
    add the I/O: connecting, reading lines, waiting."""

    def __init__(self, client: C, policy: RetryPolicy, options: EventsOptions) -> None:
        self.last_event_id = options.last_event_id  # where a new stream would resume
        self._client = client
        self._response: httpx.Response | None = None
        self._reconnect = options.reconnect
        self._timeout = httpx.Timeout(10.0, read=options.read_timeout)
        self._kinds = options.kinds
        self._policy = policy
        self._max_attempts = options.max_reconnect_attempts
        self._failures = 0  # consecutive connections that delivered no event
        self._last_error: Exception | None = None
        self._parser = SSEParser()
        self._ended = False  # evicted for the user's connection limit: connecting again would evict another

    def _request(self) -> Call[None]:
        """The next connection's request (streamed by the client)."""
        self._parser = SSEParser()
        return event_stream(kinds=self._kinds, last_event_id=self.last_event_id)

    def _delay(self) -> float:
        """Seconds to wait before the next connection (0 for the first, and after one that delivered); raises
        once ``max_reconnect_attempts`` reconnects in a row failed."""
        if not self._failures:
            return 0.0
        if self._max_attempts is not None and self._failures > self._max_attempts:
            raise self._last_error or APIConnectionError("the event stream kept ending; gave up reconnecting")
        return self._policy.delay(self._failures - 1)

    def _connect_failed(self, error: Exception) -> None:
        """Opening a connection failed: raised again when the stream does not reconnect."""
        if not self._reconnect:
            raise error
        self._last_error = error
        self._failures += 1

    def _feed(self, line: str) -> StreamEvent | None:
        """The event a line completes, if any (the connection stops being read after an ``evicted`` one)."""
        raw = self._parser.feed(line)
        event = None if raw is None else decode(raw)
        if event is not None:
            self._failures, self._last_error = 0, None
            if event.id is not None:
                self.last_event_id = event.id
            self._ended = event.is_evicted and event.reason == "connection_limit"
        return event

    def _again(self, closed: bool) -> bool:
        """The connection ended (dropped, evicted or closed): whether to open another."""
        if self._ended or not self._reconnect or closed:
            return False
        self._failures += 1
        return True


class EventStream(BaseEventStream[BlockingSender], Iterator[StreamEvent]):
    """Iterator over the live event stream; see :meth:`Client.events`. It is connected when ``events()`` returns:
    everything that happens from then on is delivered."""

    def __init__(self, client: BlockingSender, policy: RetryPolicy, options: EventsOptions) -> None:
        super().__init__(client, policy, options)
        self._closed = threading.Event()
        self._events = self._run()

    def connect(self) -> None:
        """Open the connection now, if it is not open (``events()`` does); errors such as a 401 are raised here."""
        if self._response is None:
            self._response = self._client._send(self._request(), stream=True, timeout=self._timeout)

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> StreamEvent:
        return next(self._events)

    def close(self) -> None:
        """Stop (from any thread): the iteration ends."""
        self._closed.set()
        response = self._response
        if response is not None:
            # Closing a socket does not wake a thread blocked reading it; shutting it down does.
            network_stream = response.extensions.get("network_stream")
            sock = network_stream.get_extra_info("socket") if network_stream is not None else None
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            response.close()
        with contextlib.suppress(ValueError):  # being iterated by another thread right now: it ends by itself
            self._events.close()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self) -> Generator[StreamEvent, None, None]:
        while not self._closed.is_set():
            delay = self._delay()
            if delay and self._closed.wait(delay):
                return
            try:
                self.connect()
            except (APIConnectionError, UnavailableError) as exc:
                self._connect_failed(exc)
                continue
            response = self._response
            assert response is not None
            try:
                for line in response.iter_lines():
                    event = self._feed(line)
                    if event is not None:
                        yield event
                        if event.is_evicted:
                            break
            except (httpx.TransportError, httpx.StreamError):
                pass  # dropped, or closed by close(): reconnect below, or stop
            finally:
                response.close()
                self._response = None
            if not self._again(self._closed.is_set()):
                return


class AsyncEventStream(BaseEventStream[AwaitedSender], AsyncIterator[StreamEvent]):
    """Async iterator over the live event stream; see :meth:`AsyncClient.events`. ``async with`` connects it on
    entry (everything that happens from then on is delivered); plain ``async for`` connects on the first step."""

    def __init__(self, client: AwaitedSender, policy: RetryPolicy, options: EventsOptions) -> None:
        super().__init__(client, policy, options)
        self._closed = asyncio.Event()
        self._events = self._run()

    async def connect(self) -> None:
        """Open the connection now, if it is not open; errors such as a 401 are raised here."""
        if self._response is None:
            self._response = await self._client._send(self._request(), stream=True, timeout=self._timeout)

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> StreamEvent:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        """Stop: the iteration ends."""
        self._closed.set()
        response = self._response
        if response is not None:
            await response.aclose()
        with contextlib.suppress(RuntimeError):  # being iterated by another task right now: it ends by itself
            await self._events.aclose()

    async def __aenter__(self) -> AsyncEventStream:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _wait_closed(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self._closed.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def _run(self) -> AsyncGenerator[StreamEvent, None]:
        while not self._closed.is_set():
            delay = self._delay()
            if delay and await self._wait_closed(delay):
                return
            try:
                await self.connect()
            except (APIConnectionError, UnavailableError) as exc:
                self._connect_failed(exc)
                continue
            response = self._response
            assert response is not None
            try:
                async for line in response.aiter_lines():
                    event = self._feed(line)
                    if event is not None:
                        yield event
                        if event.is_evicted:
                            break
            except (httpx.TransportError, httpx.StreamError):
                pass  # dropped, or closed by aclose(): reconnect below, or stop
            finally:
                self._response = None
                await response.aclose()
            if not self._again(self._closed.is_set()):
                return
