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
    ConfigurationError,
    NotFoundError,
    OAuthError,
    OAuthToken,
    RateLimitedError,
    RetryPolicy,
    UnavailableError,
    ValidationError,
)

from tests.clients.conftest import user_token
from tests.live_service import LiveService, free_port

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_tables_after_module")]

FAST = RetryPolicy(max_retries=3, backoff=0.01, max_backoff=0.05)


class Faulty(httpx.BaseTransport):
    """Answers the first ``unavailable`` requests with a 503 (the service's JSON error body) and refuses the next
    ``refused`` connections, then passes requests to the real transport. Records what was sent."""

    def __init__(
        self, *, unavailable: int = 0, refused: int = 0, retry_after: str | None = None, rate_limited: int = 0,
        lost_answers: int = 0, unsendable: int = 0,
    ) -> None:
        self.inner = httpx.HTTPTransport()
        self.unavailable = unavailable
        self.refused = refused
        self.retry_after = retry_after
        self.rate_limited = rate_limited
        self.lost_answers = lost_answers  # requests the service does, whose answers then never arrive
        self.unsendable = unsendable
        self.sent: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        if self.unsendable:
            self.unsendable -= 1
            raise httpx.UnsupportedProtocol("Request URL has an unsupported protocol (injected)")
        if self.rate_limited:
            self.rate_limited -= 1
            headers = {"X-Request-ID": "fault"} | ({"Retry-After": self.retry_after} if self.retry_after else {})
            body = {"code": "rate_limited", "error": "Too many requests.", "requestId": "fault"}
            return httpx.Response(429, json=body, headers=headers)
        if self.lost_answers:
            self.lost_answers -= 1
            self.inner.handle_request(request).read()
            raise httpx.ReadError("connection reset while reading the answer (injected)")
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


# --- Issue 31's client fixes --------------------------------------------------------------------------------------


def test_a_delete_whose_answer_was_lost_reports_success(live_service: LiveService) -> None:
    """The service deleted it, the answer never arrived, the retry finds nothing: that 404 is the success the
    first attempt had (before: NotFoundError for a delete that worked)."""
    transport = Faulty()
    client = client_with(live_service, transport)
    conversation = client.create_conversation(title="to delete")
    client.add_membership(conversation.id, "charlie", "reader")
    transport.lost_answers = 1
    client.remove_membership(conversation.id, "charlie")
    assert [m.user_id for m in client.iter_memberships(conversation.id)] == ["bob"]
    transport.lost_answers = 1
    client.delete_conversation(conversation.id)
    assert [r.method for r in transport.sent[-2:]] == ["DELETE", "DELETE"]
    with pytest.raises(NotFoundError):
        client.get_conversation(conversation.id)
    # Without a lost answer, a 404 is still a 404: nothing was there to delete.
    with pytest.raises(NotFoundError):
        client.delete_conversation(conversation.id)
    with pytest.raises(NotFoundError):
        client.delete_conversation(uuid.uuid4())


def test_429_is_retried_after_retry_after_whatever_the_method(live_service: LiveService) -> None:
    transport = Faulty(rate_limited=2, retry_after="0.2")
    client = client_with(live_service, transport, retry=RetryPolicy(max_retries=3, backoff=0.0, max_backoff=0.01))
    started = time.monotonic()
    assert client.me().user_id == "bob"
    assert time.monotonic() - started >= 0.4  # Retry-After, not the (tiny) backoff
    assert len(transport.sent) == 3
    transport.rate_limited = 1
    title = f"after a 429 {uuid.uuid4().hex}"
    created = client.create_conversation(title=title)  # a POST: the 429 says nothing was done
    assert [c.id for c in client.list_conversations(query=title)] == [created.id]


def test_429_retries_are_bounded(live_service: LiveService) -> None:
    transport = Faulty(rate_limited=10, retry_after="0")
    client = client_with(live_service, transport)
    with pytest.raises(RateLimitedError):
        client.me()
    assert len(transport.sent) == 1 + FAST.max_retries
    # A wait longer than the policy allows ends the call at once, saying how long to wait.
    transport = Faulty(rate_limited=1, retry_after="120")
    client = client_with(live_service, transport)
    started = time.monotonic()
    with pytest.raises(RateLimitedError) as caught:
        client.me()
    assert time.monotonic() - started < 5 and len(transport.sent) == 1
    assert caught.value.retry_after == 120.0 and caught.value.code == "rate_limited"


def test_configuration_errors_are_raised_at_once_and_never_retried(live_service: LiveService) -> None:
    for base_url in ("localhost:8080", "ftp://localhost:8080", "http://", "/v1", "http://host/?x=1"):
        with pytest.raises(ConfigurationError):
            Client(base_url, token="t")
    with pytest.raises(ValueError):  # a ConfigurationError is a ValueError too
        Client("localhost:8080")
    transport = Faulty(unsendable=5)
    client = client_with(live_service, transport, retry=RetryPolicy(max_retries=5, backoff=0.0))
    with pytest.raises(ConfigurationError):
        client.me()
    assert len(transport.sent) == 1


def test_a_validation_error_names_its_fields(sdk) -> None:
    client = sdk("bob")
    conversation = client.create_conversation()
    with pytest.raises(ValidationError) as caught:
        client.list_entries(conversation.id, limit=0)
    assert "limit" in caught.value.fields
    assert "limit: must be an integer between 1 and 200" in str(caught.value)


def test_timeouts_are_split_as_langgraph_sdk_splits_them() -> None:
    assert Client("http://localhost:8080")._http.timeout == httpx.Timeout(connect=5.0, read=30.0, write=30.0, pool=5.0)
    assert Client("http://localhost:8080", timeout=(1, 2, 3, 4))._http.timeout == httpx.Timeout(
        connect=1, read=2, write=3, pool=4
    )
    assert Client("http://localhost:8080", timeout=7)._http.timeout == httpx.Timeout(7.0)
    given = httpx.Timeout(3.0, read=60.0)
    assert AsyncClient("http://localhost:8080", timeout=given)._http.timeout == given
    for bad in ((1, 2), "10", True):
        with pytest.raises(ConfigurationError):
            Client("http://localhost:8080", timeout=bad)
