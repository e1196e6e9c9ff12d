"""The Python client (clients/python) against the live service (tests.live_service: gunicorn + uvicorn, the
production stack, so the event stream works too); tokens come from the live service's own dev IdP through the
client's OAuthToken.

The service commits what these tests write. The tables are flushed once after each module (as tests/fuzz does), not
after every test (``django_db(transaction=True)`` costs a flush of about a second per test), so a test scopes what it
asserts to what it made itself (its own titles, namespaces and ids). Their ``django_db`` mark only makes pytest-django
create the test database."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from memory_service import AsyncClient, Client, OAuthToken

from tests.live_service import LiveService

# One OAuthToken per user for the session: each caches its token (an RSA signature per token is slow).
_tokens: dict[tuple[str, str], OAuthToken] = {}


def user_token(live_service: LiveService, user: str) -> OAuthToken:
    key = (live_service.base_url, user)
    if key not in _tokens:
        _tokens[key] = OAuthToken.dev_idp(live_service.base_url, user)
    return _tokens[key]


@pytest.fixture
def sdk(live_service: LiveService) -> Iterator[Callable[..., Client]]:
    """``sdk(user, **kwargs) -> Client`` for a dev IdP user (alice: admin; bob, charlie: users); closed afterwards."""
    clients: list[Client] = []

    def make(user: str = "bob", **kwargs) -> Client:
        kwargs.setdefault("token", user_token(live_service, user))
        client = Client(live_service.base_url, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def async_sdk(live_service: LiveService) -> Callable[..., AsyncClient]:
    """``async_sdk(user, **kwargs) -> AsyncClient``; use it as ``async with`` inside the test's event loop."""

    def make(user: str = "bob", **kwargs) -> AsyncClient:
        kwargs.setdefault("token", user_token(live_service, user))
        return AsyncClient(live_service.base_url, **kwargs)

    return make
