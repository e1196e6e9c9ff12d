"""pytest-django: the embedded PostgreSQL (a fresh test database per session) unless DATABASE_URL is set."""

from __future__ import annotations

import os

from config.env import env_bool

from .embedded import *  # noqa: F403

DEBUG = False
API_KEYS = "test-client:test-api-key-0123456789"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOG_LEVEL = "WARNING"
LOGGING["root"]["level"] = "WARNING"  # noqa: F405
CELERY_TASK_ALWAYS_EAGER = False

# One test database per pytest process, so parallel runs (several checkouts, a developer and CI) never drop each
# other's database; pytest-django destroys it at the end of the session.
DATABASES["default"]["TEST"] = {"NAME": f"test_memory_service_{os.getpid()}"}  # noqa: F405

# The lexical hashing embedder keeps most tests fast; tests marked `model` switch to the real local model.
EMBEDDING_PROVIDER = "hash"
# Tests switch to the local model at run time (marker `model`) after policies were evaluated, and compare it with
# the model on torch (tests/core/test_embedding_quality.py): load torch first (apps.core.native). A subprocess that
# must show a process without torch sets PRELOAD_TORCH=false.
PRELOAD_TORCH = env_bool("PRELOAD_TORCH", True)
# Tests add vectors between searches of the same scope; a cached scope size would hide the plan they expect.
MEMORY_VECTOR_SCOPE_SIZE_CACHE_SECONDS = 0

# pytest-xdist (make test runs two worker processes): each worker gets a Valkey database of its own for the indexers'
# wake flags and Celery's queue, and an event-stream prefix of its own (Redis pub/sub channels ignore the database
# number), so one worker's writes never wake, feed or notify the other's. The Celery workers tests start use
# databases 8-15 (tests/celery_workers.py).
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _XDIST_WORKER:
    _worker = int(_XDIST_WORKER.removeprefix("gw"))
    REDIS_URL = f"{REDIS_URL.rpartition('/')[0]}/{1 + _worker % 7}"  # noqa: F405
    CELERY_BROKER_URL = REDIS_URL
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}}
    SSE_REDIS_PREFIX = f"sse-{_XDIST_WORKER}:"
