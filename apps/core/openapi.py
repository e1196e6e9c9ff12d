"""OpenAPI generation details shared by every view: the schema class (DEFAULT_SCHEMA_CLASS) and the page envelope
of every cursor-paginated list."""

from __future__ import annotations

import functools
import re

from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers
from rest_framework.serializers import ListSerializer


class ServiceAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema, with two differences:

    - a list body's bounds: ``many=True`` with ``allow_empty=False`` or ``max_length`` refuses an empty or longer
      array (400), so the schema says minItems/maxItems (tests/fuzz holds the server to every schema-valid request);
    - no response is a bare array: every list answers its page envelope (``page_of``), which drf-spectacular
      would otherwise wrap in an array for a ViewSet's ``list``.
    """

    def _is_list_view(self, serializer=None) -> bool:
        return False

    def _unwrap_list_serializer(self, serializer, direction):
        schema = super()._unwrap_list_serializer(serializer, direction)
        if schema is not None and isinstance(serializer, ListSerializer):
            if not serializer.allow_empty:
                schema["minItems"] = max(1, serializer.min_length or 0)
            elif serializer.min_length is not None:
                schema["minItems"] = serializer.min_length
            if serializer.max_length is not None:
                schema["maxItems"] = serializer.max_length
        return schema


@functools.cache
def page_of(item: type[serializers.Serializer], *, both_ways: bool = False) -> type[serializers.Serializer]:
    """The page envelope of a cursor-paginated list of ``item``, as apps.core.pagination.envelope builds it:
    ``{"data": [item], "afterCursor": string | null}``, plus ``beforeCursor`` for a list paged ``both_ways``
    (pagination.window_envelope). One serializer (one schema component) per item type, named after the item without
    a trailing ListItem, Item, Response or Result: ConversationListItem -> ConversationPage."""
    name = re.sub(r"(ListItem|Item|Response|Result)$", "", item.__name__) + "Page"
    fields = {"data": item(many=True), "afterCursor": serializers.CharField(allow_null=True)}
    if both_ways:
        fields["beforeCursor"] = serializers.CharField(allow_null=True)
    return type(name, (serializers.Serializer,), {"__module__": item.__module__, **fields})
