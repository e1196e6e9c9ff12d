"""pytest-django: the embedded PostgreSQL (a fresh test database per session) unless DATABASE_URL is set."""

from __future__ import annotations

from .embedded import *  # noqa: F403

DEBUG = False
API_KEYS = "test-client:test-api-key-0123456789"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOG_LEVEL = "WARNING"
LOGGING["root"]["level"] = "WARNING"  # noqa: F405
CELERY_TASK_ALWAYS_EAGER = False
