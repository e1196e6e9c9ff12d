"""Operational endpoints (D9) and the caller's own identity."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.request import Request
from rest_framework.response import Response

from apps.core import errors, metrics, readiness
from apps.core.serializers import error_responses


@extend_schema(
    tags=["operations"],
    auth=[],
    responses={200: inline_serializer("Health", {"status": serializers.CharField()})},
    summary="Liveness: the process is up",
)
@api_view(["GET"])
@authentication_classes([])
@permission_classes([])
def healthz(request: Request) -> Response:
    return Response({"status": "ok"})


@extend_schema(
    tags=["operations"],
    auth=[],
    responses={
        200: inline_serializer(
            "Readiness", {"status": serializers.CharField(), "checks": serializers.DictField(child=serializers.CharField())}
        ),
        **error_responses(503),
    },
    summary="Readiness: database, Redis, policy engine and embedder; 503 naming the failing parts",
)
@api_view(["GET"])
@authentication_classes([])
@permission_classes([])
def readyz(request: Request) -> Response:
    checks = readiness.run_checks()
    info = readiness.run_info()
    if all(result == "ok" for result in checks.values()):
        return Response({"status": "ok", "checks": checks, **info})
    failing = sorted(name for name, result in checks.items() if result != "ok")
    raise errors.ApiError(503, f"Not ready: {', '.join(failing)}.", details={"checks": checks, **info})


@csrf_exempt  # read-only; CSRF would answer a POST with Django's HTML page instead of the JSON 405
def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        response = errors.error_response(errors.ApiError(405, f'Method "{request.method}" not allowed.'))
        response["Allow"] = "GET, HEAD"
        return response
    return HttpResponse(metrics.render(), content_type="text/plain; version=0.0.4; charset=utf-8")


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
