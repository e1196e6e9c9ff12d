"""Memory authorization by Rego policies (D4). Import from here; see engine.py for the contract, current.py for the process's engine."""

from apps.policy.current import check, get_engine, load_or_die, reset_engine
from apps.policy.engine import Decision, FilterResult, PolicyCompileError, PolicyEngine, policy_context, policy_error

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
