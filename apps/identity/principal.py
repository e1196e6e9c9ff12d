"""The authenticated caller, as every view and policy sees it (D2). DRF puts it in ``request.user``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings


@dataclass(frozen=True)
class Principal:
    """A verified user (from the Bearer token), optionally acting through an API-key client.

    ``roles`` is the normalized union of the configured role claims; ``raw_claims`` are the token claims as issued.
    """

    user_id: str
    client_id: str | None
    roles: tuple[str, ...]
    raw_claims: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    # DRF's IsAuthenticated and Django templates look for these.
    is_authenticated = True
    is_anonymous = False

    @property
    def is_admin(self) -> bool:
        return settings.ADMIN_ROLE in self.roles

    @property
    def is_auditor(self) -> bool:
        """Read-only admin; an admin may do everything an auditor may."""
        return self.is_admin or settings.AUDITOR_ROLE in self.roles

    @property
    def is_indexer(self) -> bool:
        return self.is_admin or settings.INDEXER_ROLE in self.roles

    def policy_claims(self) -> dict[str, Any]:
        """``context.jwt_claims`` for policies: the raw claims with ``roles`` replaced by the flat role list, so a
        policy can test ``"admin" in input.context.jwt_claims.roles`` whatever claim the IdP put the role in."""
        claims = dict(self.raw_claims)
        claims["roles"] = list(self.roles)
        return claims

    def __str__(self) -> str:
        return self.user_id
