"""The one pagination helper (D3): opaque keyset cursors and per-endpoint limit bounds.

A cursor is base64url(JSON [sort value, id]) of the last item returned. Continuing from it is a keyset condition
(``(sort, id) > (cursor.sort, cursor.id)``), never a lookup of that item, so a cursor whose item was deleted in the
meantime still continues at the right place. Every list endpoint takes its limit bounds from ``LIMITS``, which mirrors
the interface's limits table.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import connection
from django.db.models import F, Q, QuerySet

from apps.core import errors
from apps.core.parsers import nesting_exceeds

T = TypeVar("T")


@dataclass(frozen=True)
class LimitBounds:
    default: int
    maximum: int
    minimum: int = 1


# Endpoint name -> bounds. Mirrors the interface's "Limits" table; nothing else defines limits.
LIMITS: dict[str, LimitBounds] = {
    "conversations": LimitBounds(20, 200),
    "conversation_entries": LimitBounds(50, 200),
    "conversation_memberships": LimitBounds(50, 200),
    "conversation_forks": LimitBounds(50, 200),
    "conversation_search": LimitBounds(20, 200),
    "conversations_unindexed": LimitBounds(100, 200),
    "ownership_transfers": LimitBounds(50, 200),
    "admin_conversations": LimitBounds(100, 1000),
    "admin_conversation_entries": LimitBounds(50, 1000),
    "admin_conversation_memberships": LimitBounds(50, 1000),
    "admin_conversation_forks": LimitBounds(50, 1000),
    "admin_conversation_search": LimitBounds(20, 1000),
    "admin_attachments": LimitBounds(50, 1000),
    "memory_search": LimitBounds(10, 100),
    "memory_events": LimitBounds(50, 200),
}

MAX_OFFSET = 10_000  # memory search pages by offset (D3)


def parse_limit(raw: Any, endpoint: str, field: str = "limit") -> int:
    """The request's limit, or the endpoint default when absent; anything else than an integer in bounds is 400."""
    bounds = LIMITS[endpoint]
    if raw is None:
        return bounds.default  # an empty query value is not absent: int("") below makes it a 400 (D3)
    if isinstance(raw, bool):
        raise _limit_error(field, bounds)
    if isinstance(raw, str):
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


