"""The one memory policy engine interface (D4).

Three Rego documents decide memory access (interface, "Memory access policies"):

* ``data.memories.authz.decision``       → ``authorize()``  → Decision(allow, reason)
* ``data.memories.attributes.attributes`` → ``attributes()`` → plaintext attributes stored with a memory
* ``data.memories.filter``                → ``filter()``     → FilterResult(namespace_prefix, attribute_filter)

``apps.policy.current.get_engine()`` returns the process-wide engine chosen by ``settings.POLICY_ENGINE``:
``embedded`` (regopy, in-process) or ``opa`` (a sidecar's REST Data API). Both share this base class, so validation, the error model and
metrics are identical whichever evaluates: a malformed result or a failed evaluation is a 500 ``policy_error``, an
unreachable sidecar a 503 ``unavailable`` — never an allow.
"""

from __future__ import annotations

import logging
import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from apps.core import errors
from apps.core.metrics import POLICY_DECISIONS, POLICY_LATENCY
from apps.core.serializers import json_value_problem

if TYPE_CHECKING:
    from apps.identity.principal import Principal

logger = logging.getLogger(__name__)

# Rule name → entrypoint path (regopy entrypoint, and the OPA Data API path after /v1/data/).
AUTHZ: Final = "authz"
ATTRIBUTES: Final = "attributes"
FILTER: Final = "filter"
ENTRYPOINTS: Final[dict[str, str]] = {
    AUTHZ: "memories/authz/decision",
    ATTRIBUTES: "memories/attributes/attributes",
    FILTER: "memories/filter",
}
POLICY_FILES: Final[tuple[str, ...]] = ("authz.rego", "attributes.rego", "filter.rego")

# The interface's built-in default result of authz.rego; also what an undefined decision means.
DEFAULT_DENY_REASON: Final = "access denied"


class _Undefined:
    """A Rego query with no value (the rule did not match and has no default). Distinct from JSON null."""

    def __repr__(self) -> str:
        return "UNDEFINED"


UNDEFINED: Final = _Undefined()


class PolicyEvaluationError(Exception):
    """An engine could not produce a value (runtime error, conflicting rule values, bad response). Becomes a 500."""


class PolicyCompileError(ImproperlyConfigured):
    """The policies do not compile. At start this stops the service; on reload the previous policies stay."""


@dataclass(frozen=True)
class Decision:
    allow: bool
    reason: str | None = None


@dataclass(frozen=True)
class FilterResult:
    """``namespace_prefix`` replaces the requested prefix and ``attribute_filter`` is ANDed with the caller's filter
    (D4). Both are always set: a policy that leaves one undefined is a policy_error (fail closed)."""

    namespace_prefix: list[str]
    attribute_filter: dict[str, Any]


def policy_error(message: str = "Memory policy evaluation failed.") -> errors.ApiError:
    return errors.ApiError(500, message, code="policy_error")


def role_names() -> dict[str, str]:
    """``input.context.role_names``: the role names this service is configured with (ADMIN_ROLE, AUDITOR_ROLE,
    INDEXER_ROLE), so a policy tests ``input.context.role_names.admin in roles`` instead of hard-coding "admin"."""
    return {"admin": settings.ADMIN_ROLE, "auditor": settings.AUDITOR_ROLE, "indexer": settings.INDEXER_ROLE}


def policy_context(principal: Principal) -> dict[str, Any]:
    """``input.context`` for every memory policy: user id, client id when an API key was used, the claims with
    ``roles`` flattened (D2), and the service's configured role names (``role_names``)."""
    context: dict[str, Any] = {
        "user_id": principal.user_id,
        "jwt_claims": principal.policy_claims(),
        "role_names": role_names(),
    }
    if principal.client_id:
        context["client_id"] = principal.client_id
    return context


