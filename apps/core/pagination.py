"""The one pagination module (D3): the limit check, the cursor codec and the keyset pager.

Every list declares its own limit bounds (``LimitBounds``) with its request validation (its app's serializers.py),
and its view hands them to ``parse_limit`` (through apps.core.requests.page_params for a query) and to the schema
helpers of apps.core.serializers; nothing here knows the endpoints.

A cursor is base64url (unpadded) of the JSON ``[position, item id, tag]`` of the last item returned: the position is
the list's sort value (a timestamp, a score or a sequence number), the id a UUID, and the tag names the list (and,
for ranked lists, the query), so a cursor handed to another list or another search is a 400 instead of a silently
wrong page. ``decode_cursor`` is the only decoder: it refuses a cursor over ``MAX_CURSOR_CHARS`` or outside the
base64url alphabet before decoding anything, and nested JSON before the recursive JSON decoder sees it; every
refusal is the same 400 ``validation_error`` naming the cursor field ("malformed cursor").

``keyset_page`` is the only pager. Continuing from a cursor is a keyset condition
(``(position, id) > (cursor.position, cursor.id)``, ``<`` for newest-first lists), never a lookup of that item, so
a cursor whose item was deleted in the meantime still continues at the right place; it fetches limit + 1 rows, so
the next cursor is null exactly when nothing follows. The rows come from a ``Keyset``: ``ModelKeyset`` (a QuerySet),
``SqlKeyset`` (a raw-SQL list) or a list's own (conversation search ranks in Python).

``keyset_window`` pages a list both ways (D11's conversation entries): after a cursor (or from the start), before a
cursor, or its newest page (``tail``); every page is in the list's order, and carries the cursor of the page before
it (``beforeCursor``, tagged ``<tag>.before``) as well as the one after it. Walking back is the same keyset
condition turned round (``< (position, id)`` from the end), so it costs what walking forward costs.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from django.db import connection
from django.db.models import F, Q, QuerySet

from apps.core import errors
from apps.core.parsers import nesting_exceeds
from apps.core.shapes import Envelope, WindowEnvelope

T = TypeVar("T")


@dataclass(frozen=True)
class LimitBounds:
    """A list's ``limit``: the default when it is absent and the maximum (D3: the minimum is 1). Each list declares
    its own in its app's serializers.py, as the interface's limits table gives them, and its view names them; this
    module only checks them."""

    default: int
    maximum: int
    minimum: int = 1


MAX_OFFSET = 10_000  # memory search pages by offset (D3)


def parse_limit(raw: Any, bounds: LimitBounds, field: str = "limit", *, body: bool = False) -> int:
    """The request's limit, or ``bounds.default`` when absent; anything else than an integer within ``bounds`` is
    400. A query value is text ("5"); a JSON body's (``body=True``) must be a JSON integer."""
    if raw is None:
        return bounds.default  # an empty query value is not absent: int("") below makes it a 400 (D3)
    if isinstance(raw, bool):
        raise _limit_error(field, bounds)
    if isinstance(raw, str) and not body:
        try:
            raw = int(raw.strip())
        except ValueError:
            raise _limit_error(field, bounds) from None
    if not isinstance(raw, int) or not bounds.minimum <= raw <= bounds.maximum:
        raise _limit_error(field, bounds)
    return raw


def parse_offset(raw: Any, field: str = "offset") -> int:
    if raw is None:
        return 0
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= MAX_OFFSET:
        raise errors.validation_error({field: f"must be an integer between 0 and {MAX_OFFSET}"})
    return raw


def _limit_error(field: str, bounds: LimitBounds) -> errors.ApiError:
    return errors.validation_error({field: f"must be an integer between {bounds.minimum} and {bounds.maximum}"})


# --- The cursor codec -------------------------------------------------------------------------------------------

# Ours are at most ~150 characters (a 38-character search tag, a float's repr, a UUID); the bound is what the schema
# states and what decode_cursor checks before decoding anything.
MAX_CURSOR_CHARS = 256
_CURSOR_ALPHABET = "A-Za-z0-9_-"  # base64url, unpadded
_CURSOR_TEXT = re.compile(f"[{_CURSOR_ALPHABET}]+")
CURSOR_SCHEMA: dict[str, Any] = {
    "type": "string",
    "maxLength": MAX_CURSOR_CHARS,
    # Empty is allowed: an empty query value is read as absent (the first page).
    "pattern": f"^[{_CURSOR_ALPHABET}]*$",
}


def _timestamp(value: Any) -> datetime:
    if not isinstance(value, str):
        raise ValueError("not a timestamp")
    position = datetime.fromisoformat(value)
    if position.tzinfo is None:
        raise ValueError("naive timestamp")
    return position


