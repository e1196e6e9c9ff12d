from django.apps import AppConfig


class PolicyConfig(AppConfig):
    name = "apps.policy"
    label = "policy"
    verbose_name = "Policy: the Rego engines"

    def ready(self) -> None:
        from apps import policy
        from apps.core import readiness

        readiness.register("policy_engine", policy.check)
