"""Content negotiation: DRF's, with its answer for the two common Accept values computed without parsing."""

from __future__ import annotations

from rest_framework.negotiation import DefaultContentNegotiation


class ContentNegotiation(DefaultContentNegotiation):
    """No Accept header or ``*/*`` (and no ``?format=``/suffix): DRF's DefaultContentNegotiation always picks the
    first renderer with its own media type. Answered directly, it skips parsing and ranking the Accept list on
    nearly every API request (4-5% of a web worker's busy time under GET load, issue 12); anything else is DRF's."""

    def select_renderer(self, request, renderers, format_suffix=None):
        accept = request.META.get("HTTP_ACCEPT")
        if (
            (accept is None or accept == "*/*")
            and not format_suffix
            and renderers
            and (self.settings.URL_FORMAT_OVERRIDE is None or self.settings.URL_FORMAT_OVERRIDE not in request.query_params)
        ):
            return renderers[0], renderers[0].media_type
        return super().select_renderer(request, renderers, format_suffix)
