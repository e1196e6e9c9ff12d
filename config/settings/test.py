"""pytest-django: the embedded PostgreSQL (a fresh test database per session, the server started when a test first
needs it) unless DATABASE_URL is set."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from apps.limits import definitions as _limits
from apps.runtime import embedded_services
from config.env import env_bool

# The test session is one host, on the embedded PostgreSQL or (DATABASE_URL set) on a database of its own: it may
# generate the secrets its live servers and workers then read (config.local_secrets).
os.environ.setdefault("GENERATE_SECRETS", "true")
# The embedded PostgreSQL is started by the session when its first test that uses the database is set up
# (tests/conftest.py), not here: a run of tests that need none (`pytest tests/core/test_cursors.py`) starts none.
embedded_services.defer_postgres = True

from .embedded import *  # noqa: E402, F403

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


# Valkey databases (16, the server's default): a run in one process keeps the URL's own (0); under pytest-xdist (make
# test runs two worker processes) each worker gets one of 1-7 for the indexers' wake flags and Celery's queue, and an
# event-stream prefix of its own (Redis pub/sub channels ignore the database number), so one worker's writes never
# wake, feed or notify the other's. 8-15 are the brokers of the Celery workers tests start (tests/celery_workers.py),
# split evenly between the xdist workers.
def xdist_valkey_databases(worker: int, workers: int) -> tuple[int, range]:
    """xdist worker ``worker`` (0-based) of ``workers``: its own database and its share of the Celery brokers'. More
    than 7 workers would share a database: refused here rather than left to show as flaky tests."""
    if workers > 7:
        raise ImproperlyConfigured(f"{workers} pytest-xdist workers: at most 7 (each takes a test Valkey database)")
    share = 8 // workers
    return 1 + worker, range(8 + worker * share, 8 + (worker + 1) * share)


def valkey_database_url(url: str, database: int) -> str:
    """``url`` with its database (the path) replaced; a URL without one (``redis://host:6379``) gets one."""
    return urlsplit(url)._replace(path=f"/{database}").geturl()


_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_broker_databases = range(8, 16)
if _XDIST_WORKER:
    _database, _broker_databases = xdist_valkey_databases(
        int(_XDIST_WORKER.removeprefix("gw")), int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    )
    REDIS_URL = valkey_database_url(REDIS_URL, _database)  # noqa: F405
    CELERY_BROKER_URL = REDIS_URL
    CHANNEL_LAYERS = {"default": {**CHANNEL_LAYERS["default"], "CONFIG": {"hosts": [REDIS_URL]}}}  # noqa: F405
    SSE_REDIS_PREFIX = f"sse-{_XDIST_WORKER}:"
TEST_CELERY_BROKER_URLS = [valkey_database_url(REDIS_URL, database) for database in _broker_databases]

# The suite makes many requests fast as a few users: rates far above what it sends, so only the tests of the limits
# meet them (they override these with the real defaults, apps.limits.definitions). The live servers tests start get
# the same (tests/live_service.py). Quotas keep their defaults: no test stores that much.
TEST_RATE_LIMIT_PER_MINUTE = 6_000_000
TEST_RATE_LIMIT_BURST = 1_000_000
for _rate in _limits.RATES.values():
    globals()[_rate.per_minute_setting] = TEST_RATE_LIMIT_PER_MINUTE
    globals()[_rate.burst_setting] = TEST_RATE_LIMIT_BURST
# A loaded test machine can hold a healthy Valkey's answer past the production 50 ms: the limiter would then fail
# open and a test of the limits would see no 429. The outage tests set the production timeout themselves.
RATE_LIMIT_TIMEOUT_SECONDS = 2.0
