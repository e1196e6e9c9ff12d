"""D1: every failure is the one JSON error body, with the request id echoed in a header."""

import pytest
from django.test import override_settings

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.runtime.urls_probe")]


def assert_error(response, status, code):
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["code"] == code
    assert isinstance(body["error"], str) and body["error"]
    assert body["requestId"] == response["X-Request-ID"]
    return body


def test_validation_error_names_fields(api):
    response = api.post("/probe/echo", {"name": "x" * 11, "count": "many"}, format="json")
    body = assert_error(response, 400, "validation_error")
    assert set(body["details"]["fields"]) == {"name", "count"}


def test_malformed_json_is_400(api):
    response = api.post("/probe/echo", data='{"name": ', content_type="application/json")
    body = assert_error(response, 400, "validation_error")
    assert "body" in body["details"]["fields"]


def test_wrong_content_type_is_415(api):
    response = api.post("/probe/echo", data="name=x", content_type="text/plain")
    assert_error(response, 415, "unsupported_media_type")


def test_unauthenticated_is_401_with_challenge(api):
    response = api.get("/v1/me")
    assert_error(response, 401, "unauthenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_forbidden_is_403(api):
    assert_error(api.get("/probe/deny"), 403, "forbidden")


def test_unknown_path_is_json_404(api):
    assert_error(api.get("/no/such/path"), 404, "not_found")
    assert_error(api.get("/v1/nothing-here"), 404, "not_found")


def test_wrong_method_is_405(api):
    assert_error(api.post("/healthz", {}, format="json"), 405, "method_not_allowed")


def test_unhandled_exception_is_500_without_detail(api, caplog):
    api.raise_request_exception = False
    response = api.get("/probe/boom")
    body = assert_error(response, 500, "internal_error")
    assert "secret detail" not in response.content.decode()
    assert set(body) == {"code", "error", "requestId"}
    # Logged with the request id so an operator can find it.
    assert any(getattr(r, "request_id", None) == body["requestId"] for r in caplog.records)


@override_settings(DEBUG=True)
def test_plain_django_failure_is_json_even_with_debug(api):
    api.raise_request_exception = False
    response = api.get("/probe/plain-boom")
    assert_error(response, 500, "internal_error")


def test_oversized_body_is_413(api, settings):
    settings.REQUEST_MAX_BODY_BYTES = 1000
    response = api.post("/probe/echo", data='{"name": "' + "x" * 2000 + '"}', content_type="application/json")
    assert_error(response, 413, "payload_too_large")


def test_request_id_is_echoed_when_well_formed(api):
    response = api.get("/healthz", HTTP_X_REQUEST_ID="abc-123.XYZ_9")
    assert response["X-Request-ID"] == "abc-123.XYZ_9"


def test_malformed_request_id_is_replaced(api):
    response = api.get("/healthz", HTTP_X_REQUEST_ID="bad id\nwith newline")
    assert response["X-Request-ID"] != "bad id\nwith newline"
    assert len(response["X-Request-ID"]) == 32


@pytest.mark.parametrize("raw", ["0", "201", "abc", "1.5", "-3"])
def test_limit_out_of_bounds_is_400(api, raw):
    body = assert_error(api.get("/probe/limited", {"limit": raw}), 400, "validation_error")
    assert body["details"]["fields"]["limit"] == "must be an integer between 1 and 200"


def test_limit_default_and_bounds(api):
    assert api.get("/probe/limited").json() == {"limit": 20}
    assert api.get("/probe/limited", {"limit": "1"}).json() == {"limit": 1}
    assert api.get("/probe/limited", {"limit": "200"}).json() == {"limit": 200}


def test_too_many_query_fields_is_400_not_500(api):
    query = "&".join(f"ns=s{i}" for i in range(1500))
    response = api.get(f"/probe/limited?{query}")
    assert_error(response, 400, "validation_error")
