"""The process's one policy engine: which engine the settings choose, built and compiled once, rebuilt when the
settings change."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from apps.core.settings_cache import BuiltFromSettings
from apps.policy.engine import PolicyEngine
from apps.policy.opa_engine import OpaEngine


def _config_key() -> tuple[Any, ...]:
    return (
        settings.POLICY_ENGINE,
        settings.SERVICE_POLICY_DIR,
        str(settings.BUILTIN_POLICY_DIR),
        settings.OPA_URL,
        settings.OPA_TIMEOUT_SECONDS,
        settings.POLICY_INTERPRETERS,
    )


def _build(key: tuple[Any, ...]) -> PolicyEngine:
    kind, policy_dir, builtin_dir, opa_url, opa_timeout, interpreters = key
    if kind == "embedded":
        # Imported when chosen: regopy loads a native library (apps.core.native), which an OPA deployment never needs.
        from apps.policy.regopy_engine import RegopyEngine

        return RegopyEngine(policy_dir or None, builtin_dir, interpreters=interpreters)
    if kind == "opa":
        return OpaEngine(opa_url, opa_timeout)
    raise ImproperlyConfigured(f"POLICY_ENGINE must be 'embedded' or 'opa', got {kind!r}")


def _build_loaded(key: tuple[Any, ...]) -> PolicyEngine:
    engine = _build(key)
    engine.load()
    return engine


_engine: BuiltFromSettings[PolicyEngine] = BuiltFromSettings(_config_key, _build_loaded)


def get_engine() -> PolicyEngine:
    """The engine for the current settings; rebuilt when they change (override_settings in tests)."""
    return _engine.get()


def reset_engine() -> None:
    """Forget the process-wide engine (tests)."""
    _engine.reset()


def load_or_die() -> None:
    """Compile the configured policies now. Call once at start-up (apps.runtime.startup): a policy that does not
    compile raises ImproperlyConfigured with the file and the compiler's message, which stops the service."""
    get_engine()


def check() -> None:
    """Readiness check (registered as "policy_engine")."""
    get_engine().check()
