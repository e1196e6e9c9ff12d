"""The real URL map plus probe views that fail on purpose, to test the error model end to end."""

from django.urls import path
from rest_framework import serializers
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from apps.core import pagination
from config import urls as real_urls


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
    return Response({"limit": pagination.parse_limit(request.query_params.get("limit"), "conversations")})


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


urlpatterns = [
    path("probe/echo", echo),
    path("probe/limited", limited),
    path("probe/deny", deny),
    path("probe/boom", boom),
    path("probe/plain-boom", plain_boom),
    *real_urls.urlpatterns,
]
