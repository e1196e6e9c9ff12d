"""Every response under /v1 and from the operational endpoints is JSON in D1's shape, whatever the method, path or
failure; CSRF applies to cookie-session pages (the admin) only (issue 7, item 3).

The clients here enforce CSRF like a browser-less caller meets it: Django's test client skips the check unless told.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

pytestmark = pytest.mark.django_db

METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
ROUTED = [
    "/v1/memories",
    "/v1/memories/search",
    "/v1/memories/namespaces",
    "/v1/memories/events",
    "/v1/me",
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
]
# Paths no route matches (/v1/conversations has none yet: it may get one, so its status is not pinned).
UNROUTED = ["/v1/nope", "/v1/no/such/route", "/v1", "/v1/", "/v1/memories/", "/healthz/", "/nope"]


@pytest.fixture
def csrf_client() -> Client:
    return Client(enforce_csrf_checks=True)


def call(client: Client, method: str, path: str, **extra):
    data = "{}" if method in ("POST", "PUT", "PATCH", "DELETE") else ""
    return client.generic(method, path, data=data, content_type="application/json", **extra)


def assert_d1(response, case: str = "") -> dict | None:
    """JSON, and when it is a failure, the one error body with the request id echoed (HEAD carries no body)."""
    content_type = response["Content-Type"]
    if response.status_code < 400:
        # Success bodies may use a JSON subtype (/openapi.json is application/vnd.oai.openapi+json).
        assert content_type.startswith("application/json") or "+json" in content_type, (case, content_type)
        return None
    assert content_type.startswith("application/json"), (case, response.status_code, response.content[:200])
    if response.request["REQUEST_METHOD"] == "HEAD":
        return None
    body = response.json()
    assert isinstance(body.get("code"), str) and body["code"]
    assert isinstance(body.get("error"), str) and body["error"]
    assert body["requestId"] == response["X-Request-ID"]
    assert set(body) <= {"code", "error", "requestId", "details", "reason"}
    if response.status_code == 400:
        assert body["code"] == "validation_error" and body["details"]["fields"]
    return body


@pytest.mark.parametrize("path", [*ROUTED, *UNROUTED, "/v1/conversations"])
def test_every_api_response_is_d1_json(csrf_client, mint_token, path):
    """Every method, anonymous and with a bearer token (one test per path: the matrix is cheap, the per-test
    database setup is not)."""
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {mint_token('bob')}"}
    for method in METHODS:
        for extra in ({}, bearer):
            response = call(csrf_client, method, path, **extra)
            case = f"{method} {path} {'bearer' if extra else 'anonymous'}: {response.status_code}"
            assert response.status_code < 500 or path == "/readyz", (case, response.content[:300])
            if path == "/metrics" and method in ("GET", "HEAD"):
                assert response.status_code == 200, case
                assert response["Content-Type"].startswith("text/plain"), case  # Prometheus' format, by design
                continue
            assert_d1(response, case)
            if path in UNROUTED:
                assert response.status_code == 404, case
                if method != "HEAD":
                    assert response.json()["code"] == "not_found", case


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/openapi.json"])
def test_wrong_method_on_operational_endpoints_is_json_405(csrf_client, method, path):
    response = call(csrf_client, method, path)
    assert response.status_code == 405
    assert assert_d1(response)["code"] == "method_not_allowed"


def test_post_to_unrouted_api_path_is_404_not_csrf(csrf_client):
    """The report: POST /v1/conversations answered Django's CSRF page (403 text/html)."""
    response = csrf_client.post("/v1/nope", {"a": 1}, content_type="application/json")
    assert response.status_code == 404
    assert assert_d1(response)["code"] == "not_found"


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_unrouted_paths_are_json_with_debug_on_or_off(csrf_client, settings, debug):
    settings.DEBUG = debug
    for method in METHODS:
        response = call(csrf_client, method, "/v1/nope")
        assert response.status_code == 404
        assert_d1(response)


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
@pytest.mark.parametrize("path", ["/v1/memories", "/v1/nope", "/healthz", "/metrics"])
def test_disallowed_host_is_json_400(csrf_client, settings, debug, path):
    """Django raises DisallowedHost in a middleware, before any view; with DEBUG on it renders an HTML page."""
    settings.ALLOWED_HOSTS = ["service.example"]
    settings.DEBUG = debug
    response = csrf_client.get(path, HTTP_HOST="evil.example")
    assert response.status_code == 400
    assert_d1(response)


