"""The REST hook of the rate limiter: DRF's throttle step (after authentication and the permission check) takes a
``requests`` token for every authenticated caller, and one of the view's class for an expensive operation.

A view names its class per action (a ViewSet) or per method (an APIView): ``rate_kinds = {"search": "searches"}``.
Anonymous requests (the dev IdP's token endpoint, the signed download link) are not limited here.
"""

from __future__ import annotations

from typing import Any

from rest_framework.throttling import BaseThrottle

from apps.limits.rates import check_rate


class UserRateThrottle(BaseThrottle):
    def allow_request(self, request: Any, view: Any) -> bool:
        principal = request.user
        if getattr(principal, "user_id", None) is None:
            return True
        kinds = getattr(view, "rate_kinds", None)
        kind = None
        if kinds:
            kind = kinds.get(getattr(view, "action", None) or request.method.lower())
        check_rate(principal, kind)  # raises 429 rate_limited
        return True
