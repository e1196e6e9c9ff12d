"""The live event stream without I/O: a server-sent events parser (the WHATWG event-stream format), fed one line at
a time, and :class:`BaseEventStream`, what a stream knows across its connections (the clients' ``EventStream`` and
``AsyncEventStream`` add reading lines and waiting)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Generic, TypeVar

import httpx

from memory_service._base import Call, RetryPolicy
from memory_service._operations import EventsOptions, event_stream
from memory_service.errors import APIConnectionError
from memory_service.models import StreamEvent

C = TypeVar("C")  # the client


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
