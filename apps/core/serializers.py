"""Serializer building blocks shared by every app."""

from __future__ import annotations

import copy
import functools
import math
import uuid
from typing import Any

from drf_spectacular.extensions import OpenApiSerializerExtension, OpenApiSerializerFieldExtension
from drf_spectacular.utils import OpenApiParameter, extend_schema_field
from rest_framework import serializers

from apps.core import errors
from apps.core.pagination import CURSOR_SCHEMA, LimitBounds, parse_limit


def _clone_field(field: serializers.Field) -> serializers.Field:
    """An unbound copy of a prototype field, as DRF's deepcopy would make it, without re-running ``__init__``.

    Leaf fields hold no per-request state (bind() sets name/parent on the copy), so a shallow copy is enough; a
    container's child is cloned too and re-parented to the copy, so parent/root/context chains are exactly DRF's. Nested
    serializers keep DRF's deepcopy (they cache bound fields and instance state of their own)."""
    if isinstance(field, serializers.BaseSerializer):
        return copy.deepcopy(field)
    clone = copy.copy(field)
    child = getattr(field, "child", None)  # ListField, DictField
    if isinstance(child, serializers.Field):
        # The prototype's child is already bound (name "", source ""), as DRF binds it in __init__: only its
        # parent differs.
        clone.child = _clone_field(child)
        clone.child.parent = clone
    return clone


class StrictSerializer(serializers.Serializer):
    """Rejects unknown top-level fields (D1): a misspelt field is a 400, not silently ignored.

    Fields are cloned from per-class prototypes: DRF deep-copies the declared fields for every instance, and each
    Field.__deepcopy__ re-runs __init__ (validators, lazy messages): 240 µs of a 430 µs GET address validation."""

    def get_fields(self) -> dict[str, serializers.Field]:
        cls = type(self)
        prototypes = cls.__dict__.get("_field_prototypes")
        if prototypes is None:
            prototypes = copy.deepcopy(self._declared_fields)
            cls._field_prototypes = prototypes  # a race only builds the same prototypes twice
        return {name: _clone_field(field) for name, field in prototypes.items()}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: "unknown field" for name in unknown})
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    """A string that really is a string: DRF's CharField would turn 12 or true into "12"/"True"."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        if "\x00" in data:
            raise serializers.ValidationError("must not contain NUL characters")
        try:
            data.encode("utf-8")  # a JSON "\ud800" escape parses to a lone surrogate, which no column can store
        except UnicodeEncodeError:
            raise serializers.ValidationError("must not contain lone surrogates") from None
        return super().to_internal_value(data)


class NonBlankCharField(StrictCharField):
    """Text kept exactly as sent (no trimming) that must hold something besides whitespace."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_blank=False, trim_whitespace=False, **kwargs)

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        if not value.strip():
            raise serializers.ValidationError("must not be blank")
        return value


class StrictChoiceField(serializers.ChoiceField):
    """An enum value. The error names the allowed values, never echoes the input: a lone surrogate in it would make
    the error body itself unencodable (a 500 at the renderer)."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str) or data not in self.choice_strings_to_values:
            allowed = ", ".join(sorted(self.choice_strings_to_values))
            raise serializers.ValidationError(f"must be one of: {allowed}")
        return self.choice_strings_to_values[data]


class StrictIntegerField(serializers.IntegerField):
    """An integer that really is an integer: no "5", 5.0 or true."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


MAX_VALUE_NESTING = 32
_INT64 = range(-(2**63), 2**63)


def json_value_problem(value: Any, depth: int = 0, *, int64: bool = True, nul: bool = True) -> str | None:
    """Why ``value`` cannot be stored and handed to the policies, or None. Values reach attributes.rego and
    authz.rego as input, which carries no NUL, no integer beyond 64 bits, no Infinity/NaN (``1e400`` parses to
    Infinity) and limited nesting; a lone surrogate cannot be encoded as UTF-8 at all. ``int64=False`` allows
    any integer and ``nul=False`` NUL characters, for JSON that only PostgreSQL jsonb (no NUL) or an encrypted
    blob (anything encodable) holds."""
    if depth > MAX_VALUE_NESTING:
        return f"must not be nested deeper than {MAX_VALUE_NESTING} levels"
    if isinstance(value, str):
        return text_problem(value, nul)
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return None if not int64 or value in _INT64 else "integers must fit in 64 bits"
    if isinstance(value, float):
        return None if math.isfinite(value) else "numbers must be finite"
    if isinstance(value, dict):
        for key, item in value.items():
            problem = text_problem(key, nul) or json_value_problem(item, depth + 1, int64=int64, nul=nul)
            if problem:
                return problem
        return None
    if isinstance(value, list):
        for item in value:
            problem = json_value_problem(item, depth + 1, int64=int64, nul=nul)
            if problem:
                return problem
        return None
    return "must be JSON"


def text_problem(text: str, nul: bool = True) -> str | None:
    if nul and "\x00" in text:
        return "strings must not contain NUL characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "strings must not contain lone surrogates"
    return None


@extend_schema_field({"type": "object", "additionalProperties": True})
class JsonObjectField(serializers.Field):
    default_error_messages = {"invalid": "must be a JSON object"}

    def to_internal_value(self, data: Any) -> dict:
        if not isinstance(data, dict):
            self.fail("invalid")
        problem = json_value_problem(data)
        if problem:
            raise serializers.ValidationError(problem)
        return data

    def to_representation(self, value: dict) -> dict:
        return value