def encode_cursor(sort_value: Any, item_id: Any) -> str:
    if isinstance(sort_value, datetime):
        sort_value = sort_value.isoformat()
    raw = json.dumps([sort_value, str(item_id)], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(cursor: str, field: str = "afterCursor") -> tuple[Any, str]:
    """(sort value, id) from a cursor; anything that is not one of ours is a 400 naming ``field``."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        raw = base64.urlsafe_b64decode(padded.encode("ascii"))
        # Ours are [sort value, id]; a forged deeply nested one must not reach the recursive decoder.
        if nesting_exceeds(raw, 2):
            raise ValueError("nested cursor")
        value = json.loads(raw)
    except (ValueError, UnicodeError, binascii.Error):
        raise errors.validation_error({field: "malformed cursor"}) from None
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], str)):
        raise errors.validation_error({field: "malformed cursor"})
    return value[0], value[1]


@dataclass
class Page(Generic[T]):
    items: list[T]
    next_cursor: str | None


def keyset_page(
    queryset: QuerySet,
    *,
    sort_field: str,
    limit: int,
    cursor: str | None,
    descending: bool = False,
    cursor_field: str = "afterCursor",
    parse_sort_value=None,
) -> Page:
    """One page of ``queryset`` ordered by (sort_field, id), continuing after ``cursor``.

    Fetches limit + 1 rows so the next cursor is null exactly when nothing follows. ``parse_sort_value`` turns the
    cursor's JSON sort value back into the column's type (e.g. datetime.fromisoformat); a value it rejects is a 400.
    """
    if cursor:
        sort_value, item_id = decode_cursor(cursor, cursor_field)
        if parse_sort_value is not None:
            try:
                sort_value = parse_sort_value(sort_value)
            except (TypeError, ValueError):
                raise errors.validation_error({cursor_field: "malformed cursor"}) from None
        op = "lt" if descending else "gt"
        after = Q(**{f"{sort_field}__{op}": sort_value}) | Q(**{sort_field: sort_value, f"id__{op}": item_id})
        try:
            # Values are converted to the column types here: a forged cursor (bad uuid, wrong type) is a 400.
            queryset = queryset.filter(after)
        except (DjangoValidationError, TypeError, ValueError):
            raise errors.validation_error({cursor_field: "malformed cursor"}) from None
    order = (F(sort_field).desc(), F("id").desc()) if descending else (F(sort_field).asc(), F("id").asc())
    rows = list(queryset.order_by(*order)[: limit + 1])
    has_more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = encode_cursor(getattr(rows[-1], sort_field), rows[-1].id) if has_more else None
    return Page(rows, next_cursor)


def envelope(data: list[Any], next_cursor: str | None) -> dict[str, Any]:
    """The interface's page envelope for every cursor-paginated list (memory lists have their own shapes)."""
    return {"data": data, "afterCursor": next_cursor}


# --- Tagged keyset cursors (raw-SQL lists) ----------------------------------------------------------------------
# Lists that page in raw SQL (conversations, entries, memberships, transfers) tag their cursors with the list and
# order they belong to, so a cursor handed to another endpoint is a 400 instead of a silently wrong page.


def encode_tagged_cursor(tag: str, sort_value: Any, item_id: Any) -> str:
    if isinstance(sort_value, datetime):
        sort_value = sort_value.isoformat()
    raw = json.dumps([sort_value, str(item_id), tag], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def fetch_timestamp_page(
    select_from: str,
    where: list[str],
    params: list[Any],
    *,
    order: tuple[str, str],
    tag: str,
    cursor: str | None,
    limit: int,
    position_index: int,
    descending: bool = False,
) -> tuple[list[tuple], str | None]:
    """One page of a raw-SQL list ordered by (timestamp column, id column), oldest first unless ``descending``,
    continuing after ``cursor``.

    ``select_from`` is ``SELECT <id>, ... FROM ...`` (the id first, the timestamp at ``position_index``); ``where``
    the list's own conditions. Fetches limit + 1 rows so the next cursor (tagged with ``tag``) is None exactly
    when nothing follows.
    """
    where, params = list(where), list(params)
    position_column, id_column = order
    if cursor:
        position, item_id = decode_timestamp_cursor(cursor, tag)
        where.append(f"({position_column}, {id_column}) {'<' if descending else '>'} (%s, %s)")
        params += [position, item_id]
    direction = "DESC" if descending else "ASC"
    sql = (
        f"{select_from} WHERE {' AND '.join(where)} "
        f"ORDER BY {position_column} {direction}, {id_column} {direction} LIMIT %s"
    )
    with connection.cursor() as db:
        db.execute(sql, [*params, limit + 1])
        rows = db.fetchall()
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, encode_tagged_cursor(tag, rows[-1][position_index], rows[-1][0])


def decode_timestamp_cursor(cursor: str, tag: str, field: str = "afterCursor") -> tuple[datetime, Any]:
    """(timestamp, item id as text) of a cursor made by ``encode_tagged_cursor(tag, <datetime>, id)``; anything
    else (another list's cursor, a forged value) is a 400 naming ``field``."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        value = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (ValueError, UnicodeError, binascii.Error):
        raise errors.validation_error({field: "malformed cursor"}) from None
    if not (isinstance(value, list) and len(value) == 3 and value[2] == tag and isinstance(value[0], str)
            and isinstance(value[1], str)):
        raise errors.validation_error({field: "malformed cursor"})
    try:
        position = datetime.fromisoformat(value[0])
        if position.tzinfo is None:
            raise ValueError("naive timestamp")
        item_id = uuid.UUID(value[1])
    except (ValueError, OverflowError):
        raise errors.validation_error({field: "malformed cursor"}) from None
    return position, item_id


def decode_number_cursor(cursor: str, tag: str, field: str = "afterCursor") -> tuple[float, uuid.UUID]:
    """(number, item id) of a cursor made by ``encode_tagged_cursor(tag, <float>, id)`` (ranked lists such as
    search, ordered by score); another list's cursor, another query's or a forged value is a 400 naming
    ``field``."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        raw = base64.urlsafe_b64decode(padded.encode("ascii"))
        if nesting_exceeds(raw, 2):
            raise ValueError("nested cursor")
        value = json.loads(raw)
    except (ValueError, UnicodeError, binascii.Error):
        raise errors.validation_error({field: "malformed cursor"}) from None
    if not (isinstance(value, list) and len(value) == 3 and value[2] == tag and isinstance(value[1], str)
            and isinstance(value[0], int | float) and not isinstance(value[0], bool)):
        raise errors.validation_error({field: "malformed cursor, or one from another search"})
    try:
        number = float(value[0])
        if number != number or number in (float("inf"), float("-inf")):
            raise ValueError("not finite")
        item_id = uuid.UUID(value[1])
    except (ValueError, OverflowError):
        raise errors.validation_error({field: "malformed cursor"}) from None
    return number, item_id