@pytest.mark.urls("tests.runtime.urls_probe")
def test_request_data_too_big_is_json_413(csrf_client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10
    response = csrf_client.post("/v1/probe/read-body", data="x" * 100, content_type="text/plain")
    assert response.status_code == 413
    assert assert_d1(response)["code"] == "payload_too_large"


@pytest.mark.urls("tests.runtime.urls_probe")
def test_plain_views_under_v1_cannot_leak_html(csrf_client):
    """Django's bare 405 (empty text/html) and any HTML error page a plain view returns leave as D1 JSON."""
    not_allowed = csrf_client.get("/v1/probe/post-only")
    assert not_allowed.status_code == 405
    assert assert_d1(not_allowed)["code"] == "method_not_allowed"
    assert not_allowed["Allow"] == "POST"
    bad_gateway = csrf_client.get("/v1/probe/html-error")
    assert bad_gateway.status_code == 502
    assert b"<h1>" not in bad_gateway.content
    assert_d1(bad_gateway)
    # A plain view under /v1 is CSRF-exempt too.
    assert csrf_client.post("/v1/probe/post-only").status_code == 200


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
@pytest.mark.urls("tests.runtime.urls_probe")
def test_plain_view_crash_under_v1_is_json_500(csrf_client, settings, debug):
    settings.DEBUG = debug
    csrf_client.raise_request_exception = False
    response = csrf_client.get("/probe/plain-boom")
    assert response.status_code == 500
    assert assert_d1(response)["code"] == "internal_error"


@pytest.fixture
def operator():
    return get_user_model().objects.create_superuser("operator", "operator@example.com", "operator-password")


def test_admin_login_is_still_csrf_protected(csrf_client, operator):
    forged = csrf_client.post("/admin/login/", {"username": "operator", "password": "operator-password"})
    assert forged.status_code == 403
    assert not forged.wsgi_request.user.is_authenticated

    csrf_client.get("/admin/login/")
    token = csrf_client.cookies["csrftoken"].value
    login = csrf_client.post(
        "/admin/login/?next=/admin/",
        {"username": "operator", "password": "operator-password", "csrfmiddlewaretoken": token},
    )
    assert login.status_code == 302, login.content[:300]


def test_admin_session_cookie_is_no_api_credential(csrf_client, operator):
    """Why the API may skip CSRF: a browser's session cookie authenticates nothing there."""
    csrf_client.force_login(operator)
    assert csrf_client.get("/v1/me").status_code == 401
    response = csrf_client.put(
        "/v1/memories", {"namespace": ["user", "operator"], "key": "k", "value": {}}, content_type="application/json"
    )
    assert response.status_code == 401
    assert_d1(response)


@pytest.mark.parametrize(
    ("accept", "status"),
    [
        (None, 200),
        ("*/*", 200),
        ("application/json", 200),
        ("application/json; indent=2", 200),
        ("text/*, */*;q=0.1", 200),
        ("text/html", 406),
        ("", 406),
    ],
)
def test_content_negotiation(csrf_client, mint_token, accept, status):
    # The fast answer for no Accept / */* must be DRF's own; everything else still goes through DRF's negotiation.
    extra = {"HTTP_AUTHORIZATION": f"Bearer {mint_token('bob')}"}
    if accept is not None:
        extra["HTTP_ACCEPT"] = accept
    response = csrf_client.get("/v1/me", **extra)
    assert response.status_code == status, response.content[:200]
    assert_d1(response, accept or "")
    assert response["Content-Type"].startswith("application/json")
    if accept == "application/json; indent=2":
        assert response.content.startswith(b"{\n  ")


def test_format_override_still_negotiated(csrf_client, mint_token):
    response = csrf_client.get("/v1/me?format=xml", HTTP_AUTHORIZATION=f"Bearer {mint_token('bob')}")
    assert response.status_code == 404 or response.status_code == 406, response.status_code
    assert_d1(response)