class PolicyEngine(ABC):
    """Evaluate the three memory policies. Subclasses implement ``_evaluate``, ``check`` and optionally ``load``."""

    name: str = "abstract"

    # --- public API ---------------------------------------------------------------------------------------------

    def authorize(self, input: dict[str, Any]) -> Decision:
        """data.memories.authz.decision. Undefined means the built-in default deny."""
        value = self._timed(AUTHZ, input)
        if value is UNDEFINED:
            decision = Decision(False, DEFAULT_DENY_REASON)
        else:
            decision = self._validated(AUTHZ, _as_decision, value)
        POLICY_DECISIONS.labels(AUTHZ, "allow" if decision.allow else "deny").inc()
        return decision

    def attributes(self, input: dict[str, Any]) -> dict[str, Any]:
        """data.memories.attributes.attributes. Undefined means no attributes."""
        value = self._timed(ATTRIBUTES, input)
        result = {} if value is UNDEFINED else self._validated(ATTRIBUTES, _as_attributes, value)
        POLICY_DECISIONS.labels(ATTRIBUTES, "ok").inc()
        return result

    def filter(self, input: dict[str, Any]) -> FilterResult:
        """data.memories.filter (the whole package). Undefined is an error, not "no constraint": it means the
        package is missing (e.g. a sidecar without the policy), and reading it as unconstrained would widen search.
        So is a package that leaves ``namespace_prefix`` or ``attribute_filter`` undefined (or null) for this
        input: a rule that matched no case must not read as "no constraint" either (a policy that means none says
        so: ``namespace_prefix := input.namespace_prefix``, ``attribute_filter := {}``)."""
        value = self._timed(FILTER, input)
        if value is UNDEFINED:
            POLICY_DECISIONS.labels(FILTER, "error").inc()
            logger.error("memory filter policy is undefined (package data.memories.filter missing)")
            raise policy_error()
        result = self._validated(FILTER, _as_filter, value)
        POLICY_DECISIONS.labels(FILTER, "ok").inc()
        return result

    def load(self) -> None:
        """Prepare at start-up; raise PolicyCompileError when the policies cannot be used."""
        logger.debug("memory policy engine %s ready", self.name)

    @abstractmethod
    def check(self) -> None:
        """Readiness: raise when the engine cannot evaluate now."""

    # --- for subclasses -----------------------------------------------------------------------------------------

    @abstractmethod
    def _evaluate(self, rule: str, input: dict[str, Any]) -> Any:
        """The raw JSON value of ``rule`` for ``input``, or UNDEFINED. Raise PolicyEvaluationError when it cannot
        be computed, errors.ApiError (503) when the engine is unreachable."""

    # --- internals ----------------------------------------------------------------------------------------------

    def _timed(self, rule: str, input: dict[str, Any]) -> Any:
        started = time.perf_counter()
        try:
            return self._evaluate(rule, input)
        except errors.ApiError as exc:
            POLICY_DECISIONS.labels(rule, "unavailable" if exc.status == 503 else "error").inc()
            raise
        except Exception as exc:  # any engine failure must surface as policy_error, never as an allow
            POLICY_DECISIONS.labels(rule, "error").inc()
            logger.error("memory policy %s evaluation failed on engine %s: %s", rule, self.name, exc)
            raise policy_error() from exc
        finally:
            POLICY_LATENCY.labels(rule).observe(time.perf_counter() - started)

    def _validated(self, rule: str, convert: Any, value: Any) -> Any:
        try:
            return convert(value)
        except _Malformed as exc:
            POLICY_DECISIONS.labels(rule, "error").inc()
            logger.error("memory policy %s returned a malformed result on engine %s: %s", rule, self.name, exc)
            raise policy_error() from None


class _Malformed(ValueError):
    pass


_SCALARS = (str, int, float, bool, type(None))


def _is_scalar(value: Any) -> bool:
    # JSON has no NaN or infinity; a policy computing one (e.g. 1e400) must not reach the store or the filters.
    return isinstance(value, _SCALARS) and not (isinstance(value, float) and not math.isfinite(value))


def _as_decision(value: Any) -> Decision:
    if not isinstance(value, dict):
        raise _Malformed(f"decision must be an object, got {type(value).__name__}")
    allow = value.get("allow")
    if not isinstance(allow, bool):
        raise _Malformed("decision.allow must be a boolean")
    reason = value.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise _Malformed("decision.reason must be a string")
    return Decision(allow, reason)


def _as_attributes(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Malformed(f"attributes must be an object, got {type(value).__name__}")
    for key, item in value.items():
        if not _is_scalar(item):
            raise _Malformed(f"attribute {key!r} must be a JSON scalar, got {type(item).__name__}")
    # Stored in jsonb (memories, vectors, events): no NUL in a name or a string, nothing UTF-8 cannot encode.
    # Caught here it is the policy's error, never a database error, and nothing is written.
    problem = json_value_problem(value, int64=False)
    if problem:
        raise _Malformed(f"attributes cannot be stored: {problem}")
    return dict(value)


def _as_filter(value: Any) -> FilterResult:
    if not isinstance(value, dict):
        raise _Malformed(f"filter result must be an object, got {type(value).__name__}")
    for rule in ("namespace_prefix", "attribute_filter"):
        # Fail closed: undefined would otherwise mean "keep the requested prefix" / "no attribute filter".
        if value.get(rule) is None:
            raise _Malformed(f"{rule} is undefined for this input (define it for every input; fail closed)")
    prefix = value["namespace_prefix"]
    if not (isinstance(prefix, list) and all(isinstance(s, str) for s in prefix)):
        raise _Malformed("namespace_prefix must be an array of strings")
    attribute_filter = value["attribute_filter"]
    if not isinstance(attribute_filter, dict):
        raise _Malformed("attribute_filter must be an object")
    for key, condition in attribute_filter.items():
        if not _is_condition(condition):
            raise _Malformed(f"attribute_filter[{key!r}] must be a scalar or an operator object of scalars")
    return FilterResult(namespace_prefix=list(prefix), attribute_filter=dict(attribute_filter))


def _is_condition(condition: Any) -> bool:
    # The caller's filter forms (D4): a bare scalar, or {"in": [..]} / {"gt": v, ...}. Operator names are checked
    # where the filter is applied; here only the shape, so nothing nested reaches the query builder.
    if _is_scalar(condition):
        return True
    if isinstance(condition, dict):
        return all(
            _is_scalar(arg) or (isinstance(arg, list) and all(_is_scalar(x) for x in arg)) for arg in condition.values()
        )
    return False
