"""The roles of D2 as DRF permission classes: ``IsAuditor`` (read-only admin) and ``IsIndexer``; an admin holds
both (apps.identity.principal says so, once).

D1 orders the checks 401, 400, 403, 404, but DRF checks a view's ``permission_classes`` in ``initial()``, before
the handler has validated anything: a malformed request from a caller without the role would be a 403. So a view
that requires a role mixes in ``RoleChecked``: ``initial()`` then asks only for an authenticated caller (401), and
the handler calls ``self.authorize(request)`` once the request is valid (403). A handler that answers without
calling it is a programming error and answers 500, never the data.

Used anywhere else (a plain DRF view), a role permission still works, checked in ``initial()``.
"""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from apps.core import errors


class RolePermission(BasePermission):
    """A role the caller must hold: ``principal_flag`` names the apps.identity.principal.Principal property."""

    principal_flag = ""
    message = "Requires a role the caller does not hold."

    def has_permission(self, request: Request, view: Any) -> bool:
        return bool(getattr(request.user, self.principal_flag, False))  # no user (unauthenticated): False


class IsAuditor(RolePermission):
    principal_flag = "is_auditor"
    message = "Requires the auditor or admin role."


class IsIndexer(RolePermission):
    principal_flag = "is_indexer"
    message = "Requires the indexer or admin role."


# Mixin for an APIView or ViewSet whose ``permission_classes`` (or an action's) name role permissions: they are
# checked by ``self.authorize(request)``, which the handler calls after validating its input (D1). (A comment, not
# a docstring: drf-spectacular would describe every undescribed operation of the view with it.)
class RoleChecked:
    _authorized = False

    def _roles(self) -> list[RolePermission]:
        return [permission for permission in self.get_permissions() if isinstance(permission, RolePermission)]

    def check_permissions(self, request: Request) -> None:
        # DRF's initial(): a role waits for authorize(); until then it asks only for an authenticated caller.
        for permission in self.get_permissions():
            early = IsAuthenticated() if isinstance(permission, RolePermission) else permission
            if not early.has_permission(request, self):
                self.permission_denied(request, message=getattr(permission, "message", None))

    def authorize(self, request: Request) -> None:
        """403 unless the caller holds every role the view requires."""
        for permission in self._roles():
            if not permission.has_permission(request, self):
                raise errors.forbidden(permission.message)
        self._authorized = True

    def options(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        # DRF answers OPTIONS with the view's metadata, no handler of ours: it too is for the role's holders only.
        self.authorize(request)
        return super().options(request, *args, **kwargs)

    def finalize_response(self, request: Request, response: Response, *args: Any, **kwargs: Any) -> Response:
        if response.status_code < 400 and not self._authorized and self._roles():
            raise RuntimeError(f"{type(self).__name__} answered without authorize(): its roles were never checked")
        return super().finalize_response(request, response, *args, **kwargs)
