"""Policy evaluation by an OPA sidecar through its REST Data API (POLICY_ENGINE=opa, OPA_URL).

``POST {OPA_URL}/v1/data/memories/authz/decision`` with ``{"input": ...}`` answers ``{"result": ...}``; a missing
``result`` is OPA's "undefined". The sidecar owns loading and reloading the policies (``opa run --server --watch
DIR``), so nothing is compiled here and start-up does not wait for the sidecar: readiness reports it instead.

Failure mapping: connection refused / timeout / 502-504 → 503 ``unavailable``; any other non-200 answer (OPA
answers 500 for evaluation errors such as conflicting rule values) or a body that is not OPA's shape → 500
``policy_error``. Neither is ever an allow.
"""

from __future__ import annotations

import logging
from typing import Any

import requests

from apps.core import errors
from apps.core.http import ThreadLocalSessions
from apps.policy.engine import ENTRYPOINTS, UNDEFINED, PolicyEngine, PolicyEvaluationError

logger = logging.getLogger(__name__)

_GATEWAY_STATUSES = {502, 503, 504}


class OpaEngine(PolicyEngine):
    name = "opa"

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.timeout = float(timeout)
        self._sessions = ThreadLocalSessions()

    def _session(self) -> requests.Session:
        return self._sessions.get()

    def load(self) -> None:
        logger.info("memory policies evaluated by OPA", extra={"opa_url": self.url})

    def _evaluate(self, rule: str, input: dict[str, Any]) -> Any:
        path = ENTRYPOINTS[rule]
        try:
            response = self._session().post(f"{self.url}/v1/data/{path}", json={"input": input}, timeout=self.timeout)
        except requests.RequestException as exc:
            # Connection refused, DNS, timeouts: the sidecar is not answering; retrying later may succeed.
            logger.error("OPA unreachable for %s: %s", path, type(exc).__name__)
            raise errors.unavailable("The memory policy engine is unavailable.") from None
        if response.status_code in _GATEWAY_STATUSES:
            logger.error("OPA behind a gateway answered %s for %s", response.status_code, path)
            raise errors.unavailable("The memory policy engine is unavailable.")
        if response.status_code != 200:
            raise PolicyEvaluationError(f"OPA answered {response.status_code} for {path}: {response.text[:500]}")
        try:
            body = response.json()
        except ValueError:
            raise PolicyEvaluationError(f"OPA answered non-JSON for {path}") from None
        if not isinstance(body, dict):
            raise PolicyEvaluationError(f"OPA answered a non-object body for {path}")
        return body["result"] if "result" in body else UNDEFINED

    def check(self) -> None:
        response = self._session().get(f"{self.url}/health", timeout=self.timeout)
        if response.status_code != 200:
            raise PolicyEvaluationError(f"OPA /health answered {response.status_code}")
