"""The admin audit trail: every call to an admin endpoint is recorded, to the ``admin_audit_log`` table and to the
JSON log, before the view answers. Used by every app that serves ``/v1/admin/...``."""

from __future__ import annotations

import logging
from typing import Any

from apps.core.logging import current_request_id
from apps.core.models import AdminAuditRecord
from apps.identity.principal import Principal

logger = logging.getLogger("apps.audit")


def record(principal: Principal, action: str, *, target_id: str | None = None, params: dict[str, Any] | None = None) -> None:
    """Record ``principal`` calling ``action`` (e.g. ``admin.conversations.list``) on ``target_id``.

    ``params`` must hold only what shaped the call (filters, limit, cursor presence), never content or secrets.
    """
    params = params or {}
    AdminAuditRecord.objects.create(
        user_id=principal.user_id,
        client_id=principal.client_id,
        action=action,
        target_id=target_id,
        params=params,
        request_id=current_request_id(),
    )
    logger.info(
        "admin audit",
        extra={"audit_user": principal.user_id, "audit_client": principal.client_id, "action": action,
               "target_id": target_id, "params": params},
    )
