"""HTTP endpoints of memberships (nested under a conversation) and ownership transfers. Thin: parse, call a
service or selector, shape the response. Path ids are checked here: a malformed UUID is 400 (D1)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.core import audit
from apps.core.requests import page_params, path_text, path_uuid, validated
from apps.core.serializers import USER_ID_SCHEMA, cursor_parameter, error_responses, limit_parameter
from apps.core.shapes import page_of
from apps.identity.permissions import IsAuditor, RoleChecked
from apps.sharing import responses, selectors, serializers, services

CONVERSATION_ID = OpenApiParameter("conversationId", OpenApiTypes.UUID, OpenApiParameter.PATH)
USER_ID = OpenApiParameter("userId", {**USER_ID_SCHEMA, "minLength": 1}, OpenApiParameter.PATH)
TRANSFER_ID = OpenApiParameter("transferId", OpenApiTypes.UUID, OpenApiParameter.PATH)
AFTER_CURSOR = cursor_parameter()


class MembershipViewSet(viewsets.ViewSet):
    """/v1/conversations/{conversationId}/memberships[/{userId}]. Memberships belong to the fork tree: the same
    members answer for every conversation of it."""

    lookup_field = "userId"
    lookup_value_regex = r"[^/]+"
    rate_kinds = {"create": "memberships", "partial_update": "memberships"}  # apps.limits.throttling

    @extend_schema(
        tags=["memberships"],
        summary="List the conversation's members",
        description="Reader or above. Oldest first.",
        parameters=[CONVERSATION_ID, AFTER_CURSOR, limit_parameter(serializers.MEMBERSHIPS_LIMIT)],
        responses={200: page_of(responses.MembershipResponse), **error_responses(400, 401, 403, 404)},
    )
    def list(self, request: Request, conversationId: str) -> Response:
        conversation_id = path_uuid(conversationId, "conversationId")
        cursor, limit = page_params(request, serializers.MEMBERSHIPS_LIMIT)
        return Response(selectors.list_memberships(request.user, conversation_id, cursor=cursor, limit=limit))

    @extend_schema(
        tags=["memberships"],
        summary="Add a member",
        description="An owner may grant any level (owner included: a co-owner); a manager only writer or reader "
        "(else 403). A user who is already a member is 409.",
        parameters=[CONVERSATION_ID],
        request=serializers.MembershipCreateSerializer,
        responses={201: responses.MembershipResponse, **error_responses(400, 401, 403, 404, 409)},
    )
    def create(self, request: Request, conversationId: str) -> Response:
        conversation_id = path_uuid(conversationId, "conversationId")
        data = validated(serializers.MembershipCreateSerializer, request.data)
        body = services.add_membership(
            request.user, conversation_id, user_id=data["userId"], access_level=data["accessLevel"]
        )
        return Response(body, status=201)

    @extend_schema(
        tags=["memberships"],
        summary="Change a member's level",
        description="A manager may change only writers and readers, only to writer or reader (else 403). The "
        "primary owner's level cannot be lowered (400). Lowering an owner below owner ends (deletes) the pending "
        "transfer they started.",
        parameters=[CONVERSATION_ID, USER_ID],
        request=serializers.MembershipUpdateSerializer,
        responses={200: responses.MembershipResponse, **error_responses(400, 401, 403, 404)},
    )
    def partial_update(self, request: Request, conversationId: str, userId: str) -> Response:
        conversation_id = path_uuid(conversationId, "conversationId")
        user_id = path_text(userId, "userId")
        data = validated(serializers.MembershipUpdateSerializer, request.data)
        return Response(
            services.update_membership(request.user, conversation_id, user_id=user_id, access_level=data["accessLevel"])
        )

    @extend_schema(
        tags=["memberships"],
        summary="Remove a member (or leave)",
        description="Owners remove anyone, managers only writers and readers (else 403); any member may remove "
        "their own membership. The primary owner's membership cannot be removed (400). Pending transfers to "
        "and from the removed user are deleted.",
        parameters=[CONVERSATION_ID, USER_ID],
        responses={204: None, **error_responses(400, 401, 403, 404)},
    )
    def destroy(self, request: Request, conversationId: str, userId: str) -> Response:
        conversation_id = path_uuid(conversationId, "conversationId")
        user_id = path_text(userId, "userId")
        services.remove_membership(request.user, conversation_id, user_id=user_id)
        return Response(status=204)


class AdminMembershipViewSet(RoleChecked, viewsets.ViewSet):
    permission_classes = [IsAuditor]

    @extend_schema(
        tags=["admin"],
        summary="List any conversation's members",
        description="Auditor or admin role; audit-logged. For a deleted conversation: the members its fork tree had "
        "when it was deleted (kept for this view only; they grant no access and users see none of them).",
        parameters=[CONVERSATION_ID, AFTER_CURSOR, limit_parameter(serializers.ADMIN_MEMBERSHIPS_LIMIT)],
        responses={200: page_of(responses.MembershipResponse), **error_responses(400, 401, 403, 404)},
    )
    def list(self, request: Request, conversationId: str) -> Response:
        conversation_id = path_uuid(conversationId, "conversationId")
        cursor, limit = page_params(request, serializers.ADMIN_MEMBERSHIPS_LIMIT)
        self.authorize(request)
        audit.record(
            request.user,
            "admin.conversations.memberships",
            target_id=str(conversation_id),
            params={"limit": limit, "afterCursor": bool(cursor)},
        )
        return Response(selectors.admin_list_memberships(conversation_id, cursor=cursor, limit=limit))


class OwnershipTransferViewSet(viewsets.ViewSet):
    rate_kinds = {"create": "memberships"}  # apps.limits.throttling
    lookup_field = "transferId"
    lookup_value_regex = r"[^/]+"

    @extend_schema(
        tags=["ownership-transfers"],
        summary="List pending transfers",
        description="`role`: recipient (to the caller), sender (from the caller) or all (default). Oldest first.",
        parameters=[
            OpenApiParameter("role", str, enum=list(serializers.TRANSFER_ROLES)),
            AFTER_CURSOR,
            limit_parameter(serializers.TRANSFERS_LIMIT),
        ],
        responses={200: page_of(responses.TransferResponse), **error_responses(400, 401)},
    )
    def list(self, request: Request) -> Response:
        role = serializers.transfer_role(request.query_params.get("role"))
        cursor, limit = page_params(request, serializers.TRANSFERS_LIMIT)
        return Response(selectors.list_transfers(request.user, role=role, cursor=cursor, limit=limit))

    @extend_schema(
        tags=["ownership-transfers"],
        summary="Start an ownership transfer",
        description="Owner level required (403): the primary owner or a co-owner. The recipient must be another "
        "member (400). One pending transfer per conversation tree: a second is 409 with details.existingTransferId. "
        "The transfer lives only while its sender holds owner level: removing the sender (or their leaving) or "
        "lowering them below owner deletes it.",
        request=serializers.TransferCreateSerializer,
        responses={201: responses.TransferResponse, **error_responses(400, 401, 403, 404, 409)},
    )
    def create(self, request: Request) -> Response:
        data = validated(serializers.TransferCreateSerializer, request.data)
        body = services.create_transfer(
            request.user, conversation_id=data["conversationId"], new_owner_user_id=data["newOwnerUserId"]
        )
        return Response(body, status=201)

    @extend_schema(
        tags=["ownership-transfers"],
        summary="Get a pending transfer",
        description="Only its sender or recipient see it (404 for anyone else).",
        parameters=[TRANSFER_ID],
        responses={200: responses.TransferResponse, **error_responses(400, 401, 404)},
    )
    def retrieve(self, request: Request, transferId: str) -> Response:
        return Response(selectors.get_transfer(request.user, path_uuid(transferId, "transferId")))

    @extend_schema(
        tags=["ownership-transfers"],
        summary="Cancel (sender) or decline (recipient) a transfer",
        parameters=[TRANSFER_ID],
        responses={204: None, **error_responses(400, 401, 403, 404)},
    )
    def destroy(self, request: Request, transferId: str) -> Response:
        services.delete_transfer(request.user, path_uuid(transferId, "transferId"))
        return Response(status=204)

    @extend_schema(
        tags=["ownership-transfers"],
        summary="Accept a transfer",
        description="Recipient only (403 for others). The sender must still hold owner level, checked at accept "
        "(a transfer whose sender was removed or lowered is gone: 404). The recipient becomes owner and "
        "ownerUserId (the primary owner); the previous primary owner (the previous ownerUserId) becomes manager, "
        "whichever owner sent the transfer: a co-owner's transfer hands over primary ownership too, and the "
        "co-owner keeps their own owner level. No other membership changes. The transfer is gone (404 afterwards).",
        parameters=[TRANSFER_ID],
        request=None,
        responses={204: None, **error_responses(400, 401, 403, 404)},
    )
    @action(detail=True, methods=["post"], url_path="accept")
    def accept(self, request: Request, transferId: str) -> Response:
        services.accept_transfer(request.user, path_uuid(transferId, "transferId"))
        return Response(status=204)
