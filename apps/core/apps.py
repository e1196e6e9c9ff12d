from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "apps.core"
    label = "core"
    verbose_name = "Core: the admin audit trail"

    def ready(self) -> None:
        from apps.core import key_rings, readiness

        readiness.register("database", readiness.check_database)
        readiness.register("redis", readiness.check_redis)
        readiness.register("encryption_key_ring", key_rings.check)
        readiness.register_info("encryption_keys", readiness.encryption_keys_info)
