from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "apps.core"
    label = "core"
    verbose_name = "Core: the admin audit trail"

    def ready(self) -> None:
        from apps.core import readiness

        readiness.register("database", readiness.check_database)
        readiness.register("redis", readiness.check_redis)
