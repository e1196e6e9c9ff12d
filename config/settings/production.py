"""Production: every external dependency comes from the environment; missing essentials stop the start-up."""

from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from config.env import database_from_url, env_bool, env_str

from .base import *  # noqa: F403
from .base import (
    DB_CONN_MAX_AGE,
    DEV_IDP_ALLOW_IN_PRODUCTION,
    DEV_IDP_SIGNING_KEY_FILE,
    OIDC_AUDIENCE,
    OIDC_AUDIENCE_CHECK,
)

DEBUG = env_bool("DEBUG", False)
DEV_IDP_ENABLED = env_bool("DEV_IDP_ENABLED", False)

DATABASE_URL = env_str("DATABASE_URL", "")
REDIS_URL = env_str("REDIS_URL", "")
SECRET_KEY = env_str("SECRET_KEY", "")

for _name in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "MEMORY_ENCRYPTION_KEYS"):
    if not globals()[_name]:
        raise ImproperlyConfigured(f"{_name} must be set in production (config.settings.production)")
# Production never generates a secret (issue 32.2): every host is given the same ones.
SECRET_SOURCES = {"SECRET_KEY": "environment", "MEMORY_ENCRYPTION_KEYS": "environment"}

if DEV_IDP_ENABLED and not DEBUG and not DEV_IDP_ALLOW_IN_PRODUCTION:
    raise ImproperlyConfigured(
        "DEV_IDP_ENABLED is on while DEBUG is off: the development identity provider issues tokens for anyone. "
        "Turn it off, or set DEV_IDP_ALLOW_IN_PRODUCTION=true if you really mean it."
    )

if DEV_IDP_ENABLED:
    # Allowed on: its key and issuer are what every instance must agree on, so neither is left to a per-host default.
    for _name in ("DEV_IDP_ISSUER", "DEV_IDP_SIGNING_KEY_FILE"):
        if not env_str(_name, ""):
            raise ImproperlyConfigured(
                f"{_name} must be set in production when the development identity provider is on: every instance "
                "signs and verifies its tokens with the same key file and issuer (README \"Several hosts\")."
            )
    if not Path(DEV_IDP_SIGNING_KEY_FILE).is_file():
        raise ImproperlyConfigured(
            f"DEV_IDP_SIGNING_KEY_FILE names no file ({DEV_IDP_SIGNING_KEY_FILE}); production never generates one. "
            "Create it once (python -m apps.identity.dev_idp.keys create PATH) and give every instance a copy."
        )
    SECRET_SOURCES["DEV_IDP_SIGNING_KEY_FILE"] = f"file {DEV_IDP_SIGNING_KEY_FILE}"

if OIDC_AUDIENCE_CHECK and not OIDC_AUDIENCE:
    raise ImproperlyConfigured(
        "OIDC_AUDIENCE must be set in production: without it a token the issuer minted for any other application "
        "is accepted here. Set it to this service's audience (the client id or API identifier the IdP puts in "
        "'aud'; a comma list for several), or set OIDC_AUDIENCE_CHECK=false if every token of the issuer is "
        "meant for this service."
    )

SECURE_CONTENT_TYPE_NOSNIFF = True
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", True)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", True)

DATABASES = {"default": database_from_url(DATABASE_URL, DB_CONN_MAX_AGE)}
CELERY_BROKER_URL = REDIS_URL
CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}}
