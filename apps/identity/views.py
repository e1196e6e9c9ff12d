"""GET /v1/me: who the service thinks the caller is."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from apps.core.shapes import Shape


class Me(Shape):
    """The principal without its raw claims. Field names are camelCase like the rest of the JSON API
    (``userId``, ``ownerUserId``...); ``roles`` is the normalized role list policies see."""

    userId = serializers.CharField(source="user_id", help_text="From the first present of OIDC_USER_ID_CLAIMS.")
    clientId = serializers.CharField(
        source="client_id", allow_null=True, help_text="The API key's client; null without X-API-Key."
    )
    roles = serializers.ListField(child=serializers.CharField(), help_text="Union of the OIDC_ROLE_CLAIMS paths.")
    isAdmin = serializers.BooleanField(source="is_admin")
    isAuditor = serializers.BooleanField(source="is_auditor", help_text="True for admins too.")
    isIndexer = serializers.BooleanField(source="is_indexer", help_text="True for admins too.")


@extend_schema(
    tags=["identity"],
    operation_id="getMe",
    summary="The authenticated caller: user id, API-key client, roles",
    responses={200: Me, 401: OpenApiResponse(description="Missing, invalid or expired credentials.")},
)
@api_view(["GET"])
def me(request: Request) -> Response:
    return Response(Me.from_object(request.user, roles=list(request.user.roles)))
