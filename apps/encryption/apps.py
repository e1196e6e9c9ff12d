from django.apps import AppConfig


class EncryptionConfig(AppConfig):
    name = "apps.encryption"
    label = "encryption"
    verbose_name = "Encryption: key rings"

    def ready(self) -> None:
        from apps.core import readiness
        from apps.encryption import checks, key_rings

        readiness.register("encryption_key_ring", key_rings.check)
        readiness.register_info("encryption_keys", checks.encryption_keys_info)
