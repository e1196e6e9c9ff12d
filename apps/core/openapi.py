"""OpenAPI generation details shared by every view (DEFAULT_SCHEMA_CLASS) and the apps' ViewSets."""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema
from rest_framework.serializers import ListSerializer


class ServiceAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema, stating a list body's bounds: ``many=True`` with ``allow_empty=False`` or
    ``max_length`` refuses an empty or longer array (400), so the schema says minItems/maxItems (tests/fuzz holds
    the server to every schema-valid request)."""

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


class EnvelopeAutoSchema(ServiceAutoSchema):
    """For ViewSets whose ``list`` answers the page envelope (``{"data": [...], "afterCursor": ...}``) rather than
    a bare array: drf-spectacular would otherwise wrap the declared response in an array for ``list`` actions."""

    def _is_list_view(self, serializer=None) -> bool:
        return False
