from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _seed_api_keys(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """API_KEYS is seeded right after migrate so that `apikeys list` and the admin show the keys; authentication
    also seeds on demand (apps.identity.api_keys) for databases that were migrated before a key was added."""
    from apps.identity.api_keys import seed_from_settings

    seed_from_settings(using=using)


class IdentityConfig(AppConfig):
    name = "apps.identity"
    label = "identity"
    verbose_name = "Identity: API keys"

    def ready(self) -> None:
        post_migrate.connect(_seed_api_keys, sender=self, dispatch_uid="apps.identity.seed_api_keys")
