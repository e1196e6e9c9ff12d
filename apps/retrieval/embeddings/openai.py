"""Any OpenAI-compatible embeddings endpoint: OpenAI itself, Azure-style gateways, vLLM, Ollama, LiteLLM, TEI...

Protocol: ``POST {base_url}/embeddings`` with ``{"model", "input": [...], "dimensions"?}`` answered by
``{"data": [{"embedding": [...], "index": i}, ...]}``. The API key travels only in the Authorization header
and is never logged or put in an exception message.
"""

from __future__ import annotations

import logging
import math
import random
import time
from typing import Any

import requests
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from apps.core.http import ThreadLocalSessions

from .base import EmbeddingError, EmbeddingProvider, l2_normalize

logger = logging.getLogger(__name__)


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


# OpenAI's embedding models read 8191 tokens; a token is at least one character of ordinary text, so 8000
# characters fit. Set EMBEDDING_MAX_INPUT_CHARS for a server with a smaller window.
DEFAULT_MAX_INPUT_CHARS = 8000


class OpenAICompatibleEmbeddingProvider(EmbeddingProvider):
    """Remote embeddings. Inputs are sent in batches of ``batch_size``; transient failures (connection errors,
    timeouts, 429 and 5xx) are retried ``max_retries`` times with exponential backoff and full jitter, other
    4xx fail at once because repeating the same request cannot succeed."""

    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        dimension: int,
        api_key: str = "",
        timeout: float = 10.0,
        max_retries: int = 3,
        batch_size: int = 64,
        send_dimensions: bool = True,
        backoff_base: float = 0.5,
        backoff_max: float = 20.0,
        max_input_chars: int = DEFAULT_MAX_INPUT_CHARS,
    ) -> None:
        if not base_url:
            raise ImproperlyConfigured("EMBEDDING_BASE_URL is required for the openai embedding provider")
        if not model:
            raise ImproperlyConfigured("EMBEDDING_MODEL is required for the openai embedding provider")
        if not dimension or dimension < 1:
            raise ImproperlyConfigured(
                "EMBEDDING_DIMENSIONS is required for the openai embedding provider (it sizes the vector column)"
            )
        self.url = base_url.rstrip("/") + "/embeddings"
        self.model = model
        self.dimension = dimension
        self._api_key = api_key
        self.timeout = timeout
        self.max_retries = max(0, max_retries)
        self.batch_size = max(1, batch_size)
        # Some servers (and OpenAI's older models) reject "dimensions"; they must then natively match.
        self.send_dimensions = send_dimensions
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        # Longer index fields are sent as overlapping chunks (EmbeddingProvider.chunk) rather than cut by the server.
        self.max_input_chars = max_input_chars
        # requests.Session is not documented as thread-safe; one per thread keeps connection reuse safely.
        self._sessions = ThreadLocalSessions()

    @classmethod
    def from_settings(cls) -> OpenAICompatibleEmbeddingProvider:
        return cls(
            base_url=getattr(settings, "EMBEDDING_BASE_URL", ""),
            model=getattr(settings, "EMBEDDING_MODEL", ""),
            dimension=getattr(settings, "EMBEDDING_DIMENSIONS", None) or 0,
            api_key=getattr(settings, "EMBEDDING_API_KEY", ""),
            timeout=getattr(settings, "EMBEDDING_TIMEOUT_SECONDS", 10.0),
            max_retries=getattr(settings, "EMBEDDING_MAX_RETRIES", 3),
            batch_size=getattr(settings, "EMBEDDING_BATCH_SIZE", None) or 64,
            max_input_chars=getattr(settings, "EMBEDDING_MAX_INPUT_CHARS", None) or DEFAULT_MAX_INPUT_CHARS,
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} url={self.url!r} model={self.model!r} dimension={self.dimension}>"

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            vectors.extend(self._embed_batch(list(texts[start : start + self.batch_size])))
        return vectors

    def _session(self) -> requests.Session:
        return self._sessions.get()

    def _embed_batch(self, batch: list[str]) -> list[list[float]]:
        payload: dict[str, Any] = {"model": self.model, "input": batch}
        if self.send_dimensions:
            payload["dimensions"] = self.dimension
        attempt = 0
        while True:
            try:
                return self._parse(self._post(payload), len(batch))
            except _Retryable as exc:
                if attempt >= self.max_retries:
                    raise EmbeddingError(f"{self.url}: {exc} (gave up after {attempt + 1} attempts)") from exc
                delay = self._backoff(attempt, exc.retry_after)
                logger.warning(
                    "embedding request failed, retrying",
                    extra={"url": self.url, "error": str(exc), "attempt": attempt + 1, "delay": round(delay, 3)},
                )
                time.sleep(delay)
                attempt += 1

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.backoff_max)
        # Full jitter: spreads out workers that failed together so they do not retry in lockstep.
        return random.uniform(0.0, min(self.backoff_max, self.backoff_base * 2**attempt))  # noqa: S311

    def _post(self, payload: dict[str, Any]) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        try:
            response = self._session().post(self.url, json=payload, headers=headers, timeout=self.timeout)
        except requests.Timeout as exc:
            raise _Retryable(f"timed out after {self.timeout}s") from exc
        except requests.ConnectionError as exc:
            raise _Retryable(f"connection failed: {type(exc).__name__}") from exc
        except requests.RequestException as exc:
            raise EmbeddingError(f"{self.url}: request failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code == 429 or response.status_code >= 500:
            raise _Retryable(f"HTTP {response.status_code}", _retry_after(response))
        if response.status_code >= 400:
            raise EmbeddingError(f"{self.url}: HTTP {response.status_code}: {_snippet(response)}")
        try:
            return response.json()
        except ValueError as exc:
            raise EmbeddingError(f"{self.url}: response is not JSON: {_snippet(response)}") from exc

    def _parse(self, body: Any, expected: int) -> list[list[float]]:
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or len(data) != expected:
            got = len(data) if isinstance(data, list) else "no"
            raise EmbeddingError(f"{self.url}: expected {expected} embeddings, got {got}")
        vectors: list[list[float] | None] = [None] * expected
        for position, item in enumerate(data):
            index = item.get("index", position) if isinstance(item, dict) else None
            embedding = item.get("embedding") if isinstance(item, dict) else None
            if not isinstance(index, int) or not 0 <= index < expected or vectors[index] is not None:
                raise EmbeddingError(f"{self.url}: bad or duplicate index {index!r} in response")
            if not isinstance(embedding, list):
                raise EmbeddingError(f"{self.url}: item {index} has no embedding list")
            if len(embedding) != self.dimension:
                raise EmbeddingError(
                    f"{self.url}: model {self.model!r} returned dimension {len(embedding)}, expected {self.dimension}"
                )
            try:
                floats = [float(v) for v in embedding]
            except (TypeError, ValueError) as exc:
                raise EmbeddingError(f"{self.url}: item {index} has non-numeric values") from exc
            if not all(math.isfinite(v) for v in floats):
                raise EmbeddingError(f"{self.url}: item {index} has non-finite values")
            # Some servers return unnormalized vectors; the provider contract promises unit length.
            vectors[index] = l2_normalize(floats)
        return vectors  # type: ignore[return-value]  # every slot was filled: len(data) == expected, no duplicates


def _retry_after(response: requests.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP-date; plain backoff is good enough


def _snippet(response: requests.Response) -> str:
    return response.text[:200].replace("\n", " ")
