"""The Redis layout of the live event stream (D8), shared by the publisher (sync, web threads) and the stream
consumer (asyncio).

- ``<prefix>u:<user>``: a Redis Stream per user. Each entry is an event (field ``e``: the exact JSON of the SSE
  ``data:`` line), an ``invalidate`` the publisher owed the user for events it could not send (field ``i``: the
  wall-clock milliseconds of the newest of them; streams show it as the plain ``invalidate`` event), or a control
  message for the user's open streams (field ``c``: ``{"close": <connection id>}``, the per-user connection limit). The entry id is the SSE ``id:``; ids only grow, so a client's last id orders every
  later entry after it. Entries older than ``SSE_RETENTION_SECONDS`` are trimmed (``XADD ... MINID ~``) and an idle
  stream expires, so retention is bounded without a sweeper.
- ``<prefix>p:<user>``: a Pub/Sub channel carrying every entry appended to the user's stream, as
  ``<entry id> <field><value>``. Appends go through one script (``append_args``) that adds the entry and publishes it,
  so the live feed and the stream agree on ids and order. Processes with open streams subscribe to their users'
  channels (apps.events.hub): Redis pushes each entry once per process, and a process sends Redis nothing per event.
- ``<prefix>c:<user>``: a sorted set of the user's open streams across every process, scored by a global counter
  (``<prefix>seq``), so "the oldest" is well defined even between hosts whose clocks differ.

Resume is exact without extra bookkeeping: trimming only ever removes a stream's oldest entries, so when the
client's last id is still in the stream, every later entry is too (replay everything after it); when it is gone
(trimmed, expired, or Redis restarted empty), something may have been lost and the client gets one ``invalidate``.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from django.conf import settings

EVENTS = ("created", "updated", "deleted")
KINDS = ("conversation", "entry", "membership")
# Events of kind "stream" are about the connection itself and pass every `kinds` filter.
STREAM_KIND = "stream"

_ENTRY_ID = re.compile(r"^\d{1,20}-\d{1,20}$")


def prefix() -> str:
    return settings.SSE_REDIS_PREFIX


def stream_key(user_id: str) -> str:
    return f"{prefix()}u:{user_id}"


def channel_key(user_id: str) -> str:
    return f"{prefix()}p:{user_id}"


def connections_key(user_id: str) -> str:
    return f"{prefix()}c:{user_id}"


def sequence_key() -> str:
    return f"{prefix()}seq"


def retention_ms() -> int:
    return settings.SSE_RETENTION_SECONDS * 1000


def stream_ttl_seconds() -> int:
    # A stream whose newest entry is older than retention holds nothing a client may replay.
    return settings.SSE_RETENTION_SECONDS + 60


# KEYS: stream, channel. ARGV: field ("e" event, "c" control), value, MINID (trim), TTL. Returns the entry id.
_APPEND = """
local id = redis.call('XADD', KEYS[1], 'MINID', '~', ARGV[3], '*', ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('PUBLISH', KEYS[2], id .. ' ' .. ARGV[1] .. ARGV[2])
return id
"""


def append_args(user_id: str, field: str, value: bytes | str) -> tuple:
    """Arguments of ``EVAL`` (sync or asyncio client, or a pipeline) appending ``{field: value}`` to the user's
    stream and publishing it on the user's channel, trimming entries past retention and refreshing the stream's
    expiry. EVAL rather than EVALSHA: nothing to reload after a Redis restart (Redis caches the compiled script)."""
    if field not in ("e", "c", "i"):
        raise ValueError("field must be 'e', 'c' or 'i'")
    minid = int(time.time() * 1000) - retention_ms()
    return (_APPEND, 2, stream_key(user_id), channel_key(user_id), field, value, minid, stream_ttl_seconds())


# The same append for many users in one call (an event to every member of a conversation). ARGV: the key prefix,
# then as _APPEND's (field, value, MINID, TTL), then the user ids; the keys are built here as stream_key and
# channel_key build them. Sending _APPEND once per recipient cost the web process a command to build, send and parse
# per member, and Valkey a script-body hash per call: an append to a conversation of 2,000 members kept its worker
# ~100 ms publishing (bench/conversations.py, issue 28 item 3). What is left grows with the members still: one
# XADD and PUBLISH per member's stream, in Valkey.
_FAN_OUT = """
local prefix, field, value, minid, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
for i = 6, #ARGV do
    local stream = prefix .. 'u:' .. ARGV[i]
    local id = redis.call('XADD', stream, 'MINID', '~', minid, '*', field, value)
    redis.call('EXPIRE', stream, ttl)
    redis.call('PUBLISH', prefix .. 'p:' .. ARGV[i], id .. ' ' .. field .. value)
end
return #ARGV - 5
"""
# Users per fan-out call: Valkey runs one script at a time, so a huge one would hold up every other client.
FAN_OUT_BATCH = 500


def fan_out_args(user_ids: list[str], field: str, value: bytes | str) -> list[tuple]:
    """``append_args`` for many users: the arguments of one ``EVAL`` per FAN_OUT_BATCH users, each appending
    ``{field: value}`` to every one of their streams and publishing it on their channels."""
    if field not in ("e", "c", "i"):
        raise ValueError("field must be 'e', 'c' or 'i'")
    head = (prefix(), field, value, int(time.time() * 1000) - retention_ms(), stream_ttl_seconds())
    return [
        (_FAN_OUT, 0, *head, *user_ids[start : start + FAN_OUT_BATCH])
        for start in range(0, len(user_ids), FAN_OUT_BATCH)
    ]


def parse_published(data: bytes) -> tuple[str, dict[bytes, bytes]]:
    """A channel message → (entry id, the entry's fields), the shape XREAD/XRANGE give."""
    entry_id, _, rest = data.partition(b" ")
    return entry_id.decode(), {rest[:1]: rest[1:]}


def slot_ttl() -> int:
    """Expiry of a user's set of open streams; refreshed by each process holding one, so the set of a crashed
    process's streams expires on its own."""
    return int(max(60, 4 * settings.SSE_KEEPALIVE_SECONDS))


def encode_event(event: str, kind: str, data: dict[str, Any]) -> bytes:
    return json.dumps({"event": event, "kind": kind, "data": data}, separators=(",", ":")).encode()


def payload_of(fields: dict[bytes, bytes]) -> bytes | None:
    """The ``data:`` JSON a stream entry shows a client (None for a control message)."""
    payload = fields.get(b"e")
    if payload is None and b"i" in fields:
        return INVALIDATE
    return payload


def stream_event(event: str, reason: str | None = None) -> bytes:
    """An event about the connection itself (``invalidate``, ``evicted``): never stored, so it carries no id."""
    return encode_event(event, STREAM_KIND, {"reason": reason} if reason else {})


INVALIDATE = stream_event("invalidate")


def valid_entry_id(value: str) -> bool:
    return bool(_ENTRY_ID.match(value))


def resumable(last_event_id: str) -> bool:
    """Whether a ``Last-Event-ID`` may be replayed from: one of our ids, and no older than retention. Approximate
    trimming may keep older entries a while, but the promise is SSE_RETENTION_SECONDS: a client away longer is told
    to refetch whether or not they are still there."""
    return valid_entry_id(last_event_id) and entry_id_key(last_event_id)[0] >= time.time() * 1000 - retention_ms()


def kind_of(payload: bytes) -> str:
    try:
        return json.loads(payload).get("kind", "")
    except ValueError:
        return ""


def entry_id_key(entry_id: str) -> tuple[int, int]:
    milliseconds, _, sequence = entry_id.partition("-")
    return int(milliseconds), int(sequence)


def sse_block(data: bytes, entry_id: str | None = None) -> bytes:
    """One SSE event: an ``id:`` line when it can be resumed from, one ``data:`` line, a blank line."""
    head = f"id: {entry_id}\n".encode() if entry_id else b""
    return head + b"data: " + data + b"\n\n"


KEEPALIVE = b": keepalive\n\n"


def parse_kinds(raw: str | None) -> frozenset[str] | None:
    """The ``kinds`` query parameter: None = every kind. Raises ValueError naming an unknown kind."""
    if raw is None or not raw.strip():
        return None
    kinds = {part.strip() for part in raw.split(",") if part.strip()}
    unknown = sorted(kinds - set(KINDS))
    if unknown:
        raise ValueError(f"unknown kind '{unknown[0]}'; expected a comma-separated list of {', '.join(KINDS)}")
    return frozenset(kinds)
