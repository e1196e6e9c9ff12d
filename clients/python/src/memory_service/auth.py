"""Credentials: a bearer token (a string, or a callable the client asks before each request), an API key, and
:class:`OAuthToken`, a callable that gets tokens from an OAuth 2.0 token endpoint and refreshes them.

A token callable may be synchronous or, for :class:`~memory_service.AsyncClient`, a coroutine function. When the
service answers 401, a client holding a callable calls its ``invalidate()`` (when it has one) and retries the request
once with a fresh token.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import quote_plus

import httpx

from memory_service.errors import APIConnectionError, OAuthError

TokenSource = str | Callable[[], str] | Callable[[], Awaitable[str]]

DEV_IDP_CLIENT_ID = "memory-service-client"
DEV_IDP_CLIENT_SECRET = "dev-client-secret"


@runtime_checkable
class RefreshableToken(Protocol):
    """A token callable that can be told its token was refused (the client then asks it again)."""

    def __call__(self) -> str: ...

    def invalidate(self) -> None: ...


class OAuthToken:
    """An access token from an OAuth 2.0 token endpoint (``application/x-www-form-urlencoded`` grant), cached until
    ``refresh_margin`` seconds before it expires, then fetched again. Thread-safe; use one instance per identity.

    Pass it as ``token=`` to :class:`~memory_service.Client` (it is called for each request) or
    :class:`~memory_service.AsyncClient` (which awaits :meth:`async_token`)::

        token = OAuthToken.password("https://idp/token", client_id="app", client_secret="s", username="bob",
                                    password="...")
        client = Client("https://memory.example", token=token)
    """

    def __init__(
        self,
        token_url: str,
        form: Mapping[str, str],
        *,
        client_id: str,
        client_secret: str | None = None,
        client_auth: Literal["body", "basic"] = "body",
        refresh_margin: float = 30.0,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        async_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.token_url = token_url
        self._form = dict(form)
        self._client_id = client_id
        self._client_secret = client_secret
        self._client_auth = client_auth
        self._refresh_margin = refresh_margin
        self._timeout = timeout
        self._transport = transport
        self._async_transport = async_transport
        self._token: str | None = None
        self._expires_at = 0.0
        self._lock = threading.Lock()
        self._async_lock: asyncio.Lock | None = None

    @classmethod
    def password(
        cls, token_url: str, *, client_id: str, client_secret: str | None, username: str, password: str,
        scope: str | None = None, **kwargs: Any,
    ) -> OAuthToken:
        """The resource-owner password grant (a user's own token)."""
        form = {"grant_type": "password", "username": username, "password": password}
        if scope:
            form["scope"] = scope
        return cls(token_url, form, client_id=client_id, client_secret=client_secret, **kwargs)

    @classmethod
    def client_credentials(
        cls, token_url: str, *, client_id: str, client_secret: str, scope: str | None = None,
        audience: str | None = None, **kwargs: Any,
    ) -> OAuthToken:
        """The client-credentials grant (a service account's token; its user id is whatever the IdP puts in the
        claims the service reads, ``OIDC_USER_ID_CLAIMS``)."""
        form = {"grant_type": "client_credentials"}
        if scope:
            form["scope"] = scope
        if audience:
            form["audience"] = audience
        return cls(token_url, form, client_id=client_id, client_secret=client_secret, **kwargs)

    @classmethod
    def dev_idp(
        cls, base_url: str, username: str, password: str | None = None, *,
        client_id: str = DEV_IDP_CLIENT_ID, client_secret: str = DEV_IDP_CLIENT_SECRET, **kwargs: Any,
    ) -> OAuthToken:
        """A token of the service's development identity provider (``/dev-idp/token``; the dev users' password is
        their name unless ``DEV_IDP_USERS`` says otherwise)."""
        return cls.password(
            f"{base_url.rstrip('/')}/dev-idp/token", client_id=client_id, client_secret=client_secret,
            username=username, password=username if password is None else password, **kwargs,
        )

    # --- The token ----------------------------------------------------------------------------------------------

    def __call__(self) -> str:
        with self._lock:
            if self._fresh():
                return self._token  # type: ignore[return-value]
            request = self._request()
            try:
                with httpx.Client(timeout=self._timeout, transport=self._transport) as http:
                    response = http.send(http.build_request(**request))
            except httpx.TransportError as exc:
                raise APIConnectionError(f"token endpoint unreachable: {exc}") from exc
            return self._accept(response)

    async def async_token(self) -> str:
        if self._async_lock is None:
            self._async_lock = asyncio.Lock()
        async with self._async_lock:
            if self._fresh():
                return self._token  # type: ignore[return-value]
            request = self._request()
            try:
                async with httpx.AsyncClient(timeout=self._timeout, transport=self._async_transport) as http:
                    response = await http.send(http.build_request(**request))
            except httpx.TransportError as exc:
                raise APIConnectionError(f"token endpoint unreachable: {exc}") from exc
            return self._accept(response)

    def invalidate(self) -> None:
        """Forget the cached token (the service refused it); the next call fetches a new one."""
        self._token = None
        self._expires_at = 0.0

    def _fresh(self) -> bool:
        return self._token is not None and time.monotonic() < self._expires_at

    def _request(self) -> dict[str, Any]:
        form = dict(self._form)
        headers = {"Accept": "application/json"}
        if self._client_auth == "basic" and self._client_secret is not None:
            # RFC 6749 2.3.1: each part form-encoded, then HTTP Basic.
            pair = f"{quote_plus(self._client_id)}:{quote_plus(self._client_secret)}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        else:
            form["client_id"] = self._client_id
            if self._client_secret is not None:
                form["client_secret"] = self._client_secret
        return {"method": "POST", "url": self.token_url, "data": form, "headers": headers}

    def _accept(self, response: httpx.Response) -> str:
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code != 200 or not isinstance(body, dict) or not isinstance(body.get("access_token"), str):
            error = body.get("error") if isinstance(body, dict) else None
            description = body.get("error_description") if isinstance(body, dict) else None
            raise OAuthError(str(error or f"http_{response.status_code}"), description, response.status_code)
        lifetime = body.get("expires_in")
        lifetime = float(lifetime) if isinstance(lifetime, int | float) and not isinstance(lifetime, bool) else 300.0
        self._token = body["access_token"]
        self._expires_at = time.monotonic() + max(0.0, lifetime - self._refresh_margin)
        return self._token


def resolve_token(source: TokenSource | None) -> str | None:
    """The current token of a synchronous client's token source."""
    if source is None or isinstance(source, str):
        return source
    value = source()
    if inspect.isawaitable(value):
        close = getattr(value, "close", None)
        if close is not None:
            close()  # never awaited: do not leave a "coroutine was never awaited" warning behind
        raise TypeError("an async token callable needs AsyncClient")
    return _checked(value)


async def resolve_token_async(source: TokenSource | None) -> str | None:
    """The current token of an asynchronous client's token source (awaiting ``async_token`` or a coroutine)."""
    if source is None or isinstance(source, str):
        return source
    async_token = getattr(source, "async_token", None)
    if async_token is not None:
        return _checked(await async_token())
    value = source()
    if inspect.isawaitable(value):
        value = await value
    return _checked(value)


def _checked(token: object) -> str:
    if not isinstance(token, str):
        raise TypeError(f"a token callable must return a str, not {type(token).__name__}")
    return token


def invalidate(source: TokenSource | None) -> bool:
    """Tell a token source its token was refused. False when there is nothing to refresh (a fixed string)."""
    if source is None or isinstance(source, str):
        return False
    forget = getattr(source, "invalidate", None)
    if forget is not None:
        forget()
    return True
