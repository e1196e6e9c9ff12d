"""Operational endpoints (D9): liveness, readiness and metrics."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
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