class ErrorSerializer(serializers.Serializer):
    """The one error body (D1). A policy deny adds `reason`; validation errors name fields in `details.fields`."""

    code = serializers.CharField(help_text="Stable machine-readable code, e.g. validation_error, forbidden")
    error = serializers.CharField(help_text="Safe human-readable message")
    requestId = serializers.CharField(help_text="Also in the X-Request-ID response header")
    reason = serializers.CharField(required=False, help_text="Policy reason on a 403 deny")
    details = serializers.DictField(required=False)


def error_responses(*statuses: int) -> dict:
    """OpenAPI responses for the given error statuses, all with the one error body."""
    from drf_spectacular.utils import OpenApiResponse

    return {status: OpenApiResponse(ErrorSerializer, description=_ERROR_DESCRIPTIONS.get(status, "")) for status in statuses}


_ERROR_DESCRIPTIONS = {
    400: "Validation error (details.fields names the offending fields)",
    401: "Missing or invalid credentials",
    403: "Denied (by policy: reason carries the policy's reason)",
    404: "Not found",
    413: "Payload too large",
    500: "Internal error (code policy_error when a policy fails to evaluate; code undecryptable when the stored "
    "value this single-item read returns does not decrypt with the service's keys: a key missing from "
    "MEMORY_ENCRYPTION_KEYS or a damaged row, which retrying does not fix; code disk_full or "
    "program_limit_exceeded when the database refuses the work until an operator acts)",
    503: "A dependency is unavailable (the database down, frozen or unreachable; Redis for the event stream; the "
    "embedding provider for semantic search): retry later",
}


@extend_schema_field({"type": "string", "format": "uuid"})
class StrictUUIDField(serializers.Field):
    """A UUID given as a string. DRF's UUIDField would also take an integer (``uuid.UUID(int=...)``)."""

    default_error_messages = {"invalid": "must be a UUID string"}

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid")
        try:
            return uuid.UUID(data)
        except ValueError:
            self.fail("invalid")

    def to_representation(self, value: Any) -> str:
        return str(value)


# --- OpenAPI: say what the strict fields enforce, so generated clients and fuzzers send what is accepted --------

NO_NUL_PATTERN = r"^[^\u0000]*$"
# The longest user id a token may carry (apps.identity.tokens), and so the longest one any request names.
MAX_USER_ID_CHARS = 256
# A user id anywhere in a request (path, query, body) is at most as long as one a token may carry.
USER_ID_SCHEMA = {"type": "string", "maxLength": MAX_USER_ID_CHARS, "pattern": NO_NUL_PATTERN}
# No NUL, and something besides whitespace: what a field that trims and refuses blanks takes.
NOT_BLANK_PATTERN = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"


class StrictSerializerSchema(OpenApiSerializerExtension):
    """Request bodies of StrictSerializer subclasses reject unknown fields: ``additionalProperties: false``."""

    target_class = StrictSerializer
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        # Views validate these bodies whole, PATCH included (never partial=True): required fields stay required.
        target = copy.copy(self.target)
        target.partial = False
        schema = auto_schema._map_serializer(target, direction, bypass_extensions=True)
        schema["additionalProperties"] = False
        return schema


class StrictCharFieldSchema(OpenApiSerializerFieldExtension):
    """StrictCharField refuses NUL characters (PostgreSQL text cannot hold them), and one that trims surrounding
    whitespace and refuses blanks (DRF's defaults) refuses a string of whitespace."""

    target_class = StrictCharField
    match_subclasses = True

    def map_serializer_field(self, auto_schema, direction):
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        field = self.target
        not_blank = isinstance(field, NonBlankCharField) or (field.trim_whitespace and not field.allow_blank)
        schema["pattern"] = NOT_BLANK_PATTERN if not_blank else NO_NUL_PATTERN
        return schema


def limit_schema(bounds: LimitBounds) -> dict[str, Any]:
    """A list's ``limit`` in OpenAPI, with the bounds apps.core.pagination.parse_limit enforces."""
    return {"type": "integer", "minimum": bounds.minimum, "maximum": bounds.maximum, "default": bounds.default}


def limit_parameter(bounds: LimitBounds) -> OpenApiParameter:
    """The ``limit`` query parameter of a paginated list."""
    return OpenApiParameter(
        "limit", limit_schema(bounds), description=f"{bounds.minimum}..{bounds.maximum}, default {bounds.default}"
    )


def cursor_parameter(name: str = "afterCursor") -> OpenApiParameter:
    """The cursor query parameter of a paginated list, with the bounds apps.core.pagination.decode_cursor enforces."""
    return OpenApiParameter(
        name, CURSOR_SCHEMA, description="The previous page's cursor (opaque; absent or empty: the first page)"
    )


@functools.cache
def body_limit_field(bounds: LimitBounds) -> type[serializers.JSONField]:
    """The ``limit`` of a JSON request body: a JSON integer (``"5"`` is a 400: body types are strict, unlike a query
    string's, where every value is text) within ``bounds``, checked by apps.core.pagination.parse_limit, the one
    place limits are checked; the schema states both."""

    @extend_schema_field(limit_schema(bounds))
    class BodyLimitField(serializers.JSONField):
        def to_internal_value(self, data: Any) -> int:
            try:
                return parse_limit(data, bounds, self.field_name, body=True)
            except errors.ApiError as refusal:  # reported with the body's other fields
                raise serializers.ValidationError(refusal.details["fields"][self.field_name]) from None

    return BodyLimitField
