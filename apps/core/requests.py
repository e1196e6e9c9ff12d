"""Reading a request's input, for every app's views: bodies through serializers, path segments, query parameters
and the page parameters of a list. Every refusal is D1's 400 naming the field; nothing here authorizes (roles:
apps.identity.permissions)."""

from __future__ import annotations

import uuid
from typing import Any

from rest_framework.request import Request
from rest_framework.serializers import BaseSerializer

from apps.core import errors, pagination
from apps.core.serializers import MAX_USER_ID_CHARS


def validated(serializer_class: type[BaseSerializer], data: Any) -> Any:
    """``data`` validated by ``serializer_class``; a refusal is a 400 naming the fields (errors.exception_handler)."""
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def path_uuid(value: str, field: str) -> uuid.UUID:
    """A UUID from a URL path segment; anything else is a 400 naming ``field`` (D1: malformed UUIDs in paths)."""
    try:
        return uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        raise errors.validation_error({field: "must be a UUID"}) from None


def path_text(value: str, field: str, max_chars: int = MAX_USER_ID_CHARS) -> str:
    """A user id or similar free text from a URL path segment: non-empty, bounded, no NUL (PostgreSQL text rejects
    it, and it can never name a real row)."""
    if not value or len(value) > max_chars or "\x00" in value:
        raise errors.validation_error({field: f"must be 1 to {max_chars} characters without NUL"})
    return value


def page_params(request: Request, bounds: pagination.LimitBounds) -> tuple[str | None, int]:
    """(afterCursor, limit) of a cursor-paginated list: the cursor as sent (the list's selector decodes it; empty
    is the first page), the limit within the list's ``bounds`` (apps.core.pagination.parse_limit)."""
    params = request.query_params
    return params.get("afterCursor") or None, pagination.parse_limit(params.get("limit"), bounds)


def window_params(request: Request, bounds: pagination.LimitBounds) -> pagination.Window:
    """``afterCursor``, ``beforeCursor``, ``tail`` and ``limit`` of a list paged both ways (D11): the three are
    mutually exclusive (an empty cursor counts as absent, ``tail=false`` as no tail), else a 400 naming them."""
    after, limit = page_params(request, bounds)
    return pagination.window_of(
        limit,
        after=after,
        before=request.query_params.get("beforeCursor"),
        tail=flag_param(request.query_params.get("tail"), "tail"),
    )


def flag_param(raw: str | None, name: str) -> bool:
    """A boolean query parameter: true/1 or false/0 (any case); absent or empty is false."""
    if raw is None or raw == "":
        return False
    lowered = raw.lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise errors.validation_error({name: "must be true or false"})


def user_id_param(raw: str | None, name: str) -> str | None:
    """A user id filter from the query: absent or empty is no filter, anything else what ``path_text`` takes."""
    return path_text(raw, name) if raw else None
