"""D9: health, readiness, OpenAPI, docs, metrics."""

import pytest

pytestmark = pytest.mark.django_db


def test_healthz(api):
    response = api.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_ok(api):
    response = api.get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ok"
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["redis"] == "ok"


def test_readyz_reports_stopped_redis_as_503(api, settings):
    import socket

    with socket.socket() as sock:  # a port nobody listens on: a stopped Redis
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    response = api.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["code"] == "unavailable"
    assert body["details"]["checks"]["redis"].startswith("failed")
    assert body["details"]["checks"]["database"] == "ok"
    assert "redis" in body["error"]


def test_readyz_reports_stopped_database_as_503(api, monkeypatch):
    from apps.core import readiness

    def database_down():
        raise ConnectionError("database stopped")

    monkeypatch.setitem(readiness._CHECKS, "database", database_down)
    response = api.get("/readyz")
    assert response.status_code == 503
    assert response.json()["details"]["checks"]["database"] == "failed: ConnectionError"


def test_openapi_schema(api):
    response = api.get("/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.1")
    assert "/v1/me" in schema["paths"]
    assert "bearerAuth" in schema["components"]["securitySchemes"]
    paths = schema["paths"]
    assert set(paths["/v1/memories"]) >= {"put", "get", "delete"}
    assert "post" in paths["/v1/memories/search"]
    assert "get" in paths["/v1/memories/namespaces"] and "get" in paths["/v1/memories/events"]
    # Every documented failure of the memory endpoints uses the one error body.
    error_ref = {"$ref": "#/components/schemas/Error"}
    assert paths["/v1/memories"]["put"]["responses"]["403"]["content"]["application/json"]["schema"] == error_ref
    assert paths["/v1/memories"]["get"]["responses"]["404"]["content"]["application/json"]["schema"] == error_ref
    search_body = schema["components"]["schemas"]["MemorySearchRequest"]["properties"]
    assert search_body["limit"]["maximum"] == 100 and search_body["offset"]["maximum"] == 10000


def test_docs_page_is_served_offline(api):
    response = api.get("/docs")
    assert response.status_code == 200
    assert b"swagger" in response.content.lower()
    assert b"cdn." not in response.content  # assets come from drf-spectacular-sidecar, not a CDN


def test_metrics_exposes_request_latency(api):
    api.get("/healthz")
    response = api.get("/metrics")
    assert response.status_code == 200
    text = response.content.decode()
    assert 'http_request_duration_seconds_count{method="GET",route="/healthz",status="200"}' in text


def test_logs_never_contain_tokens_keys_or_values(client_for, caplog):
    import logging

    from pythonjsonlogger.json import JsonFormatter

    from apps.core.logging import RequestContextFilter
    from tests.conftest import TEST_API_KEY

    caplog.set_level(logging.DEBUG)
    client = client_for("bob", api_key=TEST_API_KEY)
    token = client._credentials["HTTP_AUTHORIZATION"].split()[1]
    secret_value = "value-marker-5d2c"
    client.put(
        "/v1/memories",
        {"namespace": ["user", "bob"], "key": "k", "value": {"v": secret_value}, "index": {"t": secret_value}},
        format="json",
    )
    client.get("/v1/memories", {"ns": ["user", "bob"], "key": "k"})
    client.put("/v1/memories", data='{"broken": ', content_type="application/json")
    formatter = JsonFormatter()
    context = RequestContextFilter()
    lines = []
    for record in caplog.records:
        context.filter(record)
        lines.append(formatter.format(record))
    text = "\n".join(lines)
    assert any('"route": "/v1/memories"' in line for line in lines)  # the access log did run
    for secret in (token, TEST_API_KEY, secret_value):
        assert secret not in text