def _score(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError("not a finite number")
    return float(value)


# An integer position or id is a bigint column's value: anything outside could name no row, and would reach the SQL
# as a numeric parameter (the bigint column then compared as numeric).
_BIGINT = range(-(2**63), 2**63)


def _sequence(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in _BIGINT:
        raise ValueError("not a bigint")
    return value


# The position kinds a cursor can carry, each with its parser from the cursor's JSON value.
_POSITIONS: dict[type, Callable[[Any], Any]] = {datetime: _timestamp, float: _score, int: _sequence}


def encode_cursor(tag: str, position: Any, item_id: Any) -> str:
    """The cursor continuing after the item ``item_id`` (a UUID, or a sequence number where that is what tells a
    list's items apart) at ``position`` of the list ``tag``."""
    if isinstance(position, datetime):
        position = position.isoformat()
    raw = json.dumps([position, str(item_id), tag], separators=(",", ":")).encode()
    cursor = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    if len(cursor) > MAX_CURSOR_CHARS:  # a programming error (a long tag): such a cursor would never decode
        raise ValueError(f"cursor of {tag!r} longer than {MAX_CURSOR_CHARS} characters")
    return cursor


def _sequence_id(value: str) -> int:
    if not _SEQUENCE_ID.fullmatch(value) or int(value) not in _BIGINT:
        raise ValueError("not a sequence number")
    return int(value)


_SEQUENCE_ID = re.compile("[0-9]{1,19}")  # no sign, and no int() of a long digit string
# The item id kinds a cursor can carry (encode_cursor writes either as text).
_IDS: dict[type, Callable[[str], Any]] = {uuid.UUID: uuid.UUID, int: _sequence_id}


def decode_cursor(
    cursor: str, tag: str, kind: type = datetime, field: str = "afterCursor", id_kind: type = uuid.UUID
) -> tuple[Any, Any]:
    """(position, item id) of a cursor made by ``encode_cursor(tag, <position>, id)``. Anything else (over-long,
    not base64url, not UTF-8 JSON, nested, another list's tag, a position not of ``kind``: a ``datetime`` with its
    zone, a finite ``float`` or a bigint ``int``; an id not of ``id_kind``: a UUID or a non-negative bigint) is a 400
    naming ``field``."""
    malformed = errors.validation_error({field: "malformed cursor"})
    if len(cursor) > MAX_CURSOR_CHARS or not _CURSOR_TEXT.fullmatch(cursor):
        raise malformed
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        # Ours are a flat list: anything nested must not reach the recursive decoder.
        if nesting_exceeds(raw, 1):
            raise malformed
        value = json.loads(raw.decode("utf-8"))
        if not (isinstance(value, list) and len(value) == 3 and value[2] == tag and isinstance(value[1], str)):
            raise malformed
        return _POSITIONS[kind](value[0]), _IDS[id_kind](value[1])
    except (ValueError, TypeError, OverflowError, binascii.Error):  # UnicodeError and JSONDecodeError included
        raise malformed from None


# --- The keyset pager -------------------------------------------------------------------------------------------


@dataclass
class Page(Generic[T]):
    items: list[T]
    next_cursor: str | None
    before_cursor: str | None = None  # keyset_window's pages only


class Keyset(Protocol[T]):
    """Where a list's rows come from, in (position, id) order."""

    kind: type  # of the position (the sort value): datetime, float or int (see decode_cursor)

    def fetch(self, after: tuple[Any, uuid.UUID] | None, count: int) -> list[T]:
        """The first ``count`` rows after the keyset position ``after`` (None: from the start)."""

    def key(self, row: T) -> tuple[Any, Any]:
        """(position, id) of ``row``."""


def keyset_page(keyset: Keyset[T], *, tag: str, cursor: str | None, limit: int, field: str = "afterCursor") -> Page[T]:
    """One page of ``limit`` rows of ``keyset`` continuing after ``cursor``; the next cursor, tagged ``tag``, is
    None exactly when nothing follows."""
    after = decode_cursor(cursor, tag, keyset.kind, field) if cursor else None
    rows = keyset.fetch(after, limit + 1)
    if len(rows) <= limit:
        return Page(rows, None)
    rows = rows[:limit]
    return Page(rows, encode_cursor(tag, *keyset.key(rows[-1])))


class BackwardKeyset(Keyset[T], Protocol):
    """A keyset that can also be read from its end."""

    def fetch_before(self, before: tuple[Any, Any] | None, count: int) -> list[T]:
        """The last ``count`` rows before the keyset position ``before`` (None: up to the end), nearest first."""


def before_tag(tag: str) -> str:
    """The tag of a list's backward cursors: a ``beforeCursor`` handed in as ``afterCursor`` (or the other way
    round) is a 400, not a page that silently overlaps."""
    return f"{tag}.before"


@dataclass(frozen=True)
class Window:
    """Which page of a list paged both ways: ``limit`` rows after the cursor ``after`` (or from the start), before
    the cursor ``before``, or the last ones (``tail``). At most one of the three (apps.core.requests.window_params
    refuses more)."""

    limit: int
    after: str | None = None
    before: str | None = None
    tail: bool = False


WINDOW_NAMES = ("afterCursor", "beforeCursor", "tail")  # the REST query's names of a Window's three modes


def window_of(
    limit: int, *, after: str | None, before: str | None, tail: bool, names: tuple[str, str, str] = WINDOW_NAMES
) -> Window:
    """The Window a request asks for (D11): at most one of ``after``, ``before`` and ``tail`` (an empty cursor counts
    as absent), else a 400 naming the ones given, by ``names`` (the REST query's; the MCP tool's arguments)."""
    after, before = after or None, before or None
    given = [name for name, value in zip(names, (after, before, tail), strict=True) if value]
    if len(given) > 1:
        message = f"{names[0]}, {names[1]} and {names[2]}=true are mutually exclusive"
        raise errors.validation_error({name: message for name in given})
    return Window(limit, after, before, tail)


def keyset_window(keyset: BackwardKeyset[T], *, tag: str, window: Window) -> Page[T]:
    """The page ``window`` of ``keyset``, in its order. It carries the cursor of the rows after it
    (``next_cursor``) and of those before it (``before_cursor``), each None exactly when there are no such rows; an
    empty page has neither."""
    limit, after, before, tail = window.limit, window.after, window.before, window.tail
    if before is not None or tail:
        position = decode_cursor(before, before_tag(tag), keyset.kind, "beforeCursor") if before else None
        rows = keyset.fetch_before(position, limit + 1)
        earlier = len(rows) > limit
        rows = rows[:limit][::-1]
        if not rows:
            return Page([], None, None)
        # Nothing follows the newest row; after a cursor, only a row past the last one shows there is more.
        later = not tail and bool(keyset.fetch(keyset.key(rows[-1]), 1))
    else:
        position = decode_cursor(after, tag, keyset.kind, "afterCursor") if after else None
        rows = keyset.fetch(position, limit + 1)
        later = len(rows) > limit
        rows = rows[:limit]
        if not rows:
            return Page([], None, None)
        earlier = position is not None and bool(keyset.fetch_before(keyset.key(rows[0]), 1))
    return Page(
        rows,
        encode_cursor(tag, *keyset.key(rows[-1])) if later else None,
        encode_cursor(before_tag(tag), *keyset.key(rows[0])) if earlier else None,
    )


@dataclass(frozen=True)
class ModelKeyset:
    """The rows of ``queryset`` (a model with a UUID ``id``) ordered by (``sort_field``, id)."""

    queryset: QuerySet
    sort_field: str
    descending: bool = False
    kind: type = datetime

    def fetch(self, after: tuple[Any, uuid.UUID] | None, count: int) -> list:
        queryset, sort = self.queryset, self.sort_field
        if after is not None:
            op = "lt" if self.descending else "gt"
            queryset = queryset.filter(Q(**{f"{sort}__{op}": after[0]}) | Q(**{sort: after[0], f"id__{op}": after[1]}))
        order = (F(sort).desc(), F("id").desc()) if self.descending else (F(sort).asc(), F("id").asc())
        return list(queryset.order_by(*order)[:count])

    def key(self, row: Any) -> tuple[Any, Any]:
        return getattr(row, self.sort_field), row.id


@dataclass(frozen=True)
class SqlKeyset:
    """A raw-SQL list: ``select_from`` is ``SELECT <id>, ... FROM ...`` (the id first, the sort column at
    ``position_index``), ``where`` the list's own conditions (ANDed) with their ``params``, ``order`` the (sort
    column, id column) it is ordered by."""

    select_from: str
    where: Sequence[str]
    params: Sequence[Any]
    order: tuple[str, str]
    position_index: int
    descending: bool = False
    kind: type = datetime

    def fetch(self, after: tuple[Any, uuid.UUID] | None, count: int) -> list[tuple]:
        where, params = list(self.where), list(self.params)
        position_column, id_column = self.order
        if after is not None:
            where.append(f"({position_column}, {id_column}) {'<' if self.descending else '>'} (%s, %s)")
            params += list(after)
        direction = "DESC" if self.descending else "ASC"
        sql = (
            f"{self.select_from} {'WHERE ' + ' AND '.join(where) if where else ''} "
            f"ORDER BY {position_column} {direction}, {id_column} {direction} LIMIT %s"
        )
        with connection.cursor() as db:
            db.execute(sql, [*params, count])
            return db.fetchall()

    def key(self, row: tuple) -> tuple[Any, Any]:
        return row[self.position_index], row[0]


def envelope(data: list[Any], next_cursor: str | None) -> dict[str, Any]:
    """The interface's page envelope for every cursor-paginated list (memory lists have their own shapes), as
    apps.core.shapes.page_of declares it."""
    return Envelope.render(data=data, afterCursor=next_cursor)


def window_envelope(data: list[Any], page: Page[Any]) -> dict[str, Any]:
    """The envelope of a list paged both ways (``keyset_window``): D11 adds ``beforeCursor``, as
    apps.core.shapes.page_of(..., both_ways=True) declares it."""
    return WindowEnvelope.render(data=data, afterCursor=page.next_cursor, beforeCursor=page.before_cursor)
