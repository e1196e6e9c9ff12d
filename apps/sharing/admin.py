"""Operator pages for memberships and pending ownership transfers (read-only: changes go through the API, which
enforces the D6 rules and publishes the events)."""

from django.contrib import admin

from apps.core.admin import ReadOnlyModelAdmin
from apps.sharing.models import ArchivedMembership, Membership, OwnershipTransfer


@admin.register(Membership)
class MembershipAdmin(ReadOnlyModelAdmin):
    list_display = ("root_id", "user_id", "access_level", "created_at")
    list_filter = ("access_level",)
    search_fields = ("=root_id", "=user_id")
    ordering = ("-created_at",)
    fields = ("id", "root_id", "user_id", "access_level", "created_at")
    readonly_fields = fields


@admin.register(OwnershipTransfer)
class OwnershipTransferAdmin(ReadOnlyModelAdmin):
    list_display = ("id", "conversation_id", "root_id", "from_user_id", "to_user_id", "created_at")
    search_fields = ("=id", "=conversation_id", "=root_id", "=from_user_id", "=to_user_id")
    ordering = ("-created_at",)
    fields = ("id", "root_id", "conversation_id", "from_user_id", "to_user_id", "created_at")
    readonly_fields = fields


@admin.register(ArchivedMembership)
class ArchivedMembershipAdmin(ReadOnlyModelAdmin):
    list_display = ("root_id", "user_id", "access_level", "created_at", "archived_at")
    list_filter = ("access_level",)
    search_fields = ("=root_id", "=user_id")
    ordering = ("-archived_at",)
    fields = ("id", "root_id", "user_id", "access_level", "created_at", "archived_at")
    readonly_fields = fields
