"""Memory authorization by Rego policies (D4). Import from here; see engine.py for the contract."""

from apps.core.policy.engine import (
    Decision,
    FilterResult,
    PolicyCompileError,
    PolicyEngine,
    check,
    get_engine,
    load_or_die,
    policy_context,
    policy_error,
    reset_engine,
)

__all__ = [
    "Decision",
    "FilterResult",
    "PolicyCompileError",
    "PolicyEngine",
    "check",
    "get_engine",
    "load_or_die",
    "policy_context",
    "policy_error",
    "reset_engine",
]
