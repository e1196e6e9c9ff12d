"""Typed shapes of what the service answers, and of the few structured things a caller sends.

Responses are frozen dataclasses with snake_case attributes (the wire uses camelCase for conversations and
snake_case for memories); timestamps are timezone-aware :class:`datetime.datetime`, ids are strings. Each class
has ``from_json`` to build it from the service's JSON (:class:`Model`: read by its fields, names and types), and
ignores fields it does not know, so a newer service does not break an older client. Content items of entries and memory values stay plain JSON (dicts): they are the
caller's own data, returned as sent.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Generic, Literal, Required, Self, TypedDict, TypeVar

T = TypeVar("T")

AccessLevel = Literal["owner", "manager", "writer", "reader"]
Channel = Literal["history", "context"]
ListMode = Literal["all", "roots", "latest-fork"]
SearchType = Literal["auto", "fulltext", "semantic"]
TransferRole = Literal["all", "sender", "recipient"]
MemoryEventKind = Literal["add", "update", "delete", "expired"]
Namespace = tuple[str, ...]


class Model:
    """A shape of the service's answers. ``from_json`` reads each field from the key of its name (camelCase, or
    as is when ``_snake_case``), by its type: timestamps parsed, tuples and nested models built. A field that has a
    default may be absent (or null); one that may be None is None when absent; any other must be there."""

    __slots__ = ()
    _snake_case: ClassVar[bool] = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        values: dict[str, Any] = {}
        for name, key, convert, need in _reading(cls):
            value = data.get(key)
            if value is not None:
                values[name] = convert(value)
            elif need == "required":
                values[name] = data[key]
            elif need == "nullable":
                values[name] = None
        return cls(**values)


_Need = Literal["required", "nullable", "defaulted"]
_Reading = list[tuple[str, str, Callable[[Any], Any], _Need]]
_readings: dict[type[Model], _Reading] = {}


def _reading(cls: type[Model]) -> _Reading:
    """For each field of ``cls``: its name, its key on the wire, how its value is read and whether it must be
    there (worked out once per class)."""
    if cls in _readings:
        return _readings[cls]
    hints = typing.get_type_hints(cls)
    reading: _Reading = []
    for spec in dataclasses.fields(cls):  # type: ignore[arg-type]
        hint = hints[spec.name]
        types_ = set(typing.get_args(hint)) if isinstance(hint, types.UnionType) else {hint}
        defaulted = spec.default is not dataclasses.MISSING or spec.default_factory is not dataclasses.MISSING
        need: _Need = "defaulted" if defaulted else "nullable" if type(None) in types_ else "required"
        key = spec.name if cls._snake_case else re.sub(r"_([a-z])", lambda m: m[1].upper(), spec.name)
        reading.append((spec.name, key, _converter(types_ - {type(None)}), need))
    _readings[cls] = reading
    return reading


def _converter(types_: set[Any]) -> Callable[[Any], Any]:
    [hint] = types_ if len(types_) == 1 else [Any]
    if hint is datetime:
        return datetime.fromisoformat
    if typing.get_origin(hint) is tuple:
        return tuple
    if isinstance(hint, type) and issubclass(hint, Model):
        return hint.from_json
    return lambda value: value


# --- Requests ---------------------------------------------------------------------------------------------------


class HistoryItem(TypedDict, total=False):
    """A content item of a history entry. Only ``role`` is required; every other field (``events``, ``type``,
    your own) is stored and returned as sent. ``text`` is what search indexes; ``attachmentId`` and
    ``attachments[].attachmentId`` link uploaded attachments to the entry."""

    role: Required[Literal["USER", "AI"]]
    text: str
    attachmentId: str
    attachments: list[dict[str, Any]]
    events: list[dict[str, Any]]


class IndexItem(TypedDict):
    """One item of :meth:`memory_service.Client.index_entries` (camelCase, as sent)."""

    conversationId: str
    entryId: str
    indexedContent: str


class SearchQuery(TypedDict, total=False):
    """One question of a multi-query memory search (``queries=``; a plain string is ``{"text": ...}``): ``purpose``
    names it in the results' ``matched_queries`` (its ``text`` does when there is none)."""

    text: Required[str]
    purpose: str


# A memory search filter: attribute name -> a scalar (equality) or an object of ``in`` / ``gt`` / ``gte`` / ``lt`` /
# ``lte`` (or their ``$``-prefixed aliases).
Filter = Mapping[str, Any]


