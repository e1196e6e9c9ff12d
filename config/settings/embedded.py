"""The embedded default: `make run` on a fresh machine, no external services.

With DATABASE_URL / REDIS_URL unset, a PostgreSQL 18 + pgvector and a Valkey are started from PyPI wheels by
apps.runtime.embedded_services (data under DATA_DIR, default var/). Set either variable to use an external server instead;
then nothing is started for it.
"""

from __future__ import annotations

import secrets

from apps.runtime import embedded_services
from config.env import database_from_url, env_bool, env_str

from .base import *  # noqa: F403
from .base import DATA_DIR, DB_CONN_MAX_AGE, DEV_IDP_AUDIENCE, OIDC_AUDIENCE, OIDC_ISSUER_URL

# Off like production (README): DEBUG keeps every SQL statement per connection in memory and wraps each cursor.
DEBUG = env_bool("DEBUG", False)
DEV_IDP_ENABLED = env_bool("DEV_IDP_ENABLED", True)
if DEV_IDP_ENABLED and not OIDC_ISSUER_URL and not OIDC_AUDIENCE:
    # The dev IdP is the issuer (apps.identity.tokens.trusted_issuer): check its tokens' audience as production
    # checks a real IdP's, so a token for another audience is refused here too.
    OIDC_AUDIENCE = [DEV_IDP_AUDIENCE]


def _local_secret(name: str) -> str:
    """A secret generated once into the data directory, so restarts keep sessions and tokens valid."""
    path = DATA_DIR / name
    if not path.exists():
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(48))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = env_str("SECRET_KEY", "") or _local_secret("secret-key")


def _local_encryption_keys() -> str:
    """MEMORY_ENCRYPTION_KEYS generated once into DATA_DIR/encryption-keys (D4). Losing this file loses every
    encrypted value, so it is created atomically (no half-written key, concurrent first starts agree on one)."""
    import base64
    import os

    path = DATA_DIR / "encryption-keys"
    if not path.exists():
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        line = f"local-{secrets.token_hex(4)}:{base64.b64encode(secrets.token_bytes(32)).decode()}\n"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(line)
        try:
            os.link(tmp, path)  # fails if another process got there first; then its key wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_text().strip()


MEMORY_ENCRYPTION_KEYS = env_str("MEMORY_ENCRYPTION_KEYS", "") or _local_encryption_keys()

DATABASE_URL = env_str("DATABASE_URL", "") or embedded_services.postgres_url()
REDIS_URL = env_str("REDIS_URL", "") or embedded_services.redis_url()

DATABASES = {"default": database_from_url(DATABASE_URL, DB_CONN_MAX_AGE)}
CELERY_BROKER_URL = REDIS_URL
CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}}
