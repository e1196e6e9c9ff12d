"""The Celery application shared by the worker and beat processes (see Procfile)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.embedded")

app = Celery("memory_service")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
