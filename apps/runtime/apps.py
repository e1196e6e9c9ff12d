from django.apps import AppConfig


class RuntimeConfig(AppConfig):
    name = "apps.runtime"
    label = "runtime"
    verbose_name = "Runtime: processes, servers and the operational endpoints"
