from django.apps import AppConfig


def _forget_overrides(sender: type, instance: object, **_kwargs: object) -> None:
    from apps.limits import config

    config.clear_cache(getattr(instance, "user_id", None))


class LimitsConfig(AppConfig):
    name = "apps.limits"
    label = "limits"
    verbose_name = "Limits: rates and quotas"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from apps.limits.models import UserLimits

        # An override saved in this process (the admin, `manage.py limits set`) applies at once here; the other
        # processes read it within LIMITS_CACHE_SECONDS.
        post_save.connect(_forget_overrides, sender=UserLimits, dispatch_uid="apps.limits.forget_saved")
        post_delete.connect(_forget_overrides, sender=UserLimits, dispatch_uid="apps.limits.forget_deleted")
