"""A server-sent events parser (the WHATWG event-stream format), fed one line at a time."""

from __future__ import annotations

import json
from dataclasses import dataclass

from memory_service.models import StreamEvent


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
