"""The JSON error pages Django serves before or instead of a view (D1)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from apps.core import errors


# The catch-all route too: an unknown path is a 404 whatever the method, never a CSRF failure.
@csrf_exempt
def handler404(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return errors.error_response(errors.not_found(f"No endpoint at {request.path}."))


def handler400(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    """Failures Django raises before any view (DisallowedHost, oversized or malformed request data)."""
    error = errors.from_exception(exception) if exception is not None else None
    return errors.error_response(error or errors.validation_error({"request": "malformed request"}, "Bad request."))


def handler500(request: HttpRequest) -> JsonResponse:
    return errors.error_response(errors.ApiError(500, "Internal server error."))