# --- Pages ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a cursor-paginated list. ``after_cursor`` is None on the last page; the ``iter_*`` methods of
    the clients follow it for you. Entry lists are paged both ways: ``before_cursor`` is the page before this one
    (None on the first page; always None on other lists)."""

    data: list[T]
    after_cursor: str | None
    before_cursor: str | None = None

    def __iter__(self) -> Iterator[T]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


# --- Identity and operations ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Me(Model):
    user_id: str
    client_id: str | None
    roles: tuple[str, ...] = ()
    is_admin: bool = False
    is_auditor: bool = False
    is_indexer: bool = False


@dataclass(frozen=True, slots=True)
class Health:
    """``/healthz`` (``checks`` empty) or ``/readyz`` (``status`` ``ok`` or the failing parts in ``checks``)."""

    status: str
    checks: dict[str, str] = field(default_factory=dict)
    http_status: int = 200

    @property
    def ok(self) -> bool:
        return self.http_status == 200

    @classmethod
    def from_json(cls, data: Mapping[str, Any], http_status: int = 200) -> Health:
        return cls(status=str(data.get("status", "")), checks=dict(data.get("checks") or {}), http_status=http_status)


# --- Memories ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryWriteResult(Model):
    """What ``put_memory`` answers: the new version, without its value."""

    _snake_case = True

    id: str
    namespace: Namespace
    key: str
    attributes: dict[str, Any] | None
    created_at: datetime
    expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class Memory(Model):
    """An active memory (``get_memory``). ``created_at`` is the time of this version (every write is a version)."""

    _snake_case = True

    id: str
    namespace: Namespace
    key: str
    value: dict[str, Any]
    attributes: dict[str, Any] | None
    created_at: datetime
    expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class MemorySearchItem(Model):
    """A search result: ``score`` in [0, 1], higher is better, for a search with ``query`` or ``queries`` (what it
    means depends on ``search_type``: see :meth:`~memory_service.Client.search_memories`), None for an attribute
    search. ``matched_queries``: with ``queries``, the purposes (or texts) of the questions that found it; None
    otherwise."""

    _snake_case = True

    id: str
    namespace: Namespace
    key: str
    value: dict[str, Any]
    attributes: dict[str, Any] | None
    score: float | None
    created_at: datetime
    matched_queries: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class MemoryEvent(Model):
    """A memory timeline event; ``value`` and ``attributes`` are None for ``delete`` and ``expired``."""

    _snake_case = True

    id: str
    namespace: Namespace
    key: str
    kind: MemoryEventKind
    occurred_at: datetime
    value: dict[str, Any] | None
    attributes: dict[str, Any] | None


# --- Conversations ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Conversation(Model):
    """A conversation. Listings (``list_conversations``) leave ``metadata`` and the fork fields None: fetch the
    conversation for them."""

    id: str
    title: str
    owner_user_id: str
    created_at: datetime
    updated_at: datetime
    access_level: AccessLevel
    metadata: dict[str, Any] | None = None
    forked_at_conversation_id: str | None = None
    forked_at_entry_id: str | None = None


@dataclass(frozen=True, slots=True)
class AdminConversation(Model):
    """A conversation as the admin endpoints show it (no caller level; ``deleted_at`` for deleted ones)."""

    id: str
    title: str
    owner_user_id: str
    created_at: datetime
    updated_at: datetime
    metadata: dict[str, Any] = field(default_factory=dict)
    forked_at_conversation_id: str | None = None
    forked_at_entry_id: str | None = None
    deleted_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Entry(Model):
    """An entry. ``content`` is the list of items exactly as they were appended."""

    id: str
    conversation_id: str
    user_id: str
    channel: Channel
    content_type: str
    content: list[dict[str, Any]]
    created_at: datetime
    key: str | None = None  # the lookup key it was appended with


@dataclass(frozen=True, slots=True)
class Fork(Model):
    """A member of a fork tree (the root has no fork point)."""

    conversation_id: str
    title: str
    forked_at_conversation_id: str | None
    forked_at_entry_id: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Membership(Model):
    conversation_id: str
    user_id: str
    access_level: AccessLevel
    created_at: datetime


@dataclass(frozen=True, slots=True)
class OwnershipTransfer(Model):
    id: str
    conversation_id: str
    from_user_id: str
    to_user_id: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class SearchResult(Model):
    """A conversation search hit: the conversation's best entry, ``score`` in [0, 1] (higher is better),
    ``highlights`` with matched terms in ``**``."""

    conversation_id: str
    conversation_title: str
    entry_id: str
    score: float
    highlights: str
    entry: Entry


@dataclass(frozen=True, slots=True)
class UnindexedEntry(Model):
    conversation_id: str
    entry: Entry


# --- Attachments ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attachment(Model):
    """An uploaded file. ``user_id`` and ``created_at`` are set in admin listings only."""

    id: str
    href: str
    content_type: str
    filename: str
    size: int
    sha256: str
    expires_at: datetime | None
    status: str
    user_id: str | None = None
    created_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class DownloadUrl(Model):
    """A signed download link: ``url`` is a path on the service (``/v1/attachments/download/<token>/<name>``)
    that needs no credentials until ``expires_in`` seconds have passed."""

    url: str
    expires_in: int


# --- Live events ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of the live stream (``events()``).

    ``event`` is ``created`` / ``updated`` / ``deleted`` for changes (``kind`` ``conversation``, ``entry`` or
    ``membership``; ``data`` holds ids only), or, with ``kind`` ``stream``: ``invalidate`` (events were missed:
    refetch what you show, then keep following) and ``evicted`` (the server closes this stream;
    ``data["reason"]`` says why). ``id`` is the resumable position (None for ``stream`` events).
    """

    event: str
    kind: str
    data: dict[str, Any]
    id: str | None = None

    @property
    def is_invalidate(self) -> bool:
        return self.kind == "stream" and self.event == "invalidate"

    @property
    def is_evicted(self) -> bool:
        return self.kind == "stream" and self.event == "evicted"

    @property
    def reason(self) -> str | None:
        """Why an ``evicted`` event came: ``connection_limit``, ``slow_consumer`` or ``token_expired``."""
        reason = self.data.get("reason")
        return reason if isinstance(reason, str) else None

    @classmethod
    def from_json(cls, data: Mapping[str, Any], event_id: str | None = None) -> StreamEvent:
        payload = data.get("data")
        return cls(
            event=str(data.get("event", "")),
            kind=str(data.get("kind", "")),
            data=dict(payload) if isinstance(payload, Mapping) else {},
            id=event_id,
        )
