"""The embedded default: `make run` on a fresh machine, no external services.

With DATABASE_URL / REDIS_URL unset, a PostgreSQL 18 + pgvector and a Valkey are started from PyPI wheels by
apps.runtime.embedded_services (data under DATA_DIR, default var/). Set either variable to use an external server instead;
then nothing is started for it.
"""

from __future__ import annotations

from apps.runtime import embedded_services
from config import local_secrets
from config.env import database_from_url, env_bool, env_str

from .base import *  # noqa: F403
from .base import DATA_DIR, DB_CONN_MAX_AGE, DEV_IDP_AUDIENCE, GENERATE_SECRETS, OIDC_AUDIENCE, OIDC_ISSUER_URL

# Off like production (README): DEBUG keeps every SQL statement per connection in memory and wraps each cursor.
DEBUG = env_bool("DEBUG", False)
DEV_IDP_ENABLED = env_bool("DEV_IDP_ENABLED", True)
if DEV_IDP_ENABLED and not OIDC_ISSUER_URL and not OIDC_AUDIENCE:
    # The dev IdP is the issuer (apps.identity.tokens.trusted_issuer): check its tokens' audience as production
    # checks a real IdP's, so a token for another audience is refused here too.
    OIDC_AUDIENCE = [DEV_IDP_AUDIENCE]


# Secrets (issue 32.2): from the environment; else from DATA_DIR, generated there on first start only where the
# database is this installation's own (config.local_secrets). A host next to a shared database must be given the
# other hosts' values instead of inventing its own.
_DATABASE_URL = env_str("DATABASE_URL", "")
DATABASE_IS_EMBEDDED = not _DATABASE_URL or embedded_services.is_embedded_database(_DATABASE_URL)
SECRETS_MAY_BE_GENERATED = local_secrets.may_generate(GENERATE_SECRETS, DATABASE_IS_EMBEDDED)
SECRET_SOURCES: dict[str, str] = {}
SECRET_KEY = local_secrets.resolve(
    "SECRET_KEY", DATA_DIR / "secret-key", local_secrets.new_secret_key, generate=SECRETS_MAY_BE_GENERATED,
    sources=SECRET_SOURCES, hint="sessions and signed download links made on one host would be refused on another",
)  # fmt: skip
# Losing the key file loses every encrypted value; write_once never leaves a half-written key.
MEMORY_ENCRYPTION_KEYS = local_secrets.resolve(
    "MEMORY_ENCRYPTION_KEYS", DATA_DIR / "encryption-keys", local_secrets.new_encryption_keys,
    generate=SECRETS_MAY_BE_GENERATED, sources=SECRET_SOURCES,
    hint="values it encrypts could not be read by the others, nor theirs by it",
)  # fmt: skip

DATABASE_URL = _DATABASE_URL or embedded_services.postgres_url()
REDIS_URL = env_str("REDIS_URL", "") or embedded_services.redis_url()

DATABASES = {"default": database_from_url(DATABASE_URL, DB_CONN_MAX_AGE)}
CELERY_BROKER_URL = REDIS_URL
CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}}
