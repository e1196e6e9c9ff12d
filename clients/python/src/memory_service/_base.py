"""What the synchronous and asynchronous clients share, written without I/O: a request described as data
(:class:`Call`), the retry policy, the client configuration that turns a call into an ``httpx`` request, and
:func:`exchange`, the whole exchange of one call (retries, the 401 refresh, errors) as a generator of the
:data:`Step` s it needs done. The clients only differ in how they do a step (blocking or awaited): :func:`drive`
and :func:`adrive` run such a generator with the one or the other. Last, the streamed downloads both hand out
(:class:`AttachmentDownload`, :class:`AsyncAttachmentDownload`)."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import httpx

from memory_service import __version__
from memory_service.auth import TokenSource, invalidate
from memory_service.errors import (
    APIConnectionError,
    APITimeoutError,
    ConfigurationError,
    MemoryServiceError,
    error_from_response,
)

T = TypeVar("T")
Y = TypeVar("Y")

DEFAULT_BASE_URL = "http://localhost:8080"
# As langgraph-sdk splits it: connecting and waiting for a pooled connection fail fast, reading and writing a body
# may take the time a large upload or a slow search needs.
DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=30.0, write=30.0, pool=5.0)
Timeouts = float | tuple[float | None, float | None, float | None, float | None] | httpx.Timeout


def timeout_of(value: Timeouts | None) -> httpx.Timeout:
    """An ``httpx.Timeout`` from what a client takes: one number for all four, ``(connect, read, write, pool)``
    seconds (None: no limit), or an ``httpx.Timeout``; None is the default."""
    if value is None:
        return DEFAULT_TIMEOUT
    if isinstance(value, httpx.Timeout):
        return value
    if isinstance(value, tuple):
        if len(value) != 4:
            raise ConfigurationError("timeout is a number, (connect, read, write, pool) or an httpx.Timeout")
        connect, read, write, pool = value
        return httpx.Timeout(connect=connect, read=read, write=write, pool=pool)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError("timeout is a number, (connect, read, write, pool) or an httpx.Timeout")
    return httpx.Timeout(float(value))


def checked_base_url(base_url: str) -> str:
    """The service's URL without a trailing slash; anything but an http(s) URL with a host is a
    :class:`ConfigurationError` at once (sending to it could never succeed, so nothing is ever retried)."""
    if not isinstance(base_url, str):
        raise ConfigurationError(f"base_url must be a string like 'http://localhost:8080', not {base_url!r}")
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"base_url must be an http:// or https:// URL with a host (e.g. 'http://localhost:8080'), not {base_url!r}"
        )
    if parts.query or parts.fragment:
        raise ConfigurationError(f"base_url must not have a query or a fragment: {base_url!r}")
    return base_url.rstrip("/")


class _NoBody:
    def __repr__(self) -> str:
        return "NO_BODY"


NO_BODY: Any = _NoBody()


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One operation: the HTTP request and how to read its answer.

    ``idempotent`` calls (reads, PUT, DELETE and the read-only POST searches) are retried on 503 and on any
    connection failure; every call is retried when the connection could not even be opened (nothing was sent) and
    on a 429 (refused before anything was done).
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
    ``min(max_backoff, backoff * 2**n)`` seconds, or the server's ``Retry-After`` (capped at ``max_backoff``).

    A 429 (over the caller's request rate) is retried, whatever the method, after the server's ``Retry-After``
    (the backoff when it sends none); one asking for more than ``max_retry_after`` seconds ends the call at once
    with :class:`~memory_service.RateLimitedError` (its ``retry_after`` says how long), rather than blocking."""

    max_retries: int = 3
    backoff: float = 0.25
    max_backoff: float = 8.0
    statuses: frozenset[int] = field(default_factory=lambda: frozenset({503}))
    max_retry_after: float = 30.0

    def rate_limited_delay(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before retrying a 429, or None when it is not retried."""
        if attempt >= self.max_retries:
            return None
        wait = self.delay(attempt) if retry_after is None else max(retry_after, 0.0)
        return wait if wait <= self.max_retry_after else None

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
        if isinstance(exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError):
            return False  # the request itself is wrong (its URL, a header): sending it again changes nothing
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


def connection_error(exc: httpx.TransportError) -> MemoryServiceError:
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError):
        return ConfigurationError(f"the request cannot be sent: {exc!r}")
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
        self.base_url = checked_base_url(base_url)
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


# --- One exchange, without I/O ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Token:
    """Ask the token source for the bearer token (it may fetch one)."""


@dataclass(frozen=True, slots=True)
class Send:
    """Build the request from ``request`` (``ClientConfig.request_kwargs``) and send it; the answer is the
    response, its body still unread."""

    request: dict[str, Any]
    follow_redirects: bool


@dataclass(frozen=True, slots=True)
class Read:
    """Read the response's body; the answer is the bytes."""

    response: httpx.Response


@dataclass(frozen=True, slots=True)
class Close:
    response: httpx.Response


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Step = Token | Send | Read | Close | Sleep


def exchange(
    config: ClientConfig, call: Call[Any], *, stream: bool = False, timeout: httpx.Timeout | None = None,
) -> Generator[Step, Any, httpx.Response]:
    """The answer to ``call`` after retries, or the error it ends in. ``stream``: the body is left unread (the
    caller closes the response)."""
    policy = config.retry
    attempt = 0
    refreshed = False
    # Whether an earlier attempt may have been done by the service, its answer lost: a DELETE sent again then
    # finds nothing (404), which is the success the first attempt had.
    maybe_done = False
    while True:
        token = (yield Token()) if call.authenticated else None
        try:
            response: httpx.Response = yield Send(config.request_kwargs(call, token, timeout), call.follow_redirects)
        except httpx.TransportError as exc:
            if not policy.retry_exception(call, exc, attempt):
                raise connection_error(exc) from exc
            maybe_done = maybe_done or not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
            yield Sleep(policy.delay(attempt))
            attempt += 1
            continue
        status = response.status_code
        if status == 404 and call.method == "DELETE" and maybe_done:
            yield Close(response)
            return response
        if status < 300 or status in call.accept:
            if stream:
                return response
            failure: httpx.TransportError | None = None
            try:
                yield Read(response)
            except httpx.TransportError as exc:
                failure = exc
            yield Close(response)
            if failure is None:
                return response
            if not policy.retry_exception(call, failure, attempt):
                raise connection_error(failure) from failure
            maybe_done = True
            yield Sleep(policy.delay(attempt))
            attempt += 1
            continue
        try:
            body: bytes = yield Read(response)
        except httpx.TransportError:
            body = b""
        yield Close(response)
        if status == 401 and call.authenticated and not refreshed and invalidate(config.token):
            refreshed = True
            continue
        if policy.retry_status(call, status, attempt):
            yield Sleep(policy.delay(attempt, retry_after_seconds(response.headers)))
            attempt += 1
            continue
        if status == 429:
            wait = policy.rate_limited_delay(attempt, retry_after_seconds(response.headers))
            if wait is not None:
                yield Sleep(wait)
                attempt += 1
                continue
        raise error_from_response(status, response.headers, body)


def drive(steps: Generator[Y, Any, T], perform: Callable[[Y], Any]) -> T:
    """Run a generator of steps to its return value: ``perform`` each step it yields and send it the answer, or
    throw in the exception doing it raised (the generator decides whether that ends it)."""
    answer: Any = None
    error: Exception | None = None
    while True:
        try:
            step = steps.send(answer) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            answer, error = perform(step), None
        except Exception as exc:
            answer, error = None, exc


async def adrive(steps: Generator[Y, Any, T], perform: Callable[[Y], Awaitable[Any]]) -> T:
    """:func:`drive`, with a ``perform`` that is awaited."""
    answer: Any = None
    error: Exception | None = None
    while True:
        try:
            step = steps.send(answer) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            answer, error = await perform(step), None
        except Exception as exc:
            answer, error = None, exc


class DownloadInfo:
    """What a streamed download (or a 304 when ``if_none_match`` matched) says about its file; the clients'
    downloads add the reading."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response

    @property
    def not_modified(self) -> bool:
        return self._response.status_code == 304

    @property
    def content_type(self) -> str | None:
        value: str | None = self._response.headers.get("content-type")
        return value

    @property
    def etag(self) -> str | None:
        value: str | None = self._response.headers.get("etag")
        return value

    @property
    def size(self) -> int | None:
        length = self._response.headers.get("content-length")
        return int(length) if length and length.isdigit() else None

    @property
    def headers(self) -> httpx.Headers:
        return self._response.headers


class AttachmentDownload(DownloadInfo):
    """A streamed download (or a 304 when ``if_none_match`` matched). Close it, or use it as a context manager."""

    def iter_bytes(self, chunk_size: int | None = 64 * 1024) -> Iterator[bytes]:
        try:
            yield from self._response.iter_bytes(chunk_size)
        except httpx.TransportError as exc:
            raise connection_error(exc) from exc

    def read(self) -> bytes:
        return b"".join(self.iter_bytes())

    def save(self, path: str | Path) -> int:
        """Write the file to ``path``; answers the number of bytes written."""
        with Path(path).open("wb") as out:
            return sum(out.write(chunk) for chunk in self.iter_bytes())

    def close(self) -> None:
        self._response.close()

    def __enter__(self) -> AttachmentDownload:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncAttachmentDownload(DownloadInfo):
    """A streamed download (or a 304 when ``if_none_match`` matched). ``aclose()`` it, or use ``async with``."""

    async def iter_bytes(self, chunk_size: int | None = 64 * 1024) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_bytes(chunk_size):
                yield chunk
        except httpx.TransportError as exc:
            raise connection_error(exc) from exc

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_bytes()])

    async def save(self, path: str | Path) -> int:
        """Write the file to ``path``; answers the number of bytes written."""
        with Path(path).open("wb") as out:
            return sum([out.write(chunk) async for chunk in self.iter_bytes()])

    async def aclose(self) -> None:
        await self._response.aclose()

    async def __aenter__(self) -> AsyncAttachmentDownload:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
