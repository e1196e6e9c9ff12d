"""What the synchronous and asynchronous clients share: a request described as data (:class:`Call`), the retry
policy, and the client configuration that turns a call into an ``httpx`` request. The clients only differ in how
they send it (blocking or awaited)."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from memory_service import __version__
from memory_service.auth import TokenSource
from memory_service.errors import APIConnectionError, APITimeoutError

T = TypeVar("T")

DEFAULT_BASE_URL = "http://localhost:8080"
DEFAULT_TIMEOUT = 30.0


class _NoBody:
    def __repr__(self) -> str:
        return "NO_BODY"


NO_BODY: Any = _NoBody()


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One operation: the HTTP request and how to read its answer.

    ``idempotent`` calls (reads, PUT, DELETE and the read-only POST searches) are retried on 503 and on any
    connection failure; every call is retried when the connection could not even be opened (nothing was sent).
    ``accept`` lists non-2xx statuses that are answers rather than errors (a 304, a 503 from ``/readyz``).
    """

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: list[tuple[str, str]] | None = None
    json: Any = NO_BODY
    files: Callable[[], dict[str, Any]] | None = None
    cleanup: Callable[[], None] | None = None  # after the last attempt (closes a file the call opened)
    idempotent: bool = False
    authenticated: bool = True
    accept: frozenset[int] = frozenset()
    headers: Mapping[str, str] | None = None
    follow_redirects: bool = False


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries with exponential backoff and jitter: attempt ``n`` waits between half and all of
    ``min(max_backoff, backoff * 2**n)`` seconds, or the server's ``Retry-After`` (capped at ``max_backoff``)."""

    max_retries: int = 3
    backoff: float = 0.25
    max_backoff: float = 8.0
    statuses: frozenset[int] = field(default_factory=lambda: frozenset({503}))

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_backoff)
        ceiling = min(self.max_backoff, self.backoff * 2.0**attempt)
        return ceiling / 2 + random.uniform(0, ceiling / 2)  # noqa: S311 - jitter, not security

    def retry_status(self, call: Call[Any], status: int, attempt: int) -> bool:
        return call.idempotent and status in self.statuses and attempt < self.max_retries

    def retry_exception(self, call: Call[Any], exc: Exception, attempt: int) -> bool:
        if attempt >= self.max_retries or not isinstance(exc, httpx.TransportError):
            return False
        # Nothing reached the server: safe to send again whatever the method.
        never_sent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
        return never_sent or call.idempotent


def retry_after_seconds(headers: httpx.Headers) -> float | None:
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def connection_error(exc: httpx.TransportError) -> APIConnectionError:
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(f"timed out: {exc!r}")
    return APIConnectionError(f"connection failed: {exc!r}")


class ClientConfig:
    """The settings every call of one client uses."""

    def __init__(
        self,
        base_url: str,
        token: TokenSource | None,
        api_key: str | None,
        retry: RetryPolicy,
        headers: Mapping[str, str] | None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.api_key = api_key or None
        self.retry = retry
        self.headers = {
            "Accept": "application/json",
            "User-Agent": f"memory-service-client/{__version__} httpx/{httpx.__version__}",
            **(headers or {}),
        }

    def url(self, path: str) -> str:
        if path.startswith(("http://", "https://")):
            return path
        return f"{self.base_url}{path}"

    def request_kwargs(
        self, call: Call[Any], token: str | None, timeout: httpx.Timeout | None = None,
    ) -> dict[str, Any]:
        headers = dict(self.headers)
        if call.authenticated:
            if token:
                headers["Authorization"] = f"Bearer {token}"
            if self.api_key:
                headers["X-API-Key"] = self.api_key
        if call.headers:
            headers.update(call.headers)
        kwargs: dict[str, Any] = {"method": call.method, "url": self.url(call.path), "headers": headers}
        if call.params:
            kwargs["params"] = call.params
        if call.json is not NO_BODY:
            kwargs["json"] = call.json
        if call.files is not None:
            kwargs["files"] = call.files()
        if timeout is not None:
            kwargs["timeout"] = timeout
        return kwargs
