"""OpenAPI generation details shared by the apps' ViewSets."""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema


class EnvelopeAutoSchema(AutoSchema):
    """For ViewSets whose ``list`` answers the page envelope (``{"data": [...], "afterCursor": ...}``) rather than
    a bare array: drf-spectacular would otherwise wrap the declared response in an array for ``list`` actions."""

    def _is_list_view(self, serializer=None) -> bool:
        return False
