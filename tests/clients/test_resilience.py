"""Retries, backoff and credentials of the Python client, against the live service with faults injected in the
client's transport (a 503 or a refused connection the service itself would not produce on demand)."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest
from memory_service import (
    APIConnectionError,
    AsyncClient,
    AuthenticationError,
    Client,
    OAuthError,
    OAuthToken,
    RetryPolicy,
    UnavailableError,
)

from tests.clients.conftest import user_token
from tests.live_service import LiveService, free_port

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_tables_after_module")]

FAST = RetryPolicy(max_retries=3, backoff=0.01, max_backoff=0.05)


class Faulty(httpx.BaseTransport):
    """Answers the first ``unavailable`` requests with a 503 (the service's JSON error body) and refuses the next
    ``refused`` connections, then passes requests to the real transport. Records what was sent."""

    def __init__(self, *, unavailable: int = 0, refused: int = 0, retry_after: str | None = None) -> None:
        self.inner = httpx.HTTPTransport()
        self.unavailable = unavailable
        self.refused = refused
        self.retry_after = retry_after
        self.sent: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        if self.unavailable:
            self.unavailable -= 1
            headers = {"X-Request-ID": "fault"} | ({"Retry-After": self.retry_after} if self.retry_after else {})
            body = {"code": "unavailable", "error": "Injected.", "requestId": "fault"}
            return httpx.Response(503, json=body, headers=headers)
        if self.refused:
            self.refused -= 1
            raise httpx.ConnectError("connection refused (injected)")
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def client_with(live_service: LiveService, transport: httpx.BaseTransport, **kwargs) -> Client:
    kwargs.setdefault("token", user_token(live_service, "bob"))
    kwargs.setdefault("retry", FAST)
    return Client(live_service.base_url, http_client=httpx.Client(transport=transport), **kwargs)


def test_idempotent_calls_are_retried_on_503(live_service: LiveService) -> None:
    transport = Faulty(unavailable=2)
    client = client_with(live_service, transport)
    assert client.me().user_id == "bob"
    assert [request.url.path for request in transport.sent] == ["/v1/me"] * 3


def test_retries_end_in_unavailable_error(live_service: LiveService) -> None:
    transport = Faulty(unavailable=10)
    client = client_with(live_service, transport)
    with pytest.raises(UnavailableError) as caught:
        client.put_memory(("user", "bob"), "k", {"v": 1})
    assert (caught.value.code, caught.value.request_id) == ("unavailable", "fault")
    assert len(transport.sent) == 1 + FAST.max_retries


def test_a_non_idempotent_call_is_not_repeated_after_a_503(live_service: LiveService) -> None:
    transport = Faulty(unavailable=1)
    client = client_with(live_service, transport)
    title = f"once {uuid.uuid4().hex}"
    with pytest.raises(UnavailableError):
        client.create_conversation(title=title)
    assert len(transport.sent) == 1
    assert client.list_conversations(query=title).data == []  # nothing was created behind the caller's back


def test_a_refused_connection_is_retried_even_for_a_post(live_service: LiveService) -> None:
    """Nothing reached the service, so sending again cannot duplicate anything."""
    transport = Faulty(refused=2)
    client = client_with(live_service, transport)
    title = f"after two refusals {uuid.uuid4().hex}"
    conversation = client.create_conversation(title=title)
    assert [c.id for c in client.list_conversations(query=title)] == [conversation.id]
    assert len(transport.sent) == 3 + 1


def test_retry_after_is_honoured(live_service: LiveService) -> None:
    transport = Faulty(unavailable=1, retry_after="0.3")
    client = client_with(live_service, transport, retry=RetryPolicy(max_retries=1, backoff=0.0, max_backoff=5))
    started = time.monotonic()
    client.me()
    assert time.monotonic() - started >= 0.3


def test_an_unreachable_service_is_a_connection_error() -> None:
    client = Client(f"http://127.0.0.1:{free_port()}", token="t", retry=FAST)  # nothing listens there
    with pytest.raises(APIConnectionError):
        client.healthz()


def test_a_refused_token_is_refreshed_once(live_service: LiveService) -> None:
    token = OAuthToken.dev_idp(live_service.base_url, "bob")
    client = Client(live_service.base_url, token=token)
    assert client.me().user_id == "bob"
    token._token = "expired-or-revoked"  # what the service would refuse, cached as if still fresh
    assert client.me().user_id == "bob"  # 401, invalidate(), a new token, the call again
    assert token() != "expired-or-revoked"

    issued: list[str] = []

    def always_bad() -> str:
        issued.append("x")
        return "not-a-token"

    with pytest.raises(AuthenticationError):
        Client(live_service.base_url, token=always_bad).me()
    assert len(issued) == 2  # the first try and one refresh, no more


def test_oauth_password_grant_and_errors(live_service: LiveService) -> None:
    good = OAuthToken.dev_idp(live_service.base_url, "alice")
    assert Client(live_service.base_url, token=good).me().user_id == "alice"
    with pytest.raises(OAuthError) as wrong:
        OAuthToken.dev_idp(live_service.base_url, "alice", "wrong-password")()
    assert wrong.value.error == "invalid_grant"
    # The dev IdP issues the password grant only (D2); a client-credentials request reaches it and is refused.
    service_account = OAuthToken.client_credentials(
        f"{live_service.base_url}/dev-idp/token", client_id="memory-service-client", client_secret="dev-client-secret"
    )
    with pytest.raises(OAuthError) as unsupported:
        service_account()
    assert unsupported.value.error == "unsupported_grant_type"
    basic = OAuthToken.dev_idp(live_service.base_url, "bob", client_auth="basic")
    assert Client(live_service.base_url, token=basic).me().user_id == "bob"


def test_async_client_retries_and_refreshes(live_service: LiveService) -> None:
    class AsyncFaulty(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = httpx.AsyncHTTPTransport()
            self.sent = 0

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            self.sent += 1
            if self.sent == 1:
                return httpx.Response(503, json={"code": "unavailable", "error": "x", "requestId": "r"})
            return await self.inner.handle_async_request(request)

    async def scenario() -> None:
        token = OAuthToken.dev_idp(live_service.base_url, "bob")
        transport = AsyncFaulty()
        async with AsyncClient(live_service.base_url, token=token, retry=FAST,
                               http_client=httpx.AsyncClient(transport=transport)) as client:
            assert (await client.me()).user_id == "bob"
            assert transport.sent == 2
            token._token = "revoked"
            assert (await client.me()).user_id == "bob"

        async def coroutine_token() -> str:
            return await token.async_token()

        async with AsyncClient(live_service.base_url, token=coroutine_token) as client:
            assert (await client.me()).user_id == "bob"

    asyncio.run(scenario())
