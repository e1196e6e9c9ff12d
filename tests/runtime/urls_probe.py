"""The real URL map plus probe views that fail on purpose, to test the error model end to end."""

from django.http import HttpResponse
from django.urls import path
from django.views.decorators.http import require_POST
from rest_framework import serializers
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from apps.core import pagination
from config import urls as real_urls

PROBE_LIMIT = pagination.LimitBounds(default=20, maximum=200)


class EchoSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=10)
    count = serializers.IntegerField(min_value=0)


@api_view(["POST"])
@authentication_classes([])
@permission_classes([])
def echo(request):
    serializer = EchoSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    return Response(serializer.validated_data)


@api_view(["GET"])
@authentication_classes([])
@permission_classes([])
def limited(request):
    return Response({"limit": pagination.parse_limit(request.query_params.get("limit"), PROBE_LIMIT)})


@api_view(["GET"])
@authentication_classes([])
@permission_classes([])
def deny(request):
    raise PermissionDenied()


@api_view(["GET"])
@authentication_classes([])
@permission_classes([])
def boom(request):
    raise RuntimeError("secret detail that must not leak")


def plain_boom(request):
    raise RuntimeError("plain django view failure")


def read_body(request):
    return HttpResponse(str(len(request.body)), content_type="text/plain")


def html_error(request):
    return HttpResponse("<h1>Bad gateway</h1>", status=502, content_type="text/html")


@require_POST
def post_only(request):
    return HttpResponse("ok", content_type="text/plain")


urlpatterns = [
    # Plain Django views under /v1 that fail the way Django's own machinery does, to test the JSON safety net.
    path("v1/probe/read-body", read_body),
    path("v1/probe/html-error", html_error),
    path("v1/probe/post-only", post_only),
    path("probe/echo", echo),
    path("probe/limited", limited),
    path("probe/deny", deny),
    path("probe/boom", boom),
    path("probe/plain-boom", plain_boom),
    *real_urls.urlpatterns,
]

handler400 = real_urls.handler400
handler404 = real_urls.handler404
handler500 = real_urls.handler500
